"""``reconfigure``: new envs built inside the live units (a task swap), in two steps.

    reconfigure(env_fns, env_ids) ─► RECONFIGURE(envs, factories) to every unit holding them,
                                     all at once: each builds its new envs beside the old ones
                                     (start tokens, retries) and checks their spaces
                                   ◄─ every unit OK: the factories a restart builds from are
                                     the new ones; RECONFIGURE(commit) swaps them in
                                   ◄─ an error (a factory, a space mismatch, a lost unit):
                                     RECONFIGURE(drop) to the others; the old envs stay

No process starts and nothing is imported again. A mixin of
:class:`subvec._front.front.VectorFront`: it uses the front's state machine, its units and its
lock-step exchange (``_front.exchange``), with the failure policy of a call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from subvec._backend import Backend, Unit
from subvec._commands import Command, ReconfigurePayload
from subvec._compat import AutoresetMode
from subvec._front.calls import CallSteps, EnvIds, checked_env_ids
from subvec._front.ended import EndedEnvs
from subvec._front.exchange import LockstepExchange
from subvec._front.recovery import FailurePolicy
from subvec._front.setup import Timeouts
from subvec._front.state import _State
from subvec._front.units import Units
from subvec._pickling import pickle_factories
from subvec.errors import EnvError

__all__ = ["EnvReconfigure"]


class EnvReconfigure(CallSteps):
    """``reconfigure`` of :class:`subvec._front.front.VectorFront` (a mixin)."""

    # The front's, declared for the type checker.
    num_envs: int
    env_fns: list[Callable[[], Any]]
    autoreset_mode: AutoresetMode
    timeouts: Timeouts
    _state: _State
    _units: Units
    _exchange: LockstepExchange
    _ended: EndedEnvs
    _backends: list[Backend]
    _policy: FailurePolicy

    if TYPE_CHECKING:

        def _build_timeout(self, timeout: float | None) -> float | None: ...

    def reconfigure(self, env_fns: Sequence[Callable[[], Any]], env_ids: EnvIds = None) -> None:
        """Replace the envs of ``env_ids`` with new ones built by ``env_fns``, inside the units
        (worker processes, Ray actors, the parent) that hold them: every unit builds its new
        envs at the same time (under ``max_concurrent_starts`` and ``build_retries``, on its
        placement), beside the old ones; only once every new env is built and its spaces
        match the old one's are they swapped in and the old ones closed. A restart or rebuild
        of those units builds the new envs from then on.

        The new envs start no episode: ``reset()`` (or a masked reset of ``env_ids``) starts
        their first, with the seeds and stored reset options as for any env. Stepping one
        before that: under NEXT_STEP the step resets it (reward 0, both flags False, as after
        an episode end); SAME_STEP resets it as it is swapped in; DISABLED refuses it until
        it is reset (with ``freeze``, its step raises, naming it).

        Args:
            env_fns: one env factory per env of ``env_ids`` (default: per env).
            env_ids: the envs to replace (default: every env).

        Raises:
            ValueError, TypeError: bad ``env_ids``, not one factory per env, or a factory that
                cannot be pickled (nothing is sent).
            EnvError: a factory raised (after its retries) or a new env's spaces differ from
                the old one's (a ``ValueError``), naming the env; every new env is dropped
                and the old envs are kept.
            WorkerDiedError, WorkerTimeoutError: a unit died or did not build within
                ``start_timeout`` (else the reset's timeout); as for a call, the failure
                policy applies, and the old envs are kept by the other units.
        """
        self._begin(_State.WAITING_CALL)
        ids = checked_env_ids(env_ids, self.num_envs, "reconfigure")
        targets = list(range(self.num_envs)) if ids is None else ids
        fns = list(env_fns)
        if len(fns) != len(targets):
            raise ValueError(
                f"reconfigure: {len(fns)} env factories for {len(targets)} envs "
                f"({targets}); give one factory per env of env_ids"
            )
        if not targets:
            return
        blobs = dict(zip(targets, pickle_factories(fns, len(fns), "a unit")))
        self._stage_envs(blobs)
        for env, fn in zip(targets, fns):
            self.env_fns[env] = fn
        self._swap_envs(blobs, commit=True)

    def _stage_envs(self, blobs: Mapping[int, bytes]) -> None:
        """Step one: every unit holding an env of ``blobs`` builds and checks its new envs
        (``blobs``: env -> its pickled factory). On any failure the units that built theirs
        drop them (unless the vector env broke) and the failure is raised."""
        only = self._send_reconfigure(blobs, with_factories=True)
        bound = self._build_timeout(self.timeouts.reset)
        try:
            self._collect(_State.WAITING_CALL, bound, only)
        except Exception as exc:
            # Every unit is there to drop what it built when an env raised (all answered) or
            # lost ones were replaced (restart); else the vector env broke or a unit hangs.
            if self._state is _State.IDLE and (
                isinstance(exc, EnvError) or self._policy.can_restart
            ):
                self._send_reconfigure(blobs, with_factories=False, commit=False)
                self._collect(_State.WAITING_CALL, None, only)
            raise

    def _swap_envs(self, blobs: Mapping[int, bytes], commit: bool) -> None:
        """Step two: swap the staged envs in (``commit``) or drop them. Committed, the
        backends build those envs from ``blobs`` from now on, and DISABLED's ended-env
        flags make the front refuse to step them until they are reset."""
        if commit:
            for backend in self._backends:
                backend.set_factories(blobs)
        only = self._send_reconfigure(blobs, with_factories=False, commit=commit)
        self._collect(_State.WAITING_CALL, None, only)
        if commit:
            self._ended.rebuilt(list(blobs))

    def _send_reconfigure(
        self, blobs: Mapping[int, bytes], *, with_factories: bool, commit: bool = False
    ) -> frozenset[int]:
        """Send RECONFIGURE to the units holding the envs of ``blobs``; their indices."""
        targets: dict[int, list[int]] = {}
        for env in sorted(blobs):
            targets.setdefault(self._units.index_of_env(env), []).append(env)

        def per_unit(unit: Unit) -> ReconfigurePayload:
            envs = targets[unit.index]
            local = [e - unit.lo for e in envs]
            if with_factories:
                return ReconfigurePayload(local, [blobs[e] for e in envs])
            return ReconfigurePayload(local, None, commit)

        only = frozenset(targets)
        self._exchange.send(Command.RECONFIGURE, per_unit=per_unit, only=only)
        self._enter(_State.WAITING_CALL)
        return only
