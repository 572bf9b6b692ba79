"""The vectoriser axis: every way of building a vector env that must match SyncVectorEnv.

Each entry of :data:`VECTORISERS` is either the constructor kwargs of SubprocVectorEnv (a
worker layout, a start method, a transport, a spin setting) or a factory callable
``(env_fns, **kwargs) -> VectorEnv`` for another backend: ``in_process``, the front over the
parent's own envs and nothing else (no process, no pipe, no shared segment: the contract
alone, a few milliseconds a step), and ``ray``, RayVectorEnv on two actors. The kwargs a test
passes (``autoreset_mode``, ``info_format``) go to the factory on top of the entry's own.

tests/test_conformance.py runs every entry but those of :data:`NEEDS_RAY`; those run in
tests/test_ray.py, on the Ray that module starts (127.0.0.1) and checks for leftovers, and
only where ray is installed. Which cases of the product each entry runs by default (the rest
under ``-m slow``) is decided in tests/test_conformance.py (``default_cases``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gymnasium.vector import VectorEnv

from subvec import SubprocVectorEnv
from subvec._inproc import InProcessVectorEnv

VectorFactory = Callable[..., VectorEnv]  # (gymnasium 0.29's VectorEnv is not generic)

VECTORISERS: dict[str, Mapping[str, Any] | VectorFactory] = {
    # several envs per worker, uneven (5 envs: 2, 2, 1)
    "workers": {"envs_per_worker": 2},
    "one_per_worker": {"envs_per_worker": 1},
    "single_worker": {"num_workers": 1},
    # the parent steps the last two envs itself
    "parent_envs": {"num_workers": 1, "parent_envs": 2},
    # observations pickled through the reply pipes instead of the shared block
    "pipes": {"num_workers": 2, "shared_memory": False},
    "fork": {"num_workers": 2, "context": "fork"},
    "spawn": {"num_workers": 2, "context": "spawn"},
    "forkserver": {"num_workers": 2, "context": "forkserver"},
    "spinning": {"num_workers": 2, "spin_us": 200},
    "no_spin": {"num_workers": 2, "spin_us": 0},
    # every env in this process: the front's contract without any transport
    "in_process": InProcessVectorEnv,
    "ray": lambda env_fns, **kwargs: _ray_vector_env(env_fns, **kwargs),
}


def _ray_vector_env(env_fns: Sequence[Callable[[], Any]], **kwargs: Any) -> VectorEnv:
    from subvec.ray import RayVectorEnv  # ray is optional: imported where a case runs on it

    return RayVectorEnv(env_fns, num_actors=2, local_workers=1, start_timeout=30, **kwargs)


#: Entries that run on Ray (tests/test_ray.py runs them, on its module's local Ray).
NEEDS_RAY = frozenset({"ray"})
#: The process backend's entries: SubprocVectorEnv's kwargs.
PROCESS = tuple(name for name, entry in VECTORISERS.items() if not callable(entry))

#: Vectorisers that take seconds to start (a fresh interpreter per worker): few default cases.
SLOW_TO_START = frozenset({"spawn"})

#: Constructor kwargs that SubprocVectorEnv reports back as attributes of the same name.
_REPORTED = ("num_workers", "parent_envs", "shared_memory", "context", "spin_us")


def vector_factory(name: str) -> VectorFactory:
    """The factory ``(env_fns, **kwargs) -> VectorEnv`` of ``VECTORISERS[name]``."""
    entry = VECTORISERS[name]
    if callable(entry):
        return entry
    return functools.partial(SubprocVectorEnv, **entry)


def make_vector_env(name: str, env_fns: Sequence[Callable[[], Any]], **kwargs: Any) -> VectorEnv:
    """Build ``env_fns`` with vectoriser ``name``."""
    return vector_factory(name)(list(env_fns), **kwargs)


def check_built_as_asked(name: str, envs: VectorEnv) -> None:
    """Assert that the settings of a kwargs entry took effect (a vectoriser that quietly fell
    back to a default would otherwise test the default twice). Factories check nothing."""
    entry = VECTORISERS[name]
    if callable(entry):
        return
    for key in _REPORTED:
        if key in entry:
            assert getattr(envs, key) == entry[key], (name, key, getattr(envs, key))
    if "envs_per_worker" in entry:
        local = getattr(envs, "parent_envs", 0)
        want = -(-(envs.num_envs - local) // entry["envs_per_worker"])
        assert envs.num_workers == want, (name, envs.num_workers, want)
