"""Action chunks: a chunked policy's K actions run inside the workers with ``step_chunk``.

Vision-language-action and diffusion policies emit K actions per forward pass and execute them
all before looking again. Run as K ``step()`` calls, every sub-step is a round trip to every
worker, and each carries the camera images the policy will not look at until the chunk ends.
``envs.step_chunk(actions)`` sends the K actions of each env in one command per worker: the
workers run the sub-steps and answer once, with the last observation of each env.

The env is a stand-in for a robot simulator: a point reaching a target, seen by a camera
(a 64x64 RGB image rendered with numpy each step). The policy is a stand-in too: a fixed
random linear map from the image to K 2-d actions (no training here). The script runs the
same number of env steps both ways, checks that they give the same rewards from the same
seeds, and prints the wall time of each.

Run:  python examples/action_chunks.py [--num-envs 8 --chunk 8 --chunks 40]
"""

from __future__ import annotations

import argparse
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
    chunks: int = 40  # forward passes per run
    image: int = 64  # camera resolution
    seed: int = 0


class CameraReach(gym.Env[np.ndarray, np.ndarray]):
    """Move a point to a target in the unit square; the observation is a camera image.

    Action: a 2-d velocity in [-1, 1]. Reward: minus the distance to the target. The episode
    ends (terminated) within 0.05 of the target, or is truncated after 60 steps.
    """

    def __init__(self, image: int = 64) -> None:
        self.size = image
        self.observation_space = spaces.Box(0, 255, (image, image, 3), np.uint8)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        grid = np.linspace(0.0, 1.0, image, dtype=np.float32)
        self.yy, self.xx = np.meshgrid(grid, grid, indexing="ij")
        self.pos = np.zeros(2, np.float32)
        self.target = np.zeros(2, np.float32)
        self.t = 0

    def _render(self) -> np.ndarray:
        frame = np.zeros((self.size, self.size, 3), np.uint8)
        for channel, (x, y) in ((0, self.pos), (1, self.target)):
            blob = (self.xx - x) ** 2 + (self.yy - y) ** 2 < 0.004
            frame[..., channel][blob] = 255
        frame[..., 2] = (self.xx * 64).astype(np.uint8)  # a textured background
        return frame

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.random(2).astype(np.float32)
        self.target = self.np_random.random(2).astype(np.float32)
        self.t = 0
        return self._render(), {}

    def step(self, action: np.ndarray):
        self.t += 1
        self.pos = np.clip(self.pos + 0.05 * np.asarray(action, np.float32), 0.0, 1.0)
        distance = float(np.linalg.norm(self.pos - self.target))
        return self._render(), -distance, distance < 0.05, self.t >= 60, {}


class ChunkedPolicy:
    """A stand-in for a VLA head: image -> K actions, one forward pass per chunk."""

    def __init__(self, image: int, chunk: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        features = 16 * 16 * 3
        self.chunk = chunk
        self.pool = image // 16
        self.weights = rng.normal(0.0, 0.05, (features, chunk * 2)).astype(np.float32)

    def __call__(self, images: np.ndarray) -> np.ndarray:
        n = len(images)
        small = images.reshape(n, 16, self.pool, 16, self.pool, 3).mean(axis=(2, 4))
        out = np.tanh(small.reshape(n, -1) / 255.0 @ self.weights)
        return out.reshape(n, self.chunk, 2).astype(np.float32)


def make_envs(args: Args) -> subvec.SubprocVectorEnv:
    return subvec.SubprocVectorEnv(
        [lambda: CameraReach(args.image) for _ in range(args.num_envs)],
        autoreset_mode="SameStep",
    )


def run(args: Args, chunked: bool) -> tuple[float, float]:
    """``args.chunks`` forward passes of the policy; returns (seconds, total reward)."""
    policy = ChunkedPolicy(args.image, args.chunk, args.seed)
    total = 0.0
    with make_envs(args) as envs:
        obs, _ = envs.reset(seed=args.seed)
        start = time.perf_counter()
        for _ in range(args.chunks):
            actions = policy(obs)  # (num_envs, K, 2)
            if chunked:
                obs, rewards, _, _, _ = envs.step_chunk(actions)
                total += float(rewards.sum())
            else:
                for k in range(args.chunk):  # K round trips, K batches of images
                    obs, rewards, _, _, _ = envs.step(actions[:, k])
                    total += float(rewards.sum())
        seconds = time.perf_counter() - start
    return seconds, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in vars(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = Args(**vars(parser.parse_args()))
    steps = args.num_envs * args.chunk * args.chunks
    print(f"{args.num_envs} envs, chunks of {args.chunk}, {args.chunks} chunks: {steps} env steps")
    loop_s, loop_reward = run(args, chunked=False)
    chunk_s, chunk_reward = run(args, chunked=True)
    assert np.isclose(loop_reward, chunk_reward), (loop_reward, chunk_reward)
    print(f"K step() calls  : {loop_s:6.3f} s  {steps / loop_s:9.0f} env-steps/s")
    print(f"one step_chunk  : {chunk_s:6.3f} s  {steps / chunk_s:9.0f} env-steps/s")
    speedup = loop_s / chunk_s
    print(f"same rewards from the same seeds ({chunk_reward:.3f}); step_chunk {speedup:.2f}x")


if __name__ == "__main__":
    main()
