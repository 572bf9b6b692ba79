"""How much of a worker's step is the env's own ``step``? (sixth round)

A wrapper times the inner env's ``step``. Two measurements:

- ``--where situ``: subvec's workers (each env's time inside ``step`` per vector step, summed
  per worker) next to the limit's processes (the same envs in a bare loop, 2 processes), in
  turn, rounds repeated. Shows whether the envs themselves run slower inside subvec.
- ``--where slab``: one worker's share in-process (``taskset -c 0``): ``EnvSlab.step`` bound
  to a shared-memory batch and the info cells, against the time inside ``step``, and the row
  writes alone. Shows what the slab adds around the envs.

    python benchmarks/experiments/env_time.py --where situ --workload pong --num-envs 8
    taskset -c 0 python benchmarks/experiments/env_time.py --where slab --workload pong --num-envs 4
"""

from __future__ import annotations

import argparse
import ast
import time
from multiprocessing import shared_memory
from typing import Any

import gymnasium as gym
import numpy as np
from ab_checkouts import factory, limit_processes, ready_envs, step_for


class Timed(gym.Wrapper):  # type: ignore[type-arg]
    """Adds up the seconds spent inside the wrapped env's ``step``."""

    def __init__(self, env: gym.Env) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        self.spent = 0.0

    def step(self, action: Any) -> Any:
        start = time.perf_counter()
        out = self.env.step(action)
        self.spent += time.perf_counter() - start
        return out

    def take(self) -> float:
        spent, self.spent = self.spent, 0.0
        return spent


class TimedFactory:
    """A picklable env factory (subvec pickles the factories for its workers)."""

    def __init__(self, workload: str) -> None:
        self.workload = workload

    def __call__(self) -> Timed:
        return Timed(factory(self.workload)())


def _limit_part(make: Any, count: int, seconds: float, go: Any, out: Any) -> None:
    envs, actions = ready_envs(make, count)
    go.wait()
    for env in envs:
        env.take()
    k, wall = step_for(envs, actions, seconds)
    out.put((wall / k, sum(env.take() for env in envs) / k))


def situ(workload: str, n: int, seconds: float, rounds: int, kwargs: dict[str, Any]) -> None:
    import subvec

    make = TimedFactory(workload)
    for r in range(rounds):
        parts = limit_processes(make, [n // 2] * 2, seconds, part=_limit_part)
        line = ", ".join(f"{1e6 * w:.0f} us a step ({1e6 * s:.0f} inside step)" for w, s in parts)
        print(f"round {r + 1}: limit processes: {line}")
        venv = subvec.SubprocVectorEnv([make] * n, **kwargs)
        try:
            venv.reset(seed=0)
            actions = [venv.action_space.sample() for _ in range(64)]
            for i in range(200):
                venv.step(actions[i % 64])
            venv.call("take")
            start, k = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                venv.step(actions[k % 64])
                k += 1
            wall = time.perf_counter() - start
            spent = venv.call("take")
            inside = [
                sum(spent[w.lo : w.hi]) / k
                for w in venv._pool.workers  # an experiment reads the layout
            ]
        finally:
            venv.close()
        each = ", ".join(f"worker {w} {1e6 * s:.0f} us" for w, s in enumerate(inside))
        print(f"round {r + 1}: subvec: {1e6 * wall / k:.0f} us a step; inside step: {each}")


def slab(workload: str, n: int, steps: int, rounds: int) -> None:
    from gymnasium.vector.vector_env import AutoresetMode

    from subvec import _spaces
    from subvec._core import EnvSlab, SlabArrays
    from subvec._infos import InfoBlockWriter, info_block_regions

    envs = [TimedFactory(workload)() for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    space = envs[0].observation_space
    shape = (n, *space.shape)
    shm = shared_memory.SharedMemory(create=True, size=int(np.prod(shape)) * space.dtype.itemsize)
    try:
        obs = np.ndarray(shape, space.dtype, shm.buf)
        actions = np.zeros((n, *envs[0].action_space.shape), envs[0].action_space.dtype)
        write_rows = _spaces.row_writer(space, obs)
        written = [0.0]

        def timed_write(value: Any, row: int) -> None:
            start = time.perf_counter()
            write_rows(value, row)
            written[0] += time.perf_counter() - start

        env_slab = EnvSlab(envs, 0, AutoresetMode.NEXT_STEP)
        env_slab.bind(
            SlabArrays(
                np.zeros(n),
                np.zeros(n, bool),
                np.zeros(n, bool),
                timed_write,
                _spaces.row_reader(envs[0].action_space, actions),
            )
        )
        cells = {name: np.zeros(s, d) for name, d, s in info_block_regions(n, 1)}
        info_writer = InfoBlockWriter(cells, 0, 0, n)
        samples = [
            np.stack([envs[0].action_space.sample() for _ in range(n)]) for _ in range(64)
        ]
        for _ in range(rounds):
            for env in envs:
                env.take()
            written[0] = 0.0
            start = time.perf_counter()
            for k in range(steps):
                np.copyto(actions, samples[k % 64])
                info_writer.put(env_slab.step().infos)
            wall = (time.perf_counter() - start) / steps
            inside = sum(env.take() for env in envs) / steps
            print(
                f"EnvSlab.step + info cells: {1e6 * wall:.1f} us a step, inside step "
                f"{1e6 * inside:.1f} us, around it {1e6 * (wall - inside):.1f} us, of which row "
                f"writes {1e6 * written[0] / steps:.1f} us ({n} envs)"
            )
        del obs
    finally:
        shm.close()
        shm.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--where", choices=("situ", "slab"), default="situ")
    parser.add_argument("--workload", default="pong")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kwargs", default="{}")
    args = parser.parse_args()
    if args.where == "situ":
        situ(args.workload, args.num_envs, args.seconds, args.rounds, ast.literal_eval(args.kwargs))
    else:
        slab(args.workload, args.num_envs, args.steps, args.rounds)


if __name__ == "__main__":
    main()
