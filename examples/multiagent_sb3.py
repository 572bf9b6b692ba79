"""Stable-Baselines3 PPO on a PettingZoo env, every agent a row, with subvec instead of SuperSuit.

One policy shared by every agent (parameter sharing), the way SuperSuit's tutorials train
PettingZoo envs with SB3. The swap from SuperSuit is one line::

    env = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 8, num_cpus=2,
                                base_class="stable_baselines3")          # before
    env = concat_vec_envs(env, 8, num_cpus=2, base_class="stable_baselines3")  # after

SuperSuit's per-env wrappers in front (here, for pistonball: colour reduction, resizing,
frame stacking) keep working: the env instance is copied into each of subvec's workers.
``PPO(..., seed=)`` seeds every ParallelEnv with its own seed, and time limits reach PPO as
``TimeLimit.truncated``.

Run:  python examples/multiagent_sb3.py --env simple_spread --total-timesteps 30000
      python examples/multiagent_sb3.py --env pistonball     (pettingzoo[butterfly], supersuit)
Needs stable-baselines3, pettingzoo and mpe2 (``pip install "subvec[sb3,examples]"``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecMonitor

from subvec.concat import concat_vec_envs


@dataclass
class Args:
    env: str = "simple_spread"  # or "pistonball"
    num_vec_envs: int = 4
    num_cpus: int = 2
    total_timesteps: int = 20_000
    n_steps: int = 64
    max_cycles: int = 25
    eval_episodes: int = 6
    seed: int = 0


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in vars(Args()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    return Args(**vars(parser.parse_args()))


def make_par_env(args: Args) -> Any:
    """One ParallelEnv, with SuperSuit's usual image preprocessing for pistonball."""
    if args.env == "simple_spread":
        from mpe2 import simple_spread_v3

        return simple_spread_v3.parallel_env(max_cycles=args.max_cycles, continuous_actions=False)
    if args.env == "pistonball":
        import pettingzoo
        import supersuit as ss

        env = pettingzoo.make(
            "parallel", "butterfly/pistonball-v6", n_pistons=6, max_cycles=args.max_cycles
        )
        env = ss.color_reduction_v0(env, mode="B")
        env = ss.resize_v1(env, x_size=42, y_size=42)
        return ss.frame_stack_v1(env, 3)
    raise SystemExit(f"--env must be simple_spread or pistonball, got {args.env!r}")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # a small network: more threads only fight the env workers

    vec_env = concat_vec_envs(
        make_par_env(args),
        args.num_vec_envs,
        num_cpus=args.num_cpus,
        base_class="stable_baselines3",
    )
    print(vec_env)
    vec_env = VecMonitor(vec_env)
    policy = "CnnPolicy" if args.env == "pistonball" else "MlpPolicy"
    model = PPO(
        policy,
        vec_env,
        n_steps=args.n_steps,
        batch_size=min(256, args.n_steps * vec_env.num_envs),
        n_epochs=4,
        learning_rate=3e-4,
        seed=args.seed,
        device="cpu",
    )
    before, _ = evaluate_policy(model, vec_env, n_eval_episodes=args.eval_episodes)
    start = time.perf_counter()
    model.learn(total_timesteps=args.total_timesteps)
    seconds = time.perf_counter() - start
    after, std = evaluate_policy(model, vec_env, n_eval_episodes=args.eval_episodes)
    rows = vec_env.num_envs
    print(f"trained {model.num_timesteps} agent-steps ({rows} rows) in {seconds:.1f} s")
    print(f"mean return per agent before={before:.2f} after={after:.2f} +/- {std:.2f}")
    vec_env.close()
    assert np.isfinite(after)


if __name__ == "__main__":
    main()
