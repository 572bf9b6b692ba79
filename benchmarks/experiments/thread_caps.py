"""Thread caps in the workers: a small matmul per step, x 8 envs, with ``worker_threads=1`` and
``worker_threads=None`` (the libraries' own pools), interleaved rounds.

For each setting: env-steps/s, and per worker the threads it has and those that did work during
a burst of matmuls (psutil's per-thread CPU times). ``--torch`` adds a torch matmul per step
(each worker then imports torch: over a second of start-up each).

    python benchmarks/experiments/thread_caps.py --rounds 3 --seconds 3
    python benchmarks/experiments/thread_caps.py --rounds 2 --seconds 3 --torch
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from subvec import SubprocVectorEnv


@dataclass
class Args:
    rounds: int = 3
    seconds: float = 3.0
    num_envs: int = 8
    size: int = 128
    torch: bool = False


class MatmulEnv(gym.Env[np.ndarray, int]):
    """One ``size x size`` matmul per step (numpy, and torch with ``use_torch``)."""

    def __init__(self, size: int, use_torch: bool) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.a = np.random.default_rng(0).random((size, size))
        self.t = None
        if use_torch:
            import torch

            self.t = torch.rand(size, size)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(1), {}

    def step(self, action: int):
        value = float((self.a @ self.a)[0, 0])
        if self.t is not None:
            value += float((self.t @ self.t)[0, 0])
        return np.array([value]), 0.0, False, False, {}

    def threads(self) -> tuple[int, int]:
        import psutil

        me = psutil.Process()

        def times() -> dict[int, float]:
            return {t.id: t.user_time + t.system_time for t in me.threads()}

        # psutil's thread times tick in 10 ms: a burst long enough for every busy thread
        before = times()
        for _ in range(300):
            self.step(0)
        after = times()
        busy = sum(1 for k, v in after.items() if v - before.get(k, 0.0) >= 0.02)
        return me.num_threads(), busy


def run(args: Args, worker_threads: int | None) -> tuple[float, list[tuple[int, int]]]:
    fns = [functools.partial(MatmulEnv, args.size, args.torch)] * args.num_envs
    with SubprocVectorEnv(fns, worker_threads=worker_threads) as envs:
        envs.reset(seed=0)
        actions = np.zeros(args.num_envs, dtype=np.int64)
        for _ in range(20):
            envs.step(actions)
        steps = 0
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            envs.step(actions)
            steps += 1
        rate = steps * args.num_envs / (time.perf_counter() - start)
        threads = list(envs.call("threads"))
    # call() runs every env of a worker in turn; one report per worker is enough
    per_worker = [threads[r.start] for r in envs.worker_envs]
    return rate, per_worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in vars(Args()).items():
        if isinstance(default, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", action="store_true")
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = Args(**vars(parser.parse_args()))
    settings: dict[str, int | None] = {"worker_threads=1": 1, "worker_threads=None": None}
    rates: dict[str, list[float]] = {k: [] for k in settings}
    threads: dict[str, list[tuple[int, int]]] = {}
    for r in range(args.rounds):
        order = list(settings) if r % 2 == 0 else list(reversed(settings))
        for label in order:
            rate, per_worker = run(args, settings[label])
            rates[label].append(rate)
            threads[label] = per_worker
            print(f"round {r + 1} {label}: {rate:,.0f} env-steps/s", flush=True)
    work = "numpy" + ("+torch" if args.torch else "")
    print(
        f"\n{work} {args.size}x{args.size} matmul per step x {args.num_envs} envs, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, {args.rounds} rounds, medians"
    )
    print("| setting | env-steps/s | rounds | threads per worker | busy threads per worker |")
    print("|---|---:|---|---:|---:|")
    for label in settings:
        per = threads[label]
        print(
            f"| {label} | {statistics.median(rates[label]):,.0f} "
            f"| {', '.join(f'{x:,.0f}' for x in rates[label])} "
            f"| {statistics.median(t for t, _ in per):.0f} "
            f"| {statistics.median(b for _, b in per):.0f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
