"""What the parent's step costs where it runs: subvec's own step next to the lean model's parent
driving the same subvec workers, with the user and system CPU of every process (fourth round).

In ``lean`` mode the parent does only what the lean model's does (copy the actions in, one
write per worker with the partner last, sleep on the partner's reply, read every reply, copy
the results out): no checks, no fallbacks, none of subvec's Python around the hand-offs. The
difference in wall time and in CPU is what subvec's parent-side step costs *in situ*, on a CPU
it shares with the partner, which is far more than the same code costs in a hot loop (the
caches and branch history each side finds cold after the other). Reading the parent's user
CPU per step in both modes shows how close a change brings subvec to the model. Minor page
faults and context switches per step are printed too (fifth round), and the lean mode reads
whole replies, so envs with infos (Pong) run in it as well.

    python benchmarks/experiments/in_situ.py --num-envs 16 --mode subvec
    python benchmarks/experiments/in_situ.py --num-envs 16 --mode lean
    taskset -c 0 python benchmarks/experiments/in_situ.py --num-envs 8 --mode lean   # one core
"""

from __future__ import annotations

import argparse
import os
import select
import time
from typing import Any

import numpy as np
import psutil
from cpu_split import env_args, ready_env


def main() -> None:
    parser = env_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--mode", choices=("subvec", "lean"), default="subvec")
    args = parser.parse_args()
    from subvec import _protocol as proto

    n = args.num_envs
    envs, actions = ready_env(args.workload, n, args.kwargs)
    try:
        step: Any = envs.step
        if args.mode == "lean":
            step = _lean_step(envs, proto)
        for i in range(300):
            step(actions[i % 64])
        processes = [psutil.Process()] + [psutil.Process(pid) for pid in envs.worker_pids if pid]
        before = [_counters(p) for p in processes]
        start, steps = time.perf_counter(), 0
        while time.perf_counter() - start < args.seconds:
            step(actions[steps % 64])
            steps += 1
        wall = time.perf_counter() - start
        after = [_counters(p) for p in processes]
        print(
            f"{args.workload} x {n}, {args.mode}: {steps * n / wall:,.0f} env-steps/s, "
            f"wall {1e6 * wall / steps:.1f} us/step"
        )
        for name, b, a in zip(
            ["parent"] + [f"worker {w.index}" for w in envs._pool.workers], before, after
        ):
            user, system = 1e6 * (a[0] - b[0]) / steps, 1e6 * (a[1] - b[1]) / steps
            faults, switches = (a[2] - b[2]) / steps, (a[3] - b[3]) / steps
            print(
                f"  {name}: user {user:.1f}, system {system:.1f} us/step, "
                f"{faults:.2f} minor faults and {switches:.2f} context switches per step"
            )
    finally:
        envs.close()


def _counters(process: psutil.Process) -> tuple[float, float, int, int]:
    """User and system CPU seconds, minor page faults, and context switches (both kinds)."""
    times = process.cpu_times()
    with open(f"/proc/{process.pid}/stat") as stat:
        minflt = int(stat.read().rsplit(")", 1)[1].split()[7])
    switches = process.num_ctx_switches()
    return times.user, times.system, minflt, switches.voluntary + switches.involuntary


def _lean_step(envs: Any, proto: Any) -> Any:
    """The lean model's parent over subvec's workers (the plain layout). Replies with infos are
    read whole and dropped: what that leaves out of the parent's step is their decoding and
    merging."""
    pool = envs._pool
    workers = pool.workers
    partner = workers[envs._partner if envs._partner is not None else 0]
    order = [w for w in workers if w is not partner] + [partner]
    poller = select.poll()
    poller.register(partner.reply_fd, select.POLLIN)
    for w in workers:
        poller.register(w.process.sentinel, select.POLLIN)
    act = pool.resources.block.views["act0"]
    obs, rew = envs._observations, envs._rewards
    term, trunc = envs._terminations, envs._truncations
    pack, step_code = proto.HEADER.pack, int(proto.Command.STEP)

    def step(actions: Any) -> Any:
        np.copyto(act, actions)
        for w in order:
            w.seq += 1
            os.write(w.cmd_fd, pack(0, step_code, w.seq))
        poller.poll()
        for w in workers:
            proto.read_frame(w.reply_fd)  # infos, if any, are read and dropped
        return obs.copy(), rew.copy(), term.copy(), trunc.copy(), {}

    return step


if __name__ == "__main__":
    main()
