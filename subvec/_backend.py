"""The face every backend shows the front: units of envs that take commands and answer.

The front (``subvec._front.front``) knows the gymnasium contract; a backend knows how envs run. A
*unit* is the backend's unit of scheduling: a worker process and its consecutive envs
``lo..hi-1``, the parent's own envs (``parent_envs``), or a Ray actor. The front speaks
to every backend the same way:

- ``send(command, payload | per_unit, units)``: start a command on a set of units (all by
  default); payloads are the protocol's records (``_process.wire``), as Python objects: the
  backend decides how they travel (pickled over a pipe, kept in-process, a Ray call);
- ``collect(timeout, what, units, stop_at_death)``: wait for those units' answers, and return
  each unit's :data:`Outcome` and the :class:`Failure` of each unit that died or did not
  answer in time; ``None`` when every unit answered a plain OK (everything is in the batch
  arrays already: the usual step);
- ``collect_ready(units, enough, timeout)``: asynchronous stepping's wait: return once at
  least ``enough`` of ``units`` answered (or ``timeout`` passed), leaving the others in flight;
- ``restart(unit, timeout)``: a fresh unit for the same envs, built but not reset;
- ``dead()``: the units whose process has exited (none for in-process units);
- ``close(timeout, terminate)``: stop every unit within a bound and release everything.

An *inline* backend does its work inside ``collect`` (the parent's own envs): the front
collects inline backends first, so they run while the others' units are busy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from subvec._commands import Command, Status
from subvec.errors import WorkerDiedError, WorkerTimeoutError

__all__ = ["PLAIN", "Backend", "Collected", "Failure", "Outcome", "RestartRecord", "Unit"]

#: A unit's answer: ``(Status.OK, None)``, ``(Status.OK_PAYLOAD, the decoded payload)`` or
#: ``(Status.ERROR, the env's exception, rebuilt with its type, env index and traceback)``.
Outcome = tuple[Status, Any]
PLAIN: Outcome = (Status.OK, None)


class Unit(Protocol):
    """A set of consecutive envs that is scheduled as one."""

    index: int
    lo: int  # first global env index
    hi: int  # one past the last

    @property
    def pid(self) -> int | None: ...

    def describe(self) -> str: ...


@dataclass
class Failure:
    """A unit that died or did not answer in time."""

    unit: Unit
    kind: str  # "died" | "hung"
    message: str
    exitcode: int | None = None

    def to_error(self, timeout: float = 0.0) -> WorkerDiedError | WorkerTimeoutError:
        envs = list(range(self.unit.lo, self.unit.hi))
        if self.kind == "hung":
            return WorkerTimeoutError(self.message, env_indices=envs, timeout=timeout)
        return WorkerDiedError(
            self.message, env_indices=envs, pid=self.unit.pid, exitcode=self.exitcode
        )


@dataclass
class Collected:
    """What a ``collect`` saw: outcomes by unit index, and failures."""

    outcomes: dict[int, Outcome]
    failures: list[Failure]


class Backend(Protocol):
    """Runs units of envs for the front; see the module docstring."""

    #: True when the backend does its work inside ``collect`` (the parent's own envs)
    inline: bool

    @property
    def units(self) -> Sequence[Unit]: ...

    def send(
        self,
        command: Command,
        payload: Any = None,
        *,
        per_unit: Callable[[Any], Any] | None = None,
        units: Sequence[Any] | None = None,
    ) -> None: ...

    def collect(
        self,
        timeout: float | None,
        what: str,
        *,
        units: Sequence[Any] | None = None,
        stop_at_death: bool = False,
    ) -> Collected | None: ...

    def collect_ready(
        self, units: Sequence[Any], enough: int, timeout: float | None, what: str
    ) -> Collected: ...

    def restart(self, unit: Any, timeout: float | None) -> Unit: ...

    def suspend(self, timeout: float) -> None:
        """End every unit (each closes its envs first, within ``timeout``), keeping what
        :meth:`resume` needs: the placement, the block, the factories."""
        ...

    def resume(self, timeout: float | None) -> None:
        """Every unit again, built on its placement within ``timeout`` (envs not reset).

        Raises:
            EnvError, WorkerDiedError, WorkerTimeoutError: a unit failed to start; the
                backend is suspended again.
        """
        ...

    def set_factories(self, blobs: Mapping[int, bytes]) -> None:
        """From now on, a restart builds env ``i`` (of this backend's) from ``blobs[i]``
        (a reconfigure's new factories; envs of other backends are ignored)."""
        ...

    def dead(self) -> list[Any]: ...

    def owing(self) -> list[Any]: ...

    def close(self, timeout: float, terminate: bool) -> BaseException | None: ...


@dataclass(frozen=True)
class RestartRecord:
    """One worker replacement: which worker, which envs, why, and when (monotonic). The
    reason of a replacement that failed to start ends with ``its replacement failed: ...``.
    Kept by the front (``restarts``, ``recycles``, ``rebuilds``), reported by the backends'
    statistics."""

    worker: int
    env_indices: tuple[int, ...]
    reason: str
    time: float
