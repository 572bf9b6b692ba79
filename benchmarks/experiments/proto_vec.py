"""Scratch prototype: the smallest process-based vector env, with the hot-path choices as knobs.

Not subvec: a stripped model of its hot path (shared-memory actions/observations, one command
and one reply per worker per step, no pickles) used to measure what each design choice costs
before the core changes. Knobs:

- ``--signal``: how the parent wakes a worker and a worker answers
  ``pipe``      one byte on os.pipe, parent reads each reply pipe in turn (blocking)
  ``pipe_poll`` the same, but the parent waits in a poll() over all reply pipes and sentinels,
                built once (``pipe_pollnew``: built anew every step, as subvec does today)
  ``eventfd``   os.eventfd per direction (no WF_SYNC wake-up hint, unlike pipes)
  ``sem``       multiprocessing.Semaphore per direction (futex)
  ``spin``      counters in shared memory, spun on for ``--spin-us``, then eventfd
- ``--num-workers`` and ``--parent-envs``: the parent may step a share of the envs itself
  between sending the commands and collecting the replies;
- ``--pin``: ``none``, ``core`` (worker w on CPU w) or ``all`` (also the parent on the last CPU).

    python benchmarks/experiments/proto_vec.py --workload cartpole --num-envs 16 --signal pipe
    python benchmarks/experiments/proto_vec.py --grid signals   # a preset comparison
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import mmap
import multiprocessing
import os
import select
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench_vector as bv  # the workloads and the timing loop of the suite
from _runner import run_clean


@dataclass
class Args:
    workload: str = "cartpole"
    num_envs: int = 16
    num_workers: int = 2
    parent_envs: int = 0
    signal: str = "pipe"
    spin_us: float = 50.0
    pin: str = "none"
    duration: float = 1.5
    warmup: float = 0.3
    grid: str = ""
    repeats: int = 3


class Channel:
    """Parent <-> one worker: ``send``/``wait`` on the parent side, ``recv``/``reply`` in the
    worker. Created before the fork; each side uses its own ends."""

    def __init__(self, kind: str, index: int, ctrl: np.ndarray, spin_us: float) -> None:
        self.kind = kind
        self.index = index
        self.ctrl = ctrl  # int64 [cmd_seq, done_seq] per worker, in shared memory
        self.spin_s = spin_us * 1e-6
        self.seq = 0
        if kind.startswith("pipe"):
            self.cmd_r, self.cmd_w = os.pipe()
            self.rep_r, self.rep_w = os.pipe()
        elif kind in ("eventfd", "spin"):
            self.cmd_fd = os.eventfd(0)
            self.rep_fd = os.eventfd(0)
        elif kind == "sem":
            self.cmd_sem = multiprocessing.get_context("fork").Semaphore(0)
            self.rep_sem = multiprocessing.get_context("fork").Semaphore(0)
        else:
            raise SystemExit(f"unknown signal {kind}")

    # parent side
    def send(self) -> None:
        self.seq += 1
        if self.kind.startswith("pipe"):
            os.write(self.cmd_w, b"\x01")
        elif self.kind == "eventfd":
            os.eventfd_write(self.cmd_fd, 1)
        elif self.kind == "sem":
            self.cmd_sem.release()
        else:
            self.ctrl[self.index, 0] = self.seq
            os.eventfd_write(self.cmd_fd, 1)  # always: a worker past its spin is blocked

    def wait(self) -> None:
        if self.kind.startswith("pipe"):
            os.read(self.rep_r, 1)
        elif self.kind == "eventfd":
            os.eventfd_read(self.rep_fd)
        elif self.kind == "sem":
            self.rep_sem.acquire()
        else:
            self._spin_wait(1, self.seq, self.rep_fd)

    # worker side
    def recv(self) -> None:
        if self.kind.startswith("pipe"):
            if not os.read(self.cmd_r, 1):
                raise EOFError
        elif self.kind == "eventfd":
            os.eventfd_read(self.cmd_fd)
        elif self.kind == "sem":
            self.cmd_sem.acquire()
        else:
            self.seq += 1
            self._spin_wait(0, self.seq, self.cmd_fd)

    def reply(self) -> None:
        if self.kind.startswith("pipe"):
            os.write(self.rep_w, b"\x01")
        elif self.kind == "eventfd":
            os.eventfd_write(self.rep_fd, 1)
        elif self.kind == "sem":
            self.rep_sem.release()
        else:
            self.ctrl[self.index, 1] = self.seq
            os.eventfd_write(self.rep_fd, 1)

    def _spin_wait(self, slot: int, want: int, fd: int) -> None:
        ctrl = self.ctrl
        end = time.perf_counter() + self.spin_s
        while ctrl[self.index, slot] < want:
            if time.perf_counter() > end:
                # eventfd tokens may be stale (left by commands seen while spinning): read,
                # re-check, read again. The sender bumps the counter before it writes the fd.
                os.eventfd_read(fd)
        return


def _worker(
    args: Args,
    spec: dict[str, Any],
    w: int,
    lo: int,
    hi: int,
    chan: Channel,
    shm: dict[str, np.ndarray],
) -> None:
    if args.pin in ("core", "all"):
        os.sched_setaffinity(0, {w % (os.cpu_count() or 1)})
    envs = [bv.make_factory(spec)() for _ in range(lo, hi)]
    for j, env in enumerate(envs):
        obs, _ = env.reset(seed=lo + j)
        shm["obs"][lo + j] = obs
    act, obs_arr, rew, term, trunc = shm["act"], shm["obs"], shm["rew"], shm["term"], shm["trunc"]
    chan.reply()  # ready
    try:
        while True:
            chan.recv()
            if shm["stop"][0]:
                break
            for j, env in enumerate(envs):
                i = lo + j
                obs, r, te, tr, _ = env.step(int(act[i]))
                if te or tr:
                    obs, _ = env.reset()
                obs_arr[i] = obs
                rew[i] = r
                term[i] = te
                trunc[i] = tr
            chan.reply()
    except EOFError:
        pass


class ProtoVec:
    def __init__(self, args: Args, spec: dict[str, Any]) -> None:
        n, nw, own = args.num_envs, args.num_workers, args.parent_envs
        probe = bv.make_factory(spec)()
        space = probe.observation_space
        # enough of the VectorEnv face for the suite's timing loop (bench_vector --impls proto_*)
        self.single_action_space = probe.action_space
        self.num_workers = nw
        probe.close()
        size = 1 << 26
        self.buf = mmap.mmap(-1, size)  # MAP_SHARED|MAP_ANONYMOUS: inherited over fork
        offset = 0

        def arr(dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
            nonlocal offset
            a = np.frombuffer(self.buf, dtype=dtype, count=int(np.prod(shape)), offset=offset)
            offset += (a.nbytes + 63) // 64 * 64
            return a.reshape(shape)

        self.shm = {
            "act": arr(np.int64, (n,)),
            "obs": arr(space.dtype, (n, *space.shape)),
            "rew": arr(np.float64, (n,)),
            "term": arr(np.bool_, (n,)),
            "trunc": arr(np.bool_, (n,)),
            "stop": arr(np.int64, (1,)),
            "ctrl": arr(np.int64, (max(1, nw), 2)),
        }
        remote = n - own
        bounds = [(own + remote * w // nw, own + remote * (w + 1) // nw) for w in range(nw)]
        self.own = [bv.make_factory(spec)() for _ in range(own)]
        for j, env in enumerate(self.own):
            env.reset(seed=j)
        self.chans = [Channel(args.signal, w, self.shm["ctrl"], args.spin_us) for w in range(nw)]
        ctx = multiprocessing.get_context("fork")
        self.procs = [
            ctx.Process(target=_worker, args=(args, spec, w, lo, hi, ch, self.shm), daemon=True)
            for w, ((lo, hi), ch) in enumerate(zip(bounds, self.chans))
        ]
        for p in self.procs:
            p.start()
        if args.pin == "all":  # the parent on the last CPU, workers from the first
            os.sched_setaffinity(0, {(os.cpu_count() or 1) - 1})
        for ch in self.chans:
            ch.wait() if args.signal != "spin" else os.eventfd_read(ch.rep_fd)
            ch.seq = 0
            self.shm["ctrl"][ch.index, 1] = 0
        self.signal = args.signal
        self.timing = [0.0, 0.0]
        if args.signal == "pipe_poll":
            self.poller = select.poll()
            for ch, p in zip(self.chans, self.procs):
                self.poller.register(ch.rep_r, select.POLLIN)
                self.poller.register(p.sentinel, select.POLLIN)
        self.by_fd = {ch.rep_r: ch for ch in self.chans} if args.signal.startswith("pipe") else {}

    def _wait_all(self) -> None:
        if self.signal == "pipe_poll" or self.signal == "pipe_pollnew":
            poller = self.poller if self.signal == "pipe_poll" else select.poll()
            if self.signal == "pipe_pollnew":
                for ch, p in zip(self.chans, self.procs):
                    poller.register(ch.rep_r, select.POLLIN)
                    poller.register(p.sentinel, select.POLLIN)
            pending = len(self.chans)
            while pending:
                for fd, _ in poller.poll():
                    ch = self.by_fd.get(fd)
                    if ch is None:
                        raise RuntimeError("worker died")
                    ch.wait()
                    pending -= 1
        else:
            for ch in self.chans:
                ch.wait()

    def step(self, actions: np.ndarray) -> Any:
        shm = self.shm
        shm["act"][:] = actions
        for ch in self.chans:
            ch.send()
        act, obs_arr, rew, term, trunc = (
            shm["act"],
            shm["obs"],
            shm["rew"],
            shm["term"],
            shm["trunc"],
        )
        t_send = time.perf_counter()
        for i, env in enumerate(self.own):
            obs, r, te, tr, _ = env.step(int(act[i]))
            if te or tr:
                obs, _ = env.reset()
            obs_arr[i] = obs
            rew[i] = r
            term[i] = te
            trunc[i] = tr
        t_own = time.perf_counter()
        self._wait_all()
        t_done = time.perf_counter()
        self.timing[0] += t_own - t_send  # the parent's own envs
        self.timing[1] += t_done - t_own  # waiting for the workers after that
        return obs_arr.copy(), rew.copy(), term.copy(), trunc.copy(), {}

    def reset(self, seed: int | None = None) -> None:
        """The workers reset their envs when they start; nothing to do."""

    def close(self) -> None:
        self.shm["stop"][0] = 1
        for ch in self.chans:
            ch.send()
        for p in self.procs:
            p.join(2)
            if p.is_alive():
                p.kill()


def measure(args: Args) -> dict[str, Any]:
    spec = bv.workload_spec(args.workload, float(os.environ.get("BUSY_ITERS_PER_US", "11.5")))
    vec = ProtoVec(args, spec)
    try:
        rng = np.random.default_rng(0)
        actions = [rng.integers(0, 2, size=args.num_envs) for _ in range(64)]
        res = bv.timed_loop(vec.step, actions, args.warmup, args.duration, watch=True)
    finally:
        vec.close()
    res["steps_per_s"] = res["vec_steps"] * args.num_envs / res["elapsed_s"]
    calls = res["vec_steps"]  # the warm-up steps count too: only the ratio is meaningful
    own, wait = vec.timing
    res["own_share"] = own / (own + wait) if own + wait else 0.0
    res["own_us"] = 1e6 * own / max(1, calls)
    return res


GRIDS = {
    # (signal, num_workers, parent_envs (-1: an equal share), pin, spin_us)
    "signals": [
        (s, 2, 0, "none", 50.0)
        for s in ("pipe", "pipe_poll", "pipe_pollnew", "eventfd", "sem", "spin")
    ],
    "layout": [
        ("pipe", 2, 0, "none", 0.0),
        ("pipe", 2, 0, "core", 0.0),
        ("pipe", 1, 0, "none", 0.0),
        ("pipe", 1, -1, "none", 0.0),
        ("eventfd", 2, 0, "none", 0.0),
        ("eventfd", 1, -1, "none", 0.0),
        ("spin", 2, 0, "none", 50.0),
        ("spin", 1, -1, "none", 50.0),
        ("spin", 1, -1, "core", 50.0),
    ],
    "focus": [
        ("pipe", 2, 0, "none", 0.0),
        ("pipe", 2, 0, "core", 0.0),
        ("pipe", 1, -1, "none", 0.0),
        ("spin", 1, -1, "none", 50.0),
        ("spin", 1, -1, "none", 200.0),
    ],
    "onecore": [  # run the whole script under taskset -c 0
        ("pipe", 1, 0, "none", 0.0),
        ("pipe", 1, -1, "none", 0.0),
        ("spin", 1, -1, "none", 50.0),
    ],
    "spin": [("spin", 1, -1, "none", us) for us in (5.0, 20.0, 50.0, 200.0, 1000.0)]
    + [("spin", 2, 0, "none", us) for us in (5.0, 20.0, 200.0)],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    for f in dataclasses.fields(Args):
        parser.add_argument(
            "--" + f.name.replace("_", "-"), type=type(f.default), default=f.default
        )
    args = Args(**vars(parser.parse_args()))
    if not args.grid:
        r = measure(args)
        print(
            f"{args.workload} n={args.num_envs} {args.signal} W={args.num_workers} "
            f"parent={args.parent_envs} pin={args.pin} spin={args.spin_us:g}: "
            f"{r['steps_per_s']:,.0f} steps/s p50 {r['p50_us']:.0f} us p99 {r['p99_us']:.0f} us "
            f"other-cpu {r['foreign_cpu']:.2f} parent-own-envs {r['own_share']:.0%} of "
            "(own + wait)"
        )
        print("RESULT " + json.dumps(r))
        return
    results: dict[tuple[Any, ...], list[float]] = {}
    grid = GRIDS[args.grid]
    for rep, cfg in itertools.product(range(args.repeats), range(len(grid))):
        signal, nw, own, pin, spin_us = grid[(cfg + rep) % len(grid)]
        if own < 0:  # the parent takes an equal share: n / (workers + 1)
            own = args.num_envs // (nw + 1)
        run = dataclasses.replace(
            args, signal=signal, num_workers=nw, parent_envs=own, pin=pin, spin_us=spin_us
        )
        # a fresh interpreter per run, like the suite, when the machine is quiet
        cmd = [sys.executable, __file__] + [
            f"--{f.name.replace('_', '-')}={getattr(run, f.name)}"
            for f in dataclasses.fields(Args)
            if f.name not in ("grid",)
        ]
        r = run_clean(cmd)
        print(
            f"{signal} W={nw} parent={own} pin={pin} spin={spin_us:g}: "
            f"{r['steps_per_s']:,.0f} steps/s p50 {r['p50_us']:.0f} us "
            f"other-cpu {r['foreign_cpu']:.2f} attempts {r['attempts']}",
            flush=True,
        )
        results.setdefault((signal, nw, own, pin, spin_us), []).append(r["steps_per_s"])
    print("\nmedians:")
    for key, rates in results.items():
        signal, nw, own, pin, spin_us = key
        label = f"{signal:<12} workers={nw} parent_envs={own:<2} pin={pin:<4} spin_us={spin_us:g}"
        print(f"  {label}: {statistics.median(rates):>10,.0f} steps/s  {rates}")


if __name__ == "__main__":
    main()
