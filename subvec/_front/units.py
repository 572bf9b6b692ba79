"""Which unit runs which env, and which backend runs which unit: the front's one map of its
units, and the one driver that replaces a unit and resets its envs.

Every replacement goes through :meth:`Units.replace` (a failed unit restarted under
``on_worker_failure="restart"``, in lock-step or asynchronous stepping, a unit rebuilt by
``reset()`` after the vector env broke, a worker recycled), and that is the one place where the
map is refreshed. :meth:`Units.reset` resets a replacement's envs and returns its answer, so
the callers differ only in the seeds and options they reset with and in what they report.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from subvec._backend import PLAIN, Backend, Collected, Outcome, Unit
from subvec._commands import Command, ResetPayload

__all__ = ["Units"]


class Units:
    """The units of every backend, in env order, with their lookups."""

    def __init__(self, backends: Sequence[Backend], num_envs: int) -> None:
        self.backends = list(backends)
        self._unit_of_env = np.empty(num_envs, dtype=np.int64)
        self._refresh()

    def refresh(self) -> None:
        """Read the units again from the backends (after they all started again)."""
        self._refresh()

    def _refresh(self) -> None:
        #: every unit, sorted by its first env
        self.all: list[Unit] = sorted(
            (u for b in self.backends for u in b.units), key=lambda u: u.lo
        )
        self._backend_of: dict[int, Backend] = {}
        for backend in self.backends:
            for unit in backend.units:
                self._unit_of_env[unit.lo : unit.hi] = unit.index
                self._backend_of[unit.index] = backend

    def unit(self, index: int) -> Unit:
        """The unit of this index."""
        units = self.all
        if index < len(units) and units[index].index == index:  # sorted by lo: the usual case
            return units[index]
        return next(u for u in units if u.index == index)

    def index_of_env(self, env: int) -> int:
        """The index of the unit that runs env ``env``."""
        return int(self._unit_of_env[env])

    def backend(self, unit: Unit | int) -> Backend:
        """The backend that runs ``unit`` (or the unit of that index)."""
        return self._backend_of[unit if isinstance(unit, int) else unit.index]

    # --- the one replacement driver ----------------------------------------------------------

    def replace(self, unit: Unit, build_timeout: float | None) -> Unit:
        """A new unit for ``unit``'s envs, built (within ``build_timeout``) but not reset.

        Raises:
            EnvError, WorkerDiedError, WorkerTimeoutError: the replacement failed to start
                (the map still names what the backend now holds).
        """
        try:
            return self.backend(unit).restart(unit, build_timeout)
        finally:
            self._refresh()

    def reset(
        self, unit: Unit, payload: ResetPayload, timeout: float | None, what: str
    ) -> Outcome | Collected:
        """Reset ``unit``'s envs with ``payload`` and wait for them: the unit's answer, or
        the :class:`Collected` holding its failure when it died or hung."""
        backend = self.backend(unit)
        backend.send(Command.RESET, payload, units=[unit])
        got = backend.collect(timeout, what, units=[unit])
        if got is None:
            return PLAIN
        if got.failures:
            return got
        return got.outcomes[unit.index]
