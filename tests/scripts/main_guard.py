"""Driven by tests/test_startup.py: a training script in miniature, run as ``python main_guard.py
CONTEXT``. It imports a heavy module at the top (``heavy``, the stand-in for torch) and a package
that registers an env on import, which its factories do not name (as CleanRL's Atari scripts
import ``ale_py``); it defines its env class and registers it *inside* the main guard (twice: a
callable entry point and a ``"__main__:Class"`` string one). It builds a SubprocVectorEnv of the
three ids, resets it with an option of a class of its own and prints one JSON line: the parent's
pid, the workers' pids, the first observations and whether an info object of the script's class
came back as that class.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import gymnasium as gym
import numpy as np

import subvec
import tests.scripts.heavy  # imported for its side effect
import tests.scripts.regpkg  # noqa: F401  (registers SubvecPkgEnv-v0 on import, as ale_py does)


class Shift:
    """A reset option of the script's own (pickled by reference to ``__main__`` by pickle)."""

    def __init__(self, by: float) -> None:
        self.by = by


class ScriptEnv(gym.Env[np.ndarray, int]):
    """Observes its own ``start`` (from the registration's kwargs), plus the reset's ``shift``
    option, plus the step count; its step info carries a ``Shift``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, start: float = 0.0) -> None:
        self.start, self.t = start, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.shift = options["shift"].by if options else 0.0
        return np.array([self.start + self.shift], np.float32), {}

    def step(self, action: int):
        self.t += 1
        obs = np.array([self.start + self.shift + self.t], np.float32)
        return obs, 1.0, False, False, {"shift": Shift(self.shift)}


def make(env_id: str) -> Any:
    return lambda: gym.make(env_id)


if __name__ == "__main__":
    gym.register("SubvecScriptCallable-v0", entry_point=ScriptEnv, kwargs={"start": 10.0})
    gym.register("SubvecScriptString-v0", entry_point="__main__:ScriptEnv", kwargs={"start": 20.0})
    ids = ["SubvecScriptCallable-v0", "SubvecScriptString-v0", "SubvecPkgEnv-v0"]
    fns = [make(env_id) for env_id in ids]
    envs = subvec.SubprocVectorEnv(fns, num_workers=2, context=sys.argv[1])
    try:
        obs, _ = envs.reset(seed=0, options={"shift": Shift(0.5)})
        obs2, _, _, _, infos = envs.step(envs.action_space.sample())
        report = {
            "parent": os.getpid(),
            "workers": envs.worker_pids,
            "obs": obs[:, 0].tolist() + obs2[:, 0].tolist(),
            "info_class": all(type(s) is Shift for s in infos["shift"]),
        }
    finally:
        envs.close()
    print(json.dumps(report), flush=True)
