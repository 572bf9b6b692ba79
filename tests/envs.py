"""Test environments: every space type, random episode ends, and infos of every shape."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def space_zoo() -> dict[str, spaces.Space[Any]]:
    """Observation spaces the conformance suite runs over, shareable and not."""
    box = lambda dtype, shape=(3,): spaces.Box(0, 9, shape=shape, dtype=dtype)  # noqa: E731
    return {
        "box_f32": box(np.float32, (2, 3)),
        "box_f64": box(np.float64),
        "box_f16": box(np.float16),
        "box_u8_image": box(np.uint8, (8, 6, 3)),
        "box_i8": box(np.int8),
        "box_i64": box(np.int64),
        "box_bool": spaces.Box(0, 1, shape=(4,), dtype=np.bool_),
        "box_scalar": spaces.Box(-1.0, 1.0, shape=(), dtype=np.float32),
        "discrete_start": spaces.Discrete(5, start=-2),
        "multidiscrete": spaces.MultiDiscrete([[3, 4], [5, 2]]),
        "multibinary": spaces.MultiBinary([2, 3]),
        "dict_nest": spaces.Dict(
            {
                "pos": box(np.float32),
                "flag": spaces.Discrete(2),
                "inner": spaces.Tuple((spaces.MultiBinary(3), box(np.uint8, (2,)))),
            }
        ),
        "tuple_nest": spaces.Tuple((spaces.Discrete(4), spaces.Dict({"a": box(np.float64)}))),
        "text": spaces.Text(max_length=6),
        "sequence": spaces.Sequence(spaces.Box(0, 1, shape=(2,), dtype=np.float32)),
        "graph": spaces.Graph(
            node_space=spaces.Box(0, 1, shape=(2,), dtype=np.float32),
            edge_space=spaces.Discrete(3),
        ),
        "dict_with_text": spaces.Dict({"x": box(np.float32), "t": spaces.Text(max_length=4)}),
        "custom": CounterSpace(),
    }


class CounterSpace(spaces.Space[int]):
    """A custom space gymnasium knows nothing about (no dtype, no shape)."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def sample(self, mask: Any = None, probability: Any = None) -> int:
        return int(self.np_random.integers(0, 100))

    def contains(self, x: Any) -> bool:
        return isinstance(x, int)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CounterSpace)

    def __hash__(self) -> int:
        return 1


class ZooEnv(gym.Env[Any, Any]):
    """Samples observations from any space with the env's own RNG; ends episodes at random.

    Infos vary per step (present on some steps only, ints/floats/arrays/nested dicts/strings),
    which exercises gymnasium's ``_key`` masks and recursive merge.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        obs_space: spaces.Space[Any] | None = None,
        act_space: spaces.Space[Any] | None = None,
        max_steps: int = 7,
        render_mode: str | None = None,
        terminate_prob: float = 0.15,
        quiet: bool = False,
        step_seconds: float = 0.0,
        steady: bool = False,
    ) -> None:
        self.terminate_prob = terminate_prob
        self.quiet = quiet  # no step infos: the workers' replies are then plain OKs
        #: the same scalar keys every step (as MuJoCo and Atari): they stay in the block
        self.steady = steady
        self.step_seconds = step_seconds  # a slow env: each step sleeps this long
        self.observation_space = obs_space if obs_space is not None else spaces.Box(0, 1, (3,))
        self.action_space = act_space if act_space is not None else spaces.Discrete(3)
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.t = 0
        self.last_action: Any = None
        self.marker = "default"

    def _obs(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        info: dict[str, Any] = {"reset_count": int(self.np_random.integers(100))}
        if options:
            info["options_seen"] = sorted(options)
        return self._obs(), info

    def step(self, action: Any):
        self.t += 1
        self.last_action = action
        if self.step_seconds:
            time.sleep(self.step_seconds)
        u = float(self.np_random.random())
        terminated = u < self.terminate_prob
        truncated = self.t >= self.max_steps
        reward = u * 2 - 0.5
        info: dict[str, Any] = {}
        if u < 0.5:
            info["low"] = int(self.t)
        if u > 0.3:
            info["score"] = np.float32(u)
            info["vec"] = np.full(2, u)
        if u > 0.8:
            info["nested"] = {"depth": self.t, "name": f"n{self.t}"}
        if self.steady:
            info = {
                "x_position": np.float64(u),
                "reward_ctrl": np.float32(-u),
                "lives": int(u * 5),
                "frame": np.int64(self.t),
                "speed": u * 3.0,
                "alive": u > 0.1,
            }
        return self._obs(), reward, terminated, truncated, {} if self.quiet else info

    def render(self) -> np.ndarray:
        return np.full((4, 4, 3), self.t, dtype=np.uint8)

    def get_t(self, plus: int = 0) -> int:
        return self.t + plus


def make_zoo(obs_name: str, act_space: spaces.Space[Any] | None = None, **kw: Any):
    """A factory (picklable by reference under every start method)."""

    def factory() -> gym.Env[Any, Any]:
        return ZooEnv(space_zoo()[obs_name], act_space, **kw)

    return factory


class CrashEnv(ZooEnv):
    """Misbehaves on demand: raises, dies, hangs, or returns a wrong-shaped observation."""

    def __init__(self, how: str = "", at_step: int = 1, seconds: float = 3600, **kw: Any) -> None:
        super().__init__(**kw)
        self.how = how
        self.at_step = at_step
        self.seconds = seconds
        self.misbehaved = False

    def step(self, action: Any):
        result = super().step(action)
        if self.t == self.at_step and not self.misbehaved:
            self.misbehaved = True  # once per instance: a rebuilt env misbehaves again
            self._misbehave()
            if self.how == "bad_shape":
                return (np.zeros(5, dtype=np.float32), *result[1:])
        return result

    def _misbehave(self) -> None:
        if self.how == "raise":
            raise KeyError("boom")
        if self.how == "exit":
            os._exit(3)
        if self.how == "kill":
            os.kill(os.getpid(), 9)
        if self.how == "segv":
            import ctypes

            ctypes.string_at(0)
        if self.how == "hang":
            time.sleep(self.seconds)
        if self.how == "native_hang":
            # Native code that keeps the GIL (PyDLL does not release it): no Python thread of
            # this process runs until it returns. Announced first, so a test knows we are in.
            import ctypes

            print(f"in native code {os.getpid()}", flush=True)
            ctypes.pythonapi.sleep(int(self.seconds))
        if self.how == "hang_ignoring_sigterm":
            import signal

            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(self.seconds)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.how == "raise_on_reset" and options and options.get("explode"):
            raise ValueError("bad reset option")
        return super().reset(seed=seed, options=options)

    def explode(self, message: str) -> None:
        raise RuntimeError(message)


def crash_fns(num_envs: int, crash_at: int, how: str, **kw: Any) -> list[Any]:
    """Factories for ``num_envs`` envs of which env ``crash_at`` misbehaves as ``how``
    (``quiet``, ``steady``, ``step_seconds`` and ``obs_space`` apply to every env)."""
    shared = {k: kw[k] for k in ("quiet", "steady", "step_seconds", "obs_space") if k in kw}

    def healthy() -> gym.Env[Any, Any]:
        return ZooEnv(max_steps=10**6, terminate_prob=0.0, **shared)

    def crashing() -> gym.Env[Any, Any]:
        return CrashEnv(how, max_steps=10**6, terminate_prob=0.0, **kw)

    return [crashing if i == crash_at else healthy for i in range(num_envs)]


class ScalarInfoEnv(ZooEnv):
    """Infos of scalars only, as MuJoCo and Atari envs report them every step, with keys that
    come and go and one key whose type changes now and then (int instead of float)."""

    def step(self, action: Any):
        obs, reward, terminated, truncated, _ = super().step(action)
        u = self.np_random.random(6)
        info: dict[str, Any] = {}
        if u[0] < 0.8:
            info["x_position"] = float(u[1])
        if u[2] < 0.5:
            info["lives"] = int(u[3] * 5)
        if u[4] < 0.3:
            info["flag"] = bool(u[5] > 0.5)
            info["f32"] = np.float32(u[5])
            info["i64"] = np.int64(self.t)
        if u[5] < 0.05:
            info["x_position"] = 1  # an int where the other envs report floats
        return obs, reward, terminated, truncated, info


class UnpicklableInfoEnv(ZooEnv):
    """Puts a lock (which neither pickle nor cloudpickle can send) in its info at step 2."""

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.t == 2:
            info = {**info, "lock": threading.Lock()}
        return obs, reward, terminated, truncated, info


class SteadyInfoEnv(ZooEnv):
    """The same scalar keys every step, of numpy and Python types, as MuJoCo and Atari envs
    report them: the workers leave these in the block. ``ragged``: a key that only some envs
    report on each step, which the block cannot hold: the workers send columns instead."""

    def __init__(self, *args: Any, ragged: bool = False, **kw: Any) -> None:
        super().__init__(*args, steady=True, **kw)
        self.ragged = ragged

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.ragged and self.np_random.random() < 0.5:
            info["bonus"] = np.float64(self.t)
        return obs, reward, terminated, truncated, info


class LooseDtypeEnv(ZooEnv):
    """Returns float64 observations for its float32 Box (gymnasium casts them when it stacks,
    but an ended episode's final observation is the env's own float64 array)."""

    def _obs(self) -> Any:
        return np.asarray(super()._obs(), dtype=np.float64)


class SilentEnv(ZooEnv):
    """No infos at all, on reset or step, as CartPole: a SAME_STEP step whose envs end then
    has nothing to send but the block."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, quiet=True, **kw)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, _ = super().reset(seed=seed, options=options)
        return obs, {}
