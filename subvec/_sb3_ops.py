"""Per-env operations for the Stable-Baselines3 face, run inside the worker processes.

SB3's ``VecEnv`` addresses single envs (``env_method("f", indices=[2])``), checks wrappers
(``env_is_wrapped(Monitor)``) and sets attributes its own way (``setattr`` on the outermost
wrapper, where gymnasium's ``set_wrapper_attr`` sets the innermost layer that has it). The SB3
face has the core run :func:`run_op` on the envs of ``indices`` only (a CALL that names the
envs; only the workers holding them get it, repeated indices run again)::

    parent (subvec.sb3)                          worker holding env 2
    _call_envs(run_op, (Op.ENV_METHOD,     ──►   for env 2: unpickle the arguments (a copy
               pickle(("f", args, kw))),         per env, as one process per env gives),
               env_ids=[2])                      run_op -> its result
    the results, in the order of indices   ◄──

This module must stay importable without Stable-Baselines3 or torch: workers unpickle the
factories that reference it, and a worker should not pay for torch unless its env needs it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import cloudpickle
import gymnasium as gym

__all__ = ["Op", "SB3EnvFactory", "class_path", "run_op"]


class Op(enum.Enum):
    """What :func:`run_op` can do to one env, mirroring SB3's SubprocVecEnv worker."""

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


def run_op(env: gym.Env[Any, Any], op: Op, payload: bytes) -> Any:
    """Run ``op`` on ``env`` with the arguments pickled in ``payload``: the function the SB3
    face has the core call on each targeted env (``VectorFront._call_envs``).

    The arguments are unpickled here, per env and per call: each env gets its own copy of them,
    as with one process per env, even when several envs share a worker.
    """
    return _OPS[op](env, *cloudpickle.loads(payload))


class SB3EnvFactory:
    """Picklable env factory: builds the user's env, converting old ``gym`` envs the way SB3
    does (``_patch_env``, via shimmy); SB3 is only imported in the worker for those."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __call__(self) -> gym.Env[Any, Any]:
        env: Any = self.fn()
        if not isinstance(env, gym.Env):
            from stable_baselines3.common.vec_env.patch_gym import _patch_env

            env = _patch_env(env)
        return env  # type: ignore[no-any-return]
