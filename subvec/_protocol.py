"""The wire protocol between the parent and its workers. Both sides import this module and no
command literal exists anywhere else.

Each worker owns two simplex pipes: commands (parent -> worker) and replies (worker -> parent).
Every message is one frame::

    | payload length: u32 | code: u8 | seq: u32 | payload: bytes |

``code`` is a :class:`Command` on the command pipe and a :class:`Status` on the reply pipe.
``seq`` is the parent's per-worker command counter, echoed in the reply, so that a reply to a
command the parent stopped waiting for (after a timeout or an interrupt) is recognised and
dropped instead of being taken for the answer to a later command.

The hot path is a STEP frame with an empty payload (actions are in shared memory) answered by
an OK frame with an empty payload (observations, rewards and flags are in shared memory): nine
bytes each way and no pickling. We frame raw file descriptors ourselves because
``Connection.send_bytes``/``recv_bytes`` cost two system calls per message and measured about
twice the round-trip of ``os.write``/``os.read`` (see docs/design.md).
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import traceback
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from subvec.errors import EnvError, RemoteEnvError, RemoteTraceback

__all__ = [
    "HEADER",
    "Command",
    "ErrorRecord",
    "Status",
    "dumps",
    "finish_frame",
    "loads",
    "read_frame",
    "rebuild_remote_error",
    "write_frame",
]

HEADER = struct.Struct("<IBI")
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


class Command(IntEnum):
    """Parent -> worker."""

    ATTACH = 1  # payload: ShmAttach; map the shared block, build views
    RESET = 2  # payload: (seeds, options, mask)
    STEP = 3  # payload: empty (actions in shared memory) or pickled per-env actions
    CALL = 4  # payload: (name, args, kwargs); get_attr is CALL of a non-callable
    SET_ATTR = 5  # payload: (name, values)
    CLOSE = 6  # payload: empty; the worker closes its envs, replies, exits
    PING = 7  # payload: empty; liveness/ordering barrier used by tests and recovery


class Status(IntEnum):
    """Worker -> parent."""

    OK = 0  # empty payload
    OK_PAYLOAD = 1  # pickled payload (infos, pipe-carried observations, call results)
    ERROR = 2  # pickled ErrorRecord
    READY = 3  # handshake after the envs are built: pickled WorkerHello


def dumps(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)


def loads(data: bytes | memoryview) -> Any:
    return pickle.loads(data)


def write_frame(fd: int, code: int, seq: int, payload: bytes = b"") -> None:
    """Write one frame. One writer per pipe, so frames never interleave."""
    data = HEADER.pack(len(payload), code, seq) + payload if payload else HEADER.pack(0, code, seq)
    written = os.write(fd, data)
    if written < len(data):  # only for frames beyond the pipe's capacity (PIPE_BUF and up)
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


def _read_exact(fd: int, size: int) -> bytes:
    chunk = os.read(fd, size)
    if len(chunk) == size:
        return chunk
    if not chunk:
        raise EOFError("pipe closed")
    parts = [chunk]
    remaining = size - len(chunk)
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            raise EOFError("pipe closed mid-frame")
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def read_frame(fd: int) -> tuple[int, int, bytes]:
    """Read one frame: (code, seq, payload). Raises EOFError when the writer is gone."""
    return finish_frame(fd, os.read(fd, HEADER.size))


def finish_frame(fd: int, head: bytes) -> tuple[int, int, bytes]:
    """Read the rest of a frame whose first bytes, ``head``, were read already (the per-step
    paths read a header and compare it with the one they expect before parsing anything)."""
    if len(head) < HEADER.size:
        if not head:
            raise EOFError("pipe closed")
        head += _read_exact(fd, HEADER.size - len(head))
    length, code, seq = HEADER.unpack(head)
    payload = _read_exact(fd, length) if length else b""
    return code, seq, payload


# --- remote errors -------------------------------------------------------------------------


@dataclass
class ErrorRecord:
    """An exception raised in a worker, in a form that always pickles."""

    pickled: bytes | None  # the exception itself when it pickles (keeps type and attributes)
    type_module: str
    type_qualname: str
    message: str
    traceback_text: str
    env_index: int | None
    command: str

    @classmethod
    def capture(cls, exc: BaseException, env_index: int | None, command: str) -> ErrorRecord:
        tb_text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        pickled: bytes | None = None
        try:
            data = dumps(exc)
            loads(data)  # some exceptions pickle but fail to unpickle (custom __init__)
            pickled = data
        except Exception:
            pass  # sent without it: type name, message and traceback text still go
        return cls(
            pickled=pickled,
            type_module=type(exc).__module__,
            type_qualname=type(exc).__qualname__,
            message=str(exc),
            traceback_text=tb_text,
            env_index=env_index,
            command=command,
        )


_remote_classes: dict[type[BaseException], type[BaseException]] = {}


def _remote_class(base: type[BaseException]) -> type[BaseException] | None:
    """A subclass of both ``base`` and EnvError, cached so ``except`` and ``type()`` are stable."""
    if issubclass(base, EnvError):
        return base
    if base in _remote_classes:
        return _remote_classes[base]

    def __str__(self: BaseException) -> str:
        inner = base.__str__(self)
        where = (
            f"env {getattr(self, 'env_index', '?')} (worker pid {getattr(self, 'worker_pid', '?')})"
        )
        return f"{inner} [raised in {where} during {getattr(self, 'command', '?')}]"

    def __reduce__(self: BaseException) -> tuple[Any, ...]:
        return (_rebuild_pickled, (base, self.args, dict(self.__dict__)))

    try:
        cls = type(base.__name__, (base, EnvError), {"__str__": __str__, "__reduce__": __reduce__})
    except TypeError:  # layout conflict or a final class: fall back to RemoteEnvError
        return None
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    _remote_classes[base] = cls
    return cls


def _rebuild_pickled(
    base: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException:
    cls = _remote_class(base) or RemoteEnvError
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def _import_type(module: str, qualname: str) -> type[BaseException] | None:
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return obj
    return None


def rebuild_remote_error(record: ErrorRecord, worker_pid: int | None) -> BaseException:
    """Turn a worker's ErrorRecord into an exception of the original type that is also an
    EnvError, naming the env and worker, with the remote traceback as ``__cause__``."""
    original: BaseException | None = None
    if record.pickled is not None:
        try:
            original = loads(record.pickled)
        except Exception:
            original = None
    if original is not None:
        base: type[BaseException] | None = type(original)
        args: tuple[Any, ...] = original.args
        state = dict(getattr(original, "__dict__", {}))
    else:
        base = _import_type(record.type_module, record.type_qualname)
        args = (record.message,)
        state = {}
    cls = _remote_class(base) if base is not None else None
    exc: BaseException
    if cls is None:
        exc = RemoteEnvError(f"{record.type_module}.{record.type_qualname}: {record.message}")
    else:
        try:
            exc = cls.__new__(cls, *args)
            exc.args = args
            exc.__dict__.update(state)
        except Exception:
            exc = RemoteEnvError(f"{record.type_module}.{record.type_qualname}: {record.message}")
    exc.env_index = record.env_index  # type: ignore[attr-defined]
    exc.worker_pid = worker_pid  # type: ignore[attr-defined]
    exc.command = record.command  # type: ignore[attr-defined]
    exc.remote_traceback = record.traceback_text  # type: ignore[attr-defined]
    exc.__cause__ = RemoteTraceback(record.traceback_text)
    return exc
