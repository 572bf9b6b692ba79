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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from subvec.errors import EnvError, RemoteEnvError, RemoteTraceback, add_note

if TYPE_CHECKING:
    from subvec._shm import BlockLayout
    from subvec._topology import PlacementReport

__all__ = [
    "HEADER",
    "AttachSpec",
    "CallPayload",
    "ChunkBlockSpec",
    "ChunkPayload",
    "ChunkReply",
    "Command",
    "ErrorRecord",
    "ResetOptionsPayload",
    "ResetPayload",
    "SetAttrPayload",
    "Status",
    "StepEnvsPayload",
    "StepPayload",
    "WorkerCounters",
    "WorkerHello",
    "decode_step_envs",
    "dumps",
    "encode_step_envs",
    "finish_frame",
    "loads",
    "raise_first",
    "read_frame",
    "rebuild_remote_error",
    "write_frame",
]

HEADER = struct.Struct("<IBI")
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


class Command(IntEnum):
    """Parent -> worker."""

    ATTACH = 1  # payload: AttachSpec; map the shared block, bind the envs' rows
    RESET = 2  # payload: ResetPayload
    STEP = 3  # payload: empty (actions in shared memory, the space's dtypes) or StepPayload
    CALL = 4  # payload: CallPayload; get_attr is CALL of a non-callable
    SET_ATTR = 5  # payload: SetAttrPayload
    CLOSE = 6  # payload: empty; the worker closes its envs, replies, exits
    STEP_ENVS = 7  # payload: encode_step_envs(StepEnvsPayload); some envs (asynchronous)
    STATS = 8  # payload: empty; the reply is a pickled WorkerCounters
    SET_RESET_OPTIONS = 9  # payload: ResetOptionsPayload; the options of later autoresets
    STEP_CHUNK = 10  # payload: ChunkPayload; K sub-steps of every env, results in the chunk block


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


# --- payloads ------------------------------------------------------------------------------


@dataclass
class WorkerHello:
    """READY: where the worker runs and what its envs look like (sent once its envs are built)."""

    placement: PlacementReport
    observation_spaces: list[Any]
    action_spaces: list[Any]
    metadata: dict[str, Any]
    render_mode: str | None
    #: failed attempts of factories that were tried again (``build_retries``; ``_starts``)
    build_failures: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerCounters:
    """STATS: what a worker has done since it started (see ``SubprocVectorEnv.stats``).

    ``busy_s`` is the time from reading a command to having replied to it (the envs' work,
    and the little around it); ``waiting_s`` the time between a reply and the next command.
    """

    env_steps: int  # env.step calls of STEP and STEP_ENVS commands (autoresets included)
    busy_s: float
    waiting_s: float


@dataclass
class AttachSpec:
    """ATTACH: the block and how a worker's envs map onto it (see ``subvec._block``)."""

    block_name: str
    layout: BlockLayout
    num_envs: int
    observation_space: Any  # single space; None when observations travel by value
    action_space: Any  # single space; None when actions travel by value
    #: per worker index: busy-poll for the next command this long before blocking
    spin_us: tuple[float, ...] = ()
    #: send scalar infos as columns (the parent merges them for info_format="gymnasium")
    info_columns: bool = False
    #: SAME_STEP: keep final observations in the block's final-observation rows
    final_obs: bool = False
    #: the block has the info regions: steady scalar infos go there (see _infos)
    info_block: bool = False
    #: how many extra batches of observations the block holds; a cell names the one each
    #: command writes (see ``_block.ObsSlots``)
    obs_slots: int = 0
    #: wake-ups and plain answers go through the block's control regions (``subvec._wake``)
    wake: bool = False


class ChunkBlockSpec(NamedTuple):
    """The chunk block (``_chunks``): its segment's name (None where a backend keeps the
    chunk's arrays itself: Ray), for ``num_envs`` envs and chunks of up to ``capacity``
    sub-steps, with or without observation rows. A unit derives the layout from these and
    its observation space (``_chunks.plan_chunk_block``)."""

    name: str | None
    num_envs: int
    capacity: int
    obs_rows: bool


class ChunkPayload(NamedTuple):
    """STEP_CHUNK: K sub-steps of each of the unit's envs (``EnvSlab.step_chunk``).

    ``actions`` holds the unit's rows of each action leaf, ``(envs, K, *shape)`` in the
    caller's dtype (``_spaces.ChunkBatch``), or is None: the actions are in the chunk block,
    in the space's dtypes. The reply is OK (everything in the blocks) or a
    :class:`ChunkReply`."""

    chunk: int
    stop_on_done: bool
    all_obs: bool
    actions: tuple[Any, ...] | None
    block: ChunkBlockSpec | None


class ChunkReply(NamedTuple):
    """A unit's answer to STEP_CHUNK beyond the blocks: its events ``(local env, sub-step,
    info)``, by-value last observations ``[(local env, obs)]`` (as a step's), by-value
    observations of every sub-step ``[(local env, [obs, ...])]`` (``all_obs`` without
    observation rows), and, where the unit keeps no block rows (Ray), its arrays: ``(rewards,
    terminations, truncations, steps, observations)``, observations batched ``(envs, K,
    ...)`` with ``all_obs``, else ``(envs, ...)``."""

    infos: list[tuple[int, int, dict[str, Any]]]
    obs: list[tuple[int, Any]] | None
    sub_obs: list[tuple[int, list[Any]]] | None = None
    arrays: tuple[Any, ...] | None = None


class ResetPayload(NamedTuple):
    """RESET: one seed per env of the unit, the options (one dict every env gets, or one dict
    or None per env of the unit; None: each env's stored options, see
    :class:`ResetOptionsPayload`), and which envs reset (None: all)."""

    seeds: Sequence[int | None]
    options: dict[str, Any] | Sequence[dict[str, Any] | None] | None
    mask: Sequence[bool] | None
    #: the envs' stored options, one per env, kept before they reset: a replacement (restarted,
    #: rebuilt, recycled) has none yet (None: none are stored)
    stored: Sequence[dict[str, Any] | None] | None = None


class ResetOptionsPayload(NamedTuple):
    """SET_RESET_OPTIONS: the options these envs (local indices) reset with from now on when
    no options are named for them (their autoresets); None clears an env's."""

    envs: Sequence[int]
    options: Sequence[dict[str, Any] | None]


class StepEnvsPayload(NamedTuple):
    """STEP_ENVS: step only these envs (local indices, ascending) with these actions, by
    value, or (None) with the actions in their rows of the block, in the space's dtypes. The
    reply is ``(infos, observations, errors)``: an env that raises is reported in ``errors``
    as ``(local env, ErrorRecord)`` and the others still step."""

    envs: Sequence[int]
    actions: Sequence[Any] | None


#: STEP_ENVS payloads on the wire: the usual one (actions in the block) is its envs' local
#: indices as u16s after a 0 byte, a few bytes built without pickle (pickling the record
#: costs ~5 us, a visible share of an async env-step); one with actions by value is a 1 byte
#: and the pickled record.
_ROWS, _BY_VALUE = b"\x00", b"\x01"
_U16 = struct.Struct("<H")


def encode_step_envs(payload: StepEnvsPayload) -> bytes:
    """A STEP_ENVS payload's bytes (see :func:`decode_step_envs`)."""
    envs = payload.envs
    if payload.actions is None and envs[-1] < 1 << 16:  # ascending: the last is the largest
        if len(envs) == 1:
            return _ROWS + _U16.pack(envs[0])
        return _ROWS + struct.pack(f"<{len(envs)}H", *envs)
    return _BY_VALUE + dumps(payload)


def decode_step_envs(data: bytes | memoryview) -> StepEnvsPayload:
    """The record :func:`encode_step_envs` wrote."""
    if data[:1] == _ROWS:
        count = (len(data) - 1) // 2
        return StepEnvsPayload(list(struct.unpack_from(f"<{count}H", data, 1)), None)
    record: StepEnvsPayload = loads(data[1:])
    return record


class StepPayload(NamedTuple):
    """STEP with something to say (a plain STEP has no payload: the actions are in the block,
    in the action space's dtypes): the actions of the unit's envs by value, or the dtypes
    (``np.dtype.str``, one per action leaf) the parent stored them in the block with."""

    actions: Sequence[Any] | None
    action_dtypes: tuple[str, ...] | None = None


class CallPayload(NamedTuple):
    """CALL: ``env.get_wrapper_attr(name)``, called with the arguments if callable, on the
    unit's envs ``envs`` (local indices, in that order, repeats run again; None: every env).
    The reply holds one result per env called, in that order."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    envs: Sequence[int] | None = None
    #: run ``function(env, *args, **kwargs)`` instead of the attribute ``name`` (the SB3
    #: face's per-env operations: a module-level function, pickled by reference)
    function: Callable[..., Any] | None = None


class SetAttrPayload(NamedTuple):
    """SET_ATTR: one value per env of the unit, or per env of ``envs`` (local indices)."""

    name: str
    values: Sequence[Any]
    envs: Sequence[int] | None = None


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


def raise_first(errors: Sequence[BaseException]) -> None:
    """Raise the first of a call's env errors (lowest env index first), noting the others."""
    if not errors:
        return
    first = errors[0]
    if len(errors) > 1:
        others = ", ".join(
            f"env {getattr(e, 'env_index', '?')}: {type(e).__name__}" for e in errors[1:]
        )
        add_note(first, f"{len(errors) - 1} more env(s) failed in the same call: {others}")
    raise first
