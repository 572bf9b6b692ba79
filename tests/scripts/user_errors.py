"""Driven by tests/test_startup.py: a user's script whose env class (defined here, in
``__main__``) raises in ``step`` and whose lambda factory raises while building. Run as ``python
user_errors.py CONTEXT``; prints one JSON line: each error's type and the worker's traceback, and
the lines of this file where the two errors are raised.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import subvec


class BrokenStep(gym.Env[np.ndarray, int]):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: int):
        raise ValueError("the env's own step failed")  # STEP-LINE


def remote_text(exc: BaseException) -> str:
    cause = exc.__cause__
    return getattr(cause, "text", "")


def main() -> None:
    context = sys.argv[1]
    report: dict[str, Any] = {}
    envs = subvec.SubprocVectorEnv([BrokenStep, BrokenStep], num_workers=2, context=context)
    try:
        envs.reset(seed=0)
        try:
            envs.step(np.array([0, 1]))
        except ValueError as exc:
            report["step"] = [type(exc).__name__, remote_text(exc)]
    finally:
        envs.close()
    try:
        subvec.SubprocVectorEnv(
            [BrokenStep, lambda: {}["no such key"]],  # LAMBDA-LINE
            num_workers=2,
            context=context,
        ).close()
    except KeyError as exc:
        report["build"] = [type(exc).__name__, remote_text(exc)]
    lines = Path(__file__).read_text().splitlines()
    report["lines"] = {
        tag: next(i + 1 for i, line in enumerate(lines) if line.endswith(f"# {tag}"))
        for tag in ("STEP-LINE", "LAMBDA-LINE")
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
