"""``gpus="auto"`` on a machine with real NVIDIA GPUs: what each worker is given and what it sees.

Builds ``SubprocVectorEnv`` of HalfCheetah-v5 envs rendering through EGL (``MUJOCO_GL=egl``)
with ``gpus="auto"`` and prints, per worker: the placement report (CPUs, GPU,
``CUDA_VISIBLE_DEVICES``, the EGL device and how it was chosen), and what the env reads inside
the worker: its GPU variables, the OpenGL renderer string of the context MuJoCo rendered with,
the CUDA devices torch sees (when torch is installed) and the time of one 128x128 render.
Exits non-zero when a worker renders on something other than the GPU it was given.

    MUJOCO_GL=egl python benchmarks/experiments/gpu_check.py --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

import subvec
from subvec._process.gpus import discover_gpus


class Probe(gym.Wrapper):  # type: ignore[misc]
    """A rendering env that can say, from inside its worker, what it renders on."""

    def probe(self) -> dict[str, Any]:
        start = time.perf_counter()
        frame = self.env.render()
        render_s = time.perf_counter() - start
        from OpenGL import GL  # the context MuJoCo's renderer made current

        report: dict[str, Any] = {
            "pid": os.getpid(),
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "MUJOCO_EGL_DEVICE_ID": os.environ.get("MUJOCO_EGL_DEVICE_ID"),
            "gl_renderer": GL.glGetString(GL.GL_RENDERER).decode(),
            "gl_vendor": GL.glGetString(GL.GL_VENDOR).decode(),
            "frame": list(frame.shape),
            "frame_mean": float(np.mean(frame)),
            "first_render_s": render_s,
        }
        start = time.perf_counter()
        for _ in range(20):
            self.env.render()
        report["render_ms"] = (time.perf_counter() - start) / 20 * 1e3
        try:
            import torch

            report["torch_devices"] = [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ]
        except ImportError:
            report["torch_devices"] = "torch not installed"
        return report


def make_env() -> gym.Env:
    return Probe(gym.make("HalfCheetah-v5", render_mode="rgb_array", width=128, height=128))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gpus", default="auto", help='"auto", or "none" (a smoke run here)')
    args = parser.parse_args()
    found = discover_gpus()
    print(f"GPUs ({found.source}):")
    for gpu in found.gpus:
        print(f"  {gpu}")
    failed = 0
    with subvec.SubprocVectorEnv(
        [make_env] * args.workers,
        num_workers=args.workers,
        gpus=None if args.gpus == "none" else args.gpus,
        worker_env={"MUJOCO_GL": "egl"},
    ) as envs:
        envs.reset(seed=0)
        for report, seen in zip(envs.placement, envs.call("probe")):
            print(json.dumps({"placement": repr(report), "in_worker": seen}, default=str))
            on_gpu = "NVIDIA" in seen["gl_renderer"] or args.gpus == "none"
            if not on_gpu or seen["frame_mean"] == 0:
                failed += 1
    print("every worker renders on its GPU" if not failed else f"{failed} worker(s) did not")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
