"""Where a step's CPU time goes, per process: the parent and each worker, in microseconds of CPU
per vector step, next to the wall time per step.

On a machine where the CPUs are the bottleneck, the CPU that carries the most per step sets the
pace. With the partner layout (worker 0 shares the parent's CPU), that CPU runs the parent's
Python, worker 0's envs and worker 0's own overhead; comparing the two sums shows how far the
layout is from balanced, and how much of a step is not env work.

    python benchmarks/experiments/cpu_split.py --workload cartpole --num-envs 16
    taskset -c 0 python benchmarks/experiments/cpu_split.py --num-envs 8   # one core

A spinning worker's CPU includes its busy-poll, so only a sleeping worker's number is its work.
"""

from __future__ import annotations

import argparse
import ast
import time
from typing import Any

import numpy as np
import psutil
from ab_checkouts import factory


def ready_env(workload: str, n: int, kwargs: str) -> tuple[Any, list[Any]]:
    """A SubprocVectorEnv of ``n`` ``workload`` envs (``kwargs``: a dict literal), reset with
    seed 0, and 64 action batches sampled from a seeded action space."""
    import subvec

    envs = subvec.SubprocVectorEnv([factory(workload)] * n, **ast.literal_eval(kwargs))
    try:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        return envs, [envs.action_space.sample() for _ in range(64)]
    except BaseException:
        envs.close()
        raise


def env_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``ready_env`` and of the timed window (shared with in_situ.py)."""
    parser.add_argument("--workload", default="cartpole")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--seconds", type=float, default=3.0)
    return parser


def main() -> None:
    parser = env_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args = parser.parse_args()
    n = args.num_envs
    envs, actions = ready_env(args.workload, n, args.kwargs)
    try:
        for i in range(300):
            envs.step(actions[i % 64])
        workers = [psutil.Process(pid) for pid in envs.worker_pids if pid]

        def cpu() -> list[float]:
            return [sum(p.cpu_times()[:2]) for p in workers]

        before, start, parent_before = cpu(), time.perf_counter(), time.process_time()
        steps = 0
        while time.perf_counter() - start < args.seconds:
            envs.step(actions[steps % 64])
            steps += 1
        wall = time.perf_counter() - start
        parent = time.process_time() - parent_before
        after = cpu()
        per_worker = [1e6 * (b - a) / steps for a, b in zip(before, after)]
        print(
            f"{args.workload} x {n}: {steps * n / wall:,.0f} env-steps/s, "
            f"wall {1e6 * wall / steps:.1f} us/step, parent CPU {1e6 * parent / steps:.1f} us/step"
        )
        for worker, us in zip(envs._pool.workers, per_worker):
            w = worker.index
            role = " (partner: shares the parent's CPU)" if w == envs._partner else ""
            print(
                f"  worker {w}, envs {worker.lo}..{worker.hi - 1}, spin "
                f"{envs._worker_spin_us[w]:g} us: CPU {us:.1f} us/step{role}"
            )
        print(f"  sum of CPU per step: {1e6 * parent / steps + float(np.sum(per_worker)):.1f} us")
    finally:
        envs.close()


if __name__ == "__main__":
    main()
