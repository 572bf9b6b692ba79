"""What a blocking hand-off between two processes costs, on one CPU and across two.

Two processes ping-pong one byte over two pipes (each blocks in ``read`` until the other
writes), pinned to the same CPU or to two different ones. With ``--work N`` the child steps N
CartPole envs inside each turn, and reports how long that work takes inside the ping-pong
next to the same work done alone: does switching slow the work itself down?

    python benchmarks/experiments/handoff.py            # both placements, no work
    python benchmarks/experiments/handoff.py --work 8   # 8 CartPole steps per turn

On the project's 2-vCPU VM a cross-CPU round trip costs 51-57 us and a same-CPU one 6-8.5 us,
and the work inside the turn is not slower (docs/benchmarks.md, Method; docs/decisions/0004).
"""

from __future__ import annotations

import argparse
import os
import time


def make_work(count: int):  # type: ignore[no-untyped-def]
    if not count:
        return lambda: None
    import gymnasium as gym

    envs = [gym.make("CartPole-v1") for _ in range(count)]
    for i, env in enumerate(envs):
        env.reset(seed=i)

    def work() -> None:
        for env in envs:
            _, _, terminated, truncated, _ = env.step(0)
            if terminated or truncated:
                env.reset()

    return work


def measure(parent_cpu: int, child_cpu: int, work_count: int, rounds: int) -> None:
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    work = make_work(work_count)
    os.sched_setaffinity(0, {child_cpu})
    start = time.perf_counter()
    for _ in range(rounds):
        work()
    alone = (time.perf_counter() - start) / rounds * 1e6
    pid = os.fork()
    if pid == 0:  # the child: wait for a byte, work, answer
        os.sched_setaffinity(0, {child_cpu})
        inside = 0.0
        for i in range(rounds + 100):
            os.read(to_child_r, 1)
            t0 = time.perf_counter()
            work()
            if i >= 100:
                inside += time.perf_counter() - t0
            os.write(to_parent_w, b"r")
        os.write(to_parent_w, f"{inside / rounds * 1e6:9.1f}".encode())
        os._exit(0)
    os.sched_setaffinity(0, {parent_cpu})
    for _ in range(100):  # warm-up
        os.write(to_child_w, b"c")
        os.read(to_parent_r, 1)
    start = time.perf_counter()
    for _ in range(rounds):
        os.write(to_child_w, b"c")
        os.read(to_parent_r, 1)
    trip = (time.perf_counter() - start) / rounds * 1e6
    inside_us = float(os.read(to_parent_r, 64))
    os.waitpid(pid, 0)
    where = "one CPU " if parent_cpu == child_cpu else "two CPUs"
    line = f"{where} (parent {parent_cpu}, child {child_cpu}): round trip {trip:7.1f} us"
    if work_count:
        line += (
            f"; {work_count} CartPole steps per turn: {inside_us:.1f} us inside the ping-pong, "
            f"{alone:.1f} us alone"
        )
    print(line, flush=True)
    for fd in (to_child_r, to_child_w, to_parent_r, to_parent_w):
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=int, default=0, help="CartPole steps per turn")
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    pairs = [(cpus[0], cpus[0])] + ([(cpus[0], cpus[1])] if len(cpus) > 1 else [])
    for _ in range(args.repeats):
        for parent_cpu, child_cpu in pairs:
            measure(parent_cpu, child_cpu, args.work, args.rounds)


if __name__ == "__main__":
    main()
