"""Prints, as JSON, the observations SyncVectorEnv and SubprocVectorEnv (forkserver and spawn)
give for the same seeds, of envs that build a Text space with gymnasium's default charset in
their own process (the worker's, for subvec)."""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
from gymnasium import spaces

import subvec
from tests.envs import ZooEnv


def make() -> ZooEnv:
    return ZooEnv(spaces.Text(max_length=8), max_steps=10**6, terminate_prob=0.0)


def samples(envs: Any) -> list[list[str]]:
    try:
        obs, _ = envs.reset(seed=3)
        out = [list(obs)]
        for _ in range(3):
            obs, *_ = envs.step(envs.action_space.sample())
            out.append(list(obs))
        return out
    finally:
        envs.close()


if __name__ == "__main__":
    report = {"sync": samples(gym.vector.SyncVectorEnv([make] * 2))}
    for context in ("forkserver", "spawn"):
        report[context] = samples(subvec.SubprocVectorEnv([make] * 2, context=context))
    print(json.dumps(report))
