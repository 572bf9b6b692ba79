"""The worker pool: starting, messaging, watching, restarting and stopping worker processes.

The pool knows processes and pipes, not env semantics: it sends commands, waits for replies and
reports failures. Every wait polls each worker's reply pipe *and* its process sentinel, so a
death is seen the moment it happens even while other workers are still busy, and every wait
can be bounded. Each command carries a per-worker sequence number echoed by its reply; a reply
whose number is not the awaited one answers a command the parent stopped waiting for (after a
timeout or an interrupt) and is dropped, never taken for the answer to a later command.

The worker records, their cleanup (:func:`release`, which holds no reference to the vector env,
so it can serve as that env's ``weakref.finalize`` callback) and the reading of one worker's
replies live in ``_process.pool_workers``; the waits on the pipes, the turns of a
``max_active`` pool and the per-step round trips in ``_process.pool_pipes``; the futex
protocol's side of the waits (pools whose workers attached with it) in ``_process.pool_bell``.
This module starts the workers, sends their commands and hands each wait to the side that
serves it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from multiprocessing.context import BaseContext
from typing import Any

import cloudpickle

from subvec import _pickling as pickling
from subvec._backend import Collected, Failure, Outcome
from subvec._commands import (
    Command,
    Status,
    StepEnvsPayload,
    raise_first,
)
from subvec._process import wire as proto
from subvec._process.bootstrap import lifeline_for, start
from subvec._process.environ import WorkerEnvSpec, worker_environment
from subvec._process.pool_bell import BellExchange
from subvec._process.pool_pipes import PipeWaits, Round
from subvec._process.pool_workers import (
    PLAIN_OK,
    TERMINATE_GRACE,
    Gathered,
    PoolResources,
    Reply,
    Worker,
    decode,
    discard,
    release,
    terminate,
    to_bell,
)
from subvec._process.shm import SharedBlock
from subvec._process.starts import BuildFailure, StartGate
from subvec._process.topology import Placement
from subvec._process.wake import PIPES, Bell
from subvec._process.wire import AttachSpec, WorkerCounters, WorkerHello
from subvec._process.worker import worker_main

__all__ = ["Worker", "WorkerPool", "release"]


class WorkerPool:
    """Worker processes for a vector env: the process backend (see ``_backend``).

    Args:
        ctx: the multiprocessing context the workers start with.
        factories: the cloudpickled env factories, in env order.
        registry: the parent's gymnasium registry for the workers to adopt
            (``_process.bootstrap.registry_snapshot``); None under fork, whose workers inherit it.
        bounds: ``(lo, hi)`` env indices of each worker.
        autoreset_mode: the AutoresetMode value the workers' envs follow.
        placements: where each worker runs (None: anywhere).
        daemon: start the workers as daemons.
        spin_s: seconds to busy-poll for replies before blocking (0: block at once).
        partner: the worker that shares the parent's CPU (see ``gather``), if any.
        late_spin_s: with a partner, seconds to busy-poll for the other workers' replies
            once the partner has answered (0: block at once; see ``gather``).
        threads: cap each worker's BLAS, OpenMP and torch pools to this many threads
            (``subvec._process.threads``; None: leave them).
        max_active: the most workers that may be stepping or resetting at once (None: all).
            A STEP or RESET then goes to that many workers first, and to the next one each
            time one answers (``gather``), so at most that many envs are in ``step`` or
            ``reset`` at any moment (a worker steps its envs one after the other).
        worker_env: variables for each worker's environment: a dict, or a callable taking
            the worker's ``Placement`` and returning one
            (``subvec._process.environ.worker_environment``; evaluated here at each start, so a
            replacement gets the same).
        max_concurrent_starts: the most workers building their envs (and serving their first
            reset) at once (None: no limit; see ``subvec._process.starts``).
        build_retries: how many more times a worker calls a factory that raised.
        wake: ``"futex"``: after ATTACH, wake the workers and learn of their plain answers
            through the block (``subvec._process.wake``); ``"pipes"``: by the pipes alone.
        freeze: the workers' envs freeze when their episodes end (``EnvSlab``; DISABLED).
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
        late_spin_s: float = 0.0,
        max_active: int | None = None,
        threads: int | None = None,
        worker_env: WorkerEnvSpec = None,
        max_concurrent_starts: int | None = None,
        build_retries: int = 0,
        wake: str = PIPES,
        freeze: bool = False,
    ) -> None:
        self.ctx = ctx
        self.wake = wake
        #: the futex protocol's exchange, once the workers attached with it
        self._bell: BellExchange | None = None
        self.worker_env = worker_env
        self.build_retries = build_retries
        #: every failed factory attempt that was tried again, in the order the workers said
        self.build_failures: list[BuildFailure] = []
        self.threads = threads
        self.factories = factories
        self.registry = registry
        self.bounds = list(bounds)
        self.autoreset_mode = autoreset_mode
        self.freeze = freeze
        self.placements = placements
        self.daemon = daemon
        self.resources = PoolResources()
        if max_concurrent_starts is not None:
            self.resources.gate = StartGate(max_concurrent_starts)
        #: the waits on the pipes (all of them until the workers attach with the futex
        #: protocol, if they do)
        self._pipes = PipeWaits(self.resources, spin_s, partner, late_spin_s, max_active)
        #: the pickled ATTACH command, kept to attach a replacement worker
        self._attach_payload = b""

    def _forget_workers(self) -> None:
        """Drop what is kept per set of workers (after a start or a replacement)."""
        self._pipes.forget_workers()
        if self._bell is not None:
            self._bell.forget_workers()

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
                self.freeze,
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
            self._bell = BellExchange(bell, self.resources, self._pipes.spin_s)
            for worker in self.workers:
                to_bell(bell, worker)

    def _answers(
        self, workers: Sequence[Worker], timeout: float | None, what: str
    ) -> dict[int, Outcome]:
        """Every one of ``workers``' outcomes; raises the first failure or env error."""
        replies, failures = self.gather(workers, timeout, what)
        if failures:
            raise failures[0].to_error(timeout or 0.0)
        outcomes = {w.index: decode(w, replies[w.index]) for w in workers}
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
        if command is Command.STEP_ENVS and per_unit is None and _is_short_step(payload):
            command, payload = Command.STEP, None  # its 9-byte frame (or the bell's word)
        dump: Callable[[Any], bytes] = proto.dumps
        if command in _CLOUDPICKLED:
            dump = pickling.dumps
        elif command is Command.STEP_ENVS:
            dump = proto.encode_step_envs
        data = payload if encoded else b"" if payload is None else dump(payload)
        pipes = self._pipes
        pipes.drop_turns()  # a command gathered no further (interrupted) has no more turns
        first = len(targets)
        if pipes.max_active is not None and (
            command in _IN_TURNS or _is_lockstep(command, payload, per_unit, targets)
        ):
            first = pipes.max_active
        exchange = self._bell
        if exchange is not None and first == len(targets):
            exchange.announce(targets, command, data, per_unit, dump)
            return
        for i, worker in enumerate(targets):
            frame = data if per_unit is None else dump(per_unit(worker))
            if i < first:
                self.send_to(worker, command, frame)
            else:
                pipes.wait_turn(worker, command, frame)

    def send_to(self, worker: Worker, command: Command, payload: bytes = b"") -> None:
        """Send one frame to ``worker``; its reply is the one awaited from now on (announced
        in the block when the worker serves the futex protocol)."""
        exchange = self._bell
        if exchange is not None and worker.on_bell:
            exchange.announce([worker], command, payload, None, proto.dumps, framed=True)
            return
        self._pipes.write(worker, command, payload)

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
        exchange = self._bell
        if exchange is not None:
            deadline = None if timeout is None else time.monotonic() + timeout
            got = exchange.wait(units, timeout, what, False, deadline, enough)
            collected = self._decoded(got if got is not None else ({}, []))
            assert collected is not None
            return collected
        collected = self._decoded(self._pipes.collect_ready(units, enough, timeout, what))
        assert collected is not None
        return collected

    def _decoded(self, gathered: Gathered | None) -> Collected | None:
        if gathered is None:
            return None
        replies, failures = gathered
        workers = self.workers
        outcomes = {i: decode(workers[i], reply) for i, reply in replies.items()}
        return Collected(outcomes, failures)

    def _send_order(self) -> list[Worker]:
        workers = self.resources.workers
        first = self._pipes.partner
        if first is None:
            return workers
        # The partner last: waking it on our CPU may hand it the CPU at once (wake-up
        # preemption), and the other workers must have their command before that.
        return [w for w in workers if w.index != first] + [workers[first]]

    def _partner_last(self, units: Sequence[Worker]) -> Sequence[Worker]:
        """``units`` in their order, the partner moved last (as ``_send_order``): a command
        to some workers must not wake the partner on our CPU before the others have theirs."""
        first = self._pipes.partner
        if first is None or len(units) < 2 or units[-1].index == first:
            return units
        return [w for w in units if w.index != first] + [w for w in units if w.index == first]

    def exchange(
        self, command: Command, timeout: float | None, what: str, stop_at_death: bool = False
    ) -> Collected | None:
        """``send(command)`` then ``collect(...)``: the per-step round trip."""
        return self.exchange_frame(command, b"", timeout, what, stop_at_death)

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
        then the replies read (quickly where it applies)."""
        gathered = self._round_trip().exchange(command, payload, timeout, what, stop_at_death)
        return None if gathered is None else self._decoded(gathered)

    def gather_all(
        self, timeout: float | None, what: str, stop_at_death: bool = False
    ) -> Gathered | None:
        """``gather`` over the whole pool. Returns None when every worker answered with a
        plain OK (nothing to decode: the usual cheap step)."""
        return self._round_trip().gather_all(timeout, what, stop_at_death)

    def _round_trip(self) -> Round:
        """The per-step round trip over every worker: the futex protocol's once they
        attached with it, else the pipes' (bound once for the workers as they are:
        :meth:`PipeWaits.round`)."""
        return self._bell or self._pipes.bound or self._pipes.round(self.send, self._send_order())

    def gather(
        self,
        workers: Sequence[Worker],
        timeout: float | None,
        what: str,
        stop_at_death: bool = False,
        *,
        deadline: float | None = None,
    ) -> tuple[dict[int, Reply], list[Failure]]:
        """Wait for the awaited reply of every worker in ``workers``: the futex protocol's
        wait where they serve it, else :meth:`PipeWaits.gather`, which says what comes back."""
        exchange = self._bell
        if exchange is not None and workers and workers[0].on_bell:
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            got = exchange.gather(workers, timeout, what, stop_at_death, deadline)
            if got is None:
                return {w.index: PLAIN_OK for w in workers}, []
            return got
        return self._pipes.gather(workers, timeout, what, stop_at_death, deadline=deadline)

    # --- restart / stop -------------------------------------------------------------------

    def set_factories(self, blobs: Mapping[int, bytes]) -> None:
        """A restarted worker builds env ``i`` from ``blobs[i]`` from now on (the parent's
        own envs, past the workers', are not ours)."""
        for env, blob in blobs.items():
            if env < len(self.factories):
                self.factories[env] = blob

    def restart(self, worker: Worker, timeout: float | None) -> Worker:
        """Kill ``worker`` if needed and start a fresh one for the same envs, attached to the
        block. Its envs are freshly built and not yet reset.

        Raises:
            WorkerDiedError, WorkerTimeoutError, EnvError: the new worker failed to start.
        """
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(5.0)
        discard(worker)
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
            to_bell(bell, new)
        return new

    def suspend(self, timeout: float) -> None:
        """End every worker (each closes its envs first, within ``timeout``; stragglers get
        SIGTERM, then SIGKILL), keeping the block, the start tokens and the plan for
        :meth:`resume`. An env's close error is dropped: its process is gone either way."""
        workers = self.workers
        live = [w for w in workers if w.process.is_alive()]
        self._pipes.drop_turns()
        if live:
            self.send(Command.CLOSE, units=live)
            self.gather(live, timeout, "suspending")
        terminate(workers, grace=TERMINATE_GRACE)
        for worker in workers:
            discard(worker)
        workers.clear()
        self._forget_workers()

    def resume(self, timeout: float | None) -> None:
        """Start every worker again on its placement, built and attached to the block, as at
        construction (their envs not reset).

        Raises:
            WorkerDiedError, WorkerTimeoutError, EnvError: a worker failed to start (the
                others are ended again: the pool stays suspended).
        """
        bell = self.resources.bell
        try:
            for index in range(len(self.bounds)):
                if bell is not None:  # each starts from no command and no answer
                    bell.cmd[index] = bell.mark[index] = 0
                    bell.expected[index] = 0
                self.workers.append(self.spawn(index))
            self._forget_workers()
            self.handshake(self.workers, timeout)
            for worker in self.workers:
                self.send_to(worker, Command.ATTACH, self._attach_payload)
            self._answers(self.workers, timeout, "attaching the shared block")
        except BaseException:
            self.suspend(0.0)
            raise
        if bell is not None:
            for worker in self.workers:
                to_bell(bell, worker)

    def counters(self, timeout: float | None) -> dict[int, WorkerCounters]:
        """Every worker's counters (a STATS round trip; the pool must be idle).

        Raises:
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self.send(Command.STATS, units=self.workers)
        outcomes = self._answers(self.workers, timeout, "reporting stats")
        return {index: value for index, (_, value) in outcomes.items()}

    def seq(self, worker: Worker) -> int:
        """The seq of ``worker``'s last command (how many commands it was sent)."""
        bell = self.resources.bell
        if bell is not None and worker.on_bell:
            return int(bell.seq[worker.index])
        return worker.seq

    def dead(self) -> list[Worker]:
        """The workers whose process has exited (reaped here), in worker order."""
        return [w for w in self.workers if not w.process.is_alive()]

    def owing(self) -> list[Worker]:
        """The live workers that still owe the reply to a command whose wait was abandoned
        (interrupted by Ctrl-C, or past its timeout): busy with it until they answer."""
        bell = self.resources.bell
        return [
            w
            for w in self.workers
            if (w.expected is not None or (bell is not None and bell.expected[w.index]))
            and w.process.is_alive()
        ]

    def close(self, timeout: float, terminate_now: bool) -> BaseException | None:
        """Ask every live worker to close its envs (bounded by ``timeout``), then release
        everything, whatever happened while asking. Returns the first error an env's close()
        raised, if any."""
        error: BaseException | None = None
        self._pipes.drop_turns()  # an interrupted command's remaining turns never come
        try:
            live = [w for w in self.workers if w.process.is_alive()]
            if live and not terminate_now:
                self.send(Command.CLOSE, units=live)
                replies, _ = self.gather(live, timeout, "closing")
                errors = [decode(w, replies[w.index]) for w in live if w.index in replies]
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


#: commands whose payloads may hold lambdas and closures (a call's arguments, attribute values)
#: or objects of the script's own classes (reset options): a worker does not run the script, so
#: pickle's reference to ``__main__.Name`` would not resolve there; cloudpickle sends them by value
_CLOUDPICKLED = (
    Command.CALL,
    Command.SET_ATTR,
    Command.RESET,
    Command.SET_RESET_OPTIONS,
    Command.RESTORE,
)
#: commands that run envs, and so take turns with ``max_active`` (gymnasium's max_concurrency
#: limits ``step`` and ``reset``; calls and attributes run everywhere at once)
_IN_TURNS = (Command.STEP, Command.RESET)


def _is_short_step(payload: Any) -> bool:
    """Whether a STEP_ENVS ``payload`` is a lock-step step with every action in the block in
    the space's dtypes: what the short STEP says."""
    return (
        isinstance(payload, StepEnvsPayload)
        and payload.envs is None
        and payload.actions is None
        and payload.action_dtypes is None
        and payload.block is None
    )


def _is_lockstep(
    command: Command, payload: Any, per_unit: Callable[[Any], Any] | None, targets: Sequence[Any]
) -> bool:
    """A lock-step STEP_ENVS (every env of the unit, or an action chunk): it runs envs as a
    step does (asynchronous stepping's commands run everywhere at once)."""
    if command is not Command.STEP_ENVS or not targets:
        return False
    record = payload if per_unit is None else per_unit(targets[0])
    if isinstance(record, bytes):  # encoded already
        record = proto.decode_step_envs(record)
    return bool(record.envs is None or record.is_chunk)
