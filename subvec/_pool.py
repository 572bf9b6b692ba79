"""The worker pool: starting, messaging, watching, restarting and stopping worker processes.

The pool knows processes and pipes, not env semantics: it sends commands, waits for replies and
reports failures. Every wait polls each worker's reply pipe *and* its process sentinel, so a
death is seen the moment it happens even while other workers are still busy, and every wait
can be bounded. Each command carries a per-worker sequence number echoed by its reply; a reply
whose number is not the awaited one answers a command the parent stopped waiting for (after a
timeout or an interrupt) and is dropped, never taken for the answer to a later command.

Cleanup lives in :func:`release`, which holds no reference to the vector env, so it can serve
as that env's ``weakref.finalize`` callback (garbage collection, interpreter exit).
"""

from __future__ import annotations

import os
import select
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

import cloudpickle
import numpy as np

from subvec import _pickling as pickling
from subvec import _protocol as proto
from subvec._backend import PLAIN, Collected, Failure, Outcome
from subvec._bootstrap import lifeline_for, start
from subvec._commands import (
    Command,
    ErrorRecord,
    Status,
    WorkerCounters,
    WorkerHello,
    raise_first,
    rebuild_remote_error,
)
from subvec._gpus import WorkerEnvSpec, worker_environment
from subvec._protocol import AttachSpec
from subvec._shm import SharedBlock
from subvec._starts import BuildFailure, StartGate
from subvec._topology import Placement
from subvec._wake import MARK_OK, PIPE_KIND, PIPES, SLICE_S, STEP_KIND, Bell
from subvec._worker import worker_main
from subvec.errors import describe_exitcode

__all__ = ["Worker", "WorkerPool", "release"]

#: After SIGTERM, how long a worker gets before SIGKILL; also the grace of a last-resort close.
TERMINATE_GRACE = 1.0

Reply = tuple[Status, bytes]


@dataclass
class Worker:
    index: int
    lo: int  # first global env index
    hi: int  # one past the last
    process: Any  # multiprocessing.process.BaseProcess
    cmd_conn: Connection
    reply_conn: Connection
    seq: int = 0
    expected: int | None = None  # seq of the reply still awaited
    hello: WorkerHello | None = None
    cmd_fd: int = -1  # the raw fds of the two pipes, read once (Connection.fileno() checks)
    reply_fd: int = -1
    #: the process's pid, kept: reports name a replaced worker after its process is closed
    pid: int | None = None
    #: attached with the futex protocol: its commands are announced in the block (``_wake``)
    on_bell: bool = False

    def __post_init__(self) -> None:
        self.cmd_fd = self.cmd_conn.fileno()
        self.reply_fd = self.reply_conn.fileno()
        self.pid = self.process.pid

    def describe(self) -> str:
        span = f"env {self.lo}" if self.hi - self.lo == 1 else f"envs {self.lo}..{self.hi - 1}"
        return f"worker {self.index} (pid {self.pid}, {span})"


Gathered = tuple[dict[int, Reply], list[Failure]]
#: (round_trip(command, timeout, what, stop_at_death), take(timeout, what, stop_at_death))
_Quick = tuple[
    Callable[[Command, "float | None", str, bool], "Gathered | None"],
    Callable[["float | None", str, bool], "Gathered | None"],
]


@dataclass
class PoolResources:
    """What must be released, held apart from the vector env so a finalizer can reach it."""

    workers: list[Worker] = field(default_factory=list)
    block: SharedBlock | None = None
    #: the chunk block (``_chunks``), once a chunk was stepped
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
            _discard(worker)
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


def _discard(worker: Worker) -> None:
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


class WorkerPool:
    """Worker processes for a vector env: the process backend (see ``_backend``).

    Args:
        ctx: the multiprocessing context the workers start with.
        factories: the cloudpickled env factories, in env order.
        registry: the parent's gymnasium registry for the workers to adopt
            (``_bootstrap.registry_snapshot``); None under fork, whose workers inherit it.
        bounds: ``(lo, hi)`` env indices of each worker.
        autoreset_mode: the AutoresetMode value the workers' envs follow.
        placements: where each worker runs (None: anywhere).
        daemon: start the workers as daemons.
        spin_s: seconds to busy-poll for replies before blocking (0: block at once).
        partner: the worker that shares the parent's CPU (see ``gather``), if any.
        threads: cap each worker's BLAS, OpenMP and torch pools to this many threads
            (``subvec._threads``; None: leave them).
        max_active: the most workers that may be stepping or resetting at once (None: all).
            A STEP or RESET then goes to that many workers first, and to the next one each
            time one answers (``gather``), so at most that many envs are in ``step`` or
            ``reset`` at any moment (a worker steps its envs one after the other).
        worker_env: variables for each worker's environment: a dict, or a callable taking
            the worker's ``Placement`` and returning one (``subvec._gpus.worker_environment``;
            evaluated here at each start, so a replacement gets the same).
        max_concurrent_starts: the most workers building their envs (and serving their first
            reset) at once (None: no limit; see ``subvec._starts``).
        build_retries: how many more times a worker calls a factory that raised.
        wake: ``"futex"``: after ATTACH, wake the workers and learn of their plain answers
            through the block (``subvec._wake``); ``"pipes"``: by the pipes alone.
    """

    inline = False

    def __init__(
        self,
        ctx: BaseContext,
        factories: list[bytes],
        bounds: Sequence[tuple[int, int]],
        autoreset_mode: str,
        placements: list[Placement] | None,
        daemon: bool,
        *,
        registry: bytes | None = None,
        spin_s: float = 0.0,
        partner: int | None = None,
        max_active: int | None = None,
        threads: int | None = None,
        worker_env: WorkerEnvSpec = None,
        max_concurrent_starts: int | None = None,
        build_retries: int = 0,
        wake: str = PIPES,
    ) -> None:
        self.ctx = ctx
        self.wake = wake
        #: the sentinels of every worker, polled between the slices of a futex wait
        self._sentinels: tuple[select.poll, dict[int, Worker]] | None = None
        self.worker_env = worker_env
        self.build_retries = build_retries
        #: every failed factory attempt that was tried again, in the order the workers said
        self.build_failures: list[BuildFailure] = []
        self.threads = threads
        self.factories = factories
        self.registry = registry
        self.bounds = list(bounds)
        self.autoreset_mode = autoreset_mode
        self.placements = placements
        self.daemon = daemon
        self.resources = PoolResources()
        if max_concurrent_starts is not None:
            self.resources.gate = StartGate(max_concurrent_starts)
        self.spin_s = spin_s
        self._poller: tuple[select.poll, dict[int, tuple[Worker, bool]]] | None = None
        #: a moving average of how long a whole-pool gather has been waiting
        self._wait_estimate = 0.0
        self.wait_first = partner
        self._first_poller: tuple[Worker, select.poll] | None = None
        self._quick: _Quick | None = None
        #: the pickled ATTACH command, kept to attach a replacement worker
        self._attach_payload = b""
        self.max_active = max_active
        #: with ``max_active``: the workers still waiting for their turn at the command being
        #: gathered, with its frame (sent by ``gather`` as earlier workers answer)
        self._queued: deque[tuple[Worker, Command, bytes]] = deque()

    def _forget_workers(self) -> None:
        """Drop what is kept per set of workers (after a start or a replacement)."""
        self._poller = self._first_poller = self._quick = self._sentinels = None

    @property
    def workers(self) -> list[Worker]:
        return self.resources.workers

    @property
    def units(self) -> list[Worker]:
        return self.resources.workers

    # --- start ----------------------------------------------------------------------------

    def placement(self, index: int) -> Placement:
        """Where worker ``index`` is planned to run (unpinned and without GPU when not placed)."""
        if self.placements:
            return self.placements[index]
        return Placement(index, None, None)

    def spawn(self, index: int) -> Worker:
        """Start worker ``index`` (its handshake is then awaited with ``gather``).

        Raises:
            TypeError: ``worker_env`` gave no dict of str to str for this worker.
        """
        lo, hi = self.bounds[index]
        ctx = self.ctx
        environ = worker_environment(self.worker_env, self.placement(index))
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        reply_r, reply_w = ctx.Pipe(duplex=False)
        inherited: list[int] = []
        method = ctx.get_start_method()
        if method == "fork":
            # A forked child inherits every fd of ours: hand it the other workers' pipe ends
            # so it closes them, and a worker's death stays visible as EOF on its pipes.
            for other in self.workers:
                if other.index != index:
                    inherited += [other.cmd_fd, other.reply_fd]
        process = ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            name=f"subvec-worker-{index}",
            args=(
                index,
                lo,
                self.factories[lo:hi],
                self.registry,
                cmd_r,
                reply_w,
                self.autoreset_mode,
                self.placements[index] if self.placements else None,
                inherited,
                lifeline_for(method),
                self.threads,
                environ,
                self.resources.gate,
                self.build_retries,
            ),
            daemon=self.daemon,
        )
        try:
            start(process)  # without running the user's script again (see _bootstrap)
        except BaseException:
            for conn in (cmd_r, cmd_w, reply_r, reply_w):
                conn.close()
            raise
        # The child holds its own copies now; keeping ours would hide its death from EOF.
        cmd_r.close()
        reply_w.close()
        worker = Worker(index, lo, hi, process, cmd_w, reply_r, expected=0)
        return worker

    def spawn_all(self) -> None:
        """Start every worker; ``handshake`` then waits until each has built its envs."""
        for index in range(len(self.bounds)):
            self.workers.append(self.spawn(index))
        self._forget_workers()

    def handshake(self, workers: Sequence[Worker], timeout: float | None) -> None:
        """Wait until each of ``workers`` has built its envs and said hello.

        Raises:
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
            EnvError: an env factory raised (the lowest env index first).
        """
        outcomes = self._answers(workers, timeout, "building the envs")
        for worker in workers:
            hello: WorkerHello = outcomes[worker.index][1]
            worker.hello = hello
            self.build_failures += [replace(f, worker=worker.index) for f in hello.build_failures]

    def attach(self, block: SharedBlock, spec: AttachSpec, timeout: float | None) -> None:
        """Hand the workers the block (the pool releases it with the workers from now on).

        Raises:
            WorkerDiedError, WorkerTimeoutError, EnvError: as :meth:`handshake`.
        """
        self.resources.block = block
        self._attach_payload = cloudpickle.dumps(spec)
        for worker in self.workers:
            self.send_to(worker, Command.ATTACH, self._attach_payload)
        self._answers(self.workers, timeout, "attaching")
        if spec.wake:
            bell = self.resources.bell = Bell(block.views)
            for worker in self.workers:
                _to_bell(bell, worker)

    def _answers(
        self, workers: Sequence[Worker], timeout: float | None, what: str
    ) -> dict[int, Outcome]:
        """Every one of ``workers``' outcomes; raises the first failure or env error."""
        replies, failures = self.gather(workers, timeout, what)
        if failures:
            raise failures[0].to_error(timeout or 0.0)
        outcomes = {w.index: self._decode(w, replies[w.index]) for w in workers}
        raise_first([v for status, v in outcomes.values() if status is Status.ERROR])
        return outcomes

    # --- messages -------------------------------------------------------------------------

    def send(
        self,
        command: Command,
        payload: Any = None,
        *,
        per_unit: Callable[[Any], Any] | None = None,
        units: Sequence[Any] | None = None,
        encoded: bool = False,
    ) -> None:
        """Send ``command`` to ``units`` (default: every worker), the partner last, with
        ``payload`` or ``per_unit(worker)``, pickled (cloudpickle for calls: their arguments
        may be lambdas); ``encoded``: ``payload`` is the bytes already."""
        targets = self._send_order() if units is None else self._partner_last(units)
        dump: Callable[[Any], bytes] = proto.dumps
        if command in _CLOUDPICKLED:
            dump = pickling.dumps
        elif command is Command.STEP_ENVS:
            dump = proto.encode_step_envs
        data = payload if encoded else b"" if payload is None else dump(payload)
        self._queued.clear()  # a command gathered no further (interrupted) has no more turns
        first = len(targets)
        if self.max_active is not None and (
            command in _IN_TURNS or _is_chunk(command, payload, per_unit, targets)
        ):
            first = self.max_active
        bell = self.resources.bell
        if bell is not None and first == len(targets):
            self._announce(bell, targets, command, data, per_unit, dump)
            return
        for i, worker in enumerate(targets):
            frame = data if per_unit is None else dump(per_unit(worker))
            if i < first:
                self.send_to(worker, command, frame)
            else:
                # Its turn comes when an earlier worker answers. Until then no reply is
                # awaited from it: a late frame of an abandoned command is stale.
                worker.expected = None
                self._queued.append((worker, command, frame))

    def send_to(self, worker: Worker, command: Command, payload: bytes = b"") -> None:
        """Send one frame to ``worker``; its reply is the one awaited from now on (announced
        in the block when the worker serves the futex protocol)."""
        bell = self.resources.bell
        if bell is not None and worker.on_bell:
            self._announce(bell, [worker], command, payload, None, proto.dumps, framed=True)
            return
        worker.seq += 1
        worker.expected = worker.seq
        try:
            proto.write_frame(worker.cmd_fd, command, worker.seq, payload)
        except OSError:
            pass  # EPIPE: the worker is gone; gather() learns how from its sentinel

    def _announce(
        self,
        bell: Bell,
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
        cmd, seqs, expected = bell.cmd, bell.seq, bell.expected
        plain = command is _STEP_COMMAND and not data and per_unit is None
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
        bell.ring(len(targets), 0 if everyone else _WAKE_EACH, cascade=everyone)

    def _next_turn(self, pending: dict[int, Worker]) -> None:
        """A worker answered (or died): command the next one waiting for its turn."""
        while self._queued:
            worker, command, frame = self._queued.popleft()
            if worker.index in pending:  # not dead meanwhile
                self.send_to(worker, command, frame)
                return

    def collect(
        self,
        timeout: float | None,
        what: str,
        *,
        units: Sequence[Any] | None = None,
        stop_at_death: bool = False,
    ) -> Collected | None:
        """Wait for ``units`` (default: every worker); see ``_backend``. None: every worker
        answered a plain OK."""
        if units is None:
            return self._decoded(self.gather_all(timeout, what, stop_at_death))
        return self._decoded(self.gather(units, timeout, what, stop_at_death))

    def collect_ready(
        self, units: Sequence[Worker], enough: int, timeout: float | None, what: str
    ) -> Collected:
        """Wait until at least ``enough`` of ``units`` have answered or died (or ``timeout``
        passes), then take every other answer already there, without waiting. A unit still
        silent is left in flight (its reply stays awaited): nothing is reported hung."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bell = self.resources.bell
        if bell is not None:
            got = self._bell_wait(bell, units, timeout, what, False, deadline, enough)
            collected = self._decoded(got if got is not None else ({}, []))
            assert collected is not None
            return collected
        pending = {w.index: w for w in units}
        # The kept poll object over every worker: building one per wait would cost more than
        # the rest of the wait. The idle workers' fds are silent but for a stale reply (read
        # and dropped) or a death (dropped from the kept object until it is rebuilt: that
        # worker's death is reported when it is next given a command).
        poller, by_fd = self._full_poller()
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
                    if is_reply and self._read(worker) is _STALE:
                        continue
                    poller.unregister(fd)  # dead: it would fire on every poll
                    self._poller = self._quick = None
                    continue
                reply = self._read(worker) if is_reply else self._drain(worker)
                if reply is _STALE:
                    continue
                del pending[worker.index]
                answered.add(worker.index)
                if reply is _DEAD:
                    # Its sentinel stays readable: out of the kept object, rebuilt next time.
                    for done in (worker.reply_fd, worker.process.sentinel):
                        poller.unregister(done)
                    self._poller = self._quick = None
                    failures.append(self._death(worker, what))
                else:
                    assert isinstance(reply, tuple)
                    replies[worker.index] = reply
                    worker.expected = None
            if not waiting:
                break
        collected = self._decoded((replies, failures))
        assert collected is not None
        return collected

    def _decoded(self, gathered: Gathered | None) -> Collected | None:
        if gathered is None:
            return None
        replies, failures = gathered
        workers = self.workers
        outcomes = {i: self._decode(workers[i], reply) for i, reply in replies.items()}
        return Collected(outcomes, failures)

    @staticmethod
    def _decode(worker: Worker, reply: Reply) -> Outcome:
        status, payload = reply
        if status is Status.OK:
            return PLAIN
        if status is Status.ERROR:
            record: ErrorRecord = proto.loads(payload)
            return status, rebuild_remote_error(record, worker.pid)
        return status, proto.loads(payload)

    def _send_order(self) -> list[Worker]:
        workers = self.resources.workers
        first = self.wait_first
        if first is None:
            return workers
        # The partner last: waking it on our CPU may hand it the CPU at once (wake-up
        # preemption), and the other workers must have their command before that.
        return [w for w in workers if w.index != first] + [workers[first]]

    def _partner_last(self, units: Sequence[Worker]) -> Sequence[Worker]:
        """``units`` in their order, the partner moved last (as ``_send_order``): a command
        to some workers must not wake the partner on our CPU before the others have theirs."""
        first = self.wait_first
        if first is None or len(units) < 2 or units[-1].index == first:
            return units
        return [w for w in units if w.index != first] + [w for w in units if w.index == first]

    def _full_poller(self) -> tuple[select.poll, dict[int, tuple[Worker, bool]]]:
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

    def _partner_poller(self, worker: Worker) -> select.poll:
        """A poll object over ``worker``'s reply fd and every sentinel, kept between waits."""
        if self._first_poller is None or self._first_poller[0] is not worker:
            poller = select.poll()
            poller.register(worker.reply_fd, select.POLLIN)
            for w in self.resources.workers:
                poller.register(w.process.sentinel, select.POLLIN)
            self._first_poller = (worker, poller)
        return self._first_poller[1]

    def exchange(
        self, command: Command, timeout: float | None, what: str, stop_at_death: bool = False
    ) -> Collected | None:
        """``send(command)`` then ``collect(...)``: the per-step round trip."""
        bell = self.resources.bell
        if bell is not None:
            workers = self.resources.workers
            self._announce(bell, workers, command, b"", None, proto.dumps)
            return self._decoded(self._bell_gather(bell, workers, timeout, what, stop_at_death))
        quick = self._quick or self._build_quick()
        if quick is None:
            self.send(command)
            return self._decoded(self.gather_all(timeout, what, stop_at_death))
        gathered = quick[0](command, timeout, what, stop_at_death)
        return None if gathered is None else self._decoded(gathered)

    def exchange_frame(
        self,
        command: Command,
        payload: bytes,
        timeout: float | None,
        what: str,
        stop_at_death: bool = False,
    ) -> Collected | None:
        """:meth:`exchange` with the same ``payload`` for every worker (an action chunk's
        command, its actions in the chunk block): framed in send order, the partner last,
        then the quick read of the replies."""
        bell = self.resources.bell
        workers = self.resources.workers
        if bell is not None:
            self._announce(bell, workers, command, payload, None, proto.dumps, framed=True)
            return self._decoded(self._bell_gather(bell, workers, timeout, what, stop_at_death))
        quick = self._quick or self._build_quick()
        if quick is None:
            self.send(command, payload, per_unit=None, encoded=True)
            return self._decoded(self.gather_all(timeout, what, stop_at_death))
        for worker in self._send_order():
            seq = worker.seq = worker.seq + 1
            worker.expected = seq
            try:
                proto.write_frame(worker.cmd_fd, command, seq, payload)
            except OSError:
                pass  # as in send()
        gathered = quick[1](timeout, what, stop_at_death)
        return None if gathered is None else self._decoded(gathered)

    def gather_all(
        self, timeout: float | None, what: str, stop_at_death: bool = False
    ) -> Gathered | None:
        """``gather`` over the whole pool. Returns None when every worker answered with a
        plain OK (nothing to decode: the usual cheap step)."""
        bell = self.resources.bell
        if bell is not None:
            workers = self.resources.workers
            return self._bell_gather(bell, workers, timeout, what, stop_at_death)
        quick = self._quick or self._build_quick()
        if quick is None:
            return self.gather(self.resources.workers, timeout, what, stop_at_death)
        return quick[1](timeout, what, stop_at_death)

    def _build_quick(self) -> _Quick | None:
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
        for the workers still awaited, within the same deadline (``_take_rest``).
        """
        workers = list(self.resources.workers)
        first = self.wait_first
        if self.spin_s or first is None or self.max_active is not None:
            return None
        order = self._send_order()
        partner_poll = self._partner_poller(workers[first]).poll
        poller, by_fd = self._full_poller()
        full_poll = poller.poll
        # What the full poll returns when every reply is in and nothing else happened (poll
        # lists fds in registration order; any other order only costs the slower path).
        all_ready = [(fd, select.POLLIN) for fd, (_, is_reply) in by_fd.items() if is_reply]
        read, write, pack, size = os.read, os.write, proto.HEADER.pack, proto.HEADER.size
        monotonic, ok, take_rest = time.monotonic, Status.OK, self._take_rest

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
                return take_rest(None, b"", timeout, what, stop_at_death, deadline)
            for w in workers:
                head = read(w.reply_fd, size)
                if head != pack(0, ok, w.expected):
                    return take_rest(w, head, timeout, what, stop_at_death, deadline)
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

        self._quick = (round_trip, take)
        return self._quick

    def _take_rest(
        self,
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
        workers = self.resources.workers
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
                replies[w.index] = (_STATUSES[code], payload)
                w.expected = None
        rest = []
        for w in workers:
            if w.expected is None:  # answered: a plain OK unless parsed above
                replies.setdefault(w.index, PLAIN_OK)
            else:
                rest.append(w)
        failures: list[Failure] = []
        if rest:
            more, failures = self.gather(rest, timeout, what, stop_at_death, deadline=deadline)
            replies.update(more)
        return replies, failures

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
        bell = self.resources.bell
        if bell is not None and workers and workers[0].on_bell:
            got = self._bell_gather(bell, workers, timeout, what, stop_at_death, deadline)
            if got is None:
                return {w.index: PLAIN_OK for w in workers}, []
            return got
        replies: dict[int, Reply] = {}
        failures: list[Failure] = []
        pending = {w.index: w for w in workers}
        if len(pending) == len(self.resources.workers):
            # Every worker: the common case (each step), served by the kept poll object. A
            # worker that has answered has nothing left to read; its fds stay registered.
            poller, by_fd = self._full_poller()
            kept = True
        else:
            poller, by_fd, kept = select.poll(), {}, False
            for w in workers:
                for fd, is_reply in ((w.reply_fd, True), (w.process.sentinel, False)):
                    by_fd[fd] = (w, is_reply)
                    poller.register(fd, select.POLLIN)
        #: the fds still registered with a poll object of this wait's own (not the kept one)
        by_fd_live = set() if kept else set(by_fd)
        # Busy-poll first (bounded) when the pool was told cores are free for it: blocking
        # costs a sleep and a wake-up, which on a VM can exceed a cheap env's whole step.
        # Only while replies have been coming within the window (see the worker's serve loop):
        # for slow envs the spin would only burn the window and slow a sibling vCPU down.
        started = time.perf_counter()
        spinning = self.spin_s and self._wait_estimate < self.spin_s
        spin_until = started + self.spin_s if spinning else 0.0
        first = self.wait_first
        if (
            first is not None
            and kept
            and not spin_until
            and len(pending) > 1
            and first in pending
            and not self._queued
        ):
            # The partner (the worker that shares our CPU) starts last and so ends last: sleep
            # until it answers (or anyone dies) instead of waking once per worker. The others'
            # replies wait in their pipes and are read by the loop below without a wake-up.
            self._partner_poller(pending[first]).poll(
                -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)
            )
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
                    waiting = {q.index for q, _, _ in self._queued}
                    self._queued.clear()
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
                        self._poller = self._quick = None
                    continue
                reply = self._read(worker) if is_reply else self._drain(worker)
                if reply is _STALE:
                    continue
                del pending[worker.index]
                if not kept:
                    for fd_done in (worker.reply_fd, worker.process.sentinel):
                        poller.unregister(fd_done)
                        by_fd_live.discard(fd_done)
                if reply is _DEAD:
                    failures.append(self._death(worker, what))
                    if kept:
                        # its sentinel stays readable from now on
                        self._poller = self._quick = None
                    if stop_at_death:
                        self._queued.clear()
                        return replies, failures
                else:
                    assert isinstance(reply, tuple)
                    replies[worker.index] = reply
                    worker.expected = None
                if self._queued:
                    self._next_turn(pending)
        if kept and not failures:
            self._wait_estimate = 0.5 * (self._wait_estimate + time.perf_counter() - started)
        return replies, failures

    def _bell_gather(
        self,
        bell: Bell,
        workers: Sequence[Worker],
        timeout: float | None,
        what: str,
        stop_at_death: bool,
        deadline: float | None = None,
    ) -> Gathered | None:
        """``gather`` under the futex protocol; None when every one answered a plain OK."""
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        return self._bell_wait(bell, workers, timeout, what, stop_at_death, deadline)

    def _bell_wait(
        self,
        bell: Bell,
        workers: Sequence[Worker],
        timeout: float | None,
        what: str,
        stop_at_death: bool,
        deadline: float | None,
        enough: int | None = None,
    ) -> Gathered | None:
        """Wait for the answers of ``workers`` in the block (``_wake``): every one's, or with
        ``enough`` until that many answered or died, then take the others already in (the
        rest stay in flight, none is hung). Sleeps on the countdown in slices of at most
        ``SLICE_S``, polling the sentinels between them, so a death is seen within a slice.
        Returns None when every one answered a plain OK (the usual step)."""
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
                    reply = self._drain(w, awaited)
                    if reply is not _DEAD:
                        assert isinstance(reply, tuple)
                        drained[w.index] = reply
                        continue
                    dead[w.index] = self._death(w, what)
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
                reply = self._read(w, awaited)
                while reply is _STALE:  # answers to commands abandoned earlier
                    reply = self._read(w, awaited)
                if reply is _DEAD:
                    failures.append(self._death(w, what))
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

    def _read(self, worker: Worker, awaited: int | None = -1) -> Reply | object:
        """The next frame on ``worker``'s reply pipe: its reply if its seq is ``awaited``
        (default: ``worker.expected``; a worker on the bell keeps it in ``bell.expected``),
        ``_STALE`` if not, ``_DEAD`` at EOF."""
        try:
            code, seq, payload = proto.read_frame(worker.reply_fd)
        except (EOFError, OSError):
            return _DEAD
        if seq != (worker.expected if awaited == -1 else awaited):
            return _STALE
        return _STATUSES[code], payload

    def _drain(self, worker: Worker, awaited: int | None = -1) -> Reply | object:
        """The sentinel fired; a reply written just before the exit may still be in the pipe
        (``awaited``: as in :meth:`_read`)."""
        fd = worker.reply_fd
        while select.select([fd], [], [], 0)[0]:
            reply = self._read(worker, awaited)
            if reply is not _STALE:
                return reply
        return _DEAD

    def _death(self, worker: Worker, what: str) -> Failure:
        worker.process.join(1.0)  # the sentinel fires slightly before the status is reapable
        exitcode = worker.process.exitcode
        return Failure(
            worker,
            "died",
            f"{worker.describe()} died with {describe_exitcode(exitcode)} while {what}",
            exitcode,
        )

    # --- restart / stop -------------------------------------------------------------------

    def restart(self, worker: Worker, timeout: float | None) -> Worker:
        """Kill ``worker`` if needed and start a fresh one for the same envs, attached to the
        block. Its envs are freshly built and not yet reset.

        Raises:
            WorkerDiedError, WorkerTimeoutError, EnvError: the new worker failed to start.
        """
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(5.0)
        _discard(worker)
        bell = self.resources.bell
        if bell is not None:
            # The replacement starts from no command and no answer.
            bell.cmd[worker.index] = bell.mark[worker.index] = 0
            bell.expected[worker.index] = 0
        new = self.spawn(worker.index)
        self.workers[worker.index] = new
        self._forget_workers()
        self.handshake([new], timeout)
        self.send_to(new, Command.ATTACH, self._attach_payload)
        self._answers([new], timeout, "attaching the shared block")
        if bell is not None:
            _to_bell(bell, new)
        return new

    def counters(self, timeout: float | None) -> dict[int, WorkerCounters]:
        """Every worker's counters (a STATS round trip; the pool must be idle).

        Raises:
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self.send(Command.STATS, units=self.workers)
        outcomes = self._answers(self.workers, timeout, "reporting stats")
        return {index: value for index, (_, value) in outcomes.items()}

    def dead(self) -> list[Worker]:
        """The workers whose process has exited (reaped here), in worker order."""
        return [w for w in self.workers if not w.process.is_alive()]

    def close(self, timeout: float, terminate_now: bool) -> BaseException | None:
        """Ask every live worker to close its envs (bounded by ``timeout``), then release
        everything, whatever happened while asking. Returns the first error an env's close()
        raised, if any."""
        error: BaseException | None = None
        self._queued.clear()  # an interrupted command's remaining turns never come
        try:
            live = [w for w in self.workers if w.process.is_alive()]
            if live and not terminate_now:
                self.send(Command.CLOSE, units=live)
                replies, _ = self.gather(live, timeout, "closing")
                errors = [self._decode(w, replies[w.index]) for w in live if w.index in replies]
                try:
                    raise_first([v for status, v in errors if status is Status.ERROR])
                except Exception as exc:
                    error = exc
        except BaseException:
            # Ctrl-C while the envs close: the user wants out now, not after the envs' own
            # close() returns; the workers are killed instead of waited for.
            release(self.resources, grace=0.0)
            raise
        release(self.resources, grace=0.0 if terminate_now else TERMINATE_GRACE)
        return error


def _to_bell(bell: Bell, worker: Worker) -> None:
    """``worker`` attached under the futex protocol: from now on its seq and awaited seq live
    in ``bell.seq`` and ``bell.expected`` (numpy arrays the usual step updates at once), not
    in the Worker."""
    assert worker.expected is None
    bell.seq[worker.index] = worker.seq
    bell.expected[worker.index] = 0
    worker.on_bell = True


_DEAD = object()
_STEP_COMMAND = Command.STEP
_SHIFT, _MARK_OK = np.uint64(8), np.uint64(MARK_OK)
#: a level no countdown reaches: every answer wakes the parent (``_wake``)
_WAKE_EACH = 2000
_STATUSES = {int(status): status for status in Status}
_STALE = object()
PLAIN_OK: Reply = (Status.OK, b"")
#: commands whose payloads may hold lambdas and closures (a call's arguments, attribute values)
#: or objects of the script's own classes (reset options): a worker does not run the script, so
#: pickle's reference to ``__main__.Name`` would not resolve there; cloudpickle sends them by value
_CLOUDPICKLED = (Command.CALL, Command.SET_ATTR, Command.RESET, Command.SET_RESET_OPTIONS)
#: commands that run envs, and so take turns with ``max_active`` (gymnasium's max_concurrency
#: limits ``step`` and ``reset``; calls and attributes run everywhere at once)
_IN_TURNS = (Command.STEP, Command.RESET)


def _is_chunk(
    command: Command, payload: Any, per_unit: Callable[[Any], Any] | None, targets: Sequence[Any]
) -> bool:
    """An action chunk (a STEP_ENVS of several sub-steps): it runs envs as a step does."""
    if command is not Command.STEP_ENVS or not targets:
        return False
    record = payload if per_unit is None else per_unit(targets[0])
    if isinstance(record, bytes):  # encoded already
        record = proto.decode_step_envs(record)
    return bool(record.substeps > 1)
