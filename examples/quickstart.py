"""Quick start: 16 CartPole envs in worker processes, timed next to gymnasium's AsyncVectorEnv."""

from __future__ import annotations

import time

import gymnasium as gym

import subvec


def steps_per_second(envs: gym.vector.VectorEnv, seconds: float = 2.0) -> float:
    envs.reset(seed=0)
    envs.action_space.seed(0)
    actions = [envs.action_space.sample() for _ in range(64)]
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(actions[steps % 64])
        steps += 1
    return steps * envs.num_envs / (time.perf_counter() - start)


def main() -> None:
    fns = [lambda: gym.make("CartPole-v1") for _ in range(16)]

    envs = subvec.SubprocVectorEnv(fns)
    obs, infos = envs.reset(seed=0)
    obs, rew, term, trunc, infos = envs.step(envs.action_space.sample())
    print(envs)
    print("obs", obs.shape, "rewards", rew, "done", term | trunc, "infos", infos)
    ours = steps_per_second(envs)
    envs.close()

    peer = gym.vector.AsyncVectorEnv(fns)
    theirs = steps_per_second(peer)
    peer.close()
    print(f"subvec.SubprocVectorEnv : {ours:10,.0f} env-steps/s")
    print(f"gymnasium AsyncVectorEnv: {theirs:10,.0f} env-steps/s  ({ours / theirs:.1f}x)")


if __name__ == "__main__":
    main()
