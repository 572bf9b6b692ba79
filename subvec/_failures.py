"""What the vector env does when a unit dies or hangs: raise, or restart it.

The backends report failures (``_backend.Failure``: which unit, died or hung, why); the policy
is kept here, apart from the wait that found them, as CPython's process pool keeps
``terminate_broken`` apart from its wait.

- ``"raise"``: a death breaks the vector env (only ``close()``, or a ``reset()`` that rebuilds
  the dead units, is allowed after it); a hang returns it to idle, the stuck units' late
  replies being dropped by sequence number. Either raises.
- ``"restart"``: each failed unit is replaced and, for a step or reset, its envs reset; the
  call then reports them truncated with ``worker_restarted``. A failed call cannot be replayed
  (it may not be idempotent) and raises, the vector env staying usable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from subvec._backend import PLAIN, Backend, Failure, Outcome, Unit
from subvec._protocol import Command, ResetPayload
from subvec.errors import WorkerDiedError, WorkerTimeoutError, add_note

__all__ = ["DEFAULT_MAX_RESTARTS", "FailurePolicy", "RestartRecord"]

#: Restarts allowed over the life of a vector env with on_worker_failure="restart".
DEFAULT_MAX_RESTARTS = 100


@dataclass(frozen=True)
class RestartRecord:
    """One worker replacement: which worker, which envs, why, and when (monotonic)."""

    worker: int
    env_indices: tuple[int, ...]
    reason: str
    time: float


class FailurePolicy:
    """``on_worker_failure`` and the restarts it has made."""

    def __init__(self, on_worker_failure: str, max_restarts: int) -> None:
        if on_worker_failure not in ("raise", "restart"):
            raise ValueError(
                f"on_worker_failure must be 'raise' or 'restart', got {on_worker_failure!r}"
            )
        self.mode = on_worker_failure
        self.max_restarts = int(max_restarts)
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
        if self.mode == "restart":
            add_note(error, f"max_restarts={self.max_restarts} restarts are used up")
        broken = first.kind == "died" or self.mode == "restart"
        if broken:
            error.args = (first.message + "; the vector env cannot continue: close() it",)
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
        backend: Backend,
        failures: Sequence[Failure],
        timeout: float | None,
        seeds: Callable[[Unit], Sequence[int | None]] | None,
    ) -> tuple[dict[int, Outcome], list[Failure]]:
        """Replace each failed unit; with ``seeds`` (a step or reset), reset its envs with
        those seeds and take that reset's outcome as the unit's answer.

        Returns:
            The resets' outcomes by unit index, and the failures met while resetting.

        Raises:
            WorkerDiedError, WorkerTimeoutError, EnvError: a replacement failed to start.
        """
        outcomes: dict[int, Outcome] = {}
        for failure in failures:
            unit = backend.restart(failure.unit, timeout)
            envs = tuple(range(unit.lo, unit.hi))
            self.restarts.append(RestartRecord(unit.index, envs, failure.message, time.monotonic()))
            if seeds is None:
                continue
            backend.send(Command.RESET, ResetPayload(seeds(unit), None, None), units=[unit])
            got = backend.collect(timeout, "resetting a restarted worker", units=[unit])
            if got is not None and got.failures:
                return outcomes, got.failures
            outcomes[unit.index] = got.outcomes[unit.index] if got is not None else PLAIN
        return outcomes, []

    def call_error(self, failures: Sequence[Failure], timeout: float | None) -> BaseException:
        """The error a call met by a restart raises (the restarted units cannot replay it)."""
        error = failures[0].to_error(timeout or 0.0)
        add_note(error, "the worker was restarted and the vector env remains usable")
        return error
