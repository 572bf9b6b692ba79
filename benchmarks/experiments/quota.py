"""subvec inside a cgroup with a CPU bandwidth limit: throughput, throttling and
the slowest steps, next to SyncVectorEnv, for one or more checkouts of subvec.

A limit such as ``docker --cpus=1`` caps CPU time, not CPUs: ``sched_getaffinity`` still lists
every CPU. Run this script from a shell inside such a cgroup; as root on cgroup v1:

    mkdir /sys/fs/cgroup/cpu/q1 && echo 100000 > /sys/fs/cgroup/cpu/q1/cpu.cfs_quota_us
    echo $$ > /sys/fs/cgroup/cpu/q1/tasks
    git worktree add /tmp/before e517ff2~1   # before the quota was counted
    python benchmarks/experiments/quota.py --stat /sys/fs/cgroup/cpu/q1/cpu.stat \\
        before=/tmp/before now=.

(cgroup v2: ``echo "100000 100000" > <cgroup>/cpu.max``, ``echo $$ > <cgroup>/cgroup.procs``.)
Each configuration runs in a fresh interpreter, rounds interleaved. ``one`` is the current
checkout confined to CPU 0 with taskset, to separate the quota from the cross-CPU hand-off.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def throttling(stat: str) -> tuple[int, float]:
    """(throttled periods, seconds throttled) so far, from a v1 or v2 ``cpu.stat``."""
    fields = dict(line.split() for line in Path(stat).read_text().splitlines() if line.strip())
    if "throttled_usec" in fields:  # v2
        return int(fields["nr_throttled"]), int(fields["throttled_usec"]) / 1e6
    return int(fields["nr_throttled"]), int(fields["throttled_time"]) / 1e9


def child(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(HERE.parent))
    import bench_vector as bv
    import gymnasium as gym

    if spec["workload"] == "cartpole":
        make: Any = functools.partial(bv._make_gym, "CartPole-v1", None)
    else:  # busy<N>: N us of work a step
        make = functools.partial(
            bv.BusyEnv, int(int(spec["workload"][4:]) * bv.calibrate(0.1)), (4,)
        )
    n = spec["n"]
    if spec["impl"] == "sync":
        envs: Any = gym.vector.SyncVectorEnv([make] * n)
    else:
        import subvec

        envs = subvec.SubprocVectorEnv([make] * n)
    try:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(64)]
        clock = time.perf_counter
        start, k = clock(), 0
        while clock() - start < 0.5:
            envs.step(actions[k % 64])
            k += 1
        before = throttling(spec["stat"])
        times: list[float] = []
        start = clock()
        while (t0 := clock()) - start < spec["seconds"]:
            envs.step(actions[len(times) % 64])
            times.append(clock() - t0)
        elapsed = clock() - start
        after = throttling(spec["stat"])
        times.sort()
        return {
            "rate": n * len(times) / elapsed,
            "workers": getattr(envs, "num_workers", 0),
            "throttled_periods": after[0] - before[0],
            "throttled_s": after[1] - before[1],
            "p99_ms": 1e3 * times[int(0.99 * len(times))],
            "max_ms": 1e3 * times[-1],
        }
    finally:
        envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", help="label=path of a subvec checkout")
    parser.add_argument("--stat", required=True, help="the cgroup's cpu.stat file")
    parser.add_argument("--workload", default="cartpole")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.5)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))))
        return
    here = str(HERE.parents[1])
    configs = [("sync", here, "sync", False)]
    configs += [
        (label, path, "subvec", False) for label, path in (c.split("=", 1) for c in args.checkouts)
    ]
    configs.append(("one", here, "subvec", True))
    rates: dict[str, list[float]] = {label: [] for label, *_ in configs}
    base = {
        "workload": args.workload,
        "n": args.num_envs,
        "seconds": args.seconds,
        "stat": args.stat,
    }
    for r in range(args.rounds):
        for label, path, impl, confine in configs[r % len(configs) :] + configs[: r % len(configs)]:
            spec = json.dumps({**base, "impl": impl})
            cmd = [sys.executable, __file__, "--stat", args.stat, "x=.", "--child", spec]
            env = {**os.environ, "PYTHONPATH": str(Path(path).resolve())}
            done = subprocess.run(
                (["taskset", "-c", "0"] if confine else []) + cmd,
                env=env,
                capture_output=True,
                text=True,
                cwd="/",
                check=False,
            )
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            if not lines:
                raise RuntimeError(f"{label} failed: {done.stderr[-2000:]}")
            row = json.loads(lines[0][7:])
            rates[label].append(row["rate"])
            print(
                f"round {r + 1} {label:8s} {row['rate']:10,.0f} steps/s, {row['workers']} workers, "
                f"throttled {row['throttled_periods']} periods ({row['throttled_s']:.2f} s), "
                f"step p99 {row['p99_ms']:.2f} ms, max {row['max_ms']:.1f} ms",
                flush=True,
            )
    sync = statistics.median(rates["sync"])
    for label, values in rates.items():
        median = statistics.median(values)
        share = median / sync
        what = f"{args.workload} x {args.num_envs}"
        print(f"{what}: {label:8s} {median:10,.0f} steps/s, {share:.0%} of Sync")


if __name__ == "__main__":
    main()
