"""``suspend`` and ``resume``: the units end between rollouts and start again where they were.

    suspend() ─► SNAPSHOT to every unit: each env's ``get_state()`` where it has the hook,
                 and what its unit keeps of it ─► every unit ends (its envs closed, its
                 processes gone: their GPU memory and simulator state freed); the vector env
                 keeps its spaces, placement, shared block, stored reset options and seeds
    resume()  ─► every unit starts again on its placement (all at once) ─► reset() of every
                 env (its stored options, no seed) ─► RESTORE: each env with a snapshot
                 ``set_state(state)``, and its unit's record of it

With the hook, an env's episode continues exactly where it was (the next step is the one it
would have had); without it, the env starts a new episode (reset by ``resume``, its
observation not returned: call ``reset()`` to seed it and see it).

A vector env built with ``start="lazy"`` begins where a suspended one is, with no snapshot:
its first call starts the units (:meth:`Suspension._start_units`, the start half of
``resume``) and then runs. A mixin of :class:`subvec._front.front.VectorFront`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from subvec._backend import Backend
from subvec._commands import Command, EnvSnapshot, RestorePayload
from subvec._front.calls import CallSteps
from subvec._front.ended import EndedEnvs
from subvec._front.exchange import LockstepExchange
from subvec._front.setup import Timeouts
from subvec._front.state import _State
from subvec._front.units import Units

__all__ = ["Suspension"]

#: how long a suspending unit's envs may take to close before its processes are ended
SUSPEND_CLOSE_TIMEOUT = 10.0


class Suspension(CallSteps):
    """``suspend`` and ``resume`` of :class:`subvec._front.front.VectorFront` (a mixin)."""

    # The front's, declared for the type checker.
    num_envs: int
    timeouts: Timeouts
    _units: Units
    _exchange: LockstepExchange
    _ended: EndedEnvs
    _backends: list[Backend]
    #: while suspended: every env's snapshot, and the ended-env flags (DISABLED) then
    _suspended: tuple[list[EnvSnapshot], np.ndarray] | None = None
    #: built with ``start="lazy"`` and no call has started the units yet
    _unstarted = False

    if TYPE_CHECKING:

        def _build_timeout(self, timeout: float | None) -> float | None: ...
        def _assert_open(self) -> None: ...
        def reset(self, *, seed: Any = None, options: Any = None) -> Any: ...

    @property
    def suspended(self) -> bool:
        """Whether the units are ended by :meth:`suspend` (until :meth:`resume`)."""
        return self._suspended is not None

    @property
    def started(self) -> bool:
        """Whether the units have started (False only for ``start="lazy"`` before the first
        call)."""
        return not self._unstarted

    def _enter_unstarted(self) -> None:
        """``start="lazy"``: no unit runs yet; the first call starts them."""
        self._unstarted = True
        self._enter(_State.SUSPENDED)

    def _start_lazily(self) -> None:
        """The first call of a ``start="lazy"`` vector env: start the units (the call then
        runs as on any vector env).

        Raises:
            EnvError, WorkerDiedError, WorkerTimeoutError, ValueError: a unit failed to start,
                or its envs' spaces are not the ones read at construction (nothing stays
                started: the next call tries again).
        """
        self._start_units()
        try:
            self._check_started()
        except BaseException:
            for backend in self._backends:
                backend.suspend(0.0)
            raise
        self._unstarted = False
        self._enter(_State.IDLE)

    def _check_started(self) -> None:
        """Raise if the units a lazy start started are not what construction read (the
        process backend checks its workers' spaces; nothing to check here)."""

    def suspend(self) -> None:
        """Snapshot every env and end every unit (worker processes, Ray actors; the
        parent's own envs are closed), freeing their memory, GPU included; the vector env
        keeps its spaces, placement plan, shared block, seeds and stored reset options.
        Every call but :meth:`resume` and ``close()`` raises until :meth:`resume`.

        An env (or a wrapper of it) with ``get_state()`` (returning something picklable) and
        ``set_state(state)`` is snapshotted here and restored by :meth:`resume`: its episode
        continues. Without them, :meth:`resume` resets it.

        Raises:
            AlreadyPendingCallError: another call is pending (``drain()`` first).
            EnvError: an env's ``get_state()`` raised (nothing is ended).
            WorkerDiedError, WorkerTimeoutError: a unit died or did not answer (as a call).
        """
        self._begin(_State.WAITING_CALL)
        snapshots = self._snapshot_envs()
        ended = self._ended.flags.copy()
        for backend in self._backends:
            backend.suspend(SUSPEND_CLOSE_TIMEOUT)
        self._suspended = (snapshots, ended)
        self._enter(_State.SUSPENDED)

    def resume(self) -> None:
        """Start every unit again on its placement (all at once, under
        ``max_concurrent_starts`` and ``build_retries``; bounded by ``start_timeout``, else
        the reset's timeout), reset every env (its stored options, no seed) and put each
        snapshotted env back where :meth:`suspend` found it.

        Raises:
            RuntimeError: the vector env is not suspended.
            EnvError, WorkerDiedError, WorkerTimeoutError: a unit failed to start (the vector
                env stays suspended: ``resume()`` again), or an env's reset or
                ``set_state`` raised.
        """
        self._assert_open()
        if self._unstarted:  # start="lazy": starting is all there is to resume
            self._start_lazily()
            return
        if self._suspended is None:
            raise RuntimeError("resume(): the vector env is not suspended (suspend() first)")
        snapshots, ended = self._suspended
        self._start_units()
        self._suspended = None
        self._enter(_State.IDLE)
        self.reset()
        self._restore_envs(snapshots)
        has_state = np.array([s.has_state for s in snapshots], dtype=bool)
        self._ended.restore(ended & has_state)

    def _start_units(self) -> None:
        """Start every unit again on its placement (all at once, under
        ``max_concurrent_starts`` and ``build_retries``; bounded by ``start_timeout``, else
        the reset's timeout); if one fails, those started are ended again.

        Raises:
            EnvError, WorkerDiedError, WorkerTimeoutError: a unit failed to start.
        """
        bound = self._build_timeout(self.timeouts.reset)
        started: list[Backend] = []
        try:
            for backend in self._backends:
                backend.resume(bound)
                started.append(backend)
        except BaseException:
            for backend in started:
                backend.suspend(0.0)
            raise
        self._units.refresh()

    def _snapshot_envs(self) -> list[EnvSnapshot]:
        """Every env's snapshot, in env order (the state must be idle)."""
        self._exchange.send(Command.SNAPSHOT)
        self._enter(_State.WAITING_CALL)
        parts = self._collect(_State.WAITING_CALL, None)
        snapshots: list[EnvSnapshot] = []
        for _, data in parts:
            snapshots.extend(data)
        return snapshots

    def _restore_envs(self, snapshots: list[EnvSnapshot]) -> None:
        """Put every env with a state back to its snapshot (``snapshots`` in env order)."""
        self._exchange.send(
            Command.RESTORE, per_unit=lambda u: RestorePayload(snapshots[u.lo : u.hi])
        )
        self._enter(_State.WAITING_CALL)
        self._collect(_State.WAITING_CALL, None)
