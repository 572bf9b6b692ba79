"""What the vector env does when a unit dies or hangs: raise, or restart it.

The backends report failures (``_backend.Failure``: which unit, died or hung, why); the policy
is kept here, apart from the wait that found them, as CPython's process pool keeps
``terminate_broken`` apart from its wait.

- ``"raise"``: a death breaks the vector env (only ``close()``, or a ``reset()`` that rebuilds
  the failed units, is allowed after it); a hang returns it to idle, the stuck units' late
  replies being dropped by sequence number. Either raises.
- ``"restart"``: each failed unit is replaced and its envs reset (fresh entropy, or the seeds of
  the reset that failed); a step or reset then reports them truncated with
  ``worker_restarted``. A failed call cannot be replayed (it may not be idempotent) and
  raises, the vector env staying usable. A replacement that cannot be built or reset within
  the bound breaks the vector env, and still counts against ``max_restarts``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from subvec._backend import Collected, Failure, Outcome, Unit
from subvec._commands import ResetPayload
from subvec._units import Units
from subvec.errors import WorkerDiedError, WorkerTimeoutError, add_note, first_line

__all__ = [
    "BROKEN_ADVICE",
    "DEFAULT_MAX_RESTARTS",
    "FailurePolicy",
    "RestartRecord",
    "Restarted",
]

#: Restarts allowed over the life of a vector env with on_worker_failure="restart".
DEFAULT_MAX_RESTARTS = 100


@dataclass(frozen=True)
class RestartRecord:
    """One worker replacement: which worker, which envs, why, and when (monotonic). The
    reason of a replacement that failed to start ends with ``its replacement failed: ...``."""

    worker: int
    env_indices: tuple[int, ...]
    reason: str
    time: float


@dataclass
class Restarted:
    """What :meth:`FailurePolicy.restart` did for one backend's failed units."""

    #: the resets' outcomes by unit index (the restarted units' answers)
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    #: why the vector env cannot continue (a replacement failed to start or to reset), or None
    error: BaseException | None = None
    #: what broke it, for the errors every later call raises
    reason: str = ""


#: What an error says the vector env can still do once it is broken.
BROKEN_ADVICE = "the vector env is broken: reset() rebuilds the failed workers, or close() it"


class FailurePolicy:
    """``on_worker_failure`` and the restarts it has made."""

    def __init__(self, on_worker_failure: str, max_restarts: int) -> None:
        if on_worker_failure not in ("raise", "restart"):
            raise ValueError(
                f"on_worker_failure must be 'raise' or 'restart', got {on_worker_failure!r}"
            )
        self.mode = on_worker_failure
        self.max_restarts = int(max_restarts)
        #: every replacement, the failed ones included (each counts against max_restarts)
        self.restarts: list[RestartRecord] = []

    @property
    def can_restart(self) -> bool:
        """Whether the next failure is met with a restart."""
        return self.mode == "restart" and len(self.restarts) < self.max_restarts

    def error(
        self, failures: Sequence[Failure], timeout: float | None
    ) -> tuple[WorkerDiedError | WorkerTimeoutError, bool]:
        """The error to raise for ``failures`` that are not restarted, and whether the vector
        env is broken by them (a death, or restarts used up) rather than back to idle."""
        first = failures[0]
        error = first.to_error(timeout or 0.0)
        if self.mode == "restart" and not self.can_restart:
            add_note(error, f"max_restarts={self.max_restarts} restarts are used up")
        broken = first.kind == "died" or self.mode == "restart"
        if broken:
            error.args = (f"{first.message}; {BROKEN_ADVICE}",)
        else:
            error.args = (
                first.message + ". Their envs are in an undefined state: reset them, or "
                "close(terminate=True).",
            )
        for other in failures[1:]:
            add_note(error, other.message)
        return error, broken

    def restart(
        self,
        units: Units,
        failures: Sequence[Failure],
        timeout: float | None,
        build_timeout: float | None,
        seeds: Callable[[Unit], Sequence[int | None]],
        stored: Callable[[Unit], Sequence[dict[str, Any] | None] | None] | None = None,
        options: Callable[[Unit], Any] | None = None,
        into: dict[int, Outcome] | None = None,
    ) -> Restarted:
        """Replace each failed unit (building its envs within ``build_timeout``) and reset its
        envs with ``seeds(unit)`` (within ``timeout``), taking that reset's outcome as the
        unit's answer. Every replacement is recorded, the failed ones too. ``stored(unit)``:
        the reset options its envs had stored (``set_reset_options``), which the replacement
        keeps and resets with unless ``options(unit)`` (the failed reset's) names others.

        Returns:
            The resets' outcomes; and, when a replacement failed to start or to reset, the
            error that breaks the vector env (the units after it are left as they are).
            ``into``: where the outcomes go as they come (an interrupted restart keeps the
            ones done).
        """
        done = Restarted(into if into is not None else {})
        for failure in failures:
            envs = tuple(range(failure.unit.lo, failure.unit.hi))
            try:
                unit = units.replace(failure.unit, build_timeout)
            except Exception as exc:  # the factory raised, or the new worker died or hung
                reason = f"{failure.message}; its replacement failed: {first_line(exc)}"
                self.restarts.append(
                    RestartRecord(failure.unit.index, envs, reason, time.monotonic())
                )
                done.error = failure.to_error(timeout or 0.0)
                done.error.args = (f"{reason}; {BROKEN_ADVICE}",)
                done.error.__cause__ = exc
                done.reason = reason
                return done
            self.restarts.append(RestartRecord(unit.index, envs, failure.message, time.monotonic()))
            kept = None if stored is None else stored(unit)
            named = None if options is None else options(unit)
            payload = ResetPayload(seeds(unit), named, None, kept)
            got = units.reset(unit, payload, timeout, "resetting a restarted worker")
            if isinstance(got, Collected):
                done.error, _ = self.error(got.failures, timeout)
                done.reason = got.failures[0].message
                return done
            done.outcomes[unit.index] = got
        return done

    def call_error(self, failures: Sequence[Failure], timeout: float | None) -> BaseException:
        """The error a call met by a restart raises (the restarted units cannot replay it)."""
        error = failures[0].to_error(timeout or 0.0)
        add_note(
            error,
            "the worker was restarted and its envs reset; the vector env remains usable and "
            "the next step reports those envs truncated with infos['worker_restarted']",
        )
        return error
