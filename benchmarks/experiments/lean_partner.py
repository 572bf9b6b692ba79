"""How far could an isolated design go on CartPole x 16 with 2 CPUs?

A bare-bones model of subvec's partner layout with almost no Python around the hand-offs: two
forked worker processes of 8 envs each, actions/observations/rewards/flags in one anonymous
shared mapping, one byte per command and per reply over pipes. Worker 0 (the partner) blocks
on its pipe; worker 1 busy-polls for up to 300 us first; the parent sends to worker 1, then
to the partner, sleeps on the partner's reply, then takes worker 1's, and copies the results
out as a vector env must. No error handling, no sentinels, no infos: an upper bound for the
layout, not an implementation. Next to it, in the same rounds: the limit (2 processes stepping
8 envs each, no IPC) and subvec's defaults.

    python benchmarks/experiments/lean_partner.py --rounds 5
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import select
import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np

N, HALF = 16, 8
SPIN_S = 300e-6


def _arrays(buf: mmap.mmap) -> dict[str, np.ndarray]:
    out, offset = {}, 0
    for name, shape, dtype in (
        ("act", (N,), np.int64),
        ("obs", (N, 4), np.float32),
        ("rew", (N,), np.float64),
        ("term", (N,), np.bool_),
        ("trunc", (N,), np.bool_),
    ):
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        out[name] = np.frombuffer(buf, dtype=dtype, count=int(np.prod(shape)), offset=offset)
        out[name] = out[name].reshape(shape)
        offset += (size + 63) // 64 * 64
    return out


def _worker(buf: mmap.mmap, lo: int, cmd: int, reply: int, spin: bool) -> None:
    a = _arrays(buf)
    act, obs, rew, term, trunc = a["act"], a["obs"], a["rew"], a["term"], a["trunc"]
    envs = [gym.make("CartPole-v1") for _ in range(HALF)]
    for j, env in enumerate(envs):
        obs[lo + j] = env.reset(seed=lo + j)[0]
    poller = select.poll()
    poller.register(cmd, select.POLLIN)
    clock = time.perf_counter
    while True:
        if spin:
            deadline = clock() + SPIN_S
            while not poller.poll(0) and clock() < deadline:
                pass
        if os.read(cmd, 1) != b"s":
            return
        for j, env in enumerate(envs):
            i = lo + j
            o, r, te, tr, _ = env.step(act[i])
            if te or tr:
                o = env.reset()[0]
            obs[i] = o
            rew[i] = r
            term[i] = te
            trunc[i] = tr
        os.write(reply, b"k")


def timed(step: Any, seconds: float) -> float:
    """Env-steps per second of ``step(k)`` (one vector step of N envs): 500 steps of warm-up,
    then as many as ``seconds`` allow."""
    for k in range(500):
        step(k)
    start, k = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step(k)
        k += 1
    return N * k / (time.perf_counter() - start)


def lean(seconds: float) -> float:
    buf = mmap.mmap(-1, 4096)
    a = _arrays(buf)
    pipes = [(os.pipe(), os.pipe()) for _ in range(2)]  # (cmd, reply) per worker
    ctx = mp.get_context("fork")
    procs = [
        ctx.Process(target=_worker, args=(buf, w * HALF, pipes[w][0][0], pipes[w][1][1], w == 1))
        for w in range(2)
    ]
    for p in procs:
        p.start()
    partner_cmd, partner_reply = pipes[0][0][1], pipes[0][1][0]
    other_cmd, other_reply = pipes[1][0][1], pipes[1][1][0]
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 2, N) for _ in range(64)]

    def step(k: int) -> tuple[Any, ...]:
        np.copyto(a["act"], batches[k % 64])
        os.write(other_cmd, b"s")
        os.write(partner_cmd, b"s")
        os.read(partner_reply, 1)
        os.read(other_reply, 1)
        return a["obs"].copy(), a["rew"].copy(), a["term"].copy(), a["trunc"].copy()

    rate = timed(step, seconds)
    for w in range(2):
        os.write(pipes[w][0][1], b"q")
    for p in procs:
        p.join()
    return rate


def _limit_part(seconds: float, go: Any, out: Any) -> None:
    envs = [gym.make("CartPole-v1") for _ in range(HALF)]
    for j, env in enumerate(envs):
        env.reset(seed=j)
    acts = np.random.default_rng(0).integers(0, 2, (64, HALF))
    go.wait()
    start, k = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        for j, env in enumerate(envs):
            _, _, te, tr, _ = env.step(acts[k % 64, j])
            if te or tr:
                env.reset()
        k += 1
    out.put(HALF * k / (time.perf_counter() - start))


def limit(seconds: float) -> float:
    ctx = mp.get_context("fork")
    go, out = ctx.Barrier(3), ctx.SimpleQueue()
    procs = [ctx.Process(target=_limit_part, args=(seconds, go, out)) for _ in range(2)]
    for p in procs:
        p.start()
    go.wait()
    rate = out.get() + out.get()
    for p in procs:
        p.join()
    return rate


def subvec_defaults(seconds: float) -> float:
    from ab_checkouts import child_vector  # the same timed loop as the A/B runs

    return child_vector("cartpole", N, {}, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    shares: dict[str, list[float]] = {"lean partner model": [], "subvec defaults": []}
    for r in range(args.rounds):
        ref = limit(args.seconds)
        model = lean(args.seconds)
        real = subvec_defaults(args.seconds)
        shares["lean partner model"].append(model / ref)
        shares["subvec defaults"].append(real / ref)
        print(
            f"round {r + 1}: limit {ref:,.0f}, lean partner model {model:,.0f} "
            f"({model / ref:.0%}), subvec {real:,.0f} ({real / ref:.0%})",
            flush=True,
        )
    for name, values in shares.items():
        each = ", ".join(f"{v:.0%}" for v in values)
        print(f"{name}: median {statistics.median(values):.0%} of the limit ({each})")


if __name__ == "__main__":
    main()
