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

:class:`Recovery` is the component the front owns for its lock-step calls: the restart-and-reset
driver a failed step, reset or call goes through, the restarts a call leaves for the next step
to report, the units a broken vector env has lost, and their rebuild by ``reset()``. It holds
named references (the units, the policy, the reset options, the restart flags, the per-env
observations) and reaches the front only through weak hooks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from subvec._backend import Collected, Failure, Outcome, RestartRecord, Unit
from subvec._commands import ResetPayload, Status, raise_first
from subvec._front.observations import ObservationBatch
from subvec._front.options import EnvOptions, EnvResetOptions, ResetRequest, unit_options
from subvec._front.units import Units
from subvec.errors import WorkerDiedError, WorkerTimeoutError, add_note, first_line

__all__ = [
    "BROKEN_ADVICE",
    "DEFAULT_MAX_RESTARTS",
    "FailurePolicy",
    "Recovery",
    "Restarted",
]

#: Restarts allowed over the life of a vector env with on_worker_failure="restart".
DEFAULT_MAX_RESTARTS = 100


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


class Recovery:
    """The front's restarts of failed units in lock-step calls, what they leave to report,
    and the rebuild of a broken vector env's lost units (see the module docstring).

    The front keeps its call state: ``break_env`` is its hook (weak: this component is the
    front's, and a cycle would delay freeing a dropped vector env).
    """

    def __init__(
        self,
        policy: FailurePolicy,
        units: Units,
        reset_options: EnvResetOptions,
        obs: ObservationBatch | None,
        *,
        build_timeout: Callable[[float | None], float | None],
        break_env: Callable[[Iterable[int], str], None],
    ) -> None:
        self._policy = policy
        self._units = units
        self._reset_options = reset_options
        #: the observation batch, where observations travel by value (else None)
        self._obs = obs
        self._build_timeout = build_timeout
        self._break = break_env
        #: units restarted during a call, by index: their reset's outcome, which the next
        #: step reports instead of stepping them (or the next reset flags them)
        self.pending: dict[int, Outcome] = {}
        #: the units a broken vector env has lost, by index (``reset()`` rebuilds them)
        self.broken_units: set[int] = set()
        #: what broke the vector env, for the error every later call raises
        self.broken_reason = ""
        #: every unit ``reset()`` rebuilt after the vector env broke
        self.rebuilds: list[RestartRecord] = []

    def broke(self, units: Iterable[int], reason: str) -> None:
        """The vector env broke, losing ``units`` (by index), for ``reason``."""
        self.broken_units.update(units)
        self.broken_reason = reason

    def restart(
        self, failures: list[Failure], timeout: float | None, request: ResetRequest | None
    ) -> dict[int, Outcome]:
        """Replace each failed unit and reset its envs: with the seeds and named options of
        ``request`` (the reset that failed) or fresh entropy, and the options they stored;
        the resets' outcomes by unit index.

        Raises:
            WorkerDiedError, WorkerTimeoutError, EnvError: a replacement could not be built
                or reset; the vector env is broken (``reset()`` rebuilds the units it lost).
        """

        def seeds(unit: Unit) -> Sequence[int | None]:
            if request is None:
                return [None] * (unit.hi - unit.lo)
            return request.seeds[unit.lo : unit.hi]

        def named(unit: Unit) -> EnvOptions:
            assert request is not None
            return unit_options(request.options, unit)

        outcomes: dict[int, Outcome] = {}
        broke = False
        try:
            done = self._policy.restart(
                self._units,
                failures,
                timeout,
                self._build_timeout(timeout),
                seeds,
                self._reset_options.stored,
                named if request is not None else None,
                into=outcomes,
            )
            if done.error is not None:
                broke = True
                self._break(self._lost(failures, outcomes), done.reason)
                raise done.error
        except BaseException:
            if not broke:  # interrupted (Ctrl-C) in the middle
                reason = "interrupted while restarting " + failures[0].unit.describe()
                self._break(self._lost(failures, outcomes), reason)
            raise
        return outcomes

    @staticmethod
    def _lost(failures: list[Failure], outcomes: dict[int, Outcome]) -> list[int]:
        return [f.unit.index for f in failures if f.unit.index not in outcomes]

    def hold(self, outcomes: dict[int, Outcome]) -> bool:
        """Keep a failed call's restarted units' resets for the next step or reset to report
        (their by-value observations shown from now on); whether any was kept."""
        kept = False
        for index, outcome in outcomes.items():
            if outcome[0] is Status.ERROR:
                continue
            self.pending[index] = outcome
            kept = True
            if self._obs is not None and outcome[0] is Status.OK_PAYLOAD:
                lo = self._units.unit(index).lo
                for local, value in outcome[1].obs or ():
                    self._obs.keep(lo + local, value)
        return kept

    def raise_call_error(
        self, failures: Sequence[Failure], timeout: float | None, outcomes: dict[int, Outcome]
    ) -> NoReturn:
        """Raise what a call met by a restart raises: the first env error of the
        replacements' resets (noting the failure), else the failure's error."""
        error = self._policy.call_error(failures, timeout)
        env_errors = [outcome[1] for outcome in outcomes.values() if outcome[0] is Status.ERROR]
        for env_error in env_errors:
            add_note(env_error, f"while resetting the envs of a replacement: {error}")
        raise_first(env_errors)
        raise error

    def take_pending(self) -> dict[int, Outcome]:
        """The units restarted during a call, now reported; none pending after."""
        pending, self.pending = self.pending, {}
        return pending

    def rebuild(self, timeout: float | None) -> list[Unit]:
        """Replace every unit a broken vector env lost (and any other whose process has
        exited since), each built within ``timeout``. Not a restart under the failure policy:
        each is recorded in ``rebuilds`` and none counts against ``max_restarts``.

        Returns:
            The new units (built, not reset).

        Raises:
            EnvError, WorkerDiedError, WorkerTimeoutError: a replacement failed to start; the
                vector env stays broken.
        """
        reason = self.broken_reason
        rebuilt: list[Unit] = []
        for backend in self._units.backends:
            dead = {u.index for u in backend.dead()}
            for unit in list(backend.units):
                if unit.index not in self.broken_units and unit.index not in dead:
                    continue
                self.broken_units.add(unit.index)  # until its replacement has started
                try:
                    new = self._units.replace(unit, timeout)
                except Exception as exc:
                    add_note(
                        exc,
                        f"rebuilding {unit.describe()} for reset() failed; the vector env "
                        "stays broken: reset() again, or close() it",
                    )
                    raise
                self.broken_units.discard(unit.index)
                envs = tuple(range(new.lo, new.hi))
                why = f"rebuilt by reset() after: {reason}"
                self.rebuilds.append(RestartRecord(new.index, envs, why, time.monotonic()))
                rebuilt.append(new)
        self.broken_reason = ""
        return rebuilt
