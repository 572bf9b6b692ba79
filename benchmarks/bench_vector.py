"""Vector-env throughput against the peers and against the physical limit.

    python benchmarks/bench_vector.py --quick              # seconds: a smoke run
    python benchmarks/bench_vector.py                      # the full sweep (about 40 minutes)
    python benchmarks/bench_vector.py --plan onecore --cpus 0   # one core free
    python benchmarks/bench_vector.py --report benchmarks/results/full.jsonl   # tables + plots

How it measures (so that numbers from different implementations can be compared):

- every configuration (workload x implementation x num_envs) runs in a fresh interpreter
  (this script with ``--child``), so no run inherits another's forkserver, caches or heap;
- configurations are interleaved: each repeat walks every (workload, num_envs) and runs all the
  implementations back to back, in an order rotated per repeat; medians over the repeats are
  quoted, and every single value is kept in the JSON lines;
- actions are sampled before timing (64 batches, cycled), a warm-up precedes the timed window,
  and each step is timed on its own for the latency percentiles;
- ``limit`` is ``W = min(num_envs, usable CPUs)`` independent processes, each stepping its share
  of the envs in a tight loop with no IPC; the sum of their rates is what a perfect vector env
  could reach on this machine;
- memory per worker is USS and PSS (psutil) of each worker process after the timed window.

Workloads: ``cartpole`` (CartPole-v1: IPC dominates), ``busy<N>us`` / ``busy<N>ms`` with an
optional ``_HxWxC`` observation (a synthetic env that burns a calibrated amount of real CPU work
per step), ``libero<N>us`` / ``libero<N>ms`` (the same work behind a LIBERO-like observation:
two 224x224x3 uint8 cameras, a 9-float state and a ``Text(64)`` instruction; ``_notext``
without the instruction), ``pong`` (ALE/Pong-v5 through ale-py), ``halfcheetah``
(HalfCheetah-v5 through mujoco), and ``simpy`` (a discrete-event queueing env built on simpy,
below). Workloads whose package is missing are skipped with a note, as are the
Stable-Baselines3 implementations.

Peers beyond gymnasium and SB3 (each skipped with a note when its package is missing):
``puffer_mp`` / ``puffer_mp_w1`` are PufferLib 3's ``pufferlib.vector.Multiprocessing``
(``pip install --no-deps pufferlib-core``; it imports torch) over its ``GymnasiumPufferEnv``
emulation of the suite's own env, in lock step (``batch_size = num_envs``, ``zero_copy``), with
a worker per physical core or one worker; ``envpool`` / ``envpool_cpus`` step EnvPool's own C++
``CartPole-v1`` and ``Pong-v5`` in lock step (``batch_size = num_envs``) with its default
``num_threads`` or one thread per usable CPU, for the ``cartpole`` and ``pong`` workloads only
(EnvPool's Pong-v5 preprocesses its frames unlike ALE/Pong-v5: see ``ENVPOOL_NOTES``);
``torchrl_parallel`` is torchrl's ``ParallelEnv`` (``pip install torchrl`` after torch) over
``GymWrapper`` of the suite's env, a worker per usable CPU (``SerialEnv`` of the rest inside
each), stepped with ``step_and_maybe_reset`` and torch actions, as torchrl's collectors do.

Outputs: ``<out-dir>/<tag>.jsonl`` (one summary line per configuration, raw values included),
``<out-dir>/<tag>.md`` (markdown tables) and ``<img-dir>/<tag>-<workload>.png`` (throughput
against num_envs, one line per implementation plus the limit). Raw per-run lines also go to
``<out-dir>/raw/<tag>-runs.jsonl``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Args:
    plan: str = "full"
    """which sweep: full, targets (the project's target configurations), onecore, quick"""
    quick: bool = False
    """shorthand for --plan quick: a few configurations, a fraction of a second each"""
    workloads: str = ""
    """comma-separated workloads, overriding the plan's (e.g. cartpole,busy100us_84x84x3)"""
    impls: str = ""
    """comma-separated implementations, overriding the plan's"""
    num_envs: str = ""
    """comma-separated num_envs values, overriding the plan's"""
    duration: float = 1.5
    """seconds of timed stepping per configuration"""
    warmup: float = 0.3
    """seconds of untimed stepping before the timed window"""
    repeats: int = 3
    """how many times the whole set of configurations is run (medians are reported)"""
    cpus: str = ""
    """restrict every run to these CPUs (e.g. "0" for one core), as taskset would"""
    tag: str = ""
    """name of the output files (default: the plan's name)"""
    out_dir: str = str(ROOT / "benchmarks" / "results")
    """where the JSON lines and the markdown table go"""
    img_dir: str = str(ROOT / "docs" / "img")
    """where the PNG plots go"""
    no_plots: bool = False
    """skip the matplotlib plots"""
    quiet: float = 0.15
    """cores that other processes may use during a run before it is retried (shared machines)"""
    max_wait: float = 20.0
    """seconds to wait for the machine to be quiet before each run"""
    wait_budget: float = 600.0
    """total seconds of such waiting (and retrying) before the sweep just records the noise"""
    retries: int = 2
    """extra attempts of a run that was disturbed by other processes; the cleanest is kept"""
    run_timeout: float = 300.0
    """seconds before one configuration's interpreter is killed and recorded as failed"""
    seed: int = 0
    report: str = ""
    """only render the tables and plots of an existing summary .jsonl file"""
    child: str = ""
    """internal: run one configuration (JSON) and print its result"""


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true")
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            parser.add_argument(flag, type=kind, default=f.default)
    return Args(**vars(parser.parse_args(argv)))


# --- workloads --------------------------------------------------------------------------------


def burn(iters: int, x: int = 1) -> int:
    """Real CPU work: ``iters`` rounds of a linear congruential generator in pure Python."""
    for _ in range(iters):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


class BusyEnv(gym.Env):
    """Burns ``iters`` LCG rounds per step (calibrated to a step cost) and returns a fresh
    observation of the given shape; episodes are truncated after ``horizon`` steps."""

    def __init__(self, iters: int, obs_shape: tuple[int, ...], horizon: int = 500) -> None:
        image = len(obs_shape) == 3
        dtype = np.uint8 if image else np.float32
        high = 255 if image else np.inf
        low = 0 if image else -np.inf
        self.observation_space = gym.spaces.Box(low, high, shape=obs_shape, dtype=dtype)
        self.action_space = gym.spaces.Discrete(2)
        self.iters = iters
        self.horizon = horizon
        self._frame = np.zeros(obs_shape, dtype=dtype)
        self._x = 1
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._x = int(self.np_random.integers(1, 2**31 - 1))
        self._t = 0
        return self._frame.copy(), {}

    def step(self, action: Any) -> Any:
        self._x = burn(self.iters, self._x + int(action))
        self._t += 1
        flat = self._frame.reshape(-1)
        flat[self._t % flat.size] = self._x & 0x7F
        return self._frame.copy(), 1.0, False, self._t >= self.horizon, {}


class LiberoEnv(gym.Env):
    """A LIBERO-like robot env: burns ``iters`` LCG rounds per step (the simulation) and
    returns two freshly rendered 224x224x3 uint8 camera images, a 9-float proprioceptive state
    and, with ``text``, the episode's language instruction (a ``Text(64)``); episodes are
    truncated after ``horizon`` steps, and each reset picks a new instruction."""

    INSTRUCTIONS = (
        "put the black bowl on the plate",
        "open the top drawer and put the bowl inside",
        "turn on the stove and put the moka pot on it",
        "pick up the alphabet soup and place it in the basket",
    )

    def __init__(self, iters: int, text: bool = True, horizon: int = 500, size: int = 224):
        camera = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        parts: dict[str, gym.Space[Any]] = {
            "agentview_image": camera,
            "eye_in_hand_image": camera,
            "state": gym.spaces.Box(-np.inf, np.inf, (9,), np.float32),
        }
        if text:
            charset = string.ascii_lowercase + " "
            parts["instruction"] = gym.spaces.Text(64, charset=charset)
        self.observation_space = gym.spaces.Dict(parts)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.iters, self.text, self.horizon = iters, text, horizon
        self._frames = [np.zeros((size, size, 3), np.uint8) for _ in range(2)]
        self._state = np.zeros(9, np.float32)
        self._instruction = ""
        self._x = 1
        self._t = 0

    def _obs(self) -> dict[str, Any]:
        obs: dict[str, Any] = {
            "agentview_image": self._frames[0].copy(),
            "eye_in_hand_image": self._frames[1].copy(),
            "state": self._state.copy(),
        }
        if self.text:
            obs["instruction"] = self._instruction
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._x = int(self.np_random.integers(1, 2**31 - 1))
        self._t = 0
        self._instruction = self.INSTRUCTIONS[int(self.np_random.integers(len(self.INSTRUCTIONS)))]
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self._x = burn(self.iters, self._x)
        self._t += 1
        for frame in self._frames:
            flat = frame.reshape(-1)
            flat[self._t % flat.size] = self._x & 0x7F
        self._state[:7] += np.asarray(action, dtype=np.float32) * 0.01
        return self._obs(), 1.0, False, self._t >= self.horizon, {}


class QueueEnv(gym.Env):
    """A discrete-event env on simpy: customers arrive (Poisson, rate 1.8) and the action routes
    the next time unit's arrivals to one of two single-server queues (exponential service,
    rate 1). Observation: queue lengths and busy flags; reward: minus the customers waiting."""

    def __init__(self, horizon: int = 200) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1e4, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.horizon = horizon

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        import simpy

        super().reset(seed=seed)
        self.sim = simpy.Environment()
        self.servers = [simpy.Resource(self.sim, capacity=1) for _ in range(2)]
        self.route = 0
        self._t = 0
        self.sim.process(self._arrivals())
        return self._obs(), {}

    def _arrivals(self) -> Any:
        while True:
            yield self.sim.timeout(float(self.np_random.exponential(1 / 1.8)))
            self.sim.process(self._customer(self.servers[self.route]))

    def _customer(self, server: Any) -> Any:
        with server.request() as request:
            yield request
            yield self.sim.timeout(float(self.np_random.exponential(1.0)))

    def _obs(self) -> np.ndarray:
        return np.array(
            [len(s.queue) for s in self.servers] + [s.count for s in self.servers],
            dtype=np.float32,
        )

    def step(self, action: Any) -> Any:
        self.route = int(action)
        self.sim.run(until=self.sim.now + 1.0)
        self._t += 1
        obs = self._obs()
        return obs, -float(obs[0] + obs[1]), False, self._t >= self.horizon, {}


_BUSY = re.compile(r"^busy(\d+)(us|ms)(?:_(\d+(?:x\d+)*))?$")
_LIBERO = re.compile(r"^libero(\d+)(us|ms)(_notext)?$")
_ALIASES = {
    "cartpole": ("CartPole-v1", None),
    "pong": ("ALE/Pong-v5", "ale_py"),
    "halfcheetah": ("HalfCheetah-v5", "mujoco"),
}


def workload_spec(name: str, iters_per_us: float) -> dict[str, Any]:
    """Everything a child needs to build one env of ``name`` (JSON-able)."""
    if name in _ALIASES:
        env_id, module = _ALIASES[name]
        return {"kind": "gym", "env_id": env_id, "module": module}
    if name.startswith("gym:"):
        return {"kind": "gym", "env_id": name[4:], "module": None}
    if name == "simpy":
        return {"kind": "simpy", "module": "simpy"}
    match = _LIBERO.match(name)
    if match:
        cost_us = int(match[1]) * (1000 if match[2] == "ms" else 1)
        iters = max(1, round(cost_us * iters_per_us))
        return {"kind": "libero", "cost_us": cost_us, "iters": iters, "text": not match[3]}
    match = _BUSY.match(name)
    if match:
        cost_us = int(match[1]) * (1000 if match[2] == "ms" else 1)
        shape = [int(s) for s in match[3].split("x")] if match[3] else [4]
        return {
            "kind": "busy",
            "cost_us": cost_us,
            "iters": max(1, round(cost_us * iters_per_us)),
            "obs_shape": shape,
            "module": None,
        }
    raise SystemExit(
        f"unknown workload {name!r}: use cartpole, pong, halfcheetah, simpy, "
        "gym:<id>, busy<N>us[_HxWxC] / busy<N>ms or libero<N>us / libero<N>ms[_notext]"
    )


def _make_gym(env_id: str, module: str | None) -> gym.Env:
    if module == "ale_py":
        import ale_py

        gym.register_envs(ale_py)
    return gym.make(env_id)


def make_factory(spec: dict[str, Any]) -> Any:
    """A picklable zero-argument callable that builds one env (module-level functions and
    classes of this script travel by value through cloudpickle)."""
    if spec["kind"] == "gym":
        return functools.partial(_make_gym, spec["env_id"], spec["module"])
    if spec["kind"] == "busy":
        return functools.partial(BusyEnv, spec["iters"], tuple(spec["obs_shape"]))
    if spec["kind"] == "simpy":
        return QueueEnv
    if spec["kind"] == "libero":
        return functools.partial(LiberoEnv, spec["iters"], spec["text"])
    raise ValueError(spec)


def calibrate(target_s: float = 0.3) -> float:
    """LCG rounds per microsecond on one idle core (median of a few timings)."""
    burn(20_000)
    rates = []
    for _ in range(7):
        iters = 20_000
        start = time.perf_counter()
        burn(iters)
        rates.append(iters / ((time.perf_counter() - start) * 1e6))
        if sum(iters / r for r in rates) / 1e6 > target_s:
            break
    return statistics.median(rates)


# --- implementations (all built inside the child interpreter) --------------------------------

SB3_IMPLS = ("sb3_subproc", "sb3_dummy")
#: PufferLib 3's Multiprocessing around the suite's own envs (GymnasiumPufferEnv)
PUFFER_IMPLS = ("puffer_mp", "puffer_mp_w1")
#: EnvPool steps its own C++ envs, so it runs only the workloads it has an equivalent for
ENVPOOL_IMPLS = ("envpool", "envpool_cpus")
ENVPOOL_IDS = {"CartPole-v1": "CartPole-v1", "ALE/Pong-v5": "Pong-v5"}
#: what the tables say under a workload's EnvPool rows (by the gymnasium id it stands in for)
ENVPOOL_NOTES = {
    "CartPole-v1": "EnvPool rows step EnvPool's own C++ CartPole-v1 (the same dynamics), not the "
    "gymnasium env that the other rows step.",
    "ALE/Pong-v5": "EnvPool's Pong-v5 is not ALE/Pong-v5: it returns 4 stacked 84x84 grayscale "
    "frames (28 KB, resized and max-pooled in C++) instead of one 210x160x3 RGB frame (100 KB), "
    "without sticky actions (0 instead of 0.25), with up to 30 no-op steps and FIRE at reset; "
    "both skip 4 frames per step.",
}
PUFFER_NOTE = (
    "PufferLib rows: Multiprocessing with batch_size = num_envs (each recv returns every env), "
    "zero_copy, over GymnasiumPufferEnv; puffer_mp has a worker per physical core (at most the "
    "usable CPUs, a divisor of num_envs), puffer_mp_w1 one worker; its workers and its recv "
    "busy-wait on shared flags."
)
ALL_IMPLS = (
    "subvec",
    "subvec_torch",
    "subvec_w1",
    "subvec_epw1",
    "subvec_core",
    "subvec_parent",
    "subvec_nospin",
    "sync",
    "async_shm",
    "async_pipe",
    "sb3_subproc",
    "sb3_dummy",
    "puffer_mp",
    "puffer_mp_w1",
    "envpool",
    "envpool_cpus",
    "torchrl_parallel",
    "limit_sync",
    "limit",
)
#: label and plot style of each implementation
IMPL_LABELS = {
    "subvec": "subvec (defaults)",
    "subvec_torch": "subvec (defaults), actions as CPU torch tensors",
    "subvec_w1": "subvec num_workers=1",
    "subvec_epw1": "subvec envs_per_worker=1",
    "subvec_core": "subvec pin='core'",
    "subvec_parent": "subvec parent_envs=half (CPUs-1 workers)",
    "subvec_nospin": "subvec spin_us=0",
    "sync": "gymnasium SyncVectorEnv",
    "async_shm": "gymnasium AsyncVectorEnv (shm)",
    "async_pipe": "gymnasium AsyncVectorEnv (pipes)",
    "sb3_subproc": "SB3 SubprocVecEnv",
    "sb3_dummy": "SB3 DummyVecEnv",
    "puffer_mp": "PufferLib Multiprocessing (a worker per core)",
    "puffer_mp_w1": "PufferLib Multiprocessing num_workers=1",
    "envpool": "EnvPool, its own C++ env (default threads)",
    "envpool_cpus": "EnvPool, its own C++ env (a thread per CPU)",
    "torchrl_parallel": "torchrl ParallelEnv (a worker per CPU)",
    "limit_sync": "limit in lock step (W processes, a barrier per step)",
    "limit": "limit (W independent processes)",
}


def usable_cpus() -> int:
    """Affinity capped by a cgroup CPU quota, as subvec's defaults count them."""
    from subvec._process.topology import usable_cpus as subvec_usable_cpus

    return subvec_usable_cpus()


def puffer_workers(num_envs: int, cores: int) -> int:
    """PufferLib's recommended worker count: one per physical core (it refuses more without
    ``overwork=True``), lowered to a divisor of ``num_envs`` (its workers hold equal shares)."""
    workers = max(1, min(num_envs, cores))
    while num_envs % workers:
        workers -= 1
    return workers


def build_puffer(impl: str, fns: list[Any], seed: int) -> Any:
    """PufferLib 3's Multiprocessing over GymnasiumPufferEnv(the suite's env), in lock step."""
    import psutil
    import pufferlib.emulation
    import pufferlib.vector

    n = len(fns)
    cores = min(psutil.cpu_count(logical=False) or usable_cpus(), usable_cpus())
    workers = 1 if impl == "puffer_mp_w1" else puffer_workers(n, cores)
    creators = [
        functools.partial(pufferlib.emulation.GymnasiumPufferEnv, env_creator=fn) for fn in fns
    ]
    return pufferlib.vector.make(
        creators,
        env_args=[()] * n,
        env_kwargs=[{}] * n,
        backend=pufferlib.vector.Multiprocessing,
        num_envs=n,
        num_workers=workers,
        batch_size=n,  # every recv returns all the envs: a lock-step vector env like the others
        zero_copy=True,
        seed=seed,
    )


def build_envpool(impl: str, num_envs: int, spec: dict[str, Any], seed: int) -> Any:
    """EnvPool's own C++ counterpart of the workload's gymnasium env, in lock step."""
    import envpool

    threads = {"num_threads": usable_cpus()} if impl == "envpool_cpus" else {}
    return envpool.make(
        ENVPOOL_IDS[spec["env_id"]],
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=num_envs,
        seed=seed,  # EnvPool seeds at construction and ignores reset(seed=)
        **threads,
    )


class TorchrlLockstep:
    """torchrl's ``ParallelEnv`` over ``GymWrapper(env)`` driven as its own rollout loop
    drives it: the action into the tensordict, ``step_and_maybe_reset``, the next tensordict
    kept (autoreset in the workers). ``step(actions)`` takes a batch of torch actions."""

    def __init__(self, fns: list[Any]) -> None:
        from torchrl.envs import GymWrapper, ParallelEnv

        workers = max(1, min(len(fns), usable_cpus()))
        while len(fns) % workers:
            workers -= 1
        per = len(fns) // workers

        def make(chunk: list[Any]) -> Any:
            from torchrl.envs import SerialEnv

            wrapped = [functools.partial(_gym_wrapper, fn, GymWrapper) for fn in chunk]
            return SerialEnv(len(wrapped), wrapped) if len(wrapped) > 1 else wrapped[0]()

        chunks = [fns[w * per : (w + 1) * per] for w in range(workers)]
        self.env = ParallelEnv(workers, [functools.partial(make, c) for c in chunks])
        self.num_envs, self.num_workers = len(fns), workers
        self.td: Any = None
        self.single_action_space = fns[0]().action_space

    def reset(self, seed: int) -> None:
        self.env.set_seed(seed)
        self.td = self.env.reset()

    def step(self, actions: Any) -> None:
        td = self.td
        td["action"] = actions.reshape(td.batch_size)
        _, self.td = self.env.step_and_maybe_reset(td)

    def close(self) -> None:
        self.env.close()


def _gym_wrapper(fn: Any, wrapper: Any) -> Any:
    return wrapper(fn(), categorical_action_encoding=True)


def build_vector(
    impl: str, fns: list[Any], spec: dict[str, Any] | None = None, seed: int = 0
) -> tuple[Any, str]:
    """The vector env and its API flavour: "gym" (reset/step 5-tuple), "seeded" (the same,
    seeded at construction) or "sb3"."""
    if impl.startswith("subvec"):
        import subvec

        kwargs: dict[str, Any] = {}
        if impl == "subvec_w1":
            kwargs["num_workers"] = 1
        elif impl == "subvec_epw1":
            kwargs["envs_per_worker"] = 1
        elif impl == "subvec_core":
            kwargs["pin"] = "core"
        elif impl == "subvec_parent":
            # The parent steps a share in-process, as one more worker: n/W' envs each with
            # W' = usable CPUs processes in all (the parent and CPUs-1 workers).
            kwargs["parent_envs"] = max(1, len(fns) // usable_cpus()) if len(fns) > 1 else 0
        elif impl == "subvec_nospin":
            kwargs["spin_us"] = 0
        elif impl.startswith("subvec_w"):
            kwargs["num_workers"] = int(impl[len("subvec_w") :])
        return subvec.SubprocVectorEnv(fns, **kwargs), "gym"
    if impl in PUFFER_IMPLS:
        return build_puffer(impl, fns, seed), "gym"
    if impl in ENVPOOL_IMPLS:
        return build_envpool(impl, len(fns), spec or {}, seed), "seeded"
    if impl == "torchrl_parallel":
        return TorchrlLockstep(fns), "torchrl"
    if impl == "sync":
        return gym.vector.SyncVectorEnv(fns), "gym"
    if impl in ("async_shm", "async_pipe"):
        return gym.vector.AsyncVectorEnv(fns, shared_memory=impl == "async_shm"), "gym"
    if impl == "sb3_subproc":
        import multiprocessing

        # A training script imports SB3 at the top, so the forkserver (which preloads
        # __main__) has torch already; our __main__ does not, so preload it explicitly.
        multiprocessing.set_forkserver_preload(["stable_baselines3.common.vec_env"])
        from stable_baselines3.common.vec_env import SubprocVecEnv

        return SubprocVecEnv(fns), "sb3"
    if impl == "sb3_dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        return DummyVecEnv(fns), "sb3"
    raise SystemExit(f"unknown implementation {impl!r}; known: {', '.join(ALL_IMPLS)}")


def _is_helper(proc: Any, me: int) -> bool:
    """multiprocessing's forkserver and resource tracker: not workers."""
    try:
        cmd = " ".join(proc.cmdline())
        return proc.ppid() == me and ("forkserver" in cmd or "resource_tracker" in cmd)
    except Exception:
        return True


def worker_memory() -> tuple[int, float | None, float | None, float]:
    """(worker count, mean USS MB, mean PSS MB, this process's USS MB)."""
    import psutil

    me = psutil.Process()
    uss, pss = [], []
    for proc in me.children(recursive=True):
        if _is_helper(proc, me.pid):
            continue
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        uss.append(info.uss / 2**20)
        pss.append(info.pss / 2**20)
    own = me.memory_full_info().uss / 2**20
    if not uss:
        return 0, None, None, own
    return len(uss), statistics.fmean(uss), statistics.fmean(pss), own


class ForeignCpu:
    """How many cores processes *outside* this process tree used during a window.

    The machine may be shared (other people's tests, builds): a run that competed with a
    stranger for the cores says little about the implementation, so each run reports this and
    the sweep repeats contaminated runs. Machine-wide busy time comes from /proc/stat, our own
    from the live process tree (workers are alive during the window, so psutil can read them).
    """

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float]:
        import psutil

        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / self.tick  # minus idle and iowait
        me = psutil.Process()
        ours = 0.0
        for proc in [me, *me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                ours += times.user + times.system
            except psutil.Error:
                pass
        return busy, ours, time.monotonic()

    def cores(self) -> float:
        busy0, ours0, t0 = self.start
        busy1, ours1, t1 = self._snapshot()
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (t1 - t0)


def presample(single_space: Any, num_envs: int, seed: int, count: int = 64) -> list[Any]:
    batched = gym.vector.utils.batch_space(single_space, num_envs)
    batched.seed(seed)
    return [batched.sample() for _ in range(count)]


def as_tensors(batches: list[Any]) -> list[Any]:
    """Each batch of actions (an array, or a dict of arrays) as CPU torch tensors."""
    import torch

    torch.set_num_threads(1)

    def convert(batch: Any) -> Any:
        if isinstance(batch, dict):
            return {key: convert(value) for key, value in batch.items()}
        return torch.from_numpy(np.ascontiguousarray(batch))

    return [convert(batch) for batch in batches]


def timed_loop(
    step: Any, actions: list[Any], warmup: float, duration: float, watch: bool = False
) -> dict[str, Any]:
    """Warm up, then step for ``duration`` seconds timing every call."""
    k = len(actions)
    end = time.perf_counter() + warmup
    i = 0
    while time.perf_counter() < end or i < 3:
        step(actions[i % k])
        i += 1
    foreign = ForeignCpu() if watch else None
    lat: list[float] = []
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + duration
    t = t0
    n = 0
    while t < deadline:
        a = t
        step(actions[n % k])
        t = time.perf_counter()
        lat.append(t - a)
        n += 1
    elapsed = t - t0
    arr = np.asarray(lat)
    return {
        "foreign_cpu": foreign.cores() if foreign else None,
        "vec_steps": n,
        "elapsed_s": elapsed,
        "p50_us": float(np.percentile(arr, 50) * 1e6),
        "p99_us": float(np.percentile(arr, 99) * 1e6),
        "parent_cpu": (time.process_time() - cpu0) / elapsed,
    }


def run_vector(cfg: dict[str, Any]) -> dict[str, Any]:
    n = cfg["num_envs"]
    fns = [make_factory(cfg["spec"]) for _ in range(n)]
    start = time.perf_counter()
    envs, api = build_vector(cfg["impl"], fns, cfg["spec"], cfg["seed"])
    try:
        if api == "torchrl":
            envs.reset(cfg["seed"])
            single = envs.single_action_space
        elif api in ("gym", "seeded"):
            envs.reset(**({"seed": cfg["seed"]} if api == "gym" else {}))
            single = envs.single_action_space
        else:
            envs.seed(cfg["seed"])
            envs.reset()
            single = envs.action_space
        startup = time.perf_counter() - start
        actions = presample(single, n, cfg["seed"])
        if cfg["impl"] in ("subvec_torch", "torchrl_parallel"):  # what a torch policy hands over
            actions = as_tensors(actions)
        result = timed_loop(envs.step, actions, cfg["warmup"], cfg["duration"], watch=True)
        count, uss, pss, own = worker_memory()
        workers = getattr(envs, "num_workers", None)
        if workers is None and cfg["impl"] in ("async_shm", "async_pipe", "sb3_subproc"):
            workers = n
        if cfg["impl"] in ENVPOOL_IMPLS:  # threads, not processes; 0 is min(n, CPUs)
            workers = envs.config["num_threads"] or min(n, os.cpu_count() or 1)
    finally:
        envs.close()
    result.update(
        steps_per_s=result["vec_steps"] * n / result["elapsed_s"],
        startup_s=startup,
        num_workers=workers or 0,
        workers_seen=count,
        worker_uss_mb=uss,
        worker_pss_mb=pss,
        parent_uss_mb=own,
    )
    return result


def _limit_worker(
    factory: Any,
    count: int,
    seed: int,
    warmup: float,
    duration: float,
    barrier: Any,
    out: Any,
    rounds: Any = None,
    me: int = 0,
    sync_every: int = 1,
) -> None:
    """One process of the limit: ``count`` envs stepped in a tight loop, no IPC while timed.

    With ``rounds`` (lock step), after each round the process spins until every process has
    finished that round: the best any synchronous vector env can do, since its step ends when
    the slowest worker's share is done, with zero cost for the wait itself. ``rounds[width]``
    is the stop flag the first process to finish raises so that nobody waits for it forever.
    A round is ``sync_every`` steps of the share (an action chunk of that many sub-steps).
    """
    import psutil

    envs = [factory() for _ in range(count)]
    for j, env in enumerate(envs):
        env.reset(seed=seed + j)
    actions = presample(envs[0].action_space, count, seed)

    def step(batch: Any) -> None:
        for j, env in enumerate(envs):
            _, _, terminated, truncated, _ = env.step(batch[j])
            if terminated or truncated:
                env.reset()

    calls = [0]

    def step_in_lock_step(batch: Any) -> None:
        step(batch)
        calls[0] += 1
        if calls[0] % sync_every:
            return
        width = len(rounds) - 1
        done = rounds[me] = rounds[me] + 1
        while min(rounds[:width]) < done and not rounds[width]:
            pass

    barrier.wait()
    result = timed_loop(step if rounds is None else step_in_lock_step, actions, warmup, duration)
    if rounds is not None:
        rounds[len(rounds) - 1] = 1
    info = psutil.Process().memory_full_info()
    result.update(uss_mb=info.uss / 2**20, pss_mb=info.pss / 2**20)
    out.put(result)
    for env in envs:
        env.close()


def run_limit(cfg: dict[str, Any]) -> dict[str, Any]:
    import multiprocessing

    n = cfg["num_envs"]
    width = min(n, usable_cpus())
    shares = [n // width + (1 if w < n % width else 0) for w in range(width)]
    ctx = multiprocessing.get_context("fork")  # a fresh interpreter: fork is safe and cheap
    barrier = ctx.Barrier(width + 1)
    out = ctx.SimpleQueue()
    rounds = ctx.RawArray("q", width + 1) if cfg["impl"] == "limit_sync" else None
    start = time.perf_counter()
    procs = [
        ctx.Process(
            target=_limit_worker,
            args=(
                make_factory(cfg["spec"]),
                share,
                cfg["seed"] + 1000 * w,
                cfg["warmup"],
                cfg["duration"],
                barrier,
                out,
                rounds,
                w,
                int(cfg.get("sync_every", 1)),
            ),
        )
        for w, share in enumerate(shares)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=cfg["timeout"])
    startup = time.perf_counter() - start
    foreign = ForeignCpu()  # spans the warm-up too: close enough
    parts = [out.get() for _ in procs]
    foreign_cpu = foreign.cores()
    for proc in procs:
        proc.join()
    if rounds is not None:  # in lock step the slowest process sets everyone's pace
        rate = min(p["vec_steps"] / p["elapsed_s"] for p in parts) * n
    else:
        rate = sum(p["vec_steps"] * s / p["elapsed_s"] for p, s in zip(parts, shares))
    return {
        "steps_per_s": rate,
        "vec_steps": min(p["vec_steps"] for p in parts),
        "elapsed_s": max(p["elapsed_s"] for p in parts),
        # the ideal vector step: every process finishes its share at the same time
        "p50_us": max(p["p50_us"] for p in parts),
        "p99_us": max(p["p99_us"] for p in parts),
        "parent_cpu": 0.0,
        "startup_s": startup,
        "num_workers": width,
        "workers_seen": width,
        "worker_uss_mb": statistics.fmean(p["uss_mb"] for p in parts),
        "worker_pss_mb": statistics.fmean(p["pss_mb"] for p in parts),
        "parent_uss_mb": None,
        "foreign_cpu": foreign_cpu,
    }


def child_main(cfg: dict[str, Any]) -> None:
    if cfg.get("cpus"):
        os.sched_setaffinity(0, cfg["cpus"])
    load = os.getloadavg()[0]
    result = run_limit(cfg) if cfg["impl"] in ("limit", "limit_sync") else run_vector(cfg)
    result.update(load_1m=load, usable_cpus=usable_cpus())
    print("RESULT " + json.dumps(result), flush=True)


# --- the sweep --------------------------------------------------------------------------------

PEERS = "sync,async_shm,async_pipe,sb3_subproc"
#: the peers that bring their own machinery (EnvPool runs only cartpole and pong)
NATIVE_PEERS = "puffer_mp,puffer_mp_w1,envpool"
#: A plan maps each workload to (num_envs values, implementations). The full sweep keeps the
#: long num_envs axis for the two cheap workloads and three points for the expensive ones,
#: so that it fits in about half an hour of a 2-core machine with 3 repeats.
PLANS: dict[str, dict[str, tuple[str, str]]] = {
    "quick": {
        "cartpole": ("4", "subvec,sync,async_shm,puffer_mp,envpool,limit"),
        "busy100us": ("4", "subvec,sync,async_shm,limit"),
    },
    "full": {
        "cartpole": (
            "2,4,8,16,32,64",
            f"subvec,subvec_w1,{PEERS},sb3_dummy,{NATIVE_PEERS},limit_sync,limit",
        ),
        "busy100us": ("2,4,8,16,32,64", f"subvec,subvec_w1,{PEERS},limit_sync,limit"),
        "busy1ms": ("2,8,32", f"subvec,subvec_w1,{PEERS},limit_sync,limit"),
        "busy100us_84x84x3": ("2,8,32", f"subvec,subvec_w1,{PEERS},limit_sync,limit"),
        "pong": ("2,8,32", f"subvec,subvec_w1,{PEERS},{NATIVE_PEERS},limit_sync,limit"),
        "halfcheetah": ("2,8,32", f"subvec,subvec_w1,{PEERS},limit_sync,limit"),
        "simpy": ("2,8,32", f"subvec,subvec_w1,{PEERS},limit_sync,limit"),
    },
    "targets": {
        w: (
            n,
            "subvec,subvec_parent,subvec_nospin,sync,async_shm,"
            + (f"{NATIVE_PEERS}," if w in ("cartpole", "pong") else "")
            + "limit_sync,limit",
        )
        for w, n in (("cartpole", "16"), ("busy100us", "8"), ("busy1ms", "8"), ("pong", "8"))
    },
    # heavy simulators' observations: camera images, a state and an instruction
    "heavy": {
        "libero1ms": ("8", "subvec,subvec_torch,sync,async_shm,limit"),
        "libero1ms_notext": ("8", "subvec,sync,async_shm,limit"),
    },
    "onecore": {
        "cartpole": ("8,16", "subvec,sync,async_shm,limit"),
        "busy100us": ("8,16", "subvec,sync,async_shm,limit"),
        "pong": ("8,16", "subvec,sync,async_shm,limit"),
    },
}
QUICK_TIMING = {"duration": 0.25, "warmup": 0.05, "repeats": 1}
#: peers that start one interpreter per env would take minutes (and GBs) at 64 envs
MAX_ENVS_PROCESS_PER_ENV = 32
PROCESS_PER_ENV = ("async_shm", "async_pipe", "sb3_subproc", "subvec_epw1")


def plan_configs(args: Args) -> list[tuple[str, list[int], list[str]]]:
    """(workload, num_envs values, implementations) for each workload of the run."""
    plan = PLANS["quick" if args.quick else args.plan]
    names = args.workloads.split(",") if args.workloads else list(plan)
    out = []
    for name in names:
        default_ns, default_impls = plan.get(name, next(iter(plan.values())))
        ns = [int(n) for n in (args.num_envs or default_ns).split(",")]
        impls = (args.impls or default_impls).split(",")
        out.append((name, ns, impls))
    return out


def _git_head() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            timeout=10,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_facts(cpus: list[int] | None) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, Any] = {}
    for pkg in ("subvec", "gymnasium", "numpy", "stable_baselines3", "ale_py", "mujoco", "simpy"):
        try:
            versions[pkg] = importlib.import_module(pkg).__version__
        except Exception:
            versions[pkg] = None
    for dist in ("pufferlib-core", "envpool"):  # by metadata: importing pufferlib loads torch
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    import psutil

    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(cpus) if cpus else usable_cpus(),
        "cpus": cpus,
        "cpu_model": model,
        "mem_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg": os.getloadavg(),
        "versions": versions,
        "subvec_file": getattr(importlib.import_module("subvec"), "__file__", None),
        "git_head": _git_head(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def available(workload: str, impl: str, spec: dict[str, Any]) -> str | None:
    """Why this configuration cannot run here, or None."""
    if impl in ENVPOOL_IMPLS:  # its own envs: the workload's module is not needed
        if not _installed("envpool"):
            return "envpool is not installed"
        if spec.get("kind") != "gym" or spec.get("env_id") not in ENVPOOL_IDS:
            return f"EnvPool has no equivalent of {workload}"
        return None
    if impl in PUFFER_IMPLS:
        if not _installed("pufferlib"):
            return "pufferlib is not installed (pip install --no-deps pufferlib-core)"
        if not _installed("torch"):
            return "torch is not installed (pufferlib-core imports it)"
    if impl == "subvec_torch" and not _installed("torch"):
        return "torch is not installed"
    if impl == "torchrl_parallel" and not _installed("torchrl"):
        return "torchrl is not installed (pip install torchrl, after torch)"
    module = spec.get("module")
    if module and not _installed(module):
        return f"{module} is not installed"
    if impl in SB3_IMPLS and not _installed("stable_baselines3"):
        return "stable_baselines3 is not installed"
    return None


def machine_busy(seconds: float = 0.5) -> float:
    """Cores busy machine-wide over ``seconds`` (this orchestrator sleeps meanwhile)."""

    def busy() -> float:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")

    b0, t0 = busy(), time.monotonic()
    time.sleep(seconds)
    return (busy() - b0) / (time.monotonic() - t0)


def wait_for_quiet(threshold: float, max_wait: float) -> float:
    """Sleep until other processes use less than ``threshold`` cores; the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < max_wait and machine_busy() > threshold:
        pass
    return time.monotonic() - start


def run_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter and parse its result line."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def sweep(args: Args) -> Path:
    plan = plan_configs(args)
    duration = QUICK_TIMING["duration"] if args.quick else args.duration
    warmup = QUICK_TIMING["warmup"] if args.quick else args.warmup
    repeats = int(QUICK_TIMING["repeats"] if args.quick else args.repeats)
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else None
    tag = args.tag or ("quick" if args.quick else args.plan)
    out_dir = Path(args.out_dir)
    (out_dir / "raw").mkdir(parents=True, exist_ok=True)
    facts = machine_facts(cpus)
    iters_per_us = calibrate(0.05 if args.quick else 0.5)
    facts["busy_iters_per_us"] = iters_per_us
    print(
        f"# {facts['nproc']} CPUs ({facts['usable_cpus']} usable), load {facts['load_avg']}, "
        f"{iters_per_us:.1f} LCG rounds/us",
        flush=True,
    )

    configs = []
    for workload, num_envs, impls in plan:
        spec = workload_spec(workload, iters_per_us)
        for n in num_envs:
            for impl in impls:
                if impl in PROCESS_PER_ENV and n > MAX_ENVS_PROCESS_PER_ENV:
                    continue
                why = available(workload, impl, spec)
                if why:
                    print(f"skip {workload} {impl}: {why}", flush=True)
                    continue
                configs.append((workload, spec, n, impl))

    raw_path = out_dir / "raw" / f"{tag}-runs.jsonl"
    runs: list[dict[str, Any]] = []
    total = len(configs) * repeats
    begin = time.monotonic()
    waited_total = 0.0
    with raw_path.open("w") as raw:
        for rep in range(repeats):
            # interleave: all implementations of one (workload, n) back to back, in an order
            # rotated every repeat so that no implementation always runs first or last
            groups: dict[tuple[str, int], list[tuple[str, dict[str, Any], int, str]]] = {}
            for c in configs:
                groups.setdefault((c[0], c[2]), []).append(c)
            for group in groups.values():
                shift = rep % len(group)
                for workload, spec, n, impl in group[shift:] + group[:shift]:
                    cfg = {
                        "workload": workload,
                        "spec": spec,
                        "impl": impl,
                        "num_envs": n,
                        "duration": duration,
                        "warmup": warmup,
                        "seed": args.seed + rep,
                        "cpus": cpus,
                        "timeout": args.run_timeout,
                    }
                    result: dict[str, Any] = {}
                    waited = 0.0
                    for attempt in range(1 + max(0, args.retries)):
                        patient = args.quiet > 0 and not args.quick
                        patient = patient and waited_total < args.wait_budget
                        if attempt and not patient:
                            break
                        if patient:
                            waited += wait_for_quiet(args.quiet, args.max_wait)
                        trial = run_child(cfg, args.run_timeout)
                        trial["attempts"] = attempt + 1
                        if (
                            not result
                            or "error" in result
                            or ((trial.get("foreign_cpu") or 0) < (result.get("foreign_cpu") or 0))
                        ):
                            result = trial
                        if "error" in trial or (trial.get("foreign_cpu") or 0) <= args.quiet:
                            break
                    result["waited_s"] = waited
                    waited_total += waited
                    run = {
                        "workload": workload,
                        "impl": impl,
                        "num_envs": n,
                        "repeat": rep,
                        **result,
                    }
                    runs.append(run)
                    raw.write(json.dumps(run) + "\n")
                    raw.flush()
                    done = len(runs)
                    rate = run.get("steps_per_s")
                    shown = f"{rate:12,.0f} steps/s" if rate else run.get("error", "?")
                    eta = (time.monotonic() - begin) / done * (total - done)
                    print(
                        f"[{done}/{total} eta {eta / 60:4.1f} min] {workload:>20} "
                        f"n={n:<3} {impl:<12} {shown}",
                        flush=True,
                    )
    facts["duration_s"] = duration
    facts["warmup_s"] = warmup
    facts["repeats"] = repeats
    facts["wall_min"] = (time.monotonic() - begin) / 60
    facts["waited_min"] = waited_total / 60
    summary = summarize(runs)
    path = out_dir / f"{tag}.jsonl"
    with path.open("w") as f:
        f.write(json.dumps({"facts": facts}) + "\n")
        for row in summary:
            f.write(json.dumps(row) + "\n")
    return path


# --- summary, tables, plots -------------------------------------------------------------------

FIELDS = (
    "steps_per_s",
    "p50_us",
    "p99_us",
    "startup_s",
    "worker_uss_mb",
    "worker_pss_mb",
    "parent_uss_mb",
    "parent_cpu",
    "num_workers",
    "load_1m",
    "foreign_cpu",
)


def _median(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per (workload, impl, num_envs), with ratios to AsyncVectorEnv and to the limit."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["workload"], run["impl"], run["num_envs"]), []).append(run)
    rows = []
    for (workload, impl, n), group in groups.items():
        ok = [r for r in group if "error" not in r]
        row: dict[str, Any] = {
            "workload": workload,
            "impl": impl,
            "num_envs": n,
            "runs": len(ok),
            "errors": [r["error"] for r in group if "error" in r],
        }
        for key in FIELDS:
            row[key] = _median([r.get(key) for r in ok])
        row["all_steps_per_s"] = [round(r["steps_per_s"]) for r in ok]
        row["repeats"] = [r.get("repeat") for r in ok]
        rows.append(row)
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``x_async``, ``of_limit`` and ``of_lock_step`` for each row, in place.

    Ratios pair each repeat with the same repeat of the reference: a repeat runs every
    implementation of a configuration back to back, so the pair shares the machine's speed of
    that minute, which drifts by tens of percent on a shared VM. The median of the paired
    ratios is steadier than the ratio of the medians (used for rows without repeat numbers).
    """
    by_key = {(r["workload"], r["impl"], r["num_envs"]): r for r in rows}

    def per_repeat(row: dict[str, Any]) -> dict[Any, float]:
        reps = row.get("repeats") or []
        return {rep: v for rep, v in zip(reps, row.get("all_steps_per_s") or []) if v}

    def ratio(row: dict[str, Any], reference: str) -> float | None:
        ref = by_key.get((row["workload"], reference, row["num_envs"]))
        if ref is None:
            return None
        mine, theirs = per_repeat(row), per_repeat(ref)
        paired = [mine[rep] / theirs[rep] for rep in mine if rep in theirs]
        if paired:
            return statistics.median(paired)
        rate, ref_rate = row["steps_per_s"], ref["steps_per_s"]
        return rate / ref_rate if rate and ref_rate else None

    for row in rows:
        row["x_async"] = ratio(row, "async_shm")
        row["of_limit"] = ratio(row, "limit")
        row["of_lock_step"] = ratio(row, "limit_sync")
        row["of_sync"] = ratio(row, "sync")
        row["of_subvec"] = ratio(row, "subvec")


def load_summary(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    facts = lines[0]["facts"] if lines and "facts" in lines[0] else {}
    rows = [row for row in lines if "facts" not in row]
    for row in rows:
        # Older files lack the repeat numbers; their values are stored in repeat order.
        row.setdefault("repeats", list(range(len(row.get("all_steps_per_s") or []))))
    add_ratios(rows)
    return facts, rows


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value * scale, spec)


#: the project's targets for subvec's defaults: (workload, num_envs, min share of the limit,
#: min ratio to AsyncVectorEnv)
TARGETS = [
    ("cartpole", 16, 0.70, 10.0),
    ("busy100us", 8, 0.90, None),
    ("pong", 8, 0.90, None),
    ("busy1ms", 8, 0.95, None),
]


def targets(facts: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each target that these rows can judge, met or missed."""
    by_key = {(r["workload"], r["impl"], r["num_envs"]): r for r in rows}
    out = []
    one_core = facts.get("usable_cpus") == 1
    if not one_core:
        for workload, n, share, ratio in TARGETS:
            r = by_key.get((workload, "subvec", n))
            if r is None or r["of_limit"] is None:
                continue
            ok = r["of_limit"] >= share and (ratio is None or (r["x_async"] or 0) >= ratio)
            want = f">= {share:.0%} of the limit" + (f", >= {ratio:g}x Async" if ratio else "")
            got = f"{r['of_limit']:.0%} of the limit, {_fmt(r['x_async'], '.1f')}x Async"
            if r.get("of_lock_step"):
                got += f" ({r['of_lock_step']:.0%} of the lock-step limit)"
            out.append(f"| {workload}, {n} envs | {want} | {got} | {'met' if ok else 'MISSED'} |")
    else:
        for (workload, impl, n), r in sorted(by_key.items()):
            rel = r.get("of_sync")
            if impl != "subvec" or not rel:
                continue
            out.append(
                f"| {workload}, {n} envs, one core | >= 90% of SyncVectorEnv | {rel:.0%} of Sync "
                f"| {'met' if rel >= 0.9 else 'MISSED'} |"
            )
    if out:
        out = ["| target | wanted | subvec (defaults) | |", "|---|---|---|---|", *out, ""]
    return out


def markdown(facts: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    order = {impl: k for k, impl in enumerate(ALL_IMPLS)}
    out = []
    if facts:
        out.append(
            f"Machine: {facts.get('nproc')} CPUs ({facts.get('usable_cpus')} usable"
            + (f", pinned to {facts['cpus']}" if facts.get("cpus") else "")
            + f"), {facts.get('cpu_model', '?')}, {facts.get('mem_gib')} GiB, Python "
            f"{facts.get('python')}, load average at start "
            + ", ".join(f"{v:.2f}" for v in facts.get("load_avg") or ())
            + "; "
            f"{facts.get('repeats')} repeats of {facts.get('duration_s')} s (after "
            f"{facts.get('warmup_s')} s warm-up), medians; {facts.get('date')}"
            + (
                f"; the sweep took {facts['wall_min']:.0f} min, {facts['waited_min']:.0f} of "
                "them waiting for other people's processes to leave the cores"
                if "waited_min" in facts
                else ""
            )
            + ".\n"
        )
    goals = targets(facts, rows)
    if goals:
        out.append("### Targets\n")
        out.extend(goals)
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    for workload in workloads:
        sub = [r for r in rows if r["workload"] == workload]
        ns = sorted({r["num_envs"] for r in sub})
        impls = sorted({r["impl"] for r in sub}, key=lambda i: order.get(i, 99))
        out.append(f"### {workload}: env-steps/s (% of the limit)\n")
        out.append("| implementation | " + " | ".join(f"{n} envs" for n in ns) + " |")
        out.append("|---|" + "---:|" * len(ns))
        cells = {(r["impl"], r["num_envs"]): r for r in sub}
        for impl in impls:
            line = [IMPL_LABELS.get(impl, impl)]
            for n in ns:
                r = cells.get((impl, n))
                if r is None or r["steps_per_s"] is None:
                    line.append("-")
                elif impl == "limit":
                    line.append(f"{r['steps_per_s']:,.0f}")
                else:
                    line.append(f"{r['steps_per_s']:,.0f} ({_fmt(r['of_limit'], '.0f', 100)}%)")
            out.append("| " + " | ".join(line) + " |")
        out.append("")
        gym_id = _ALIASES.get(workload, (workload.removeprefix("gym:"), None))[0]
        if any(i in ENVPOOL_IMPLS for i in impls) and gym_id in ENVPOOL_NOTES:
            out.append(ENVPOOL_NOTES[gym_id] + "\n")
        if any(i in PUFFER_IMPLS for i in impls):
            out.append(PUFFER_NOTE + "\n")
    out.append("### Details\n")
    out.append(
        "| workload | impl | envs | workers | env-steps/s | x async | of limit | p50 ms | "
        "p99 ms | startup s | USS MB/worker | PSS MB/worker | parent CPU | "
        "other CPU | runs |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(
        rows,
        key=lambda r: (workloads.index(r["workload"]), r["num_envs"], order.get(r["impl"], 99)),
    ):
        out.append(
            f"| {r['workload']} | {r['impl']} | {r['num_envs']} | {_fmt(r['num_workers'], '.0f')}"
            f" | {_fmt(r['steps_per_s'], ',.0f')} | {_fmt(r['x_async'], '.2f')}"
            f" | {_fmt(r['of_limit'], '.0%')} | {_fmt(r['p50_us'], '.3f', 1e-3)}"
            f" | {_fmt(r['p99_us'], '.3f', 1e-3)} | {_fmt(r['startup_s'], '.2f')}"
            f" | {_fmt(r['worker_uss_mb'], '.1f')} | {_fmt(r['worker_pss_mb'], '.1f')}"
            f" | {_fmt(r['parent_cpu'], '.0%')} | {_fmt(r['foreign_cpu'], '.2f')} | {r['runs']}"
            + (f" ({len(r['errors'])} failed)" if r["errors"] else "")
            + " |"
        )
    return "\n".join(out) + "\n"


STYLES = {
    "subvec": ("tab:red", "-", "o"),
    "subvec_torch": ("darkred", "-", "o"),
    "subvec_w1": ("tab:orange", "-", "s"),
    "subvec_epw1": ("tab:pink", "-", "v"),
    "subvec_core": ("tab:cyan", "-", "<"),
    "sync": ("tab:blue", "--", "^"),
    "async_shm": ("tab:green", "--", "D"),
    "async_pipe": ("tab:olive", "--", "d"),
    "sb3_subproc": ("tab:purple", ":", "P"),
    "sb3_dummy": ("tab:brown", ":", "X"),
    "puffer_mp": ("goldenrod", "-.", "*"),
    "puffer_mp_w1": ("darkkhaki", "-.", "h"),
    "envpool": ("teal", ":", "p"),
    "envpool_cpus": ("darkslategray", ":", "H"),
    "limit_sync": ("gray", "-.", None),
    "limit": ("black", "-.", None),
}


def plot(facts: dict[str, Any], rows: list[dict[str, Any]], img_dir: Path, tag: str) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots", flush=True)
        return []
    img_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    order = {impl: k for k, impl in enumerate(ALL_IMPLS)}
    for workload in dict.fromkeys(r["workload"] for r in rows):
        sub = [r for r in rows if r["workload"] == workload and r["steps_per_s"]]
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        for impl in sorted({r["impl"] for r in sub}, key=lambda i: order.get(i, 99)):
            pts = sorted((r["num_envs"], r["steps_per_s"]) for r in sub if r["impl"] == impl)
            color, style, marker = STYLES.get(impl, ("gray", "-", "."))
            if marker is None and len(pts) == 1:  # a lone point needs a marker to show
                marker = "x"
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                color=color,
                linestyle=style,
                marker=marker,
                linewidth=2.2 if impl in ("subvec", "limit") else 1.4,
                markersize=4,
                label=IMPL_LABELS.get(impl, impl),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("num_envs")
        ax.set_ylabel("env-steps/s")
        cpus = facts.get("usable_cpus", "?")
        ax.set_title(f"{workload} ({cpus} usable CPUs)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
        path = img_dir / f"{tag}-{workload}.png"
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def render(path: Path, args: Args, tag: str) -> None:
    facts, rows = load_summary(path)
    table = markdown(facts, rows)
    md_path = path.with_suffix(".md")
    md_path.write_text(table)
    print(table)
    print(f"wrote {path} and {md_path}")
    if not args.no_plots:
        for png in plot(facts, rows, Path(args.img_dir), tag):
            print(f"wrote {png}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    if args.report:
        path = Path(args.report)
        render(path, args, args.tag or path.stem)
        return
    path = sweep(args)
    render(path, args, args.tag or ("quick" if args.quick else args.plan))


if __name__ == "__main__":
    main()
