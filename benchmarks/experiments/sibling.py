"""Does a busy process on one vCPU slow down Python work on the other?

Times ``EnvSlab.step`` over N CartPole envs on CPU 0 (in-process, no IPC) while CPU 1 is idle,
while it runs a pure-Python busy loop, and while it runs a ``poll(0)`` loop (what a spinning
subvec worker does between steps).

    python benchmarks/experiments/sibling.py [--envs 16]

Second round of docs/benchmarks.md: on the 2-vCPU VM a busy CPU 1 made CPU 0's work 1.3-1.5x
slower (111 -> 165 and 112 -> 144 us for a pure-Python loop; a ``poll(0)`` loop 108 us in one
run and 168 us in another): the two vCPUs behave like two hyperthreads of one core, so the
limit's two processes slow each other down while SyncVectorEnv (one process) runs at full speed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium.vector.vector_env import AutoresetMode

from subvec import _spaces
from subvec._core import EnvSlab, SlabArrays

PURE_PYTHON = "import os\nos.sched_setaffinity(0, {1})\nwhile True:\n    pass\n"
POLL_LOOP = (
    "import os, select\nos.sched_setaffinity(0, {1})\nr, w = os.pipe()\n"
    "p = select.poll()\np.register(r, select.POLLIN)\nwhile True:\n    p.poll(0)\n"
)


def build(n: int) -> EnvSlab:
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    space = envs[0].observation_space
    obs = np.zeros((n, 4), np.float32)
    actions = np.zeros(n, np.int64)
    slab = EnvSlab(envs, 0, AutoresetMode.NEXT_STEP)
    slab.bind(
        SlabArrays(
            np.zeros(n),
            np.zeros(n, bool),
            np.zeros(n, bool),
            _spaces.row_writer(space, obs, env_offset=0),
            _spaces.row_reader(envs[0].action_space, actions),
        )
    )
    return slab


def best_of(slab: EnvSlab, rounds: int = 2000, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds):
            slab.step()
        best = min(best, (time.perf_counter() - start) / rounds * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two CPUs")
    os.sched_setaffinity(0, {0})
    slab = build(args.envs)
    print(f"CPU 1 idle:               {best_of(slab):6.1f} us per step of {args.envs} envs")
    for label, code in (("pure-Python loop", PURE_PYTHON), ("poll(0) loop", POLL_LOOP)):
        other = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.5)
            print(f"CPU 1 runs a {label:16s} {best_of(slab):6.1f} us")
        finally:
            other.kill()
            other.wait()
    print(f"CPU 1 idle again:         {best_of(slab):6.1f} us")


if __name__ == "__main__":
    main()
