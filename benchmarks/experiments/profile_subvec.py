"""Scratch: where a SubprocVectorEnv step spends its time, parent side and worker side.

Parent side: the private methods of one SubprocVectorEnv instance are wrapped with timers
(this file only; subvec is not changed), and the poll() inside ``_gather`` is timed separately
so that "waiting for the workers" and "Python around the wait" are told apart.

Worker side: ``EnvSlab.step`` (what a worker runs per command) is timed in-process against a
bare loop over the same envs, so the slab's own cost per env is visible without any IPC.

    python benchmarks/experiments/profile_subvec.py --workload cartpole --num-envs 16
"""

from __future__ import annotations

import argparse
import functools
import json
import select
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench_vector as bv  # the suite's workloads

import subvec
import subvec.vector as vector_module
from subvec import _spaces
from subvec._core import EnvSlab, SlabArrays

TOTALS: dict[str, float] = defaultdict(float)


def timed(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[name] += time.perf_counter() - start

    return wrapper


class _TimedPoll:
    def __init__(self) -> None:
        self._poll = select.poll()

    def register(self, *args: Any) -> None:
        self._poll.register(*args)

    def poll(self, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._poll.poll(*args)
        finally:
            TOTALS["  blocked in poll()"] += time.perf_counter() - start


class _SelectShim:
    """Stands in for the ``select`` module inside subvec.vector only."""

    poll = _TimedPoll
    POLLIN = select.POLLIN
    select = staticmethod(select.select)


def parent_side(workload: str, n: int, seconds: float, iters_per_us: float) -> dict[str, float]:
    spec = bv.workload_spec(workload, iters_per_us)
    envs = subvec.SubprocVectorEnv([bv.make_factory(spec) for _ in range(n)])
    envs.reset(seed=0)
    actions = bv.presample(envs.single_action_space, n, 0)
    for _ in range(200):
        envs.step(actions[0])
    vector_module.select = _SelectShim  # type: ignore[assignment]
    cls = type(envs)
    patched = {
        "step (total)": "step",
        "step_async": "step_async",
        "  _store_actions (validate + write)": None,
        "  _send (frame + os.write) x workers": "_send",
        "step_wait": "step_wait",
        "  _gather (incl. poll)": "_gather",
        "    _read_reply": "_read_reply",
        "  _observations_out (copy)": "_observations_out",
        "  _merge_infos": "_merge_infos",
    }
    for label, attr in patched.items():
        if attr is not None:
            setattr(envs, attr, timed(label, getattr(envs, attr)))
    envs._store_actions = timed("  _store_actions (validate + write)", envs._store_actions)
    del cls
    TOTALS.clear()
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(actions[steps % len(actions)])
        steps += 1
    elapsed = time.perf_counter() - start
    vector_module.select = select  # type: ignore[assignment]
    envs.close()
    out = {k: 1e6 * v / steps for k, v in sorted(TOTALS.items(), key=lambda kv: -kv[1])}
    out["wall per step"] = 1e6 * elapsed / steps
    return out


def worker_side(workload: str, k: int, seconds: float, iters_per_us: float) -> dict[str, float]:
    """us per step of k envs: bare loop vs EnvSlab.step on shared-memory-like arrays."""
    spec = bv.workload_spec(workload, iters_per_us)
    envs = [bv.make_factory(spec)() for _ in range(k)]
    slab_envs = [bv.make_factory(spec)() for _ in range(k)]  # the slab autoresets its own
    for j, env in enumerate(envs + slab_envs):
        env.reset(seed=j)
    obs_space, act_space = envs[0].observation_space, envs[0].action_space
    obs = np.zeros((k, *obs_space.shape), dtype=obs_space.dtype)
    act = np.zeros((k,), dtype=act_space.dtype)
    slab = EnvSlab(slab_envs, 0, subvec.vector.AutoresetMode.NEXT_STEP)
    slab.bind(
        SlabArrays(
            rewards=np.zeros(k),
            terminations=np.zeros(k, dtype=bool),
            truncations=np.zeros(k, dtype=bool),
            write_obs=_spaces.row_writer(obs_space, obs),
            read_action=_spaces.row_reader(act_space, act),
        )
    )
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 2, size=k) for _ in range(64)]

    def bare(batch: Any) -> None:
        for j, env in enumerate(envs):
            o, _, te, tr, _ = env.step(batch[j])
            if te or tr:
                o, _ = env.reset()
            obs[j] = o

    def slabbed(batch: Any) -> None:
        act[:] = batch
        slab.step()

    out = {}
    for name, fn in (("bare loop", bare), ("EnvSlab.step", slabbed), ("bare loop ", bare)):
        r = bv.timed_loop(fn, batches, 0.2, seconds)
        out[name] = 1e6 * r["elapsed_s"] / r["vec_steps"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="cartpole")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--iters-per-us", type=float, default=11.6)
    args = parser.parse_args()
    parent = parent_side(args.workload, args.num_envs, args.seconds, args.iters_per_us)
    print(f"parent side, {args.workload} x {args.num_envs} (us per vector step):")
    for k, v in parent.items():
        print(f"  {k:<40} {v:9.1f}")
    share = -(-args.num_envs // 2)
    worker = worker_side(args.workload, share, args.seconds / 2, args.iters_per_us)
    print(f"worker side, {share} envs in-process (us per command):")
    for k, v in worker.items():
        print(f"  {k:<40} {v:9.1f}")
    print("RESULT " + json.dumps({"parent": parent, "worker": worker}))


if __name__ == "__main__":
    main()
