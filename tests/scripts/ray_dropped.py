"""Driven by tests/test_ray.py: RayVectorEnvs that are never closed, on the test's Ray cluster.

Usage: python -m tests.scripts.ray_dropped ADDRESS

Connects each env to the cluster at ADDRESS itself (so each owns its connection). The first
is dropped and collected: it must have disconnected (printed as ``{"ray_after_collect":
false}``). The second is left open at interpreter exit; its actors' pids are printed first.
"""

from __future__ import annotations

import gc
import json
import os
import sys

# Loopback only: read when ray is imported.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray

from subvec.ray import RayVectorEnv
from tests.envs import make_zoo


def open_envs(address: str) -> RayVectorEnv:
    envs = RayVectorEnv([make_zoo("box_f32")] * 2, num_actors=2, local_workers=1, address=address)
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    return envs


def main() -> None:
    address = sys.argv[1]
    dropped = open_envs(address)
    del dropped
    gc.collect()
    print(json.dumps({"ray_after_collect": ray.is_initialized()}), flush=True)
    left_open = open_envs(address)
    print(json.dumps({"actor_pids": [r.pid for r in left_open.placement]}), flush=True)


if __name__ == "__main__":
    main()
