"""Driven by tests/test_startup.py: a script with no ``if __name__ == "__main__":`` guard, run as
``python no_guard.py CONTEXT``. It builds, steps and closes a SubprocVectorEnv at the top level
and prints the observations' shape."""

from __future__ import annotations

import sys

import gymnasium as gym

import subvec

envs = subvec.SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * 2, context=sys.argv[1])
obs, _ = envs.reset(seed=0)
envs.step(envs.action_space.sample())
envs.close()
print("ok", obs.shape, flush=True)
