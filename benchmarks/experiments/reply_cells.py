"""Does the other worker's pipe cost the partner's CPU? The lean partner model with worker 1's
command and reply each over its pipe or over a cell in shared memory (sixth round).

Worker 0 (the partner) keeps its pipes in every variant: it shares the parent's CPU, and its
reply is what wakes the parent. Worker 1 owns the other CPU and busy-waits for its command,
on its pipe (``poll(0)``, as in subvec) or on a command cell; it answers on its pipe, in a reply
cell, or both (the frame, then the cell: the parent reads the cell each step and empties the
pipe every 256 steps in one read). A parent that waits on a cell spins on it. Same rounds as
the limit, as in ``lean_partner.py``:

    python benchmarks/experiments/reply_cells.py --rounds 5

What subvec made of it: ``benchmarks/results/experiments/sixth-round-reply-cells.diff`` (the
"both" variant, with the failure handling a real pool needs; not kept, docs/benchmarks.md,
sixth round).
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
from lean_partner import HALF, SPIN_S, N, _arrays, _worker, limit, timed

CMD, REPLY = 0, 8  # int64 cells, one cache line apart

VARIANTS = {  # worker 1: (command, reply)
    "pipe/pipe": ("pipe", "pipe"),
    "cell/pipe": ("cell", "pipe"),
    "pipe/cell": ("pipe", "cell"),
    "cell/cell": ("cell", "cell"),
    "pipe/both": ("pipe", "both"),
}


def _other(
    buf: mmap.mmap, cells: mmap.mmap, cmd_fd: int, reply_fd: int, how: tuple[str, str]
) -> None:
    a = _arrays(buf)
    act, obs, rew, term, trunc = a["act"], a["obs"], a["rew"], a["term"], a["trunc"]
    envs = [gym.make("CartPole-v1") for _ in range(HALF)]
    for j, env in enumerate(envs):
        obs[HALF + j] = env.reset(seed=HALF + j)[0]
    cell = np.frombuffer(cells, dtype=np.int64, count=16)
    poller = select.poll()
    poller.register(cmd_fd, select.POLLIN)
    clock, seq = time.perf_counter, 0
    while True:
        if how[0] == "cell":
            while cell[CMD] == seq:
                pass
            seq = int(cell[CMD])
            if seq < 0:
                return
        else:
            deadline = clock() + SPIN_S
            while not poller.poll(0) and clock() < deadline:
                pass
            if os.read(cmd_fd, 1) != b"s":
                return
            seq += 1
        for j, env in enumerate(envs):
            i = HALF + j
            o, r, te, tr, _ = env.step(act[i])
            if te or tr:
                o = env.reset()[0]
            obs[i], rew[i], term[i], trunc[i] = o, r, te, tr
        if how[1] != "cell":
            os.write(reply_fd, b"k")
        if how[1] != "pipe":
            cell[REPLY] = seq


def run(seconds: float, how: tuple[str, str]) -> float:
    buf, cells = mmap.mmap(-1, 4096), mmap.mmap(-1, 4096)
    a = _arrays(buf)
    cell = np.frombuffer(cells, dtype=np.int64, count=16)
    (p_cmd_r, p_cmd_w), (p_rep_r, p_rep_w) = os.pipe(), os.pipe()
    (o_cmd_r, o_cmd_w), (o_rep_r, o_rep_w) = os.pipe(), os.pipe()
    ctx = mp.get_context("fork")
    procs = [
        ctx.Process(target=_worker, args=(buf, 0, p_cmd_r, p_rep_w, False)),
        ctx.Process(target=_other, args=(buf, cells, o_cmd_r, o_rep_w, how)),
    ]
    for p in procs:
        p.start()
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 2, N) for _ in range(64)]
    seq = 0

    def step(k: int) -> tuple[Any, ...]:
        nonlocal seq
        np.copyto(a["act"], batches[k % 64])
        seq += 1
        if how[0] == "cell":
            cell[CMD] = seq
        else:
            os.write(o_cmd_w, b"s")
        os.write(p_cmd_w, b"s")
        os.read(p_rep_r, 1)
        if how[1] == "pipe":
            os.read(o_rep_r, 1)
        else:
            while cell[REPLY] != seq:
                pass
            if how[1] == "both" and seq % 256 == 0:
                os.read(o_rep_r, 4096)
        return a["obs"].copy(), a["rew"].copy(), a["term"].copy(), a["trunc"].copy()

    rate = timed(step, seconds)
    os.write(p_cmd_w, b"q")
    if how[0] == "cell":
        cell[CMD] = -1
    else:
        os.write(o_cmd_w, b"q")
    for p in procs:
        p.join()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    shares: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        ref = limit(args.seconds)
        line = [f"round {r + 1}: limit {ref:,.0f}"]
        for name, how in VARIANTS.items():
            shares[name].append(run(args.seconds, how) / ref)
            line.append(f"{name} {shares[name][-1]:.0%}")
        print(", ".join(line), flush=True)
    for name, values in shares.items():
        each = ", ".join(f"{v:.0%}" for v in values)
        print(f"{name}: median {statistics.median(values):.0%} of the limit ({each})")


if __name__ == "__main__":
    main()
