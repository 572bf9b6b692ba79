"""Pipelined stages: the policy infers on one group of envs while the other runs its chunk.

A VLA policy on an accelerator and a simulator on the CPUs wait for each other in a lock-step
loop: ``step_chunk(policy(obs))`` runs the forward pass, then the chunk, one after the other.
Split the envs into two groups of whole workers (``envs.env_groups(2)``) and the loop becomes
verl's and RLinf's pipelined stages: ``recv(env_ids=group)`` returns one group's chunk results,
the policy infers on that group while the other group's workers simulate, and
``send_chunk(actions, group)`` starts the group's next chunk. With the forward pass as long as
the chunk, the limit is 2x the lock-step loop.

The env is a stand-in for a robot simulator: a point reaching a target, seen by a 32x32
camera, whose physics burns ``--sim-ms`` of CPU per step. The policy is a stand-in for a model
on a GPU: it releases the CPU for ``--policy-ms`` per forward pass of every env (in proportion
to the rows it is given), then maps each image to K actions with a fixed random linear map.
Both loops run the same chunks per env, from the same seeds, and must collect the same
rewards.

Run:  python examples/pipelined_chunks.py [--num-envs 8 --chunk 8 --chunks 20]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import subvec


@dataclass
class Args:
    num_envs: int = 8
    chunk: int = 8  # K: actions per forward pass
    chunks: int = 20  # forward passes per env
    sim_ms: float = 0.25  # CPU per simulator step
    policy_ms: float = 0.0  # per forward pass of every env; 0: as long as a lock-step chunk
    seed: int = 0


class SlowReach(gym.Env[np.ndarray, np.ndarray]):
    """A point moving to a target in the unit square, seen by a camera; each step burns
    ``sim_s`` of CPU (the physics of a real simulator). Reward: minus the distance; the
    episode ends within 0.05 of the target, or is truncated after 50 steps."""

    observation_space = spaces.Box(0, 255, (32, 32, 3), np.uint8)
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, sim_s: float) -> None:
        self.sim_s = sim_s
        grid = np.linspace(0.0, 1.0, 32, dtype=np.float32)
        self.yy, self.xx = np.meshgrid(grid, grid, indexing="ij")
        self.pos = np.zeros(2, np.float32)
        self.target = np.zeros(2, np.float32)
        self.t = 0

    def _render(self) -> np.ndarray:
        frame = np.zeros((32, 32, 3), np.uint8)
        for channel, (x, y) in ((0, self.pos), (1, self.target)):
            frame[..., channel][(self.xx - x) ** 2 + (self.yy - y) ** 2 < 0.01] = 255
        return frame

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.random(2).astype(np.float32)
        self.target = self.np_random.random(2).astype(np.float32)
        self.t = 0
        return self._render(), {}

    def step(self, action: np.ndarray):
        end = time.thread_time() + self.sim_s
        while time.thread_time() < end:  # the physics: CPU time, slower on a shared CPU
            pass
        self.t += 1
        self.pos = np.clip(self.pos + 0.05 * np.asarray(action, np.float32), 0.0, 1.0)
        distance = float(np.linalg.norm(self.pos - self.target))
        return self._render(), -distance, distance < 0.05, self.t >= 50, {}


class GpuPolicy:
    """A stand-in for a VLA model on a GPU: ``latency_s`` per forward pass of ``num_envs``
    rows, the CPU free meanwhile; image -> K 2-d actions by a fixed random linear map."""

    def __init__(self, num_envs: int, chunk: int, latency_s: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.num_envs, self.chunk, self.latency_s = num_envs, chunk, latency_s
        self.weights = rng.normal(0.0, 0.05, (8 * 8 * 3, chunk * 2)).astype(np.float32)

    def __call__(self, images: np.ndarray) -> np.ndarray:
        time.sleep(self.latency_s * len(images) / self.num_envs)
        n = len(images)
        small = images.reshape(n, 8, 4, 8, 4, 3).mean(axis=(2, 4)).reshape(n, -1)
        out = np.tanh(small / 255.0 @ self.weights)
        return out.reshape(n, self.chunk, 2).astype(np.float32)


def make_envs(args: Args) -> subvec.SubprocVectorEnv:
    # Two groups of whole workers, each with as many workers as there are CPUs: while one
    # group waits for the policy, the other's workers have every CPU.
    workers = max(2, min(args.num_envs, 2 * (os.cpu_count() or 1)) // 2 * 2)
    return subvec.SubprocVectorEnv(
        [lambda: SlowReach(args.sim_ms / 1e3) for _ in range(args.num_envs)],
        num_workers=workers,
        autoreset_mode="SameStep",
    )


def lock_step(args: Args, policy: GpuPolicy) -> tuple[float, float]:
    """Forward pass, then the chunk, ``args.chunks`` times; (seconds, total reward)."""
    with make_envs(args) as envs:
        obs, _ = envs.reset(seed=args.seed)
        total, start = 0.0, time.perf_counter()
        for _ in range(args.chunks):
            obs, rewards, _, _, _ = envs.step_chunk(policy(obs))
            total += float(rewards.sum())
        return time.perf_counter() - start, total


def pipelined(args: Args, policy: GpuPolicy) -> tuple[float, float]:
    """Two stages: one group infers while the other simulates; (seconds, total reward)."""
    with make_envs(args) as envs:
        stages = envs.env_groups(2)
        obs, _ = envs.reset(seed=args.seed)
        total, start = 0.0, time.perf_counter()
        for group in stages:
            envs.send_chunk(policy(obs[group]), group)
        for n in range(args.chunks):
            for group in stages:
                obs_g, rewards, _, _, _ = envs.recv(env_ids=group)
                total += float(rewards.sum())
                if n + 1 < args.chunks:
                    envs.send_chunk(policy(obs_g), group)
        return time.perf_counter() - start, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in vars(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = Args(**vars(parser.parse_args()))
    if not args.policy_ms:
        # as long as a lock-step chunk: K steps of every env spread over the workers' CPUs
        cpus = min(os.cpu_count() or 1, args.num_envs)
        args.policy_ms = args.sim_ms * args.chunk * args.num_envs / cpus
    policy = GpuPolicy(args.num_envs, args.chunk, args.policy_ms / 1e3, args.seed)
    steps = args.num_envs * args.chunk * args.chunks
    print(
        f"{args.num_envs} envs, chunks of {args.chunk}, {args.chunks} chunks each: {steps} env "
        f"steps; simulator {args.sim_ms:g} ms a step, policy {args.policy_ms:.1f} ms a pass"
    )
    lock_s, lock_reward = lock_step(args, policy)
    pipe_s, pipe_reward = pipelined(args, policy)
    assert np.isclose(lock_reward, pipe_reward), (lock_reward, pipe_reward)
    print(f"lock-step step_chunk : {lock_s:6.3f} s  {steps / lock_s:8.0f} env-steps/s")
    print(f"two pipelined stages : {pipe_s:6.3f} s  {steps / pipe_s:8.0f} env-steps/s")
    print(
        f"same rewards from the same seeds ({pipe_reward:.3f}); "
        f"pipelined {lock_s / pipe_s:.2f}x lock-step (2x at most)"
    )


if __name__ == "__main__":
    main()
