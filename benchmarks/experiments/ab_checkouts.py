"""Two versions of subvec side by side: interleaved rounds, the limit measured in every round.

Each round runs the limit (W free-running processes, as in bench_vector.py) and then every
labelled checkout, each in a fresh interpreter with that checkout first on ``sys.path``, and
reports the medians of the per-round shares of the limit. Use it to judge a hot-path change on
a machine whose speed drifts from minute to minute (ratios within a round, not raw rates).

    git worktree add /tmp/base HEAD~1
    python benchmarks/experiments/ab_checkouts.py --rounds 4 \\
        --workload cartpole --num-envs 16 base=/tmp/base new=.

Workloads: ``cartpole``, ``cartpole_monitor`` (in SB3's ``Monitor``), ``busy<N>``
(bench_vector.py's BusyEnv with N us of work a step), ``pong``, ``halfcheetah``, and any other
workload bench_vector.py names (``libero1ms``, ``libero1ms_notext``, ``busy100us_84x84x3``).
Extra constructor arguments: ``--kwargs "{'spin_us': 0}"``; ``--torch`` steps with CPU torch
tensors instead of numpy arrays (what a torch policy hands over); ``--chunk K`` times
``step_chunk`` with K actions per env (one-array action spaces) instead of ``step``;
``--recv-batch N`` ``recv()``/``send()`` batches of N envs (with ``--chunk K``: ``recv()``, then
``send_chunk()`` of K actions to each env of the batch).

A checkout may force how the envs are split between the workers (is an uneven split better
when worker 0 shares its CPU with the parent? docs/decisions/0007): ``label=path:6,10`` gives
worker 0 envs 0..5 and worker 1 envs 6..15, whatever ``_split`` would choose.

    python benchmarks/experiments/ab_checkouts.py --num-envs 16 even=. w0_6=.:6,10 w0_4=.:4,12
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def factory(workload: str) -> Any:
    sys.path.insert(0, str(HERE.parent))
    import bench_vector as bv

    if workload == "cartpole":
        return functools.partial(bv._make_gym, "CartPole-v1", None)
    if workload == "cartpole_monitor":  # as SB3's make_vec_env builds it
        return functools.partial(monitored, functools.partial(bv._make_gym, "CartPole-v1", None))
    if workload == "pong":
        return functools.partial(bv._make_gym, "ALE/Pong-v5", "ale_py")
    if workload == "halfcheetah":
        return functools.partial(bv._make_gym, "HalfCheetah-v5", "mujoco")
    if workload[4:].isdigit() and workload.startswith("busy"):
        return functools.partial(bv.BusyEnv, int(int(workload[4:]) * bv.calibrate(0.1)), (4,))
    return bv.make_factory(bv.workload_spec(workload, bv.calibrate(0.1)))


def monitored(make: Any) -> Any:
    """``make()`` wrapped in SB3's ``Monitor`` (episode statistics in the final info)."""
    from stable_baselines3.common.monitor import Monitor

    return Monitor(make())


def child_vector(
    workload: str,
    n: int,
    kwargs: dict[str, Any],
    seconds: float,
    split: list[int] | None = None,
    torch: bool = False,
    chunk: int = 0,
    recv_batch: int = 0,
) -> float:
    import subvec

    if split:
        bounds = [(sum(split[:w]), sum(split[: w + 1])) for w in range(len(split))]

        def forced(num_envs: int, num_workers: int, extra_last: bool = False) -> list[Any]:
            if (num_envs, num_workers) != (bounds[-1][1], len(bounds)):
                raise SystemExit(f"split {split} does not fit {num_envs} envs / {num_workers}")
            return bounds

        if hasattr(subvec, "_plan"):  # planning is its own module
            subvec._process.plan.split = forced
        else:
            subvec.vector._split = forced  # type: ignore[attr-defined]

    if recv_batch:
        kwargs = {**kwargs, "batch_size": recv_batch}
    envs = subvec.SubprocVectorEnv([factory(workload)] * n, **kwargs)
    try:
        envs.reset(seed=0)
        if recv_batch:  # first-ready: recv() the batch, send() its actions back
            import gymnasium as gym

            space = gym.vector.utils.batch_space(envs.single_action_space, recv_batch)
            envs.drain()
            envs.async_reset(seed=0)
            if chunk:  # recv() the batch, send_chunk() K actions to each of its envs
                envs.recv(min_envs=recv_batch, max_envs=recv_batch)
                envs.send_chunk(np.zeros((recv_batch, chunk), dtype=np.int64))

                def recv_send_chunk(actions: Any) -> None:
                    envs.recv(min_envs=recv_batch, max_envs=recv_batch)
                    envs.send_chunk(actions)

                samples = [space.sample() for _ in range(64 * chunk)]
                actions = [
                    np.stack(samples[i * chunk : (i + 1) * chunk], axis=1) for i in range(64)
                ]
                return timed_rate(recv_send_chunk, actions, recv_batch * chunk, seconds)

            def recv_send(actions: Any) -> None:
                envs.recv()
                envs.send(actions)

            samples = [space.sample() for _ in range(64)]
            return timed_rate(recv_send, samples, recv_batch, seconds)
        if chunk:  # (num_envs, K) batches of one array leaf (Box, Discrete, ...)
            samples = [envs.action_space.sample() for _ in range(64 * chunk)]
            actions = [np.stack(samples[i * chunk : (i + 1) * chunk], axis=1) for i in range(64)]
            return timed_rate(envs.step_chunk, actions, n * chunk, seconds)
        actions = [envs.action_space.sample() for _ in range(64)]
        if torch:
            sys.path.insert(0, str(HERE.parent))
            import bench_vector as bv

            actions = bv.as_tensors(actions)
        return timed_rate(envs.step, actions, n, seconds)
    finally:
        envs.close()


def timed_rate(step: Any, actions: list[Any], n: int, seconds: float) -> float:
    """Env-steps per second of ``step`` over ``n`` envs, cycling ``actions``: 200 steps of
    warm-up, then as many as ``seconds`` allow."""
    for i in range(200):
        step(actions[i % len(actions)])
    start, k = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step(actions[k % len(actions)])
        k += 1
    return n * k / (time.perf_counter() - start)


def ready_envs(make: Any, count: int) -> tuple[list[Any], list[Any]]:
    """``count`` envs from ``make``, reset with seeds 0.., and 64 sampled actions."""
    envs = [make() for _ in range(count)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    return envs, [envs[0].action_space.sample() for _ in range(64)]


def step_for(envs: list[Any], actions: list[Any], seconds: float) -> tuple[int, float]:
    """Step ``envs`` one after the other, resetting those that end, for ``seconds``: the
    limit's tight loop. Returns the rounds done and the seconds they took."""
    start, k = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        for env in envs:
            _, _, terminated, truncated, _ = env.step(actions[k % 64])
            if terminated or truncated:
                env.reset()
        k += 1
    return k, time.perf_counter() - start


def _limit_part(make: Any, count: int, seconds: float, go: Any, out: Any) -> None:
    envs, actions = ready_envs(make, count)
    go.wait()
    k, wall = step_for(envs, actions, seconds)
    out.put(count * k / wall)


def limit_processes(
    make: Any, shares: list[int], seconds: float, part: Any = _limit_part
) -> list[Any]:
    """One forked process per share running ``part(make, share, seconds, go, out)``, all
    released together by the ``go`` barrier; what each put in ``out``."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    go, out = ctx.Barrier(len(shares) + 1), ctx.SimpleQueue()
    procs = [ctx.Process(target=part, args=(make, s, seconds, go, out)) for s in shares]
    for proc in procs:
        proc.start()
    go.wait()
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    return results


def child_limit(workload: str, n: int, seconds: float) -> float:
    width = min(n, len(os.sched_getaffinity(0)))
    shares = [n // width + (1 if w < n % width else 0) for w in range(width)]
    return float(sum(limit_processes(factory(workload), shares, seconds)))


def run_child(spec: dict[str, Any], path: str | None) -> float:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(path).resolve()), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        cwd="/",  # not the repo root, so that PYTHONPATH decides which subvec is imported
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RATE "):
            return float(line.split()[1])
    raise RuntimeError(f"child failed: {done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="*", help="label=path")
    parser.add_argument("--workload", default="cartpole")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--torch", action="store_true", help="actions as CPU torch tensors")
    parser.add_argument("--chunk", type=int, default=0, help="step_chunk with K actions per env")
    parser.add_argument(
        "--recv-batch", type=int, default=0, help="recv()/send() batches of this many envs"
    )
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        if spec["what"] == "limit":
            rate = child_limit(spec["workload"], spec["n"], spec["seconds"])
        else:
            rate = child_vector(
                spec["workload"],
                spec["n"],
                spec["kwargs"],
                spec["seconds"],
                spec.get("split"),
                spec.get("torch", False),
                spec.get("chunk", 0),
                spec.get("recv_batch", 0),
            )
        print(f"RATE {rate}")
        return
    labelled, splits = [], {}
    for item in args.checkouts:
        label, _, where = item.partition("=")
        path, _, split = where.partition(":")
        labelled.append((label, path))
        splits[label] = [int(k) for k in split.split(",")] if split else None
    base = {"workload": args.workload, "n": args.num_envs, "seconds": args.seconds}
    vector_base = {**base, "torch": args.torch, "chunk": args.chunk, "recv_batch": args.recv_batch}
    kwargs = ast.literal_eval(args.kwargs)
    shares: dict[str, list[float]] = {label: [] for label, _ in labelled}
    rates: dict[str, list[float]] = {label: [] for label, _ in labelled}
    for r in range(args.rounds):
        limit = run_child({**base, "what": "limit"}, None)
        order = labelled[r % len(labelled) :] + labelled[: r % len(labelled)]
        for label, path in order:
            spec = {**vector_base, "what": "vector", "kwargs": kwargs, "split": splits[label]}
            rate = run_child(spec, path)
            rates[label].append(rate)
            shares[label].append(rate / limit)
        print(f"round {r + 1}: limit {limit:,.0f} steps/s", flush=True)
    actions = ", torch actions" if args.torch else ""
    actions += f", step_chunk K = {args.chunk}" if args.chunk else ""
    print(
        f"{args.workload} x {args.num_envs}, {kwargs or 'defaults'}{actions}, {args.rounds} rounds"
    )
    for label, _ in labelled:
        each = ", ".join(f"{s:.0%}" for s in shares[label])
        print(
            f"  {label:12s} {statistics.median(rates[label]):10,.0f} steps/s, "
            f"{statistics.median(shares[label]):.0%} of the limit (rounds: {each})"
        )


if __name__ == "__main__":
    main()
