"""The front's lock-step exchange: one command to every unit (or some), every answer back.

:class:`LockstepExchange` is the component the front owns for its lock-step calls (reset,
step, a chunk, call and attributes): it sends a command to the backends' units, skipping those
that answer this step with a restart's reset, collects their answers (inline backends last to
be sent, first to be collected: they run while the others' units are busy), hands failures to
the failure policy, and turns the outcomes into the parts that say something, in env order
(see ``_front.merge``). It closes the backends too, the parent's own envs first.

It also owns the restarts of a failed step, reset or call (:meth:`LockstepExchange.recover`),
and a step's command (:meth:`LockstepExchange.send_step`: the actions stored, its payloads, and
the restart bookkeeping before it goes out, the units that answer it with a reset instead),
and a reset's (``send_reset``). It is the one writer of the restart flags (``restarted``,
``any_restarted``), which the results read.

It holds named references (the backends, the units, the policy, the recovery, the observation
batch, the block's infos) and none to the front, which keeps the call state: failures that are
not restarted go to the front's ``fail``, an interrupted wait to its ``interrupted`` (weak
hooks: a cycle would keep a dropped vector env's workers until the cycle collector ran).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

import numpy as np
from gymnasium import Space

from subvec._backend import PLAIN, Backend, Collected, Failure, Outcome, Unit
from subvec._batch import BatchViews
from subvec._commands import (
    Command,
    ResetPayload,
    Status,
    StepEnvsPayload,
    UnitReply,
    raise_first,
)
from subvec._front.merge import Part
from subvec._front.observations import ObservationBatch
from subvec._front.options import ResetRequest
from subvec._front.recovery import FailurePolicy, Recovery
from subvec._front.recycle import Recycler
from subvec._front.results import block_parts, reply_errors
from subvec._front.setup import Timeouts
from subvec._front.state import _WAITING, _State
from subvec._front.units import Units
from subvec._infos import InfoBlockReader
from subvec._spaces import BY_VALUE, Stored, check_batch_layout, per_env_actions, without_tensors

#: the steady step's command: every env, its action in the block in the space's dtypes
_IN_BLOCK = StepEnvsPayload(None, None)

__all__ = ["BROKEN_CLOSE_TIMEOUT", "DEFAULT_CLOSE_TIMEOUT", "LockstepExchange"]

#: How long close() waits for workers to finish their envs' close() before escalating.
DEFAULT_CLOSE_TIMEOUT = 10.0
#: The same bound once a worker has died (the others may be stuck mid-step).
BROKEN_CLOSE_TIMEOUT = 2.0


class LockstepExchange:
    """Sends the front's lock-step commands and collects their answers; see the module
    docstring."""

    def __init__(
        self,
        backends: Sequence[Backend],
        units: Units,
        batch: BatchViews,
        policy: FailurePolicy,
        recovery: Recovery,
        obs: ObservationBatch,
        action_spaces: tuple[Space[Any], Space[Any]],
        timeouts: Timeouts,
        *,
        fail: Callable[[list[Failure], float | None], NoReturn],
        interrupted: Callable[[_State], None],
    ) -> None:
        self.backends = list(backends)
        # Inline backends run their share while the others' units are busy: collect them first.
        self.collect_order = sorted(self.backends, key=lambda b: not b.inline)
        self.units = units
        #: the units that write a step's infos into the block (the inline ones do not)
        self.info_units = frozenset(u.index for b in self.backends if not b.inline for u in b.units)
        self.info_block: InfoBlockReader | None = batch.info_block
        #: puts a batch of actions in the block (None: they go by value; ``_batch``)
        self.store_actions = batch.store_actions
        self.policy = policy
        self.recovery = recovery
        #: the envs the result being built reports truncated (a step) with worker_restarted
        self.restarted = np.zeros(len(obs.env_obs), dtype=np.bool_)
        #: whether the restart bookkeeping has anything to do (the steady step checks only this)
        self.any_restarted = False
        self.obs = obs
        #: the single and the batched action space
        self.action_spaces = action_spaces
        self.timeouts = timeouts
        #: the front's: raise the error of failures that are not restarted
        self.fail = fail
        #: the front's: Ctrl-C interrupted the wait of the call of this state
        self.interrupted = interrupted
        #: the recycler, where the backend recycles (its resets go out with a step)
        self.recycler: Recycler | None = None
        #: units this step does not send to, and their answers (restarted during a call)
        self.answered: dict[int, Outcome] = {}

    def send(
        self,
        command: Command,
        payload: Any = None,
        per_unit: Any = None,
        only: frozenset[int] | None = None,
    ) -> None:
        """Send ``command`` to every unit (those of ``only``, by index, when given), but not
        to those that answer this step with a restart's reset."""
        skip = self.answered
        if only is not None:  # an addressed call (never a step: the step path stays as it is)
            for backend in self.backends:
                chosen = [u for u in backend.units if u.index in only and u.index not in skip]
                if chosen:
                    backend.send(command, payload, per_unit=per_unit, units=chosen)
            return
        for backend in self.backends:
            units = [u for u in backend.units if u.index not in skip] if skip else None
            backend.send(command, payload, per_unit=per_unit, units=units)

    def collect(
        self,
        state: _State,
        timeout: float | None,
        only: frozenset[int] | None = None,
        request: ResetRequest | None = None,
    ) -> list[Part]:
        """Wait for every unit's answer (each of ``only``'s, when the call went to those) to
        the pending call and return the parts that say something, in env order (see
        ``_front.merge``); ``request``: the pending reset's (a restart resets with it too).

        Failures: with on_worker_failure="raise", they go to the front's ``fail`` (a death
        breaks the env, a timeout leaves it idle: late replies are dropped by seq; both
        raise). With "restart", each failed unit is replaced and, for a step or reset, its
        envs reset (see ``_front.recovery``).
        """
        if timeout is None:
            timeout = self.timeouts.of(state.value)
        restart = self.policy.can_restart
        what = _WAITING[state]
        # Units restarted during a call answer this step with their reset (see step_async).
        answered = self.answered
        if answered:
            self.answered = {}
        try:
            if only is None:
                collected = [
                    b.collect(
                        timeout,
                        what,
                        units=[u for u in b.units if u.index not in answered] if answered else None,
                        stop_at_death=not restart,
                    )
                    for b in self.collect_order
                ]
            else:  # an addressed call: only the units it went to
                collected = []
                for b in self.collect_order:
                    units = [u for u in b.units if u.index in only and u.index not in answered]
                    if units:
                        collected.append(
                            b.collect(timeout, what, units=units, stop_at_death=not restart)
                        )
        except KeyboardInterrupt:
            # The interrupted call's late replies carry an old seq and are dropped; the next
            # call waits for the units still running it, and says so.
            self.interrupted(state)
            recovery = self.recovery
            recovery.pending = {**answered, **recovery.pending}  # still to be reported
            raise
        got = [c for c in collected if c is not None]
        if not got and not answered:  # every unit said a plain OK
            return self.block_parts(self.units.all) if state is _State.WAITING_STEP else []
        if len(got) == 1 and not answered:
            return self.parts(state, got[0], timeout, restart, request=request)
        outcomes: dict[int, Outcome] = dict(answered)
        failures: list[Failure] = []
        for c in got:
            outcomes.update(c.outcomes)
            failures += c.failures
        return self.parts(state, Collected(outcomes, failures), timeout, restart, answered, request)

    def parts(
        self,
        state: _State,
        collected: Collected,
        timeout: float | None,
        restart: bool,
        answered: dict[int, Outcome] | None = None,
        request: ResetRequest | None = None,
    ) -> list[Part]:
        """The second half of :meth:`collect`: failures, then the outcomes that say
        something. ``answered``: the units that answered with a restart's reset (their
        outcomes are in ``collected`` already); ``request``: as :meth:`collect`'s."""
        outcomes, failures = collected.outcomes, collected.failures
        recovered: dict[int, Outcome] = dict(answered) if answered else {}
        if failures:
            if restart:
                restarted = self.recover(state, failures, timeout, request)
                outcomes.update(restarted)
                recovered.update(restarted)
            else:
                self.fail(failures, timeout)
        # Only outcomes with something to say become parts; a plain OK adds nothing but the
        # infos a step left in the block, as all its other results are there already.
        parts: list[Part] = []
        errors: list[BaseException] = []
        step = state is _State.WAITING_STEP and self.info_block is not None
        for unit in self.units.all:
            status, value = outcomes.get(unit.index, PLAIN)
            if status is Status.OK_PAYLOAD:
                parts.append((unit.lo, value))
                if type(value) is UnitReply and value.errors:  # envs whose step raised
                    errors += reply_errors(unit, value).values()
            elif status is Status.ERROR:
                errors.append(value)
            elif step and unit.index not in recovered:  # a restarted unit's reply is a reset's
                parts += self.block_parts((unit,))
        raise_first(errors)
        return parts

    def recover(
        self,
        state: _State,
        failures: list[Failure],
        timeout: float | None,
        request: ResetRequest | None = None,
    ) -> dict[int, Outcome]:
        """Replace each failed unit and reset its envs (``_front.recovery.Recovery``); for a step or
        reset, return that reset's outcome as the unit's answer. The step then reports those
        envs truncated with reward 0 and ``worker_restarted`` in their infos: nothing about
        the lost transition is made up. A failed call cannot be replayed and raises; its
        restarted units are reset all the same, and the next step reports them as a step's
        restart would. A replacement that cannot be built or reset breaks the vector env.
        """
        call = state is _State.WAITING_CALL
        if call and self.obs.slots is not None:
            self.obs.fresh_slot()  # the resets below must not write into the caller's batch
        outcomes = self.recovery.restart(failures, timeout, request)
        if not call:
            for failure in failures:
                self.restarted[failure.unit.lo : failure.unit.hi] = True
            self.any_restarted = True
            return outcomes
        if self.recovery.hold(outcomes):
            self.any_restarted = True
        self.recovery.raise_call_error(failures, timeout, outcomes)

    def send_step(self, actions: Any, stored: Stored, per_env: list[Any] | None = None) -> None:
        """Send the step command (every env of each unit, one sub-step) for ``actions``, which
        ``store`` has put in the block as ``stored`` says (see ``_spaces.batch_setter``). By
        value, each env gets its item of ``iterate(action_space, actions)``, exactly as
        SyncVectorEnv hands it over.

        Raises:
            ValueError, TypeError: actions by value that are not one per env (nothing sent).
        """
        per_unit = None
        payload = _IN_BLOCK
        single, space = self.action_spaces
        n = len(self.restarted)
        if stored is BY_VALUE:
            if per_env is None:
                check_batch_layout(single, actions, n)
                # numpy values, as from the block
                actions = without_tensors(single, actions)
                per_env = per_env_actions(space, actions, n, "one per env")
            elif len(per_env) != n:
                raise ValueError(f"expected {n} actions, one per env, got {len(per_env)}")

            values = per_env

            def per_unit(unit: Unit) -> StepEnvsPayload:
                return StepEnvsPayload(None, values[unit.lo : unit.hi])

        elif isinstance(stored, tuple):  # in the block, in the caller's dtypes
            payload = StepEnvsPayload(None, None, action_dtypes=stored)
        self.prepare_step()
        recycler = self.recycler
        if recycler is not None:  # their resets write into the slot just picked
            recycler.before_step(self.timeouts.reset, into=self.answered)
        self.send(Command.STEP_ENVS, payload, per_unit=per_unit)

    def send_reset(self, request: ResetRequest, per_unit: Callable[[Unit], ResetPayload]) -> None:
        """Send RESET for ``request`` with each unit's payload from ``per_unit``, after the
        restart bookkeeping and the pick of the observation slot it writes."""
        if self.any_restarted:
            self.restarted[:] = False
            # Envs restarted during a call: this reset's infos flag them. (Rebuilt ones are
            # not flagged: the caller saw the vector env break, and the result is a fresh
            # env's.)
            self.any_restarted = bool(self._take_pending())
        if self.obs.slots is not None:
            if request.mask is None:
                self.obs.pick_slot()
            else:
                self.obs.fresh_slot()  # the envs not reset keep theirs
        self.send(Command.RESET, per_unit=per_unit)

    def prepare_step(self) -> None:
        """Before a step's (or a chunk's) command goes out, once nothing was refused: the
        restart bookkeeping, and the observation slot it writes."""
        if self.any_restarted:
            self.restarted[:] = False
            # Units restarted during a call were reset then: this step reports that reset for
            # them (truncated, worker_restarted), as a restart during a step does, and does
            # not step them.
            self.answered = answered = self._take_pending()
            self.any_restarted = bool(answered)
        obs = self.obs
        if obs.slots is not None:  # only now: nothing was refused
            if answered := self.answered:
                obs.fresh_slot([self.units.unit(i) for i in answered])
            else:
                obs.pick_slot()

    def _take_pending(self) -> dict[int, Outcome]:
        """The units restarted during a call, now reported: their envs flagged in
        ``restarted``."""
        pending = self.recovery.take_pending()
        for index in pending:
            unit = self.units.unit(index)
            self.restarted[unit.lo : unit.hi] = True
        return pending

    def block_parts(self, units: Iterable[Unit]) -> list[Part]:
        """The parts of those ``units`` that left their step's infos in the block."""
        return block_parts(units, self.info_units, self.info_block)

    def close(
        self, timeout: float | None, broken: bool, terminate: bool, drop_views: Callable[[], None]
    ) -> BaseException | None:
        """Close every backend within ``timeout`` seconds (None: ``DEFAULT_CLOSE_TIMEOUT``,
        or ``BROKEN_CLOSE_TIMEOUT`` for a ``broken`` vector env), the parent's own envs first,
        calling ``drop_views`` before a process backend's close, so that a shared block
        unmaps as its workers exit; the first error to raise (a worker's before the parent's
        own envs'), or None."""
        bound = DEFAULT_CLOSE_TIMEOUT if timeout is None else timeout
        if timeout is None and broken:
            # A worker already died; the rest may be stuck mid-step. Give them a short grace
            # to close their envs, not the full default: the user is waiting on a crash.
            bound = BROKEN_CLOSE_TIMEOUT
        errors: list[BaseException | None] = []
        for backend in self.collect_order:
            if not backend.inline:
                drop_views()
            errors.append(backend.close(bound, terminate))
        return next((e for e in reversed(errors) if e is not None), None)

    def drop_views(self) -> None:
        """Drop the references to the block's infos and action rows (a shared block unmaps
        without them)."""
        self.info_block = None
        self.store_actions = None
