"""The env of ``tests.scripts.regpkg`` (see there)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class PkgEnv(gym.Env[np.ndarray, int]):
    """Observes 30, plus the reset's ``shift`` option, plus the step count; its step info
    carries the option's object back."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.option = options["shift"] if options else None
        return np.array([30.0 + (self.option.by if self.option else 0.0)], np.float32), {}

    def step(self, action: int):
        self.t += 1
        shift = self.option.by if self.option else 0.0
        return (
            np.array([30.0 + shift + self.t], np.float32),
            1.0,
            False,
            False,
            {"shift": self.option},
        )
