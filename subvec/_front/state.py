"""The front's call states, shared by the front and its components (``_front.stepping``,
``_front.calls``, ``_front.chunk``, ``_front.recycle``), and the weak hooks its components call it
back through."""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from gymnasium.error import AlreadyPendingCallError

__all__ = ["_ASYNC_NAME", "_WAITING", "_State", "pending_call", "weak_method"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


class _State(enum.Enum):
    IDLE = "idle"
    WAITING_RESET = "reset"
    WAITING_STEP = "step"
    WAITING_CALL = "call"
    WAITING_CHUNK = "step_chunk"
    ASYNC = "async"  # envs in flight or held (see _front.stepping)
    #: a lock-step call was interrupted (Ctrl-C) while units ran it: the next call waits for
    #: them first (``VectorFront._settle_interrupted``)
    INTERRUPTED = "interrupted"
    BROKEN = "broken"
    SUSPENDED = "suspended"  # the units ended by suspend() (see _front.suspend)


_WAITING = {state: f"waiting for {state.value}" for state in _State}
_ASYNC_NAME = {
    _State.WAITING_RESET: "reset_async",
    _State.WAITING_STEP: "step_async",
    _State.WAITING_CALL: "call_async",
    _State.WAITING_CHUNK: "step_chunk",
}


def pending_call(method: str, state: _State) -> AlreadyPendingCallError:
    """The error of calling ``method`` while the call of ``state`` is pending (gymnasium's
    wording and argument)."""
    return AlreadyPendingCallError(
        f"Calling `{method}` while waiting for a pending call to `{state.value}` to complete",
        str(state.value),
    )


def weak_method(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """``method`` (a bound method of the front) without a strong reference to the front.

    A component the front owns that kept the bound method would close a reference cycle: a
    vector env dropped unclosed would wait for the cycle collector, its workers held all that
    time, instead of being freed by its reference count.

    Raises:
        ReferenceError: (when called) the front is gone.
    """
    ref = weakref.WeakMethod(method)
    name = method.__qualname__

    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        bound = ref()
        if bound is None:
            raise ReferenceError(f"{name}: the vector env it belongs to was freed")
        return bound(*args, **kwargs)

    return call
