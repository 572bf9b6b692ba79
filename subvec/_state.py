"""The front's call states, shared by the front and its mixins (``_calls``, ``_chunk_front``)."""

from __future__ import annotations

import enum

__all__ = ["_ASYNC_NAME", "_WAITING", "_State"]


class _State(enum.Enum):
    IDLE = "idle"
    WAITING_RESET = "reset"
    WAITING_STEP = "step"
    WAITING_CALL = "call"
    WAITING_CHUNK = "step_chunk"
    ASYNC = "async"  # envs in flight or held (see _async)
    BROKEN = "broken"


_WAITING = {state: f"waiting for {state.value}" for state in _State}
_ASYNC_NAME = {
    _State.WAITING_RESET: "reset_async",
    _State.WAITING_STEP: "step_async",
    _State.WAITING_CALL: "call_async",
    _State.WAITING_CHUNK: "step_chunk",
}
