"""The parent's own envs (``parent_envs``): a backend with one unit that runs in-process.

The vector env steps its last ``parent_envs`` envs itself, in the parent, while the workers
step theirs: ``send`` only records the command, and ``collect`` (which the front calls before
waiting for the workers) runs it. Those envs share the block's rows as a worker's do (one
binding, ``_process.block.bind_rows``), and an env's exception becomes the same ``EnvError`` a
worker's would (type kept, env index, this pid, traceback as cause).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gymnasium import Env

from subvec._backend import PLAIN, Collected, Outcome, Unit
from subvec._commands import Command, ErrorRecord, Status, rebuild_remote_error
from subvec._compat import AutoresetMode
from subvec._process.block import bind_rows
from subvec._process.chunks import ChunkAttachment, ChunkViews
from subvec._process.serve import PROCESS_COMMANDS, run_command, unit_reply
from subvec._process.starts import build_env
from subvec._process.wire import AttachSpec
from subvec._slab import EnvSlab, close_quietly
from subvec._slab_records import ChunkResult, SlabResult

__all__ = ["LocalShare"]


class LocalShare:
    """The parent's envs ``lo..hi-1`` as a backend of one unit (itself)."""

    inline = True

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Env[Any, Any]]],
        lo: int,
        index: int,
        autoreset_mode: AutoresetMode,
        freeze: bool = False,
        build_retries: int = 0,
    ) -> None:
        """Build the envs (in the parent, while the workers build theirs), each factory tried
        ``1 + build_retries`` times (a reconfigure's too); ``freeze``: they freeze when their
        episodes end (``EnvSlab``).

        Raises:
            EnvError: an env factory raised (its type kept, naming the env).
        """
        self.index = index
        #: how many more times a reconfigure calls a factory that raised
        self.build_retries = build_retries
        self.lo, self.hi = lo, lo + len(env_fns)
        #: what :meth:`resume` builds the envs from again
        self._env_fns = list(env_fns)
        self.slab = EnvSlab(self._build(env_fns, lo, build_retries), lo, autoreset_mode, freeze)
        self._pending: Callable[[], Any] | None = None
        self._command = Command.STEP_ENVS
        #: the chunk block, mapped here as a worker maps it (``_process.chunks``)
        self._chunks = ChunkAttachment()
        #: the single observation and action spaces of what the blocks hold (None: by value)
        self._spaces: tuple[Any, Any] = (None, None)

    @staticmethod
    def _build(
        env_fns: Sequence[Callable[[], Env[Any, Any]]], lo: int, build_retries: int
    ) -> list[Env[Any, Any]]:
        """The envs ``lo..`` built from ``env_fns``.

        Raises:
            EnvError: a factory raised (its type kept, naming the env; the envs built so
                far are closed).
        """
        envs: list[Env[Any, Any]] = []
        try:
            for fn in env_fns:
                envs.append(build_env(fn, lo + len(envs), build_retries, []))
        except Exception as exc:
            close_quietly(envs)
            record = ErrorRecord.capture(exc, lo + len(envs), "make")
            error = rebuild_remote_error(record, os.getpid())
            raise error from error.__cause__  # the traceback as the cause, as a worker's
        return envs

    # --- the unit --------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return os.getpid()

    def describe(self) -> str:
        span = f"env {self.lo}" if self.hi - self.lo == 1 else f"envs {self.lo}..{self.hi - 1}"
        return f"the parent's own {span}"

    @property
    def envs(self) -> list[Env[Any, Any]]:
        return self.slab.envs

    @property
    def units(self) -> Sequence[Unit]:
        return (self,)

    # --- the backend -----------------------------------------------------------------------

    def bind(self, views: dict[str, Any], spec: AttachSpec) -> None:
        """Give the envs their rows of the block, as a worker's are given."""
        self.slab.bind(bind_rows(views, spec, self.lo, self.hi))
        self._spaces = (spec.observation_space, spec.action_space)

    def adopt_chunks(self, views: ChunkViews) -> None:
        """The chunk block's views, when the front keeps them in this process's memory (the
        in-process vector env): no segment to attach."""
        self._chunks.adopt(views)

    def send(
        self,
        command: Command,
        payload: Any = None,
        *,
        per_unit: Callable[[Any], Any] | None = None,
        units: Sequence[Any] | None = None,
    ) -> None:
        """Record ``command``; :meth:`collect` runs it."""
        if units is not None and self not in units:
            return
        if per_unit is not None:
            payload = per_unit(self)
        self._command = command
        if command in PROCESS_COMMANDS:
            raise ValueError(f"the parent's own envs take no {command.name} command")
        self._pending = lambda: run_command(
            self.slab, command, payload, self._chunk_views, None, self.build_retries
        )

    def _chunk_views(self, block: Any) -> ChunkViews:
        return self._chunks.get(block, *self._spaces)

    def collect(
        self,
        timeout: float | None,
        what: str,
        *,
        units: Sequence[Any] | None = None,
        stop_at_death: bool = False,
    ) -> Collected | None:
        """Run the recorded command; None when it left nothing to say (a plain OK)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        outcome = self._run(pending)
        if outcome is PLAIN:
            return None
        return Collected({self.index: outcome}, [])

    def _run(self, pending: Callable[[], Any]) -> Outcome:
        try:
            result = pending()
        except Exception as exc:
            record = ErrorRecord.capture(exc, self.slab.current_env, self._command.name.lower())
            return Status.ERROR, rebuild_remote_error(record, os.getpid())
        if isinstance(result, (SlabResult, ChunkResult)):  # as a worker replies
            reply = unit_reply(result, self.lo)
            return PLAIN if reply is None else (Status.OK_PAYLOAD, reply)
        if result is None:  # set_attr, set_reset_options, restore, reconfigure
            return PLAIN
        return Status.OK_PAYLOAD, result

    def collect_ready(
        self, units: Sequence[Any], enough: int, timeout: float | None, what: str
    ) -> Collected:
        """Run the recorded command (this unit is always ready once asked)."""
        pending, self._pending = self._pending, None
        if pending is None or self not in units:
            self._pending = pending
            return Collected({}, [])
        return Collected({self.index: self._run(pending)}, [])

    def restart(self, unit: Any, timeout: float | None) -> Unit:
        raise RuntimeError("the parent's own envs cannot be restarted")

    def suspend(self, timeout: float) -> None:
        """Close the envs (their close errors dropped); :meth:`resume` builds them again."""
        self._pending = None
        close_quietly(self.slab.envs)

    def resume(self, timeout: float | None) -> None:
        """Build the envs again from their factories, in new slabs bound to the same rows.

        Raises:
            EnvError: a factory raised (the envs stay closed: resume again).
        """
        arrays = self.slab.arrays
        envs = self._build(self._env_fns, self.lo, self.build_retries)
        old = self.slab
        self.slab = EnvSlab(envs, self.lo, old.autoreset_mode, old.freeze)
        if arrays is not None:
            self.slab.bind(arrays)

    def set_factories(self, blobs: Mapping[int, bytes]) -> None:
        """Nothing to keep: the parent's own envs are never rebuilt."""

    def dead(self) -> list[Any]:
        """None: these envs live and die with the parent."""
        return []

    def owing(self) -> list[Any]:
        """None: these envs run inside ``collect``, so an interrupted call left nothing
        running."""
        return []

    def close(self, timeout: float, terminate: bool) -> BaseException | None:
        """Close the envs; return the first error an env's close() raised, naming it."""
        self._pending = None
        self._chunks.close()
        slab = self.slab
        # Unbind its rows of the block: a traceback may keep the slab alive after close.
        slab.arrays = None
        try:
            slab.close()
        except Exception as exc:
            record = ErrorRecord.capture(exc, slab.current_env, "close")
            return rebuild_remote_error(record, os.getpid())
        return None
