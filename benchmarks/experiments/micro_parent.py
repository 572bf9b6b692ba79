"""Scratch: in-process costs of the pieces of a subvec step on the parent side (no workers).

Each line times one piece the way vector.py does it today next to a cheaper alternative, with
timeit (best of 5), in microseconds per vector step. Single-threaded and short, so it is far
less sensitive to a busy machine than the throughput runs.

    python benchmarks/experiments/micro_parent.py
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import timeit
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from subvec import _protocol as proto
from subvec import _spaces
from subvec.vector import SubprocVectorEnv


def best_us(stmt: Any, number: int = 2000) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e6


def actions(n: int) -> None:
    space = gym.spaces.Discrete(2)
    batch = batch_space(space, n)
    block = np.zeros(n, dtype=np.int64)
    store = _spaces.batch_setter(space, block, n)
    acts = batch.sample()

    def direct() -> None:
        if acts.shape != block.shape:
            raise ValueError
        np.copyto(block, acts, casting="same_kind")

    print(
        f"  store {n} Discrete actions: batch_setter {best_us(lambda: store(acts)):6.2f}"
        f" | shape check + np.copyto {best_us(direct):6.2f}"
    )


def frames(workers: int) -> None:
    r, w = os.pipe()
    header = struct.Struct("<IBI")
    frame = header.pack(0, 3, 7)

    def current() -> None:
        for seq in range(workers):
            proto.write_frame(w, 3, seq)
        for _ in range(workers):
            proto.read_frame(r)

    def prebuilt() -> None:
        for _ in range(workers):
            os.write(w, frame)
        for _ in range(workers):
            os.read(r, 9)

    print(
        f"  {workers} STEP frames out and back (no wake-ups): write_frame/read_frame "
        f"{best_us(current):6.2f} | prebuilt bytes + os.write/os.read {best_us(prebuilt):6.2f}"
    )
    os.close(r)
    os.close(w)


def polls(workers: int) -> None:
    fds = [os.pipe() for _ in range(2 * workers)]
    for _, w in fds:
        os.write(w, b"x")  # readable: poll returns at once, so only the bookkeeping is timed
    readers = [r for r, _ in fds]

    def anew() -> None:
        poller = select.poll()
        by_fd = {}
        for fd in readers:
            by_fd[fd] = fd
            poller.register(fd, select.POLLIN)
        poller.poll(0)

    kept = select.poll()
    for fd in readers:
        kept.register(fd, select.POLLIN)

    print(
        f"  poll over {2 * workers} fds: built per call (today) {best_us(anew):6.2f}"
        f" | built once {best_us(lambda: kept.poll(0)):6.2f}"
    )
    for r, w in fds:
        os.close(r)
        os.close(w)


def copies(n: int, shape: tuple[int, ...], dtype: Any) -> None:
    obs = np.zeros((n, *shape), dtype=dtype)
    rew = np.zeros(n)
    flags = np.zeros(n, dtype=bool)

    def out() -> Any:
        return obs.copy(), rew.copy(), flags.copy(), flags.copy()

    print(
        f"  copy out obs {n}x{shape} {np.dtype(dtype).name} + rewards + flags: "
        f"{best_us(out, 500):8.2f}"
    )


def infos(n: int) -> None:
    """Pong's per-step info: three ints per env, every step."""
    events = [
        (i, {"lives": 0, "episode_frame_number": 1000 + i, "frame_number": 5000 + i})
        for i in range(n // 2)
    ]
    payload = pickle.dumps((events, None), protocol=pickle.HIGHEST_PROTOCOL)
    env = SubprocVectorEnv.__new__(SubprocVectorEnv)  # only for its _add_info
    env.num_envs = n

    def today() -> Any:  # two workers: dumps in each worker, loads + _add_info in the parent
        merged: dict[str, Any] = {}
        for w in range(2):
            proto.dumps((events, None))
            evs, _ = proto.loads(payload)
            for local, info in evs:
                merged = env._add_info(merged, info, w * (n // 2) + local)
        return merged

    def columns() -> Any:  # workers send per-key columns; the parent stacks them once
        cols: dict[str, list[Any]] = {}
        for _ in range(2):
            for _, info in events:
                for key, value in info.items():
                    cols.setdefault(key, []).append(value)
        merged = {}
        for key, values in cols.items():
            merged[key] = np.array(values)
            merged["_" + key] = np.ones(n, dtype=bool)
        return merged

    print(
        f"  infos of {n} envs x 3 int keys: pickle + _add_info {best_us(today, 500):7.2f}"
        f" | per-key columns {best_us(columns, 500):7.2f}"
    )


def main() -> None:
    print("parent-side pieces, us per vector step (best of 5):")
    for n in (8, 16):
        actions(n)
    for workers in (1, 2, 16):
        frames(workers)
    for workers in (2, 16):
        polls(workers)
    copies(16, (4,), np.float32)
    copies(8, (210, 160, 3), np.uint8)
    copies(8, (84, 84, 3), np.uint8)
    infos(8)


if __name__ == "__main__":
    main()
