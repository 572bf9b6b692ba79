"""The pipes' per-step round trip for a pool with a partner: the commands written in send
order, one sleep until the partner answers, and the replies read as bytes when every one is a
plain OK (docs/decisions/0009-steady-state-step-path.md). Anything else goes on through the
pool's ``gather``.
"""

from __future__ import annotations

import functools
import os
import select
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from subvec._backend import Failure
from subvec._commands import Command, Status
from subvec._process import wire as proto
from subvec._process.pool_workers import PLAIN_OK, STATUSES, Gathered, PoolResources, Reply, Worker

__all__ = ["Quick", "build_quick", "take_rest"]

#: (round_trip(command, timeout, what, stop_at_death), take(timeout, what, stop_at_death))
Quick = tuple[
    Callable[[Command, "float | None", str, bool], "Gathered | None"],
    Callable[["float | None", str, bool], "Gathered | None"],
]


class WorkerPool(Protocol):
    """What the quick round trip reads of its pool (``_process.pool.WorkerPool``), named here so
    that this module does not import the pool's."""

    resources: PoolResources
    wait_first: int | None
    spin_s: float
    max_active: int | None

    def _send_order(self) -> list[Worker]: ...

    def _partner_poller(self, worker: Worker) -> select.poll: ...

    def _full_poller(self) -> tuple[select.poll, dict[int, tuple[Worker, bool]]]: ...

    def gather(
        self,
        workers: Sequence[Worker],
        timeout: float | None,
        what: str,
        stop_at_death: bool = False,
        *,
        deadline: float | None = None,
    ) -> tuple[dict[int, Reply], list[Failure]]: ...


def build_quick(pool: WorkerPool) -> Quick | None:
    """The per-step round trip as two closures over what it needs, kept until the workers
    change (``_forget_workers``), or None when it does not apply: the parent busy-polls,
    or there is no partner.

    The parent sends the partner its command last and sleeps until the partner (the
    worker on its CPU, or the only worker) answers or anyone dies; the others have
    usually answered by then. If the kept poll object then shows every reply fd readable
    and nothing else, each reply header is read and compared, as bytes, with the plain OK
    it should be. On a cheap env the parent shares its CPU with the partner, so every
    call and attribute lookup here is paid twice: in time, and in the caches and branch
    history the partner finds cold after us (docs/decisions/0009-steady-state-step-path.md:
    these closures against the same steps as methods). Anything else (a reply still to come,
    a payload, an error, a death, a stale or broken frame) goes on through ``gather``
    for the workers still awaited, within the same deadline (:func:`take_rest`).
    """
    workers = list(pool.resources.workers)
    first = pool.wait_first
    if pool.spin_s or first is None or pool.max_active is not None:
        return None
    order = pool._send_order()
    partner_poll = pool._partner_poller(workers[first]).poll
    poller, by_fd = pool._full_poller()
    full_poll = poller.poll
    # What the full poll returns when every reply is in and nothing else happened (poll
    # lists fds in registration order; any other order only costs the slower path).
    all_ready = [(fd, select.POLLIN) for fd, (_, is_reply) in by_fd.items() if is_reply]
    read, write, pack, size = os.read, os.write, proto.HEADER.pack, proto.HEADER.size
    monotonic, ok, rest = time.monotonic, Status.OK, functools.partial(take_rest, pool)

    def take(timeout: float | None, what: str, stop_at_death: bool) -> Gathered | None:
        if timeout is None:
            deadline = None
            events = partner_poll(-1)
        else:
            deadline = monotonic() + timeout
            events = partner_poll(int(timeout * 1000) + 1)
        # With one worker, the partner's own events already say it all (one system call
        # less per step on one CPU); otherwise the full poll shows the others.
        if events != all_ready and full_poll(0) != all_ready:
            return rest(None, b"", timeout, what, stop_at_death, deadline)
        for w in workers:
            head = read(w.reply_fd, size)
            if head != pack(0, ok, w.expected):
                return rest(w, head, timeout, what, stop_at_death, deadline)
            w.expected = None
        return None

    def round_trip(
        command: Command, timeout: float | None, what: str, stop_at_death: bool
    ) -> Gathered | None:
        for w in order:
            seq = w.seq = w.seq + 1
            w.expected = seq
            try:
                write(w.cmd_fd, pack(0, command, seq))
            except OSError:
                pass  # as in send()
        return take(timeout, what, stop_at_death)

    return round_trip, take


def take_rest(
    pool: WorkerPool,
    odd: Worker | None,
    head: bytes,
    timeout: float | None,
    what: str,
    stop_at_death: bool,
    deadline: float | None,
) -> Gathered:
    """The quick read's way out. ``odd`` (None when not every reply was in) sent ``head``,
    which is not a plain OK; the workers before it answered plain OKs. Every reply being
    in, the ones from ``odd`` on are read and parsed here (infos from every env each step
    are common: MuJoCo, Atari); a death, a stale frame or a reply still to come is left
    to ``gather``, within the same deadline."""
    replies: dict[int, Reply] = {}
    workers = pool.resources.workers
    if odd is not None:
        for w in workers[workers.index(odd) :]:
            try:
                if w is not odd:
                    head = os.read(w.reply_fd, proto.HEADER.size)
                code, seq, payload = proto.finish_frame(w.reply_fd, head)
            except (EOFError, OSError):
                break  # gather() sees the EOF again and reports the death
            if seq != w.expected:
                # A stale frame (the late answer to an abandoned call) is dropped;
                # gather() waits for the answer behind it.
                break
            replies[w.index] = (STATUSES[code], payload)
            w.expected = None
    rest = []
    for w in workers:
        if w.expected is None:  # answered: a plain OK unless parsed above
            replies.setdefault(w.index, PLAIN_OK)
        else:
            rest.append(w)
    failures: list[Failure] = []
    if rest:
        more, failures = pool.gather(rest, timeout, what, stop_at_death, deadline=deadline)
        replies.update(more)
    return replies, failures
