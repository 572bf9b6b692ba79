"""Envs that record how their worker started them: its environment variables and when they
were built and first reset (``time.monotonic``, one clock for every process of the machine).
Kept apart from the test modules so that a worker imports only this."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

#: The variables a worker's placement and ``worker_env`` set, as the tests read them back.
WATCHED = ("CUDA_VISIBLE_DEVICES", "MUJOCO_EGL_DEVICE_ID", "EGL_DEVICE_ID", "SIM_TAG", "MUJOCO_GL")


class SimulatorStartError(RuntimeError):
    """What a simulator that fails to start raises (a type of the env's own)."""


class StartRecorder(gym.Env[np.ndarray, int]):
    """Records at construction the watched variables and the build interval.

    Args:
        build_s: seconds its construction takes.
        reset_s: seconds its first reset takes (where some simulators load).
        fail_marker: a path: the first construction that finds no file there creates it and
            raises, as a start that fails once.
        always_fail: every construction raises.
    """

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(
        self,
        build_s: float = 0.0,
        reset_s: float = 0.0,
        fail_marker: str | None = None,
        always_fail: bool = False,
    ) -> None:
        started = time.monotonic()
        if always_fail:
            raise SimulatorStartError("EGL device not found")
        if fail_marker is not None and not Path(fail_marker).exists():
            Path(fail_marker).write_text("failed once\n")
            raise SimulatorStartError("EGL context storm")
        self.environ = {name: os.environ.get(name) for name in WATCHED}
        self.pid = os.getpid()
        time.sleep(build_s)
        self.built = (started, time.monotonic())
        self.reset_s = reset_s
        self.first_reset: tuple[float, float] | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if self.first_reset is None:
            started = time.monotonic()
            time.sleep(self.reset_s)
            self.first_reset = (started, time.monotonic())
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.zeros(1, np.float32), 0.0, False, False, {}
