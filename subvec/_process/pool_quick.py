"""The pool's per-step round trip over every worker, one object per way of waiting, chosen once
for a set of workers (:func:`build_round`; the futex protocol's is ``pool_bell.BellExchange``):

- :class:`PartnerRound`: the pipes with a partner: the commands written in send order, one
  sleep until the partner answers, and the replies read as bytes when every one is a plain OK
  (docs/decisions/0009-steady-state-step-path.md);
- :class:`PollRound`: the pipes otherwise (the parent busy-polls, no partner, or turns): the
  pool's ``send`` and ``gather``.

Each returns None when every worker answered a plain OK (nothing to decode: the usual step),
whatever the way of waiting. Anything else goes on through the pool's ``gather``.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Sequence
from typing import Any, Protocol

from subvec._backend import Failure
from subvec._commands import Command, Status
from subvec._process import wire as proto
from subvec._process.pool_workers import PLAIN_OK, STATUSES, Gathered, PoolResources, Reply, Worker

__all__ = ["PartnerRound", "PollRound", "Round", "build_round", "plain_or", "take_rest"]


class Round(Protocol):
    """The per-step round trip of a pool over every worker."""

    def exchange(
        self, command: Command, payload: bytes, timeout: float | None, what: str, stop: bool
    ) -> Gathered | None:
        """Send ``command`` with ``payload`` (bytes, the same for every worker) to every
        worker and wait for their replies (``stop``: the first death ends the wait). Returns
        None when every one answered a plain OK."""
        ...

    def gather_all(self, timeout: float | None, what: str, stop: bool) -> Gathered | None:
        """Wait for every worker's awaited reply; None when every one was a plain OK."""
        ...


class WorkerPool(Protocol):
    """What the round trips read of their pool (``_process.pool.WorkerPool``), named here so
    that this module does not import the pool's."""

    resources: PoolResources
    wait_first: int | None
    spin_s: float
    max_active: int | None

    def _send_order(self) -> list[Worker]: ...

    def _partner_poller(self, worker: Worker) -> select.poll: ...

    def _full_poller(self) -> tuple[select.poll, dict[int, tuple[Worker, bool]]]: ...

    def send(self, command: Command, payload: Any = None, *, encoded: bool = False) -> None: ...

    def gather(
        self,
        workers: Sequence[Worker],
        timeout: float | None,
        what: str,
        stop_at_death: bool = False,
        *,
        deadline: float | None = None,
    ) -> tuple[dict[int, Reply], list[Failure]]: ...


def build_round(pool: WorkerPool) -> Round:
    """The pipes' round trip for ``pool``'s workers as they are now: :class:`PartnerRound`
    where it applies (a partner, the parent blocks, no turns), :class:`PollRound` otherwise."""
    if pool.spin_s or pool.wait_first is None or pool.max_active is not None:
        return PollRound(pool)
    return PartnerRound(pool)


class PollRound:
    """The pipes' round trip through the pool's ``send`` and ``gather`` (which busy-polls
    first when the pool spins, and takes turns with ``max_active``).

    Args:
        pool: the pool whose workers it serves.
    """

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    def exchange(
        self, command: Command, payload: bytes, timeout: float | None, what: str, stop: bool
    ) -> Gathered | None:
        """See :class:`Round`."""
        self.pool.send(command, payload, encoded=True)
        return self.gather_all(timeout, what, stop)

    def gather_all(self, timeout: float | None, what: str, stop: bool) -> Gathered | None:
        """See :class:`Round`."""
        pool = self.pool
        return plain_or(*pool.gather(pool.resources.workers, timeout, what, stop))


class PartnerRound:
    """The pipes' round trip with a partner, kept until the workers change (the pool's
    ``_forget_workers``) or its poll objects do.

    The parent sends the partner its command last and sleeps until the partner (the
    worker on its CPU, or the only worker) answers or anyone dies; the others have
    usually answered by then. If the kept poll object then shows every reply fd readable
    and nothing else, each reply header is read and compared, as bytes, with the plain OK
    it should be. On a cheap env the parent shares its CPU with the partner, so every
    call and attribute lookup here is paid twice: in time, and in the caches and branch
    history the partner finds cold after us (docs/decisions/0009-steady-state-step-path.md).
    Anything else (a reply still to come, a payload, an error, a death, a stale or broken
    frame) goes on through ``gather`` for the workers still awaited, within the same
    deadline (:func:`take_rest`).

    Args:
        pool: the pool whose workers it serves.
    """

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.workers = list(pool.resources.workers)
        self.order = pool._send_order()
        self.partner_poll = pool._partner_poller(self.workers[pool.wait_first or 0]).poll
        poller, by_fd = pool._full_poller()
        self.full_poll = poller.poll
        # What the full poll returns when every reply is in and nothing else happened (poll
        # lists fds in registration order; any other order only costs the slower path).
        self.all_ready = [(fd, select.POLLIN) for fd, (_, is_reply) in by_fd.items() if is_reply]

    def exchange(
        self, command: Command, payload: bytes, timeout: float | None, what: str, stop: bool
    ) -> Gathered | None:
        """See :class:`Round`."""
        write, pack = os.write, proto.HEADER.pack
        for w in self.order:
            seq = w.seq = w.seq + 1
            w.expected = seq
            try:
                if payload:
                    proto.write_frame(w.cmd_fd, command, seq, payload)
                else:
                    write(w.cmd_fd, pack(0, command, seq))
            except OSError:
                pass  # EPIPE: as in the pool's send_to
        return self.gather_all(timeout, what, stop)

    def gather_all(self, timeout: float | None, what: str, stop: bool) -> Gathered | None:
        """See :class:`Round`."""
        if timeout is None:
            deadline = None
            events = self.partner_poll(-1)
        else:
            deadline = time.monotonic() + timeout
            events = self.partner_poll(int(timeout * 1000) + 1)
        # With one worker, the partner's own events already say it all (one system call
        # less per step on one CPU); otherwise the full poll shows the others.
        all_ready = self.all_ready
        if events != all_ready and self.full_poll(0) != all_ready:
            return take_rest(self.pool, None, b"", timeout, what, stop, deadline)
        read, pack, size, ok = os.read, proto.HEADER.pack, proto.HEADER.size, Status.OK
        for w in self.workers:
            head = read(w.reply_fd, size)
            if head != pack(0, ok, w.expected):
                return take_rest(self.pool, w, head, timeout, what, stop, deadline)
            w.expected = None
        return None


def plain_or(replies: dict[int, Reply], failures: list[Failure]) -> Gathered | None:
    """None when every reply of a whole-pool wait is a plain OK, else what was gathered."""
    if failures or any(reply != PLAIN_OK for reply in replies.values()):
        return replies, failures
    return None


def take_rest(
    pool: WorkerPool,
    odd: Worker | None,
    head: bytes,
    timeout: float | None,
    what: str,
    stop_at_death: bool,
    deadline: float | None,
) -> Gathered | None:
    """The quick read's way out. ``odd`` (None when not every reply was in) sent ``head``,
    which is not a plain OK; the workers before it answered plain OKs. Every reply being
    in, the ones from ``odd`` on are read and parsed here (infos from every env each step
    are common: MuJoCo, Atari); a death, a stale frame or a reply still to come is left
    to ``gather``, within the same deadline. None when every reply was a plain OK after all
    (the others came in while the partner's was read)."""
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
    return plain_or(replies, failures)
