"""Worker process entry point: pin, build envs, handshake, then serve commands until CLOSE.

    parent                                     worker (this module)
    ------                                     --------------------
    Process(target=worker_main, args=...) ───► set its environment (GPU, worker_env), tie
                                               itself to the parent's life, pin itself
                                               build its k envs from cloudpickled factories
                                               (holding a start token; retried on failure)
                       READY(hello) ◄───────── report pid, placement, spaces, metadata
    ATTACH(block name, layout) ──────────────► map the shared block, bind the EnvSlab
    STEP / RESET / CALL / SET_ATTR / ... ───► EnvSlab does the work; rows land in the block
              OK | OK_PAYLOAD | ERROR ◄─────── one reply per command, same seq
    CLOSE ───────────────────────────────────► close envs, reply, unmap, exit

SIGINT is ignored: on Ctrl-C the whole process group gets the signal and the parent decides.
A daemon thread waits on the parent's sentinel and exits the process when the parent dies, even
in the middle of a long env step; on Linux the kernel also kills the worker then, which covers
native code that keeps the GIL (``_process.bootstrap.tie_to_parent``). The worker does not run the
user's script; it registers the parent's gymnasium envs it lacks before building its own
(``_process.bootstrap``).
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from subvec._commands import (
    Command,
    ErrorRecord,
    Status,
)
from subvec._compat import AutoresetMode
from subvec._infos import InfoBlockWriter, to_columns
from subvec._process import wire as proto
from subvec._process.block import bind_rows, slot_writers
from subvec._process.bootstrap import Lifeline, adopt_registry, tie_to_parent
from subvec._process.chunks import ChunkAttachment
from subvec._process.gpus import gpu_environment
from subvec._process.serve import PROCESS_COMMANDS, run_command, unit_reply
from subvec._process.shm import SharedBlock
from subvec._process.slice import set_thread_slice
from subvec._process.starts import (
    BuildFailure,
    StartGate,
    build_env,
    maybe_token,
)
from subvec._process.threads import cap_environment, cap_loaded_blas, cap_torch
from subvec._process.topology import Placement, apply_placement
from subvec._process.wake import MARK_OK, MARK_PIPE, STEP_KIND, Bell
from subvec._process.wire import AttachSpec, WorkerCounters, WorkerHello
from subvec._slab import EnvSlab, env_metadata
from subvec._slab_records import ChunkResult, SlabResult

__all__ = ["worker_main"]


def _watch_parent() -> None:
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def wait_and_exit() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        # The parent is gone: nobody will read our replies or unlink anything we could touch.
        os._exit(0)

    threading.Thread(target=wait_and_exit, name="subvec-parent-watch", daemon=True).start()


def worker_main(
    worker_index: int,
    first_env: int,
    factories: list[bytes],
    registry: bytes | None,
    cmd_conn: Connection,
    reply_conn: Connection,
    autoreset_mode: str,
    placement: Placement | None,
    inherited_fds: list[int],
    lifeline: Lifeline,
    threads: int | None = None,
    environ: dict[str, str | None] | None = None,
    gate: StartGate | None = None,
    build_retries: int = 0,
    freeze: bool = False,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads is not None:
        # Before the factories are unpickled: what they import reads these as it loads. The
        # BLAS that numpy loaded before we ran is capped by call (see _threads).
        cap_environment(threads)
        cap_loaded_blas(threads)
    # Also before the factories are unpickled: a simulator reads its device variables when it
    # is imported. After the thread caps, so that worker_env may change those too.
    gpu = placement.gpu_info if placement is not None else None
    gpu_report = gpu_environment(gpu, environ or {})
    for fd in inherited_fds:  # fork only: other workers' pipe ends copied into us
        try:
            os.close(fd)
        except OSError:
            pass  # already closed: nothing of ours to release
    tie_to_parent(lifeline)
    _watch_parent()
    set_thread_slice(None)  # the parent's short slice, where inherited, is the parent's alone
    report = replace(
        apply_placement(placement),
        gpu=None if gpu is None else gpu.index,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        egl_device=None if gpu_report is None else gpu_report.egl_device,
        egl_source=None if gpu_report is None else gpu_report.egl_source,
    )
    cmd_fd, reply_fd = cmd_conn.fileno(), reply_conn.fileno()

    envs: list[Any] = []
    failures: list[BuildFailure] = []
    loaded = 0  # factories unpickled: an error before all are names the next env
    try:
        # A start token covers unpickling too: it imports the simulator (max_concurrent_starts).
        with maybe_token(gate):
            # Unpickling imports the modules the factories name (and so their registrations);
            # the parent's registry then fills in what the script registered (see _bootstrap).
            fns = []
            for blob in factories:
                fns.append(cloudpickle.loads(blob))
                loaded += 1
            if registry is not None:
                adopt_registry(registry)
            for fn in fns:
                envs.append(build_env(fn, first_env + len(envs), build_retries, failures))
        if threads is not None:
            cap_torch(threads)  # the envs may have imported torch, which sized its pools
            cap_loaded_blas(threads)  # and loaded a BLAS of their own
    except Exception as exc:
        at = loaded if loaded < len(factories) else len(envs)
        record = ErrorRecord.capture(exc, first_env + at, "make")
        proto.write_frame(reply_fd, Status.ERROR, 0, proto.dumps(record))
        for env in envs:
            try:
                env.close()
            except Exception:
                pass  # the construction error is the one to report; it is already sent
        return

    slab = EnvSlab(envs, first_env, AutoresetMode(autoreset_mode), freeze)
    try:
        hello = WorkerHello(
            placement=report,
            observation_spaces=[env.observation_space for env in envs],
            action_spaces=[env.action_space for env in envs],
            metadata=env_metadata(envs[0]),
            render_mode=envs[0].render_mode,
            build_failures=failures,
        )
        proto.write_frame(reply_fd, Status.READY, 0, cloudpickle.dumps(hello))
    except Exception as exc:
        record = ErrorRecord.capture(exc, first_env, "make")
        proto.write_frame(reply_fd, Status.ERROR, 0, proto.dumps(record))
        return
    _Server(worker_index, slab, cmd_fd, reply_fd, gate, build_retries).serve()


# Enum members as module constants: the per-step path compares against them every step.
_STEP, _CLOSE = Command.STEP, Command.CLOSE
#: the commands besides STEP that write observations (into the slot the parent picked)
_WRITES_OBS = (Command.RESET, Command.STEP_ENVS)
_OK, _OK_PAYLOAD = Status.OK, Status.OK_PAYLOAD
_HEADER_PACK, _HEADER_SIZE = proto.HEADER.pack, proto.HEADER.size


class _Server:
    def __init__(
        self,
        index: int,
        slab: EnvSlab,
        cmd_fd: int,
        reply_fd: int,
        gate: StartGate | None = None,
        build_retries: int = 0,
    ) -> None:
        self.index = index
        #: the start tokens, held again for the first reset (where some simulators load)
        self.first_reset_gate = gate
        #: the start tokens and factory retries of a reconfigure's builds
        self.gate = gate
        self.build_retries = build_retries
        self.slab = slab
        self.cmd_fd = cmd_fd
        self.reply_fd = reply_fd
        self.block: SharedBlock | None = None
        #: with the futex protocol (``_process.wake``), its words, and our command word at ATTACH
        self.bell: Bell | None = None
        self.bell_seen = 0
        self.spin_s = 0.0
        self.info_columns = False
        self.info_block: InfoBlockWriter | None = None
        #: with observation slots: a row writer per slot, and the cell that picks one
        self.obs_writers: list[Any] = []
        self.obs_slot_cell: memoryview | None = None
        #: the chunk block named by the last chunk, and the single observation and action
        #: spaces of what the blocks hold (None: by value)
        self.chunks = ChunkAttachment()
        self.obs_space: Any = None
        self.act_space: Any = None
        #: short STEPs served, seconds handling commands, seconds waiting for them (kept
        #: here by ``serve`` before each command but the usual step), env steps of STEP_ENVS
        self.steps = 0
        self.env_steps_some = 0
        self.busy_s = 0.0
        self.waiting_s = 0.0

    def serve(self) -> None:
        """Serve commands until CLOSE or until the parent closes our command pipe: on the
        pipes, and from an ATTACH that names a bell on the futex protocol
        (``_process.wake``). A plain STEP (every env, its action in the block) is served
        here; every other command goes through :meth:`handle`."""
        door: _Pipes | _BellDoor = _Pipes(self.cmd_fd, self.reply_fd)
        commands = {int(c): c for c in Command}
        plain_step, clock = self._plain_step, time.perf_counter
        # How long the next command has been taking to come after our reply (a moving
        # average). We only spin while it is shorter than the spin window: when the other
        # workers' envs are slow, spinning would only burn the window, and a busy vCPU slows
        # its sibling down (measured 1.3-1.5x on the 2-vCPU VM, as on hyperthreads). A worker
        # that never spins (the partner) skips that average.
        wait_estimate = 0.0
        # The counters of stats(): two clock reads per command, the time between them and
        # since the last reply added up in locals (kept on self at each other command).
        replied_at = clock()
        steps, busy_s, waiting_s = 0, 0.0, 0.0
        try:
            while True:
                spin_s = self.spin_s  # set by ATTACH, the first command
                seq = door.next_step(spin_s if wait_estimate < spin_s else 0.0)
                started = clock()
                waiting_s += started - replied_at
                if spin_s:
                    wait_estimate = 0.5 * (wait_estimate + started - replied_at)
                if seq:
                    steps += 1
                    reply: bytes | None
                    try:
                        reply = plain_step()
                    except Exception as exc:
                        self._reply_error(exc, _STEP, seq)
                        reply = None
                    door.answer_step(seq, reply)
                    replied_at = clock()
                    busy_s += replied_at - started
                    continue
                self.steps, self.busy_s, self.waiting_s = steps, busy_s, waiting_s
                try:
                    for code, got, payload in door.frames():
                        command = commands[code]
                        if command is _STEP:
                            steps += 1  # a STEP that is not the next (an earlier one dropped)
                        try:
                            status, out = self.handle(command, payload)
                        except Exception as exc:
                            self._reply_error(exc, command, got)
                        else:
                            proto.write_frame(self.reply_fd, status, got, out)
                        if command is _CLOSE:
                            door.frames_answered()
                            return
                except EOFError:
                    return  # the parent closed our command pipe: nothing more will come
                door.frames_answered()
                replied_at = clock()
                busy_s += replied_at - started
                if self.bell is not None and isinstance(door, _Pipes):
                    door = _BellDoor(
                        self.bell, self.index, self.bell_seen, self.cmd_fd, self.reply_fd
                    )
        finally:
            if self.block is not None:
                self.slab.arrays = None
                # Our views of the block go first, so that it unmaps now.
                self.info_block, self.obs_writers, self.obs_slot_cell = None, [], None
                self.chunks.close()
                if self.bell is not None:
                    self.bell.close()
                self.block.close()

    def _plain_step(self) -> bytes:
        """A plain STEP of every env: its reply payload, empty for a plain OK."""
        if self.obs_writers:
            self._point_obs_rows()
        return self._step_reply(self.slab.step())

    def _reply_error(self, exc: Exception, command: Command, seq: int) -> None:
        env_index = None if command is Command.ATTACH else self.slab.current_env
        record = ErrorRecord.capture(exc, env_index, command.name.lower())
        proto.write_frame(self.reply_fd, Status.ERROR, seq, proto.dumps(record))

    def handle(self, command: Command, payload: bytes) -> tuple[Status, bytes]:
        if command is _STEP:  # first: the per-step case (the short form: no payload)
            reply = self._plain_step()
            return (Status.OK_PAYLOAD if reply else Status.OK), reply
        slab = self.slab
        if self.obs_writers and command in _WRITES_OBS:
            self._point_obs_rows()
        if command in PROCESS_COMMANDS:
            return self._own(command, payload)
        step_envs = command is Command.STEP_ENVS
        record: Any = None  # SNAPSHOT's: no payload
        if step_envs:
            record = proto.decode_step_envs(payload)
        elif payload:
            record = proto.loads(payload)
        views, gate, retries = self._chunk_views, self.gate, self.build_retries
        if command is Command.RESET and self.first_reset_gate is not None:
            first, self.first_reset_gate = self.first_reset_gate, None
            with first.token():  # the first reset holds a start token again
                result = run_command(slab, command, record, views, gate, retries)
        else:
            result = run_command(slab, command, record, views, gate, retries)
        if isinstance(result, ChunkResult):
            self.env_steps_some += result.executed
            return self._chunk_reply(result)
        if step_envs:
            self.env_steps_some += len(slab.envs) if record.envs is None else len(record.envs)
            if self.info_block is not None:
                # Its infos travel in the reply: a flag left by an earlier step must not make
                # the parent read that step's infos as this one's.
                self.info_block.put(())
        if isinstance(result, SlabResult):
            if result.is_empty():
                return Status.OK, b""
            return Status.OK_PAYLOAD, self._dump_result(result)
        if command is Command.CALL:
            called = range(len(slab.envs)) if record.envs is None else record.envs
            what = f"the result of {record.name!r}"
            return Status.OK_PAYLOAD, self._dump_per_env(result, what, zip(called, result))
        if command is Command.SNAPSHOT:
            return Status.OK_PAYLOAD, self._dump_per_env(result, "the state", enumerate(result))
        return Status.OK, b""

    def _own(self, command: Command, payload: bytes) -> tuple[Status, bytes]:
        """The commands of the process, not of its envs: ATTACH, STATS and CLOSE."""
        if command is Command.ATTACH:
            self.attach(proto.loads(payload))
            return Status.OK, b""
        if command is Command.STATS:
            env_steps = self.steps * len(self.slab.envs) + self.env_steps_some
            counters = WorkerCounters(env_steps, self.busy_s, self.waiting_s)
            return Status.OK_PAYLOAD, proto.dumps(counters)
        self.slab.close()  # CLOSE
        return Status.OK, b""

    def _chunk_views(self, block: Any) -> Any:
        return self.chunks.get(block, self.obs_space, self.act_space)

    def _chunk_reply(self, done: ChunkResult) -> tuple[Status, bytes]:
        """An action chunk's answer (its results are in the chunk block): the events, the
        by-value observations and the envs that raised, if any."""
        reply = unit_reply(done, self.slab.first_index)
        if reply is None:
            return Status.OK, b""
        items = [(i, info) for i, _, info in done.infos]
        return Status.OK_PAYLOAD, self._dump_per_env(
            reply, "the info", [*items, *(done.obs or ()), *(done.sub_obs or ())]
        )

    def _dump_per_env(self, obj: Any, what: str, items: Iterable[tuple[int, Any]]) -> bytes:
        """Pickle ``obj`` (cloudpickle if pickle cannot). On failure, the env of the first of
        ``items`` (local env index, its part) that cannot be sent becomes the slab's current
        env, so that the error names it rather than the env stepped last."""
        try:
            return proto.dumps(obj)
        except Exception:
            try:
                return cloudpickle.dumps(obj)  # type: ignore[no-any-return]
            except Exception as exc:
                for local, item in items:
                    try:
                        cloudpickle.dumps(item)
                    except Exception:
                        self.slab.current = local
                        break
                raise TypeError(f"{what} returned by the env cannot be pickled: {exc}") from exc

    def _point_obs_rows(self) -> None:
        """Write this command's observations into the slot the parent picked for them."""
        arrays = self.slab.arrays
        assert arrays is not None and self.obs_slot_cell is not None
        if arrays.split_obs is not None:
            arrays.split_obs = self.obs_writers[self.obs_slot_cell[0]]
        else:
            arrays.write_obs = self.obs_writers[self.obs_slot_cell[0]]

    def _step_reply(self, result: SlabResult) -> bytes:
        """The short STEP's reply payload; empty for a plain OK (every result in the block).
        Every short STEP goes through here: with the info regions, it sets or clears our flag.
        (A step with by-value observations or an env's error always has a payload, whose
        infos the parent takes from it: the flag is read for plain OKs only.)"""
        info_block = self.info_block
        if (
            info_block is not None
            and not result.obs
            and not result.errors
            and info_block.put(result.infos)
        ):
            return b""
        return b"" if result.is_empty() else self._dump_result(result)

    def _dump_result(self, result: SlabResult) -> bytes:
        """A reply's ``UnitReply`` (:func:`unit_reply`), its infos as columns when the parent
        merges them so."""
        reply = unit_reply(result, self.slab.first_index)
        assert reply is not None  # the caller answers an empty result with a plain OK
        events = result.infos
        if self.info_columns and events:
            reply = reply._replace(infos=to_columns(events) or events)
        return self._dump_per_env(reply, "the info", [*events, *(result.obs or ())])

    def attach(self, spec: AttachSpec) -> None:
        block = SharedBlock.attach(spec.block_name, spec.layout)
        self.block = block
        self.spin_s = spec.spin_us[self.index] * 1e-6 if spec.spin_us else 0.0
        self.info_columns = spec.info_columns
        lo, hi = self.slab.first_index, self.slab.first_index + len(self.slab.envs)
        views = block.views
        if spec.info_block:
            self.info_block = InfoBlockWriter(views, self.index, lo, hi)
        self.obs_writers, self.obs_slot_cell = slot_writers(views, spec, lo, hi)
        self.slab.bind(bind_rows(views, spec, lo, hi))
        self.obs_space, self.act_space = spec.observation_space, spec.action_space
        if spec.wake:
            self.bell = Bell(views)
            self.bell_seen = int(self.bell.cmd[self.index])


class _Pipes:
    """Commands as frames on the command pipe (until ATTACH names a bell, and for good
    without one). The parent numbers each worker's commands 1, 2, 3...: a plain STEP is
    recognised by comparing its header's bytes, without parsing anything."""

    def __init__(self, cmd_fd: int, reply_fd: int) -> None:
        self.cmd_fd = cmd_fd
        self.reply_fd = reply_fd
        self.poller = select.poll()
        self.poller.register(cmd_fd, select.POLLIN)
        self.seq = 0
        self._head = b""

    def next_step(self, spin_s: float) -> int:
        """Wait for the next command (busy-polling for up to ``spin_s`` first: when the
        parent sends within that window we skip a sleep and a wake-up). Returns its seq if
        it is a plain STEP, else 0 (its frame is in :meth:`frames`)."""
        if spin_s:
            poll, deadline = self.poller.poll, time.perf_counter() + spin_s
            while not poll(0) and time.perf_counter() < deadline:
                pass  # busy-poll: nothing to do but look again
        head = os.read(self.cmd_fd, _HEADER_SIZE)
        if head == _HEADER_PACK(0, _STEP, self.seq + 1):
            self.seq += 1
            return self.seq
        self._head = head
        return 0

    def frames(self) -> list[tuple[int, int, bytes]]:
        """The command behind the header just read, ``(code, seq, payload)``.

        Raises:
            EOFError: the parent closed the command pipe.
        """
        frame = proto.finish_frame(self.cmd_fd, self._head)
        self.seq = frame[1]
        return [frame]

    def answer_step(self, seq: int, reply: bytes | None) -> None:
        """Answer plain STEP ``seq``: ``reply`` its payload (empty: a plain OK; None: the
        error frame is written already)."""
        if reply:
            proto.write_frame(self.reply_fd, _OK_PAYLOAD, seq, reply)
        elif reply is not None:
            os.write(self.reply_fd, _HEADER_PACK(0, _OK, seq))

    def frames_answered(self) -> None:
        """Nothing to do: every frame's reply went on the reply pipe."""


class _BellDoor:
    """Commands announced in the block's words (``_process.wake``): a plain STEP there,
    anything else as frames on the command pipe up to the announced seq (earlier frames are
    commands the parent stopped waiting for: served in order, their replies dropped there as
    stale, as with the pipes alone)."""

    def __init__(self, bell: Bell, index: int, seen: int, cmd_fd: int, reply_fd: int) -> None:
        self.bell = bell
        self.index = index
        self.seen = seen
        self.cmd_fd = cmd_fd
        self.reply_fd = reply_fd
        self.upto = 0

    def next_step(self, spin_s: float) -> int:
        """Wait for the next announcement (busy-looking for up to ``spin_s`` first). Returns
        its seq if it is a plain STEP, else 0 (its frames are in :meth:`frames`)."""
        word = self.seen = self.bell.wait_command(self.index, self.seen, spin_s)
        if word & 0xFF == STEP_KIND:
            return word >> 8
        self.upto = word >> 8
        return 0

    def frames(self) -> list[tuple[int, int, bytes]]:
        """The frames on the command pipe up to the announced seq, ``(code, seq, payload)``
        (all written before the announcement).

        Raises:
            EOFError: the parent closed the command pipe.
        """
        frames = [proto.read_frame(self.cmd_fd)]
        while frames[-1][1] != self.upto:
            frames.append(proto.read_frame(self.cmd_fd))
        return frames

    def answer_step(self, seq: int, reply: bytes | None) -> None:
        """Answer plain STEP ``seq`` with a mark: OK for an empty ``reply``, else "on the
        pipe" (its payload, or the error frame already written)."""
        mark = MARK_PIPE
        if reply:
            proto.write_frame(self.reply_fd, _OK_PAYLOAD, seq, reply)
        elif reply is not None:
            mark = MARK_OK
        self.bell.answer(self.index, seq, mark)

    def frames_answered(self) -> None:
        """Mark the announced command answered on the pipe."""
        self.bell.answer(self.index, self.upto, MARK_PIPE)
