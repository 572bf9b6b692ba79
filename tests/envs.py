"""Test environments: every space type, random episode ends, and infos of every shape."""

from __future__ import annotations

import os
import string
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

#: the characters of the zoo's Text spaces, in a fixed order. gymnasium < 1.4 draws a Text
#: sample from its charset in the charset's iteration order, and its default charset is a
#: frozenset, ordered by the process's hash seed: the same seed samples other strings in a
#: worker than in the parent (and than in the next run) unless PYTHONHASHSEED is set
#: (tests/test_versions.py). A string charset has one order in every process.
TEXT_CHARS = string.digits + string.ascii_uppercase + string.ascii_lowercase


def text_space(max_length: int) -> spaces.Text:
    """A Text space sampling alike in every process (see ``TEXT_CHARS``)."""
    return spaces.Text(max_length=max_length, charset=TEXT_CHARS)


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
        "text": text_space(6),
        "sequence": spaces.Sequence(spaces.Box(0, 1, shape=(2,), dtype=np.float32)),
        "graph": spaces.Graph(
            node_space=spaces.Box(0, 1, shape=(2,), dtype=np.float32),
            edge_space=spaces.Discrete(3),
        ),
        "dict_with_text": spaces.Dict({"x": box(np.float32), "t": text_space(4)}),
        # A robot's observation: two cameras and a state vector in the block, a language
        # instruction (the same for a whole episode, see ZooEnv) by pipe; 5 envs of it are
        # big enough for observation slots
        "cameras_text": spaces.Dict(
            {
                "agentview": spaces.Box(0, 255, (24, 32, 3), np.uint8),
                "wrist": spaces.Box(0, 255, (24, 32, 3), np.uint8),
                "state": spaces.Box(-1.0, 1.0, (9,), np.float32),
                "instruction": text_space(16),
            }
        ),
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
        self.instruction: str | None = None

    def _obs(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        obs = self.observation_space.sample()
        if isinstance(obs, dict) and "instruction" in obs:
            # A task's instruction holds for its episode: sampled at reset, then kept
            if self.instruction is None:
                self.instruction = obs["instruction"]
            obs["instruction"] = self.instruction
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.instruction = None
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

    def close(self) -> None:
        if self.how == "raise_on_close":
            raise OSError("cannot close")
        if self.how == "slow_close":
            time.sleep(self.seconds)
        super().close()

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


class RecordObs(gym.Wrapper[Any, Any, Any, Any]):
    """Keeps the last observation its env returned (from reset or step) as ``last_obs``."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self.last_obs: Any = None

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self.last_obs = obs
        return obs, info

    def step(self, action: Any) -> Any:
        result = self.env.step(action)
        self.last_obs = result[0]
        return result


def checked(env: gym.Env[Any, Any]) -> gym.Env[Any, Any]:
    """``env`` behind gymnasium's order checks, as ``gym.make`` builds it: stepping before the
    first reset raises ``ResetNeeded``."""
    return gym.wrappers.PassiveEnvChecker(gym.wrappers.OrderEnforcing(RecordObs(env)))


class BuildOnce:
    """A picklable factory whose first build succeeds and whose later ones (a replacement
    worker's) do as ``how`` says: ``"raise"`` a ValueError, ``"hang"``, or build again (``""``).
    The marker file that tells them apart is created by the first build."""

    def __init__(self, marker: str, how: str, make: Callable[[], gym.Env[Any, Any]]) -> None:
        self.marker, self.how, self.make = marker, how, make

    def __call__(self) -> gym.Env[Any, Any]:
        if os.path.exists(self.marker):
            if self.how == "raise":
                raise ValueError("this env cannot be built again")
            if self.how == "hang":
                time.sleep(3600)
        else:
            with open(self.marker, "w"):
                pass
        return self.make()


def exit_after_next_write() -> None:
    """Make this process exit with code 3 right after its next ``os.write`` returns: in a
    worker, the write of its reply. The reply is then in the pipe when the process is gone, so
    the parent's next wait sees both at once (no timing involved)."""

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_return" and arg is os.write:
            os._exit(3)

    sys.setprofile(hook)


class ExitAfterReplyEnv(ZooEnv):
    """Its worker exits right after replying to step ``at_step``, or to a call of
    :meth:`exit_after_reply`."""

    def __init__(self, at_step: int = 0, **kw: Any) -> None:
        super().__init__(**kw)
        self.at_step = at_step

    def step(self, action: Any):
        result = super().step(action)
        if self.t == self.at_step:
            exit_after_next_write()
        return result

    def exit_after_reply(self) -> int:
        exit_after_next_write()
        return self.t


class BigIntInfoEnv(ZooEnv):
    """Reports ``{"big": value}`` in the infos of its first step (``nested``: as
    ``{"n": {"deep": value}}``) and ``{"big": 1}`` (or nested 1) on the others."""

    def __init__(self, value: int, nested: bool = False, **kw: Any) -> None:
        super().__init__(quiet=True, **kw)
        self.value, self.nested = value, nested

    def step(self, action: Any):
        obs, reward, terminated, truncated, _ = super().step(action)
        value = self.value if self.t == 1 else 1
        info: dict[str, Any] = {"n": {"deep": value}} if self.nested else {"big": value}
        return obs, reward, terminated, truncated, info


class SleepActionEnv(gym.Env[np.ndarray, Any]):
    """Sleeps for its action, as gymnasium's own test env does: ``time.sleep`` takes a Python
    float or a numpy float64, not a float32, so it fails unless the action arrives in the
    dtype the caller passed."""

    observation_space = spaces.Box(0, 1, shape=(2,), dtype=np.float32)
    action_space = spaces.Box(0.0, 1.0, shape=(), dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action: Any):
        time.sleep(action)
        return np.zeros(2, dtype=np.float32), 0.0, False, False, {}


class ArrayRewardEnv(gym.Env[np.ndarray, int]):
    """Returns its reward as a numpy array of shape (1,) (a common slip in custom envs)."""

    observation_space = spaces.Box(0, 1, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action: Any):
        return np.zeros(2, dtype=np.float32), np.array([1.5]), False, False, {}


class OneBufferEnv(gym.Env[Any, int]):
    """Mutates and returns one observation buffer (and one info dict) on every step and reset.
    Gymnasium asks envs not to, but some do; an episode ends every third step. The observation
    is filled with the step count (0 after a reset) and the info holds it too."""

    def __init__(self, obs_space: spaces.Space[Any] | None = None) -> None:
        self.observation_space = obs_space or spaces.Box(0, 100, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.buffer = self.observation_space.sample()
        self.info: dict[str, Any] = {}
        self.t = 0

    def _fill(self) -> Any:
        if isinstance(self.buffer, dict):
            for value in self.buffer.values():
                value[...] = self.t
        else:
            self.buffer[...] = self.t
        self.info["t"] = self.t
        self.info["t_array"] = np.full(2, self.t)
        return self.buffer

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._fill(), self.info

    def step(self, action: Any):
        self.t += 1
        return self._fill(), 0.0, self.t % 3 == 0, False, self.info


class StepClockEnv(gym.Env[np.ndarray, int]):
    """Sleeps in each step and reset, and reports when it started and ended (``time.monotonic``
    is one clock for every process of the machine)."""

    observation_space = spaces.Box(0, 1, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def _timed(self) -> dict[str, float]:
        start = time.monotonic()
        time.sleep(self.seconds)
        return {"start": start, "end": time.monotonic()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), self._timed()

    def step(self, action: Any):
        return np.zeros(2, dtype=np.float32), 0.0, False, False, self._timed()


class OptionsEnv(gym.Env[np.ndarray, int]):
    """Shows the options of its last reset: the observation is ``[level, t]``, where ``level``
    is ``options["level"]`` (-1 without options), and the reset info holds ``level`` too.
    Episodes are truncated after ``length`` steps. ``last_options`` is what the last reset
    got (None and ``{}`` told apart), ``resets`` how many resets it had."""

    def __init__(self, length: int = 2) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.length = length
        self.level = -1
        self.t = 0
        self.last_options: dict[str, Any] | None = None
        self.resets = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.level, self.t], dtype=np.float64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.last_options = None if options is None else dict(options)
        self.level = int(options.get("level", -1)) if options else -1
        self.t = 0
        self.resets += 1
        return self._obs(), {"level": self.level}

    def step(self, action: Any):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= self.length, {}


class EpisodeEnv(gym.Env[np.ndarray, int]):
    """Episodes of exactly ``length`` steps; the observation is ``[pid, t, first obs]`` of the
    process the env runs in, so a test sees which process made every row. ``first`` is drawn
    from the reset's seed. ``leak_bytes`` are allocated (and kept) on every step;
    ``crash_marker``: the first env to reach step 2 with no file there creates it and exits."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self, length: int = 3, leak_bytes: int = 0, crash_marker: str | None = None
    ) -> None:
        self.length = length
        self.leak_bytes = leak_bytes
        self.crash_marker = crash_marker
        self.observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.t = 0
        self.first = 0.0
        self.kept: list[np.ndarray] = []

    def _obs(self) -> np.ndarray:
        return np.array([os.getpid(), self.t, self.first], dtype=np.float64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.first = float(self.np_random.integers(1 << 30))
        return self._obs(), {"reset_pid": os.getpid()}

    def step(self, action: int):
        self.t += 1
        if self.leak_bytes:
            self.kept.append(np.ones(self.leak_bytes, dtype=np.uint8))  # touched: resident
        marker = self.crash_marker
        if marker is not None and self.t == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(7)
        return self._obs(), 1.0, self.t >= self.length, False, {"step_pid": os.getpid()}


class MatmulEnv(gym.Env[np.ndarray, int]):
    """A small numpy matmul per step (and a torch one with ``use_torch``); ``threads()``
    reports what the worker's pools and environment say."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, size: int = 64, use_torch: bool = False) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.a = np.random.default_rng(0).random((size, size))
        self.torch_a = None
        if use_torch:
            import torch

            self.torch_a = torch.rand(size, size)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return np.zeros(1), {}

    def step(self, action: int):
        value = float((self.a @ self.a)[0, 0])
        if self.torch_a is not None:
            value += float((self.torch_a @ self.torch_a)[0, 0])
        return np.array([value]), 0.0, False, False, {}

    def threads(self) -> dict[str, Any]:
        import sys

        import psutil

        from subvec._process.threads import THREAD_VARIABLES

        torch = sys.modules.get("torch")
        me = psutil.Process()

        def cpu_times() -> dict[int, float]:
            return {t.id: t.user_time + t.system_time for t in me.threads()}

        # Threads that did any work during a burst of matmuls big enough for BLAS to split
        # (an idle pool thread that a cap left parked does not count).
        before = cpu_times()
        # Long enough (about 0.4 s on one core) that a parked pool thread's wake-up spin (tens
        # of ms of sched_yield in OpenBLAS) stays well under a quarter of the main thread's.
        big = np.random.default_rng(1).random((384, 384))
        for _ in range(240):
            big @ big
        if torch is not None:
            tbig = torch.rand(384, 384)
            for _ in range(120):
                tbig @ tbig
        after = cpu_times()
        # Thread times come in clock ticks (10 ms): a thread that woke once may show a tick.
        # A pool thread sharing the work does a good part of it; count those.
        spent = [t - before.get(tid, 0.0) for tid, t in after.items()]
        busy = sum(1 for t in spent if t >= 0.25 * max(spent) and t > 0)
        return {
            "environ": {name: os.environ.get(name) for name in THREAD_VARIABLES},
            "threads": me.num_threads(),
            "busy_threads": busy,
            "spent": sorted(round(t, 3) for t in spent),
            "torch": None if torch is None else torch.get_num_threads(),
            "torch_interop": None if torch is None else torch.get_num_interop_threads(),
        }


class StartMethodEnv(ZooEnv):
    """Records how its worker process started: a forked worker inherits the modules of the
    process that forked it (``ray`` inside a Ray actor); a forkserver or spawn worker does not."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.inherited_ray = "ray" in sys.modules
