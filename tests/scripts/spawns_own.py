"""Driven by tests/test_startup.py: a script with no main guard that builds a vector env at the
top level and then starts a process of its own with multiprocessing's spawn, run as ``python
spawns_own.py CONTEXT``. That child re-runs this script while it bootstraps, so it builds the
vector env from inside multiprocessing's bootstrapping phase: subvec must say what to do."""

from __future__ import annotations

import multiprocessing
import os
import sys

import gymnasium as gym

import subvec

envs = subvec.SubprocVectorEnv([lambda: gym.make("CartPole-v1")], context=sys.argv[1])
envs.close()
child = multiprocessing.get_context("spawn").Process(target=os.getpid)
child.start()
child.join()
print("child exit code", child.exitcode, flush=True)
