"""The pipes' side of the worker pool: commands written to each worker's command pipe, replies
waited for on its reply pipe and its process sentinel at once (a death is seen the moment it
happens), for the pools whose workers do not serve the futex protocol (``pool_bell``).

- :class:`PipeWaits` owns the waits: the poll objects kept between them, the parent's spin
  (bounded, while replies come within the window), the partner's sleep, the turns of a
  ``max_active`` pool, and the per-step round trip over every worker, bound once for a set of
  workers (:meth:`PipeWaits.round`);
- the round trips, one object per way of waiting: :class:`PartnerRound`, with a partner: the
  commands written in send order, one sleep until the partner answers, and the replies read as
  bytes when every one is a plain OK (docs/decisions/0009-steady-state-step-path.md);
  :class:`SpinRound` where the parent busy-polls: the same writes and reads, the replies
  looked for without sleeping; :class:`PollRound` otherwise: the same writes (the rounds
  share :meth:`PollRound.exchange`), then :meth:`PipeWaits.gather`; :class:`TurnsRound` with
  ``max_active``: the pool's ``send``, which holds the later workers back for their turns.

Each round trip returns None when every worker answered a plain OK (nothing to decode: the
usual step), whatever the way of waiting; the futex protocol's (``BellExchange``) does the same.
"""

from __future__ import annotations

import os
import select
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from subvec._backend import Failure
from subvec._commands import Command, Status
from subvec._process import wire as proto
from subvec._process.pool_workers import (
    DEAD,
    PLAIN_OK,
    STALE,
    STATUSES,
    Gathered,
    PoolResources,
    Reply,
    Worker,
    death,
    drain,
    read_reply,
)

__all__ = ["PartnerRound", "PipeWaits", "PollRound", "Round", "SpinRound", "TurnsRound"]

#: the pool's ``send`` (a command to every worker, the partner last, in turns where it applies)
Send = Callable[..., None]


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


class PipeWaits:
    """The pool's waits on the pipes; see the module docstring.

    Args:
        resources: the pool's workers (and the rest it releases).
        spin_s: seconds to busy-poll for replies before blocking (0: block at once).
        partner: the worker that shares the parent's CPU (see :meth:`gather`), if any.
        late_spin_s: with a partner, seconds to busy-poll for the other workers' replies
            once the partner has answered (0: block at once).
        max_active: the most workers stepping or resetting at once (None: all); the others
            wait for their turn (:meth:`wait_turn`).
    """

    def __init__(
        self,
        resources: PoolResources,
        spin_s: float,
        partner: int | None,
        late_spin_s: float,
        max_active: int | None,
    ) -> None:
        self.resources = resources
        self.spin_s = spin_s
        self.partner = partner
        self.late_spin_s = late_spin_s
        self.max_active = max_active
        self._poller: tuple[select.poll, dict[int, tuple[Worker, bool]]] | None = None
        self._partner_poller: tuple[Worker, select.poll] | None = None
        #: a moving average of how long a whole-pool gather has been waiting
        self._wait_estimate = 0.0
        #: the per-step round trip over every worker, kept until the workers or the kept poll
        #: objects change (:meth:`round`)
        self.bound: Round | None = None
        #: with ``max_active``: the workers still waiting for their turn at the command being
        #: gathered, with its frame (sent by :meth:`gather` as earlier workers answer)
        self._turns: deque[tuple[Worker, Command, bytes]] = deque()

    def forget_workers(self) -> None:
        """Drop what is kept per set of workers (after a start or a replacement)."""
        self._poller = self._partner_poller = self.bound = None

    def round(self, send: Send, order: Sequence[Worker]) -> Round:
        """The per-step round trip for the workers as they are (kept in :attr:`bound`):
        :class:`TurnsRound` with turns, :class:`SpinRound` where the parent spins,
        :class:`PartnerRound` where it sleeps on a partner, :class:`PollRound` otherwise.
        ``send`` is the pool's, ``order`` its send order."""
        if self.max_active is not None:
            self.bound = TurnsRound(self, send)
        elif self.spin_s:
            self.bound = SpinRound(self, order)
        elif self.partner is None:
            self.bound = PollRound(self, order)
        else:
            self.bound = PartnerRound(self, order)
        return self.bound

    # --- frames and turns -----------------------------------------------------------------

    def write(self, worker: Worker, command: Command, payload: bytes = b"") -> None:
        """Write one frame to ``worker``'s command pipe; its reply is the one awaited from
        now on."""
        worker.seq += 1
        worker.expected = worker.seq
        try:
            proto.write_frame(worker.cmd_fd, command, worker.seq, payload)
        except OSError:
            pass  # EPIPE: the worker is gone; gather() learns how from its sentinel

    def wait_turn(self, worker: Worker, command: Command, frame: bytes) -> None:
        """``worker`` gets ``command`` (``frame``) when an earlier worker answers. Until then
        no reply is awaited from it: a late frame of an abandoned command is stale."""
        worker.expected = None
        self._turns.append((worker, command, frame))

    def drop_turns(self) -> None:
        """Forget the turns still to come (a new command, or one gathered no further)."""
        self._turns.clear()

    def _next_turn(self, pending: dict[int, Worker]) -> None:
        """A worker answered (or died): command the next one waiting for its turn."""
        while self._turns:
            worker, command, frame = self._turns.popleft()
            if worker.index in pending:  # not dead meanwhile
                self.write(worker, command, frame)
                return

    # --- poll objects ---------------------------------------------------------------------

    def full_poller(self) -> tuple[select.poll, dict[int, tuple[Worker, bool]]]:
        """A poll object over every worker's reply fd and sentinel, kept between waits (built
        anew after a worker is replaced or an fd was dropped from it)."""
        if self._poller is None:
            poller = select.poll()
            by_fd: dict[int, tuple[Worker, bool]] = {}
            for w in self.resources.workers:
                for fd, is_reply in ((w.reply_fd, True), (w.process.sentinel, False)):
                    by_fd[fd] = (w, is_reply)
                    poller.register(fd, select.POLLIN)
            self._poller = (poller, by_fd)
        return self._poller

    def partner_poller(self, worker: Worker) -> select.poll:
        """A poll object over ``worker``'s reply fd and every sentinel, kept between waits."""
        if self._partner_poller is None or self._partner_poller[0] is not worker:
            poller = select.poll()
            poller.register(worker.reply_fd, select.POLLIN)
            for w in self.resources.workers:
                poller.register(w.process.sentinel, select.POLLIN)
            self._partner_poller = (worker, poller)
        return self._partner_poller[1]

    def _changed_fds(self) -> None:
        """An fd was dropped from the kept poll object: it and the round built on it go."""
        self._poller = self.bound = None

    # --- waits ----------------------------------------------------------------------------

    def spin_pays(self) -> bool:
        """Whether to busy-poll before blocking: the pool was told cores are free for it, and
        replies have been coming within the window (see the worker's serve loop): for slow
        envs the spin would only burn the window and slow a sibling vCPU down."""
        return bool(self.spin_s) and self._wait_estimate < self.spin_s

    def waited(self, seconds: float) -> None:
        """A whole-pool wait took ``seconds``: the moving average :meth:`spin_pays` reads."""
        self._wait_estimate = 0.5 * (self._wait_estimate + seconds)

    def gather(
        self,
        workers: Sequence[Worker],
        timeout: float | None,
        what: str,
        stop_at_death: bool = False,
        *,
        deadline: float | None = None,
    ) -> tuple[dict[int, Reply], list[Failure]]:
        """Wait for the awaited reply of every worker in ``workers``.

        Returns the replies by worker index and the failures: workers that died (seen through
        their sentinel, at once) or, once ``timeout`` has passed, those still silent ("hung").
        With ``stop_at_death`` the first death ends the wait at once, whatever the others do.
        ``deadline`` (monotonic) continues a wait that started earlier with that ``timeout``.
        """
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        replies: dict[int, Reply] = {}
        failures: list[Failure] = []
        pending = {w.index: w for w in workers}
        if len(pending) == len(self.resources.workers):
            # Every worker: the common case (each step), served by the kept poll object. A
            # worker that has answered has nothing left to read; its fds stay registered.
            poller, by_fd = self.full_poller()
            kept = True
        else:
            poller, by_fd, kept = select.poll(), {}, False
            for w in workers:
                for fd, is_reply in ((w.reply_fd, True), (w.process.sentinel, False)):
                    by_fd[fd] = (w, is_reply)
                    poller.register(fd, select.POLLIN)
        #: the fds still registered with a poll object of this wait's own (not the kept one)
        by_fd_live = set() if kept else set(by_fd)
        # Busy-poll first (bounded) where it pays: blocking costs a sleep and a wake-up, which
        # on a VM can exceed a cheap env's whole step.
        started = time.perf_counter()
        spin_until = started + self.spin_s if self.spin_pays() else 0.0
        first = self.partner
        if (
            first is not None
            and kept
            and not spin_until
            and len(pending) > 1
            and first in pending
            and not self._turns
        ):
            # The partner (the worker that shares our CPU) starts last and so ends last: sleep
            # until it answers (or anyone dies) instead of waking once per worker. The others'
            # replies wait in their pipes and are read by the loop below without a wake-up.
            self.partner_poller(pending[first]).poll(
                -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)
            )
            if self.late_spin_s:
                # The partner has answered (or a worker died): our CPU has nothing else to
                # run until we command it again, while a sleep here would be ended from a
                # late worker's CPU, a cross-CPU wake-up (42-44 us each way on a 2-vCPU VM,
                # 2 us on one CPU: decision 0040). Look for the others' replies busy, a while.
                spin_until = time.perf_counter() + self.late_spin_s
        while pending:
            if spin_until:
                events = poller.poll(0)
                if not events:
                    if time.perf_counter() >= spin_until:
                        spin_until = 0.0
                    continue
            elif deadline is None:
                events = poller.poll()
            else:
                remaining = deadline - time.monotonic()
                # Past the deadline, still take what is already there: only the silent hung.
                events = poller.poll(int(remaining * 1000) + 1 if remaining > 0 else 0)
                if not events:
                    waiting = {q.index for q, _, _ in self._turns}
                    self._turns.clear()
                    for w in sorted(pending.values(), key=lambda w: w.index):
                        message = f"no reply from {w.describe()} after {timeout:g} s {what}"
                        if w.index in waiting:
                            message += (
                                " (never commanded: the workers before it in turn took the "
                                f"whole time; at most {self.max_active} work at once)"
                            )
                        failures.append(Failure(w, "hung", message))
                    break
            for fd, _ in events:
                worker, is_reply = by_fd[fd]
                if worker.index not in pending:
                    # Only a dead worker's sentinel (or EOF) keeps firing once it has answered:
                    # drop it from the wait so the loop does not spin on it. The same poll may
                    # list both of a worker's fds after its reply already unregistered them.
                    if kept or fd in by_fd_live:
                        poller.unregister(fd)
                        by_fd_live.discard(fd)
                    if kept:
                        self._changed_fds()
                    continue
                if is_reply:
                    # A plain OK is its header alone: compared as bytes, as the quick round
                    # reads them; anything else is parsed from there.
                    head = os.read(fd, proto.HEADER.size)
                    plain = head == proto.HEADER.pack(0, Status.OK, worker.expected)
                    reply = PLAIN_OK if plain else read_reply(worker, head=head)
                else:
                    reply = drain(worker)
                if reply is STALE:
                    continue
                del pending[worker.index]
                if not kept:
                    for fd_done in (worker.reply_fd, worker.process.sentinel):
                        poller.unregister(fd_done)
                        by_fd_live.discard(fd_done)
                if reply is DEAD:
                    failures.append(death(worker, what))
                    if kept:
                        # its sentinel stays readable from now on
                        self._changed_fds()
                    if stop_at_death:
                        self._turns.clear()
                        return replies, failures
                else:
                    assert isinstance(reply, tuple)
                    replies[worker.index] = reply
                    worker.expected = None
                if self._turns:
                    self._next_turn(pending)
        if kept and not failures:
            self.waited(time.perf_counter() - started)
        return replies, failures

    def collect_ready(
        self, units: Sequence[Worker], enough: int, timeout: float | None, what: str
    ) -> tuple[dict[int, Reply], list[Failure]]:
        """Wait until at least ``enough`` of ``units`` have answered or died (or ``timeout``
        passes), then take every other answer already there, without waiting. A unit still
        silent is left in flight (its reply stays awaited): nothing is reported hung."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = {w.index: w for w in units}
        # The kept poll object over every worker: building one per wait would cost more than
        # the rest of the wait. The idle workers' fds are silent but for a stale reply (read
        # and dropped) or a death (dropped from the kept object until it is rebuilt: that
        # worker's death is reported when it is next given a command).
        poller, by_fd = self.full_poller()
        answered: set[int] = set()
        replies: dict[int, Reply] = {}
        failures: list[Failure] = []
        waiting = True
        while pending:
            if waiting and len(replies) + len(failures) >= enough:
                waiting = False  # enough: one more look for whatever else is in
            if not waiting:
                ms = 0
            elif deadline is None:
                ms = -1
            else:
                ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
            events = poller.poll(ms)
            if not events and (not waiting or ms == 0):
                break
            for fd, _ in events:
                worker, is_reply = by_fd[fd]
                if worker.index in answered:
                    continue  # its other fd in the same poll, after its answer
                if worker.index not in pending:  # idle
                    if is_reply and read_reply(worker) is STALE:
                        continue
                    poller.unregister(fd)  # dead: it would fire on every poll
                    self._changed_fds()
                    continue
                reply = read_reply(worker) if is_reply else drain(worker)
                if reply is STALE:
                    continue
                del pending[worker.index]
                answered.add(worker.index)
                if reply is DEAD:
                    # Its sentinel stays readable: out of the kept object, rebuilt next time.
                    for done in (worker.reply_fd, worker.process.sentinel):
                        poller.unregister(done)
                    self._changed_fds()
                    failures.append(death(worker, what))
                else:
                    assert isinstance(reply, tuple)
                    replies[worker.index] = reply
                    worker.expected = None
            if not waiting:
                break
        return replies, failures


class _GatheringRound:
    """A round whose replies are all read by :meth:`PipeWaits.gather`.

    Args:
        waits: the pool's waits.
    """

    def __init__(self, waits: PipeWaits) -> None:
        self.waits = waits

    def gather_all(self, timeout: float | None, what: str, stop: bool) -> Gathered | None:
        """See :class:`Round`."""
        waits = self.waits
        return plain_or(*waits.gather(waits.resources.workers, timeout, what, stop))


class PollRound(_GatheringRound):
    """The pipes' round trip where the parent neither spins nor sleeps on a partner: the
    commands written in send order (the frames of :meth:`PipeWaits.write`, its lookups made
    once a round; a frame without a payload is its header alone), then
    :meth:`PipeWaits.gather`. The other rounds write as this one does.

    Args:
        waits: the pool's waits.
        order: the pool's send order.
    """

    def __init__(self, waits: PipeWaits, order: Sequence[Worker]) -> None:
        super().__init__(waits)
        self.order = list(order)

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
                pass  # EPIPE: as in PipeWaits.write
        return self.gather_all(timeout, what, stop)


class TurnsRound(_GatheringRound):
    """The pipes' round trip with ``max_active``: the pool's ``send`` holds the workers past
    the first ``max_active`` back, and :meth:`PipeWaits.gather` sends each its turn as an
    earlier one answers.

    Args:
        waits: the pool's waits.
        send: the pool's ``send``.
    """

    def __init__(self, waits: PipeWaits, send: Send) -> None:
        super().__init__(waits)
        self.send = send

    def exchange(
        self, command: Command, payload: bytes, timeout: float | None, what: str, stop: bool
    ) -> Gathered | None:
        """See :class:`Round`."""
        self.send(command, payload, encoded=True)
        return self.gather_all(timeout, what, stop)


class PartnerRound(PollRound):
    """The pipes' round trip with a partner, kept until the workers change
    (:meth:`PipeWaits.forget_workers`) or its poll objects do.

    The parent sends the partner its command last and sleeps until the partner (the
    worker on its CPU, or the only worker) answers or anyone dies; the others have
    usually answered by then. If the kept poll object then shows every reply fd readable
    and nothing else, each reply header is read and compared, as bytes, with the plain OK
    it should be. On a cheap env the parent shares its CPU with the partner, so every
    call and attribute lookup here is paid twice: in time, and in the caches and branch
    history the partner finds cold after us (docs/decisions/0009-steady-state-step-path.md).
    Anything else (a reply still to come, a payload, an error, a death, a stale or broken
    frame) goes on through ``gather`` for the workers still awaited, within the same
    deadline (:func:`gather_after_quick_read`).

    Args:
        waits: the pool's waits.
        order: the pool's send order (the partner last).
    """

    def __init__(self, waits: PipeWaits, order: Sequence[Worker]) -> None:
        super().__init__(waits, order)
        self.workers = list(waits.resources.workers)
        self.partner_poll = waits.partner_poller(self.workers[waits.partner or 0]).poll
        poller, by_fd = waits.full_poller()
        self.full_poll = poller.poll
        # What the full poll returns when every reply is in and nothing else happened (poll
        # lists fds in registration order; any other order only costs the slower path).
        self.all_ready = [(fd, select.POLLIN) for fd, (_, is_reply) in by_fd.items() if is_reply]

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
            return gather_after_quick_read(self.waits, None, b"", timeout, what, stop, deadline)
        return self.read_all(timeout, what, stop, deadline)

    def read_all(
        self, timeout: float | None, what: str, stop: bool, deadline: float | None
    ) -> Gathered | None:
        """Every reply is in: read each header and compare it, as bytes, with the plain OK it
        should be; the first other one leaves through :func:`gather_after_quick_read`."""
        read, pack, size, ok = os.read, proto.HEADER.pack, proto.HEADER.size, Status.OK
        for w in self.workers:
            head = read(w.reply_fd, size)
            if head != pack(0, ok, w.expected):
                return gather_after_quick_read(self.waits, w, head, timeout, what, stop, deadline)
            w.expected = None
        return None


class SpinRound(PartnerRound):
    """The pipes' round trip where the parent busy-polls (fewer workers than free CPUs): the
    commands written as :class:`PartnerRound` writes them, then the kept poll object looked
    at, without sleeping, until it shows every reply fd readable and nothing else, for up to
    the spin window while spinning pays (:meth:`PipeWaits.spin_pays`), and the replies read as
    bytes. Anything else (a reply later than the window, a death, a slow pool) goes through
    :meth:`PipeWaits.gather`, within the same deadline."""

    def gather_all(self, timeout: float | None, what: str, stop: bool) -> Gathered | None:
        """See :class:`Round`."""
        waits, clock = self.waits, time.perf_counter
        deadline = None if timeout is None else time.monotonic() + timeout
        if not waits.spin_pays():
            return gather_after_quick_read(waits, None, b"", timeout, what, stop, deadline)
        started = clock()
        until = started + waits.spin_s
        poll, all_ready = self.full_poll, self.all_ready
        while poll(0) != all_ready:
            if clock() >= until:
                return gather_after_quick_read(waits, None, b"", timeout, what, stop, deadline)
        waits.waited(clock() - started)
        return self.read_all(timeout, what, stop, deadline)


def plain_or(replies: dict[int, Reply], failures: list[Failure]) -> Gathered | None:
    """None when every reply of a whole-pool wait is a plain OK, else what was gathered."""
    if failures or any(reply != PLAIN_OK for reply in replies.values()):
        return replies, failures
    return None


def gather_after_quick_read(
    waits: PipeWaits,
    not_plain: Worker | None,
    not_plain_head: bytes,
    timeout: float | None,
    what: str,
    stop_at_death: bool,
    deadline: float | None,
) -> Gathered | None:
    """The quick read's way out. ``not_plain`` (None when not every reply was in) sent
    ``not_plain_head``, which is not a plain OK; the workers before it answered plain OKs.
    Every reply being in, the ones from ``not_plain`` on are read and parsed here (infos from
    every env each step are common: MuJoCo, Atari); a death, a stale frame or a reply still
    to come is left to ``gather``, within the same deadline. None when every reply was a
    plain OK after all (the others came in while the partner's was read)."""
    replies: dict[int, Reply] = {}
    workers = waits.resources.workers
    if not_plain is not None:
        head = not_plain_head
        for w in workers[workers.index(not_plain) :]:
            try:
                if w is not not_plain:
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
        more, failures = waits.gather(rest, timeout, what, stop_at_death, deadline=deadline)
        replies.update(more)
    return plain_or(replies, failures)
