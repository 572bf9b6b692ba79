"""make_vec: one line from an env id (or a callable) to a :class:`SubprocVectorEnv`.

Mirrors ``gymnasium.make_vec`` with subvec's options as plain keyword arguments::

    envs = subvec.make_vec("CartPole-v1", 16, seed=0, num_workers=4)
    obs, infos = envs.reset()          # the same as reset(seed=0): env i gets seed 0 + i

The id is resolved in the parent, so an unknown id fails here (with gymnasium's suggestions)
instead of in every worker, and envs registered only in the caller's script still build in
workers that never ran it (the resolved ``EnvSpec`` travels with the factory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from subvec._kwargs import check_kwargs, options_of
from subvec.vector import SubprocVectorEnv

if TYPE_CHECKING:
    from subvec.ray import RayVectorEnv

__all__ = ["BACKENDS", "VECTOR_KWARGS", "EnvFactory", "backend_kwargs", "check_kwargs", "make_vec"]

#: ``make_vec(..., backend=)``: worker processes on this machine, or Ray actors (each holding
#: worker processes) across a cluster
BACKENDS = ("process", "ray")


#: The options ``make_vec`` passes on to :class:`SubprocVectorEnv`.
VECTOR_KWARGS: tuple[str, ...] = options_of(SubprocVectorEnv)


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")


def backend_kwargs(backend: str) -> tuple[str, ...]:
    """The options of ``backend``'s vector env class (``"ray"`` imports ray)."""
    _check_backend(backend)
    if backend == "ray":
        from subvec.ray import RayVectorEnv

        return options_of(RayVectorEnv)
    return VECTOR_KWARGS


# Arguments people bring from gymnasium.make_vec or SubprocVectorEnv, and what to do instead.
_MAKE_VEC_HINTS = {
    "vectorization_mode": "subvec always runs the envs in worker processes; drop it",
    "vector_kwargs": "pass SubprocVectorEnv's options directly, e.g. make_vec(id, 8, "
    "num_workers=2)",
    "env_fns": "make_vec builds the env factories itself; to pass your own list, call "
    "subvec.SubprocVectorEnv(env_fns, ...)",
    "kwargs": "pass the env constructor's arguments as env_kwargs={...}",
}


class EnvFactory:
    """Picklable factory: ``gym.make(spec, **env_kwargs)`` or ``fn(**env_kwargs)``, then the
    wrappers in order. Usable directly as an entry of ``SubprocVectorEnv(env_fns)``."""

    def __init__(
        self,
        target: EnvSpec | Callable[..., gym.Env[Any, Any]],
        env_kwargs: Mapping[str, Any] | None = None,
        wrappers: Sequence[Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]] = (),
    ) -> None:
        self.target = target
        self.env_kwargs = dict(env_kwargs or {})
        self.wrappers = tuple(wrappers)

    def __call__(self) -> gym.Env[Any, Any]:
        if isinstance(self.target, EnvSpec):
            env = gym.make(self.target, **self.env_kwargs)
        else:
            env = self.target(**self.env_kwargs)
            if not isinstance(env, gym.Env):
                raise TypeError(
                    f"{self.target!r} returned {type(env).__name__}, not a gymnasium.Env; "
                    "make_vec needs a callable that builds one env"
                )
        for wrapper in self.wrappers:
            env = wrapper(env)
        return env

    def __repr__(self) -> str:
        target = self.target.id if isinstance(self.target, EnvSpec) else self.target
        return f"EnvFactory({target!r}, env_kwargs={self.env_kwargs}, wrappers={self.wrappers})"


def _resolve_spec(env_id: str | EnvSpec) -> EnvSpec:
    if isinstance(env_id, EnvSpec):
        return env_id
    # gymnasium.make's own lookup: imports "module:" prefixes, picks the latest version of an
    # unversioned id, raises NameNotFound/VersionNotFound with suggestions.
    from gymnasium.envs.registration import _find_spec

    return _find_spec(env_id)


def make_vec(
    env_id_or_callable: str | EnvSpec | Callable[..., gym.Env[Any, Any]],
    num_envs: int,
    *,
    seed: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]] | None = None,
    backend: str = "process",
    **vector_kwargs: Any,
) -> SubprocVectorEnv | RayVectorEnv:
    """Build ``num_envs`` copies of an env in worker processes, as ``gymnasium.make_vec`` would.

    Args:
        env_id_or_callable: a registered id (``"CartPole-v1"``, ``"module:Env-v0"``), an
            ``EnvSpec``, or a callable returning an env (an env class works).
        num_envs: how many envs.
        seed: seeds the first ``reset()`` that is given no seed (env i gets ``seed + i``,
            exactly as ``reset(seed=seed)``) and the action spaces (``action_space`` and
            ``single_action_space``). ``None``: each env draws its own entropy.
        env_kwargs: keyword arguments of ``gym.make(id, ...)`` or of the callable.
        wrappers: callables ``env -> env`` applied to every env, in order.
        backend: ``"process"`` (a :class:`SubprocVectorEnv`) or ``"ray"`` (a
            :class:`subvec.ray.RayVectorEnv`: Ray actors, each holding worker processes;
            needs ``pip install "subvec[ray]"``).
        **vector_kwargs: options of the backend's class (``num_workers``, ``autoreset_mode``,
            ``info_format``, ``context``, ...; for Ray ``num_actors``, ``address``, ...);
            anything else is rejected with a message saying what to change.

    Returns:
        A :class:`SubprocVectorEnv` or a ``RayVectorEnv`` (its ``spec`` records the env id
        and kwargs).
    """
    _check_backend(backend)
    cls_name = "RayVectorEnv" if backend == "ray" else "SubprocVectorEnv"
    check_kwargs(
        vector_kwargs,
        backend_kwargs(backend),
        "make_vec()",
        hints=_MAKE_VEC_HINTS,
        otherwise=f"not an option of {cls_name}; if it is for the env constructor, "
        "pass env_kwargs={{{name!r}: ...}}",
    )
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(
            f"seed must be an int or None, got {seed!r}; for one seed per env, call "
            "envs.reset(seed=[...]) instead"
        )
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise TypeError(f"env_kwargs must be a dict, got {type(env_kwargs).__name__}")
    wrappers = list(wrappers or ())
    for i, wrapper in enumerate(wrappers):
        if not callable(wrapper):
            raise TypeError(f"wrappers[{i}] must be a callable env -> env, got {wrapper!r}")

    spec: EnvSpec | None = None
    if isinstance(env_id_or_callable, (str, EnvSpec)):
        spec = _resolve_spec(env_id_or_callable)
        factory = EnvFactory(spec, env_kwargs, wrappers)
    elif callable(env_id_or_callable):
        factory = EnvFactory(env_id_or_callable, env_kwargs, wrappers)
    else:
        raise TypeError(
            "env_id_or_callable must be a registered env id, an EnvSpec or a callable "
            f"returning an env, got {env_id_or_callable!r}"
        )

    envs: SubprocVectorEnv | RayVectorEnv
    if backend == "ray":
        from subvec.ray import RayVectorEnv

        envs = RayVectorEnv([factory] * num_envs, **vector_kwargs)
    else:
        envs = SubprocVectorEnv([factory] * num_envs, **vector_kwargs)
    if spec is not None:
        # As gymnasium.make_vec records it: the env's kwargs, and num_envs when not 1.
        kwargs = {**spec.kwargs, **(env_kwargs or {})}
        if num_envs != 1:
            kwargs["num_envs"] = num_envs
        envs.spec = dataclasses.replace(spec, kwargs=kwargs)
    if seed is not None:
        envs.seed_first_reset(seed)
        envs.action_space.seed(seed)
        envs.single_action_space.seed(seed)
    return envs
