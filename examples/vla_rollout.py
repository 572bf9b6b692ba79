"""A VLA-shaped rollout loop on a simulator that renders, with no hand-written env manager.

Robot-learning RL stacks write their own env manager around a simulator in subprocesses: a
fixed horizon where ended envs freeze, GRPO groups (n envs per initial state), a task swap
inside the live workers, the workers ended between rollouts so the trainer gets the GPU. Here
subvec does each of those with one call:

    freeze=True                 an ended env is not stepped again until reset (fixed horizon)
    reset(options=[...])        per-env reset options: the init state of each env's group
    step_chunk(actions)         the policy's K actions per env run inside the workers
    reconfigure(env_fns)        a new task built inside the live workers, spaces checked
    suspend() / resume()        workers ended between rollouts, started again after
    timeout={"reset": ..., "step": ...}   a bound per command (a reset renders and settles)

The simulator: gymnasium's MuJoCo HalfCheetah-v5 rendering 128x128 RGB frames through EGL
(Mesa's llvmpipe where there is no GPU: ``MUJOCO_GL=egl``), shadows and multisampling off,
wrapped so that each observation is what a VLA policy reads: ``Dict(pixels, state,
instruction)``. An episode ends when the cheetah is the task's distance away from where it
started, either way (terminated), or after ``--max-steps`` (truncated). The policy is a
stand-in: a fixed gait nudged by a linear map of the state, K actions at a time, and a sleep of
``--latency-ms`` per forward pass standing for a GPU model.

Needs MuJoCo (the `examples` extra: `pip install "subvec[examples]"`).

Run:  python examples/vla_rollout.py [--num-envs 4 --group 2 --rollouts 4 --chunk 8]
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

#: the tasks the loop swaps between (each a goal distance and an instruction)
TASKS = {"far": (0.3, "leave the start zone by 0.3 m"), "near": (0.15, "leave it by 0.15 m")}
#: MuJoCo renders through EGL in every worker (Mesa's llvmpipe on a CPU: one thread each)
WORKER_ENV = {"MUJOCO_GL": "egl", "LP_NUM_THREADS": "1"}
#: ``mujoco.mjtState.mjSTATE_INTEGRATION``: everything a step reads (mujoco's own constant,
#: spelled out so that importing this file needs no mujoco)
_INTEGRATION = 0x7FFF


class RenderedCheetah(gym.Wrapper[Any, Any, Any, Any]):
    """HalfCheetah-v5 as a VLA env: ``Dict(pixels uint8 (size, size, 3), state (17,),
    instruction Text)``; terminated at the task's goal, truncated after ``max_steps``. Reset
    option ``init_state=k``: the k-th of a fixed set of initial states (a GRPO group's).
    ``get_state``/``set_state``: what ``suspend()``/``resume()`` keep of an episode."""

    def __init__(self, task: str = "far", size: int = 128, max_steps: int = 64) -> None:
        env = gym.make(
            "HalfCheetah-v5",
            render_mode="rgb_array",
            width=size,
            height=size,
            max_episode_steps=max_steps,
        )
        super().__init__(env)
        model = env.unwrapped.model  # type: ignore[attr-defined]
        model.vis.quality.shadowsize = 0  # no shadow map
        model.vis.quality.offsamples = 0  # no multisampling
        model.light_castshadow[:] = 0
        self.goal, self.instruction = TASKS[task]
        self.task = task
        #: the init state of resets that name none (set by an env manager that passes no
        #: per-env reset options)
        self.init_state: int | None = None
        self.observation_space = spaces.Dict(
            {
                "pixels": spaces.Box(0, 255, (size, size, 3), np.uint8),
                "state": env.observation_space,
                "instruction": spaces.Text(max_length=64),
            }
        )

    def _observe(self, state: np.ndarray) -> dict[str, Any]:
        return {"pixels": self.env.render(), "state": state, "instruction": self.instruction}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        init = options.get("init_state") if options else self.init_state
        if init is not None:
            seed = 1000 + int(init)  # the same start for the whole group
        state, info = self.env.reset(seed=seed)
        return self._observe(state), info

    def step(self, action: Any):
        state, reward, _, truncated, info = self.env.step(action)
        terminated = bool(abs(info["x_position"]) >= self.goal)
        return self._observe(state), reward, terminated, truncated, info

    def get_state(self) -> dict[str, Any]:
        """The simulator's whole integration state (positions, velocities, controls, the
        solver's warm start: what the next step depends on), the time limit's count and the
        env's random generator."""
        import mujoco

        inner = self.env.unwrapped
        physics = np.empty(mujoco.mj_stateSize(inner.model, _INTEGRATION))  # type: ignore[attr-defined]
        mujoco.mj_getState(inner.model, inner.data, physics, _INTEGRATION)  # type: ignore[attr-defined]
        cam = self._camera()
        return {
            "physics": physics,
            "elapsed": self.env._elapsed_steps,  # type: ignore[attr-defined]  # TimeLimit's
            "rng": inner.np_random.bit_generator.state,
            # the tracking camera moves with the body from where it was: its frame depends on
            # the episode so far
            "camera": (cam.lookat.copy(), cam.distance, cam.azimuth, cam.elevation),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        import mujoco

        inner = self.env.unwrapped
        model, data = inner.model, inner.data  # type: ignore[attr-defined]
        mujoco.mj_setState(model, data, state["physics"], _INTEGRATION)
        mujoco.mj_forward(model, data)  # positions of the bodies, for the camera
        self.env._elapsed_steps = state["elapsed"]  # type: ignore[attr-defined]
        inner.np_random.bit_generator.state = state["rng"]
        cam = self._camera()
        cam.lookat[:], cam.distance, cam.azimuth, cam.elevation = state["camera"]

    def _camera(self) -> Any:
        """The renderer's camera (the renderer made now if it was not yet)."""
        renderer = self.env.unwrapped.mujoco_renderer  # type: ignore[attr-defined]
        return renderer._get_viewer("rgb_array").cam


def make_task(task: str, size: int, max_steps: int) -> Any:
    """A picklable factory of ``task``'s env."""

    def factory() -> gym.Env[Any, Any]:
        return RenderedCheetah(task, size, max_steps)

    return factory


@dataclass
class Args:
    num_envs: int = 4
    group: int = 2  # envs per initial state (GRPO)
    rollouts: int = 4
    chunk: int = 8  # K: actions per forward pass
    max_steps: int = 64  # the fixed horizon
    swap_every: int = 2  # rollouts per task
    latency_ms: float = 20.0  # the stand-in policy's forward pass
    size: int = 128
    suspend: bool = True
    seed: int = 0


def policy(
    state: np.ndarray, step: int, chunk: int, weights: np.ndarray, latency_s: float
) -> np.ndarray:
    """K actions per env from its state at sub-step ``step`` of the episode: a fixed gait
    (one sine per joint) nudged by a linear map of the state; ``(num_envs, K, 6)`` in
    [-1, 1]."""
    time.sleep(latency_s)  # the GPU model's forward pass
    phase = 2 * np.pi * (step + np.arange(chunk)) / 10.0  # (K,)
    gait = np.sin(phase[:, None] + np.arange(6)[None, :] * np.pi / 3)  # (K, 6)
    nudge = np.tanh(state @ weights)[:, None, :]  # (n, 1, 6)
    return np.clip(0.8 * gait[None] + 0.2 * nudge, -1, 1).astype(np.float32)


def rollouts(args: Args) -> dict[str, float]:
    """Run the loop; returns its counts and where the time went."""
    tasks = list(TASKS)
    weights = np.random.default_rng(args.seed).normal(0, 0.3, (17, 6))
    fns = [make_task(tasks[0], args.size, args.max_steps)] * args.num_envs
    init = [{"init_state": i // args.group} for i in range(args.num_envs)]
    spent = {"policy": 0.0, "env": 0.0, "reconfigure": 0.0, "suspend": 0.0, "resume": 0.0}
    frames = episodes = successes = 0
    blank = 0
    start = time.perf_counter()
    with subvec.SubprocVectorEnv(
        fns,
        freeze=True,
        worker_env=WORKER_ENV,
        timeout={"reset": 120, "step": 30, "call": 60},
        max_concurrent_starts=2,
        copy=False,
    ) as envs:
        for r in range(args.rollouts):
            if r and r % args.swap_every == 0:
                t = time.perf_counter()
                task = tasks[(r // args.swap_every) % len(tasks)]
                envs.reconfigure([make_task(task, args.size, args.max_steps)] * args.num_envs)
                spent["reconfigure"] += time.perf_counter() - t
            t = time.perf_counter()
            obs, _ = envs.reset(seed=args.seed + r, options=init)
            spent["env"] += time.perf_counter() - t
            ended = np.zeros(args.num_envs, dtype=bool)
            for c in range(args.max_steps // args.chunk):
                t = time.perf_counter()
                latency = args.latency_ms / 1e3
                actions = policy(obs["state"], c * args.chunk, args.chunk, weights, latency)
                spent["policy"] += time.perf_counter() - t
                t = time.perf_counter()
                obs, _, term, trunc, infos = envs.step_chunk(actions)
                spent["env"] += time.perf_counter() - t
                frames += int(infos["chunk_steps"].sum())
                blank += int((obs["pixels"].reshape(args.num_envs, -1).std(axis=1) < 1.0).sum())
                done = term.any(axis=1) | trunc.any(axis=1)
                successes += int((term.any(axis=1) & ~ended).sum())
                ended |= done
            episodes += int(ended.sum())
            if args.suspend and r + 1 < args.rollouts:
                # The trainer's turn: the workers (and their GPU memory) are gone meanwhile.
                t = time.perf_counter()
                envs.suspend()
                spent["suspend"] += time.perf_counter() - t
                t = time.perf_counter()
                envs.resume()
                spent["resume"] += time.perf_counter() - t
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "rollouts_per_s": args.rollouts / wall,
        "frames_per_s": frames / wall,
        "frames": frames,
        "episodes": episodes,
        "successes": successes,
        "blank_frames": blank,
        **{f"time_{k}_s": v for k, v in spent.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in vars(Args()).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    args = Args(**vars(parser.parse_args()))
    got = rollouts(args)
    print(
        f"{args.rollouts} rollouts of {args.num_envs} envs (groups of {args.group}, K = "
        f"{args.chunk}, horizon {args.max_steps}): {got['rollouts_per_s']:.2f} rollouts/s, "
        f"{got['frames_per_s']:.0f} frames/s; {got['episodes']} episodes ended, "
        f"{got['successes']} at the goal; {got['blank_frames']} blank frames"
    )
    spent = {k[5:-2]: v for k, v in got.items() if k.startswith("time_")}
    print(
        f"time: wall {got['wall_s']:.2f} s; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in spent.items())
    )


if __name__ == "__main__":
    main()
