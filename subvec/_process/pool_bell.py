"""The worker pool's side of the futex protocol (``_process.wake``): announcing commands in the
block and waiting for the workers' marks, for a pool whose workers attached with it.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from subvec._backend import Failure
from subvec._commands import Command
from subvec._process import wire as proto
from subvec._process.pool_workers import (
    DEAD,
    PLAIN_OK,
    STALE,
    Gathered,
    PoolResources,
    Reply,
    Worker,
    death,
    drain,
    read_reply,
)
from subvec._process.wake import MARK_OK, PIPE_KIND, SLICE_S, STEP_KIND, Bell

__all__ = ["WAKE_EACH", "BellExchange"]

#: a level no countdown reaches: every answer wakes the parent (``_process.wake``)
WAKE_EACH = 2000
_SHIFT, _MARK_OK = np.uint64(8), np.uint64(MARK_OK)


class BellExchange:
    """Commands announced in the block and answers read from its marks, for every worker of
    ``resources`` on the bell.

    Args:
        bell: the protocol's words in the block.
        resources: the pool's resources (its workers, in index order).
        spin_s: seconds to busy-look at the marks before sleeping (0: sleep at once).
    """

    def __init__(self, bell: Bell, resources: PoolResources, spin_s: float) -> None:
        self.bell = bell
        self.resources = resources
        self.spin_s = spin_s
        #: a moving average of how long a whole-pool wait has been waiting
        self._wait_estimate = 0.0
        #: the sentinels of every worker, polled between the slices of a wait
        self._sentinels: tuple[select.poll, dict[int, Worker]] | None = None

    def forget_workers(self) -> None:
        """Drop the kept sentinel poll (after a worker was replaced)."""
        self._sentinels = None

    def announce(
        self,
        targets: Sequence[Worker],
        command: Command,
        data: bytes,
        per_unit: Callable[[Any], Any] | None,
        dump: Callable[[Any], bytes],
        framed: bool = False,
    ) -> None:
        """The futex protocol's send: a STEP without payload to a worker that answered its
        last command is announced in the block alone; anything else is framed on the pipe
        first (its frame behind any a worker has not read yet, served in order). Then one
        wake-up for all. ``framed``: ``data`` is the payload as it is (not through
        ``per_unit``)."""
        bell = self.bell
        cmd, seqs, expected = bell.cmd, bell.seq, bell.expected
        plain = command is Command.STEP and not data and per_unit is None
        everyone = len(targets) == len(self.resources.workers)
        if plain and everyone and not expected.any():
            bell.step_all()  # the usual step: a few numpy calls, whatever the workers
        else:
            for worker in targets:
                i = worker.index
                seq = int(seqs[i]) + 1
                seqs[i] = seq
                if plain and not expected[i]:
                    cmd[i] = (seq << 8) | STEP_KIND
                else:
                    frame = data if per_unit is None or framed else dump(per_unit(worker))
                    try:
                        proto.write_frame(worker.cmd_fd, command, seq, frame)
                    except OSError:
                        pass  # EPIPE: as in send_to
                    cmd[i] = (seq << 8) | PIPE_KIND
                expected[i] = seq
        # Every worker: only the last answer wakes us, and the workers wake each other (a
        # cascade). Some: each answer does (the waits for some are for the first answers:
        # collect_ready), and all are woken at once (an idle one would not pass it on).
        bell.ring(len(targets), 0 if everyone else WAKE_EACH, cascade=everyone)

    def exchange(
        self, command: Command, payload: bytes, timeout: float | None, what: str, stop: bool
    ) -> Gathered | None:
        """The per-step round trip over every worker (``_process.pool_pipes.Round``):
        ``command`` with ``payload`` (the same for all) announced, then the answers."""
        workers = self.resources.workers
        self.announce(workers, command, payload, None, proto.dumps, framed=True)
        return self.gather(workers, timeout, what, stop)

    def gather_all(self, timeout: float | None, what: str, stop: bool) -> Gathered | None:
        """Every worker's answer (``_process.pool_pipes.Round``); None when all were plain."""
        return self.gather(self.resources.workers, timeout, what, stop)

    def gather(
        self,
        workers: Sequence[Worker],
        timeout: float | None,
        what: str,
        stop_at_death: bool,
        deadline: float | None = None,
    ) -> Gathered | None:
        """``WorkerPool.gather`` under the futex protocol; None when every one answered a
        plain OK."""
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        return self.wait(workers, timeout, what, stop_at_death, deadline)

    def wait(
        self,
        workers: Sequence[Worker],
        timeout: float | None,
        what: str,
        stop_at_death: bool,
        deadline: float | None,
        enough: int | None = None,
    ) -> Gathered | None:
        """Wait for the answers of ``workers`` in the block (``_process.wake``): every one's, or
        with ``enough`` until that many answered or died, then take the others already in (the
        rest stay in flight, none is hung). Sleeps on the countdown in slices of at most
        ``SLICE_S``, polling the sentinels between them, so a death is seen within a slice.
        Returns None when every one answered a plain OK (the usual step)."""
        bell = self.bell
        mark, n = bell.mark, len(workers)
        index: slice | np.ndarray = slice(None)
        if n != len(self.resources.workers):
            index = np.fromiter((w.index for w in workers), np.intp, n)
        want_seq = bell.expected[index].copy()
        want = (want_seq << _SHIFT) | _MARK_OK
        needed = n if enough is None else enough
        dead: dict[int, Failure] = {}
        #: answers found on the pipe of a worker that exited before it could mark them
        drained: dict[int, Reply] = {}
        started = time.perf_counter()
        spin_until = 0.0
        if self.spin_s and self._wait_estimate < self.spin_s:
            spin_until = started + self.spin_s
        # Waiting for the whole pool, the countdown says when to look at the marks: only the
        # last answer wakes us, and the marks are read once. Waiting for some, every answer
        # wakes us (``_announce``) and the marks are read each time.
        whole = enough is None and bell.level() == 0
        # The countdown is set by the ring and only goes down: above zero, no need to look.
        look = not whole
        rewoken = False
        while True:
            seen = bell.remaining()
            if look or seen <= 0 or not whole:
                got = mark[index]
                if not dead and not drained and (got == want).all():
                    bell.expected[index] = 0
                    if enough is None:
                        waited = time.perf_counter() - started
                        self._wait_estimate = 0.5 * (self._wait_estimate + waited)
                    return None
                answered = (got >> 8) == want_seq
                if int(answered.sum()) + len(dead) + len(drained) >= needed:
                    break
            if spin_until:
                if time.perf_counter() < spin_until:
                    continue
                spin_until = 0.0
            slice_s = SLICE_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                slice_s = min(slice_s, left)
            look = not bell.sleep(seen, slice_s)
            if look and not rewoken and bell.cascading():
                # A worker may have died before passing the wake-up on: wake every sleeper.
                rewoken = True
                bell.wake_all()
            if look:
                # The slice ran out (or a signal came): any deaths? (a skewed countdown is
                # also caught here: the marks are read again)
                answered = (mark[index] >> 8) == want_seq
                for w in self._dead_among(workers, answered, {*dead, *drained}):
                    awaited = int(bell.expected[w.index])
                    if (int(mark[w.index]) >> 8) == awaited:
                        continue  # it answered before it died: the answer is taken below
                    # Its answer may be on the pipe, written just before it exited unmarked.
                    reply = drain(w, awaited)
                    if reply is not DEAD:
                        assert isinstance(reply, tuple)
                        drained[w.index] = reply
                        continue
                    dead[w.index] = death(w, what)
                    if stop_at_death:
                        break
                if stop_at_death and dead:
                    break
        got = mark[index]
        replies: dict[int, Reply] = {}
        failures: list[Failure] = list(dead.values())
        expected = bell.expected
        for w, word, awaited in zip(workers, got.tolist(), want_seq.tolist(), strict=True):
            if w.index in dead:
                continue
            if w.index in drained:
                replies[w.index] = drained[w.index]
                expected[w.index] = 0
                continue
            if (word >> 8) != awaited:
                if enough is None and not (stop_at_death and dead):
                    message = f"no reply from {w.describe()} after {timeout:g} s {what}"
                    failures.append(Failure(w, "hung", message))
                continue
            if word & 0xFF == MARK_OK:
                replies[w.index] = PLAIN_OK
            else:
                reply = read_reply(w, awaited)
                while reply is STALE:  # answers to commands abandoned earlier
                    reply = read_reply(w, awaited)
                if reply is DEAD:
                    failures.append(death(w, what))
                    continue
                assert isinstance(reply, tuple)
                replies[w.index] = reply
            expected[w.index] = 0
        return replies, failures

    def _dead_among(
        self, workers: Sequence[Worker], answered: np.ndarray, known: set[int]
    ) -> list[Worker]:
        """Those of ``workers`` not yet answered nor ``known`` (by index) whose sentinel fired (one
        poll over every sentinel, kept between waits)."""
        if self._sentinels is None:
            poller = select.poll()
            by_fd = {}
            for w in self.resources.workers:
                poller.register(w.process.sentinel, select.POLLIN)
                by_fd[w.process.sentinel] = w
            self._sentinels = (poller, by_fd)
        poller, by_fd = self._sentinels
        events = poller.poll(0)
        if not events:
            return []
        waiting = {w.index for w, done in zip(workers, answered.tolist(), strict=True) if not done}
        fired = (by_fd[fd] for fd, _ in events)
        return [w for w in fired if w.index in waiting and w.index not in known]
