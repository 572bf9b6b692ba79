"""The variables ``worker_env=`` gives each worker's environment: what the parameter accepts,
checked at construction (:func:`check_worker_env`), and evaluated per worker in the parent at
each start (:func:`worker_environment`). The worker sets them (``gpus.gpu_environment``,
after its GPU's ``CUDA_VISIBLE_DEVICES`` and before its EGL variables) before its factories are
unpickled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["WorkerEnvSpec", "check_worker_env", "worker_environment"]

#: What ``worker_env=`` accepts: a dict of variables (None: unset it), or a callable taking
#: the worker's ``Placement`` and returning one.
WorkerEnvSpec = Mapping[str, "str | None"] | Callable[[Any], Mapping[str, "str | None"]] | None


def check_worker_env(spec: Any) -> None:
    """Refuse a ``worker_env`` that is neither None, a dict nor a callable (at construction,
    before any worker starts; what it gives is checked per worker by
    :func:`worker_environment`).

    Raises:
        TypeError: another kind of value.
    """
    if spec is not None and not (callable(spec) or isinstance(spec, Mapping)):
        raise TypeError(
            "worker_env must be a dict of environment variables or a callable taking the "
            f"worker's placement and returning one, got {type(spec).__name__}: {spec!r}"
        )


def worker_environment(spec: WorkerEnvSpec, placement: Any) -> dict[str, str | None]:
    """The variables ``worker_env`` gives the worker at ``placement`` (called in the parent).

    Raises:
        TypeError: ``worker_env`` is neither a dict nor a callable, or it gave something other
            than a dict of str keys to str (or None) values; the message names the worker.
    """
    if spec is None:
        return {}
    where = f"worker {placement.worker}"
    if callable(spec):
        env = spec(placement)
        what = f"worker_env({placement!r}) returned"
    else:
        check_worker_env(spec)
        env, what = spec, "worker_env is"
    if not isinstance(env, Mapping):
        raise TypeError(f"{what} {type(env).__name__} for {where}; expected a dict of str to str")
    out: dict[str, str | None] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key:
            raise TypeError(f"{what} a bad variable name {key!r} for {where}")
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise TypeError(
                f"{what} {key}={value!r} ({type(value).__name__}) for {where}; environment "
                "values must be str (or None to unset the variable)"
            )
        out[key] = value
    return out
