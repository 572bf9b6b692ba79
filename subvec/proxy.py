"""Attribute-style method forwarding: ``subvec.remote(envs).name(*args)``.

``remote(envs).get_t(1)`` is ``envs.call("get_t", 1)``: one result per env, as a tuple. The
rule has no exceptions, so it stays unambiguous: an attribute of the proxy is always a remote
callable, nothing runs until it is called, and calling it runs ``call`` (which, like
gymnasium's, returns the attribute's value when it is not callable: ``remote(envs).t()``).
Names starting with ``_`` are refused, so introspection (``__len__``, ``_repr_html_``, ...)
never reaches the workers. Works with any vector env that has gymnasium's ``call``; with
subvec's, ``remote(envs).get_t(1, env_ids=[0, 3])`` addresses those envs only, as ``call`` does.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["RemoteMethod", "RemoteProxy", "remote"]


class _Callable(Protocol):
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]: ...


class RemoteMethod:
    """``name`` on every env of ``envs``; call it to run ``envs.call(name, ...)``."""

    __slots__ = ("envs", "name")

    def __init__(self, envs: _Callable, name: str) -> None:
        self.envs = envs
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(self.envs.call(self.name, *args, **kwargs))

    def __repr__(self) -> str:
        return f"<remote {self.name!r} of {self.envs!r}>"


class RemoteProxy:
    """Forwards ``proxy.name(*args, **kwargs)`` to ``envs.call("name", *args, **kwargs)``."""

    __slots__ = ("_envs",)
    _envs: _Callable

    def __init__(self, envs: _Callable) -> None:
        if not callable(getattr(envs, "call", None)):
            raise TypeError(f"remote() needs a vector env with a call() method, got {envs!r}")
        object.__setattr__(self, "_envs", envs)

    def __getattr__(self, name: str) -> RemoteMethod:
        if name.startswith("_"):
            raise AttributeError(
                f"remote proxies do not forward private names ({name!r}); use "
                f"envs.call({name!r}, ...)"
            )
        return RemoteMethod(self._envs, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"remote proxies are read-only; to set {name!r} on every env use "
            f"envs.set_attr({name!r}, value) (a list gives one value per env)"
        )

    def __repr__(self) -> str:
        return f"RemoteProxy({self._envs!r})"


def remote(envs: _Callable) -> RemoteProxy:
    """An attribute-style proxy of ``envs``: ``remote(envs).name(x) == envs.call("name", x)``."""
    return RemoteProxy(envs)
