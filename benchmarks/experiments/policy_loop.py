"""A rollout with a policy in the loop: a torch MLP picks every action, as in
CleanRL's PPO, instead of the suite's pre-sampled actions; torch with 1 intra-op thread and
with its default (one per CPU).

The suite's pre-sampled actions measure the vector env alone. In training, the parent runs the
policy between steps, and torch's intra-op threads (OpenMP, which busy-waits for a while after
each parallel region) run on the same CPUs as the env workers.

    python benchmarks/experiments/policy_loop.py --rounds 3
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
IMPLS = ("sync", "subvec", "subvec_nospin", "async")


def child(spec: dict[str, Any]) -> float:
    import torch

    sys.path.insert(0, str(HERE.parent))
    import bench_vector as bv
    import gymnasium as gym

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    n = spec["n"]
    if spec["workload"] == "cartpole":
        make: Any = functools.partial(bv._make_gym, "CartPole-v1", None)
    else:  # busy<N>
        make = functools.partial(bv.BusyEnv, int(int(spec["workload"][4:]) * spec["iters"]), (4,))
    impl = spec["impl"]
    if impl == "sync":
        envs: Any = gym.vector.SyncVectorEnv([make] * n)
    elif impl == "async":
        envs = gym.vector.AsyncVectorEnv([make] * n)
    else:
        import subvec

        envs = subvec.SubprocVectorEnv(
            [make] * n, **({"spin_us": 0} if impl.endswith("nospin") else {})
        )
    torch.manual_seed(0)
    size = envs.single_observation_space.shape[0]
    policy = torch.nn.Sequential(
        torch.nn.Linear(size, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, int(envs.single_action_space.n)),
    )
    try:
        obs, _ = envs.reset(seed=0)

        def rollout(seconds: float) -> float:
            nonlocal obs
            start, k = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                with torch.no_grad():
                    logits = policy(torch.as_tensor(obs, dtype=torch.float32))
                    actions = torch.distributions.Categorical(logits=logits).sample().numpy()
                obs, _, _, _, _ = envs.step(actions)
                k += 1
            return n * k / (time.perf_counter() - start)

        rollout(0.5)
        return rollout(spec["seconds"])
    finally:
        envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="cartpole:16,busy100:8")
    parser.add_argument(
        "--threads", default="1,0", help="torch intra-op threads; 0: torch's default"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(f"RATE {child(json.loads(args.child))}")
        return
    sys.path.insert(0, str(HERE.parent))
    import bench_vector as bv

    iters = bv.calibrate(0.2)
    for item in args.workloads.split(","):
        workload, n = item.split(":")
        for threads in (int(t) for t in args.threads.split(",")):
            rates: dict[str, list[float]] = {impl: [] for impl in IMPLS}
            for r in range(args.rounds):
                for impl in IMPLS[r % len(IMPLS) :] + IMPLS[: r % len(IMPLS)]:
                    spec = {"workload": workload, "n": int(n), "impl": impl, "threads": threads}
                    spec |= {"seconds": args.seconds, "iters": iters}
                    done = subprocess.run(
                        [sys.executable, __file__, "--child", json.dumps(spec)],
                        capture_output=True,
                        text=True,
                        check=False,
                        env={**os.environ, "PYTHONPATH": str(HERE.parents[1])},
                    )
                    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RATE ")]
                    if not lines:
                        raise RuntimeError(done.stderr[-2000:])
                    rates[impl].append(float(lines[0].split()[1]))
            sync = statistics.median(rates["sync"])
            label = f"{threads} thread" if threads else f"torch default ({os.cpu_count()})"
            print(f"{workload} x {n}, torch {label}:")
            for impl, values in rates.items():
                median = statistics.median(values)
                each = ", ".join(f"{v:,.0f}" for v in values)
                print(
                    f"  {impl:14s} {median:10,.0f} steps/s, {median / sync:4.0%} of Sync ({each})"
                )


if __name__ == "__main__":
    main()
