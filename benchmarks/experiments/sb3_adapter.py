"""The Stable-Baselines3 face against SB3's own vector envs and subvec's gymnasium face, on
CartPole, Pong or HalfCheetah. SB3 steps with ``step_async``/``step_wait`` and wants SAME_STEP
semantics (``terminal_observation``) with a list of info dicts, which takes subvec off its
per-step short path; this measures what that costs.

    python benchmarks/experiments/sb3_adapter.py --num-envs 16 --rounds 3
    python benchmarks/experiments/sb3_adapter.py --workload pong --num-envs 8

Each round runs every implementation for ``--seconds`` in this interpreter, in turn, with
pre-sampled actions; medians over the rounds.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from typing import Any

import numpy as np
from ab_checkouts import factory, monitored, timed_rate


def rate(make: Any, n: int, seconds: float) -> float:
    venv = make()
    try:
        venv.reset()
        space = venv.action_space
        space.seed(0)
        # SB3's VecEnv has the single space, gymnasium's vector env the batched one
        single = getattr(venv, "single_action_space", None)
        if single is not None:
            actions = [space.sample() for _ in range(64)]
        else:
            actions = [np.stack([space.sample() for _ in range(n)]) for _ in range(64)]
        return timed_rate(venv.step, actions, n, seconds)
    finally:
        venv.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="cartpole")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument(
        "--monitor",
        action="store_true",
        help="wrap every env in SB3's Monitor, as make_vec_env does",
    )
    args = parser.parse_args()
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    import subvec
    import subvec.sb3

    n, fn = args.num_envs, factory(args.workload)
    if args.monitor:
        fn = functools.partial(monitored, fn)
    impls = {
        "subvec.SubprocVectorEnv (gymnasium)": lambda: subvec.SubprocVectorEnv([fn] * n),
        "subvec.sb3.SubprocVecEnv": lambda: subvec.sb3.SubprocVecEnv([fn] * n),
        "SB3 DummyVecEnv": lambda: DummyVecEnv([fn] * n),
        "SB3 SubprocVecEnv": lambda: SubprocVecEnv([fn] * n),
    }
    rates: dict[str, list[float]] = {name: [] for name in impls}
    for r in range(args.rounds):
        for name, make in impls.items():
            rates[name].append(rate(make, n, args.seconds))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()))
    dummy = statistics.median(rates["SB3 DummyVecEnv"])
    for name, values in rates.items():
        med = statistics.median(values)
        print(f"{name}: {med:,.0f} env-steps/s, {med / dummy:.2f}x DummyVecEnv")


if __name__ == "__main__":
    main()
