"""The pipe wire between the parent and its worker processes: how the commands of
``subvec._commands`` travel. Both sides import this module for the framing; the commands,
payload records and statuses themselves are ``_commands``', imported from there.

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

import os
import pickle
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from subvec._commands import (
    ChunkBlockSpec,
    StepEnvsPayload,
)
from subvec._process.starts import BuildFailure
from subvec._process.topology import PlacementReport

if TYPE_CHECKING:
    from subvec._process.shm import BlockLayout

__all__ = [
    "HEADER",
    "AttachSpec",
    "WorkerCounters",
    "WorkerHello",
    "decode_step_envs",
    "dumps",
    "encode_step_envs",
    "finish_frame",
    "loads",
    "read_frame",
    "write_frame",
]

# --- the records only workers send ----------------------------------------------------------


@dataclass
class WorkerHello:
    """READY: where the worker runs and what its envs look like (sent once its envs are built)."""

    placement: PlacementReport
    observation_spaces: list[Any]
    action_spaces: list[Any]
    metadata: dict[str, Any]
    render_mode: str | None
    #: failed attempts of factories that were tried again (``build_retries``; ``_process.starts``)
    build_failures: list[BuildFailure] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerCounters:
    """STATS: what a worker has done since it started (see ``SubprocVectorEnv.stats``).

    ``busy_s`` is the time from reading a command to having replied to it (the envs' work,
    and the little around it); ``waiting_s`` the time between a reply and the next command.
    """

    env_steps: int  # env.step calls of STEP and STEP_ENVS commands (autoresets included)
    busy_s: float
    waiting_s: float


# --- framing ---------------------------------------------------------------------------------

HEADER = struct.Struct("<IBI")
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


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


# --- what only the pipes carry -----------------------------------------------------------


@dataclass
class AttachSpec:
    """ATTACH: the block and how a worker's envs map onto it (see ``subvec._process.block``)."""

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
    #: the block has the info regions: scalar infos of a fixed schema go there (see _infos)
    info_block: bool = False
    #: how many extra batches of observations the block holds; a cell names the one each
    #: command writes (see ``_batch.ObsSlots``)
    obs_slots: int = 0
    #: wake-ups and plain answers go through the block's control regions (``subvec._process.wake``)
    wake: bool = False


#: STEP_ENVS payloads on the wire: the usual one (actions in the block) is its envs' local
#: indices as u16s after a 0 byte, a few bytes built without pickle (pickling the record
#: is a visible share of an async env-step); one with actions by value is a 1 byte
#: and the pickled record. An action chunk with its actions in the chunk block, addressing
#: envs ``0..count-1`` (every env of the unit), is a 2 byte, then ``_CHUNK_HEAD`` (count,
#: sub-steps, flags, the block's envs and capacity) and the block's name: a fraction of
#: pickling and unpickling the record, once per worker per chunk.
_ROWS, _BY_VALUE, _CHUNK = b"\x00", b"\x01", b"\x02"
_U16 = struct.Struct("<H")
_CHUNK_HEAD = struct.Struct("<IIBII")
_STOP, _ALL_OBS, _OBS_ROWS = 1, 2, 4


def encode_step_envs(payload: StepEnvsPayload) -> bytes:
    """A STEP_ENVS payload's bytes (see :func:`decode_step_envs`)."""
    envs = payload.envs
    # ascending: the last is the largest; the compact form says one sub-step
    if (
        envs is not None
        and payload.actions is None
        and payload.action_dtypes is None
        and payload.block is None
        and envs[-1] < 1 << 16
    ):
        if len(envs) == 1:
            return _ROWS + _U16.pack(envs[0])
        return _ROWS + struct.pack(f"<{len(envs)}H", *envs)
    block = payload.block
    if (
        payload.actions is None
        and payload.action_dtypes is None
        and block is not None
        and block.name is not None
        and envs is not None
        and type(envs) is range
        and envs.start == 0
        and envs.step == 1
    ):
        flags = (
            (_STOP if payload.stop_on_done else 0)
            | (_ALL_OBS if payload.all_obs else 0)
            | (_OBS_ROWS if block.obs_rows else 0)
        )
        head = _CHUNK_HEAD.pack(len(envs), payload.substeps, flags, block.num_envs, block.capacity)
        return _CHUNK + head + block.name.encode()
    return _BY_VALUE + dumps(payload)


def decode_step_envs(data: bytes | memoryview) -> StepEnvsPayload:
    """The record :func:`encode_step_envs` wrote."""
    kind = data[:1]
    if kind == _ROWS:
        count = (len(data) - 1) // 2
        return StepEnvsPayload(list(struct.unpack_from(f"<{count}H", data, 1)), None)
    if kind == _CHUNK:
        count, substeps, flags, num_envs, capacity = _CHUNK_HEAD.unpack_from(data, 1)
        name = bytes(data[1 + _CHUNK_HEAD.size :]).decode()
        block = ChunkBlockSpec(name, num_envs, capacity, bool(flags & _OBS_ROWS))
        return StepEnvsPayload(
            range(count), None, substeps, bool(flags & _STOP), bool(flags & _ALL_OBS), block
        )
    record: StepEnvsPayload = loads(data[1:])
    return record
