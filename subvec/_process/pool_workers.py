"""The worker pool's records and their lifecycle: a worker process with its pipes, what a pool
must release (and :func:`release`, which does it without a reference to the vector env, so it
can serve as that env's ``weakref.finalize`` callback), and reading one worker's replies.
"""

from __future__ import annotations

import select
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from subvec._backend import PLAIN, Failure, Outcome
from subvec._commands import Command, ErrorRecord, Status, rebuild_remote_error
from subvec._process import wire as proto
from subvec._process.shm import SharedBlock
from subvec._process.starts import StartGate
from subvec._process.wake import PIPE_KIND, Bell
from subvec._process.wire import WorkerHello
from subvec.errors import describe_exitcode

__all__ = [
    "DEAD",
    "PLAIN_OK",
    "STALE",
    "STATUSES",
    "TERMINATE_GRACE",
    "Gathered",
    "PoolResources",
    "Reply",
    "Worker",
    "death",
    "decode",
    "discard",
    "drain",
    "read_reply",
    "release",
    "terminate",
    "to_bell",
]

#: After SIGTERM, how long a worker gets before SIGKILL; also the grace of a last-resort close.
TERMINATE_GRACE = 1.0

Reply = tuple[Status, bytes]
#: a reply that is not the one awaited (the late answer to an abandoned command), and EOF
STALE, DEAD = object(), object()
STATUSES = {int(status): status for status in Status}
PLAIN_OK: Reply = (Status.OK, b"")


@dataclass
class Worker:
    index: int
    lo: int  # first global env index
    hi: int  # one past the last
    process: Any  # multiprocessing.process.BaseProcess
    cmd_conn: Connection
    reply_conn: Connection
    #: the seq of its last command, and of the reply still awaited; a worker on the bell
    #: (``on_bell``) keeps both in the Bell's arrays instead (``WorkerPool.seq``)
    seq: int = 0
    expected: int | None = None
    hello: WorkerHello | None = None
    cmd_fd: int = -1  # the raw fds of the two pipes, read once (Connection.fileno() checks)
    reply_fd: int = -1
    #: the process's pid, kept: reports name a replaced worker after its process is closed
    pid: int | None = None
    #: attached with the futex protocol: its commands are announced in the block (``_process.wake``)
    on_bell: bool = False

    def __post_init__(self) -> None:
        self.cmd_fd = self.cmd_conn.fileno()
        self.reply_fd = self.reply_conn.fileno()
        self.pid = self.process.pid

    def describe(self) -> str:
        span = f"env {self.lo}" if self.hi - self.lo == 1 else f"envs {self.lo}..{self.hi - 1}"
        return f"worker {self.index} (pid {self.pid}, {span})"


Gathered = tuple[dict[int, Reply], list[Failure]]


@dataclass
class PoolResources:
    """What must be released, held apart from the vector env so a finalizer can reach it."""

    workers: list[Worker] = field(default_factory=list)
    block: SharedBlock | None = None
    #: the chunk block (``_process.chunks``), once a chunk was stepped
    chunk_block: SharedBlock | None = None
    #: the start tokens (max_concurrent_starts), if any
    gate: StartGate | None = None
    #: the futex protocol's words in the block, if the pool uses it
    bell: Bell | None = None


def release(resources: PoolResources, grace: float = TERMINATE_GRACE) -> None:
    """Stop every worker (bounded: CLOSE, then SIGTERM after ``grace``, then SIGKILL), close the
    pipes and unlink the block. Idempotent. Must not reference the vector env (it is its
    finalizer).

    Ctrl-C (any exception) while waiting for the workers to exit stops the waiting: they are
    killed at once, everything is released, and the exception goes on.
    """
    workers, resources.workers = resources.workers, []
    bell = resources.bell
    try:
        for worker in workers:
            if worker.process.is_alive():
                on_bell = bell is not None and worker.on_bell
                seq = (int(bell.seq[worker.index]) if bell and on_bell else worker.seq) + 1
                try:
                    proto.write_frame(worker.cmd_fd, Command.CLOSE, seq)
                except (OSError, ValueError):
                    pass  # it is dying already; terminate() below makes sure
                if bell is not None and on_bell:
                    bell.cmd[worker.index] = (seq << 8) | PIPE_KIND
        if bell is not None:
            bell.ring(0)
        terminate(workers, grace=grace)
    except BaseException:
        terminate(workers, grace=0.0)
        raise
    finally:
        for worker in workers:
            discard(worker)
        for name in ("block", "chunk_block"):
            block = getattr(resources, name)
            setattr(resources, name, None)
            if block is not None:
                block.close()
        gate, resources.gate = resources.gate, None
        if gate is not None:
            gate.close()
        if bell is not None:
            resources.bell = None
            bell.close()


def discard(worker: Worker) -> None:
    """Close a stopped worker's pipes and its process object (the sentinel's fd, now rather
    than when collected)."""
    worker.cmd_conn.close()
    worker.reply_conn.close()
    try:
        worker.process.close()
    except ValueError:  # still running after SIGKILL + 5 s: leave it to the OS
        pass


def terminate(workers: Sequence[Worker], grace: float) -> None:
    """Join workers within ``grace``; SIGTERM the stragglers, wait ``grace``, then SIGKILL."""
    deadline = time.monotonic() + grace
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
    stragglers = [w for w in workers if w.process.is_alive()]
    for worker in stragglers:
        worker.process.terminate()
    deadline = time.monotonic() + grace
    for worker in stragglers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in stragglers:
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(5.0)


def read_reply(
    worker: Worker, awaited: int | None = -1, head: bytes | None = None
) -> Reply | object:
    """The next frame on ``worker``'s reply pipe: its reply if its seq is ``awaited``
    (default: ``worker.expected``; a worker on the bell keeps it in ``bell.expected``),
    ``STALE`` if not, ``DEAD`` at EOF. ``head``: its first bytes, read already."""
    try:
        if head is None:
            code, seq, payload = proto.read_frame(worker.reply_fd)
        else:
            code, seq, payload = proto.finish_frame(worker.reply_fd, head)
    except (EOFError, OSError):
        return DEAD
    if seq != (worker.expected if awaited == -1 else awaited):
        return STALE
    return STATUSES[code], payload


def drain(worker: Worker, awaited: int | None = -1) -> Reply | object:
    """The sentinel fired; a reply written just before the exit may still be in the pipe
    (``awaited``: as in :func:`read_reply`)."""
    fd = worker.reply_fd
    while select.select([fd], [], [], 0)[0]:
        reply = read_reply(worker, awaited)
        if reply is not STALE:
            return reply
    return DEAD


def death(worker: Worker, what: str) -> Failure:
    """How ``worker`` died (its sentinel fired), as a failure of ``what``."""
    worker.process.join(1.0)  # the sentinel fires slightly before the status is reapable
    exitcode = worker.process.exitcode
    return Failure(
        worker,
        "died",
        f"{worker.describe()} died with {describe_exitcode(exitcode)} while {what}",
        exitcode,
    )


def decode(worker: Worker, reply: Reply) -> Outcome:
    """What ``reply`` says: a plain OK, an error rebuilt from its record, or the payload."""
    status, payload = reply
    if status is Status.OK:
        return PLAIN
    if status is Status.ERROR:
        record: ErrorRecord = proto.loads(payload)
        return status, rebuild_remote_error(record, worker.pid)
    return status, proto.loads(payload)


def to_bell(bell: Bell, worker: Worker) -> None:
    """``worker`` attached under the futex protocol: from now on its seq and awaited seq live
    in ``bell.seq`` and ``bell.expected`` (numpy arrays the usual step updates at once), not
    in the Worker."""
    assert worker.expected is None
    bell.seq[worker.index] = worker.seq
    bell.expected[worker.index] = 0
    worker.on_bell = True
