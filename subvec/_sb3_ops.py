"""Per-env operations for the Stable-Baselines3 face, run inside the worker processes.

SB3's ``VecEnv`` addresses single envs (``env_method("f", indices=[2])``), checks wrappers
(``env_is_wrapped(Monitor)``) and sets attributes its own way (``setattr`` on the outermost
wrapper). The core's ``call(name, *args)`` runs the attribute ``name`` of *every* env, so each
env built for the SB3 face carries one extra attribute, :data:`OPS_ATTR`: an :class:`EnvOps`
that knows its env and the env's global index. ``call(OPS_ATTR, op, targets, payload)`` then
runs ``op`` on the targeted envs only; the others answer ``None`` at once::

    parent (subvec.sb3)                          worker, for each of its envs
    call(OPS_ATTR, Op.ENV_METHOD,          ──►   env.get_wrapper_attr(OPS_ATTR) -> EnvOps
         {2: 1}, pickle(("f", args, kw)))        index 2 targeted once: unpickle args (a copy
                                                 per env, as one-process-per-env SB3 gives),
    per-env lists, reassembled in          ◄──   run op -> [result]; other envs -> None
    the order of ``indices``

This module must stay importable without Stable-Baselines3 or torch: workers unpickle the
factories that reference it, and a worker should not pay for torch unless its env needs it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle
import gymnasium as gym

__all__ = ["OPS_ATTR", "EnvOps", "Op", "OpsFactory", "class_path"]

#: The attribute every env of a ``subvec.sb3.SubprocVecEnv`` carries.
OPS_ATTR = "_subvec_ops"


class Op(enum.Enum):
    """What :class:`EnvOps` can do to one env, mirroring SB3's SubprocVecEnv worker."""

    GET_ATTR = "get_attr"
    HAS_ATTR = "has_attr"
    SET_ATTR = "set_attr"
    ENV_METHOD = "env_method"
    IS_WRAPPED = "is_wrapped"


def class_path(cls: type) -> str:
    """``module.QualName`` of a class: how a wrapper class is named on the wire.

    Sending the name instead of the class keeps ``env_is_wrapped(Monitor)`` from importing
    Stable-Baselines3 (and torch) into workers whose envs never use it, and still matches
    classes defined in ``__main__`` or inside functions, which cloudpickle would copy by value
    (so an ``isinstance`` against the copy would always be False).
    """
    return f"{cls.__module__}.{cls.__qualname__}"


def _get_attr(env: gym.Env[Any, Any], name: str) -> Any:
    return env.get_wrapper_attr(name)


def _has_attr(env: gym.Env[Any, Any], name: str) -> bool:
    try:
        env.get_wrapper_attr(name)
    except AttributeError:
        return False
    return True


def _set_attr(env: gym.Env[Any, Any], name: str, value: Any) -> None:
    # SB3's semantics, kept on purpose: set on the outermost wrapper (DummyVecEnv and
    # SubprocVecEnv both do setattr(env, name, value)); gymnasium's set_wrapper_attr would
    # instead set the innermost layer that already has the attribute.
    setattr(env, name, value)


def _env_method(
    env: gym.Env[Any, Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    return env.get_wrapper_attr(name)(*args, **kwargs)


def _is_wrapped(env: gym.Env[Any, Any], path: str) -> bool:
    # SB3's env_util.is_wrapped: only wrapper layers count, not the base env.
    layer: Any = env
    while isinstance(layer, gym.Wrapper):
        if any(class_path(cls) == path for cls in type(layer).__mro__):
            return True
        layer = layer.env
    return False


_OPS: dict[Op, Callable[..., Any]] = {
    Op.GET_ATTR: _get_attr,
    Op.HAS_ATTR: _has_attr,
    Op.SET_ATTR: _set_attr,
    Op.ENV_METHOD: _env_method,
    Op.IS_WRAPPED: _is_wrapped,
}


class EnvOps:
    """Bound to one env and its global index; called through the core's ``call``."""

    __slots__ = ("env", "index")

    def __init__(self, env: gym.Env[Any, Any], index: int) -> None:
        self.env = env
        self.index = index

    def __call__(self, op: Op, targets: Mapping[int, int] | None, payload: bytes) -> Any:
        """Run ``op`` once per time this env is targeted (``targets``: env index -> count;
        ``None``: every env once). Returns a list of results, or ``None`` if not targeted."""
        times = 1 if targets is None else targets.get(self.index, 0)
        if not times:
            return None
        fn = _OPS[op]
        results = []
        for _ in range(times):
            # Unpickled per env and per call: each env gets its own copy of the arguments, as
            # with one process per env, even when several envs share a worker.
            args = cloudpickle.loads(payload)
            results.append(fn(self.env, *args))
        return results


class _OpsCarrier(gym.Wrapper[Any, Any, Any, Any]):
    """Used only when an env refuses new attributes (``__slots__``, a custom ``__setattr__``)."""


class OpsFactory:
    """Picklable env factory: builds the user's env and gives it an :class:`EnvOps`.

    Old ``gym`` envs are converted the way SB3 does (``_patch_env``, via shimmy); SB3 is only
    imported in the worker for those.
    """

    def __init__(self, fn: Callable[[], Any], index: int) -> None:
        self.fn = fn
        self.index = index

    def __call__(self) -> gym.Env[Any, Any]:
        env: gym.Env[Any, Any] = self.fn()
        if not isinstance(env, gym.Env):
            from stable_baselines3.common.vec_env.patch_gym import _patch_env

            env = _patch_env(env)
        try:
            setattr(env, OPS_ATTR, EnvOps(env, self.index))
        except (AttributeError, TypeError):
            env = _OpsCarrier(env)
            setattr(env, OPS_ATTR, EnvOps(env, self.index))
        return env
