"""Driven by tests/test_startup.py: a script with no ``if __name__ == "__main__":`` guard, run as
``python no_guard.py CONTEXT [sb3]``. It builds, steps and closes a SubprocVectorEnv (or, with
``sb3``, the SB3 face) at the top level and prints the observations' shape."""

from __future__ import annotations

import sys

import gymnasium as gym

import subvec

if sys.argv[2:] == ["sb3"]:
    from subvec.sb3 import SubprocVecEnv

    venv = SubprocVecEnv([lambda: gym.make("CartPole-v1")] * 2, start_method=sys.argv[1])
    obs = venv.reset()
    venv.step(venv.action_space.sample()[None].repeat(2, 0))
    venv.close()
else:
    envs = subvec.SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * 2, context=sys.argv[1])
    obs, _ = envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    envs.close()
print("ok", obs.shape, flush=True)
