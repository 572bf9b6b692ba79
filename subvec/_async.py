"""Asynchronous first-k-ready stepping on the front: ``async_reset``, ``send``, ``recv``, ``drain``.

    send(actions, env_ids) ─► queue each env's action on its unit; a free unit gets one
                              STEP_ENVS command for every env it has an action for
    recv(min, max, timeout) ◄─ collect the units that answered (waiting for the first ones
                              only as long as fewer than ``min`` envs are ready), copy each
                              env's result out of the batch arrays, return the first ready

The unit of scheduling is a unit (a worker and its envs): it has at most one command in
flight and steps the subset of its envs that have actions, then answers once. The unit of the
API is an env: each env's result (observation, reward, flags, infos, or the exception its step
raised) is copied out of the block as soon as its unit answers and held, in the order the
envs became ready, until a ``recv`` returns it. Nothing ready is ever dropped, and the envs
held longest go first, so no env starves. Per env, the trajectory is SyncVectorEnv's for the
same seed and the same actions: the envs run the same code (``EnvSlab.step_envs``), one env at
a time in their unit, whatever the others do.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import Space
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array
from gymnasium.vector.vector_env import AutoresetMode

from subvec._backend import Backend, Failure, Outcome, Unit
from subvec._block import BatchViews, ObsSlots
from subvec._calls import checked_env_ids
from subvec._commands import (
    Command,
    Status,
    StepEnvsPayload,
    UnitReply,
    rebuild_remote_error,
)
from subvec._failures import FailurePolicy
from subvec._merge import InfoMerger, make_merger
from subvec._options import EnvResetOptions, ResetOptions
from subvec._results import events_by_env, final_event, obs_by_env
from subvec._seeding import SeedArg
from subvec._spaces import ObsSplit, per_env_actions, without_tensors
from subvec._state import _State
from subvec._units import Units
from subvec.errors import RecvTimeoutError

__all__ = ["AsyncStepping", "EnvResult"]

#: a queued env's action that is in its row of the block (``send`` stored the batch there)
_IN_BLOCK: Any = object()


@dataclass
class EnvResult:
    """One env's result, copied out of the batch arrays when its unit answered."""

    obs: Any
    reward: float
    terminated: bool
    truncated: bool
    events: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    restarted: bool = False


class _InBlock:
    """A held result that is all in its env's rows of the batch arrays (a plain OK: no infos,
    no error). Nothing overwrites those rows until ``recv`` returns it, since an env is sent
    nothing new before then, so ``recv`` gathers such results with one fancy index per array
    instead of copying each env's row out when its unit answers."""

    __slots__ = ("reset",)

    def __init__(self, reset: bool) -> None:
        self.reset = reset


_STEP_IN_BLOCK, _RESET_IN_BLOCK = _InBlock(False), _InBlock(True)


def _take_rows(batch: Any, ids: np.ndarray) -> Any:
    if isinstance(batch, dict):
        return {k: _take_rows(v, ids) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_take_rows(v, ids) for v in batch)
    return batch[ids]  # a fancy index: a copy


def _copy_row(batch: Any, i: int) -> Any:
    if isinstance(batch, dict):
        return {k: _copy_row(v, i) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_copy_row(v, i) for v in batch)
    row = batch[i, ...]  # [i, ...]: a 0-d leaf stays an array, as SyncVectorEnv's iterate
    return row.copy() if isinstance(row, np.ndarray) else row


class AsyncStepping:
    """The asynchronous half of :class:`subvec._front.VectorFront` (a mixin: it uses the
    front's units, backends, batch arrays and state)."""

    # The front's, declared for the type checker.
    num_envs: int
    autoreset_mode: AutoresetMode
    info_format: str
    default_timeout: float | None
    single_observation_space: Space[Any]
    single_action_space: Space[Any]
    batch_size: int
    _state: Any
    _units: Units
    _backends: list[Backend]
    _collect_order: list[Backend]
    _policy: FailurePolicy
    _observations: Any
    _obs_shared: bool
    _obs_split: ObsSplit | None
    _obs_slots: ObsSlots | None
    _obs_slot: int
    _env_obs: list[Any]
    _rewards: np.ndarray
    _terminations: np.ndarray
    _truncations: np.ndarray
    _needs_reset: np.ndarray
    _final_in_block: bool
    _final_obs_rows: np.ndarray | None
    _reset_options: EnvResetOptions

    if TYPE_CHECKING:

        def _assert_is_running(self) -> None: ...
        def _begin_async(self, method: str) -> None: ...
        def _fail(self, failures: list[Failure], timeout: float | None) -> None: ...
        def _break(self, units: Iterable[int], reason: str) -> None: ...
        def _build_timeout(self, timeout: float | None) -> float | None: ...
        def _obs_fixed_now(self) -> list[np.ndarray]: ...

    def _start_async(self, batch: BatchViews) -> None:
        self._store_action_rows = batch.store_action_rows
        self._read_action = batch.read_action
        self._flight: dict[int, tuple[str, list[int]]] = {}  # unit index -> (kind, envs)
        self._queued: dict[int, dict[int, Any]] = {}  # unit index -> {env: action}
        # insertion order: the order envs got ready
        self._ready: dict[int, EnvResult | _InBlock] = {}
        self._after_restart: dict[int, EnvResult] = {}  # idle envs whose unit was rebuilt
        self._last_ids: np.ndarray | None = None
        # Each env's place in the order envs were sent work (a send, a reset): held results
        # that became ready together are handed out, and queued work is dispatched, oldest
        # first (see ``_dispatch`` and ``_collect_ready``).
        self._sent_at = np.zeros(self.num_envs, dtype=np.int64)
        self._sends = 0
        self._action_spaces: dict[int, Space[Any]] = {}
        self._mergers: dict[int, InfoMerger] = {}

    # --- introspection -----------------------------------------------------------------------

    @property
    def in_flight_env_ids(self) -> list[int]:
        """The envs sent an action (or a reset) whose result no ``recv`` has collected yet."""
        ids = [e for _, envs in self._flight.values() for e in envs]
        ids += [e for queued in self._queued.values() for e in queued]
        return sorted(ids)

    @property
    def ready_env_ids(self) -> list[int]:
        """The envs whose results are held for the next ``recv``, oldest first."""
        return list(self._ready)

    def _outstanding(self) -> bool:
        return bool(self._flight or any(self._queued.values()) or self._ready)

    # --- the calls ---------------------------------------------------------------------------

    def async_reset(self, seed: SeedArg = None, options: ResetOptions = None) -> None:
        """Start resetting every env (or those in ``options["reset_mask"]``); their results
        come back through :meth:`recv` (reward 0, both flags False, the reset's infos).

        Args:
            seed: as :meth:`reset`: None, an int (env ``i`` gets ``seed + i``) or one per env.
            options: as :meth:`reset`: a dict (``"reset_mask"`` included) or one dict (or
                None) per env; envs given none reset with their stored options.

        Raises:
            AlreadyPendingCallError: envs are in flight or held (``drain()`` first), or a
                lock-step call is pending.
            ValueError, TypeError: bad seeds, options or reset mask.
        """
        self._begin_async("async_reset")
        if self._outstanding():
            raise AlreadyPendingCallError(
                "async_reset while envs are in flight or held "
                f"(in flight: {self.in_flight_env_ids}, ready: {self.ready_env_ids}); "
                "call drain() first",
                "async",
            )
        request = self._reset_options.request(seed, options)
        mask = request.mask
        self._enter_async()
        self._stamp(np.arange(self.num_envs) if mask is None else np.flatnonzero(mask))
        for unit in self._units.all:
            envs = request.envs(unit)
            if not envs:
                continue
            payload = request.payload(unit, self._reset_options.stored(unit))
            self._units.backend(unit).send(Command.RESET, payload, units=[unit])
            self._flight[unit.index] = ("reset", envs)
            self._needs_reset[envs] = False

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Start stepping the envs ``env_ids`` with ``actions`` (one each, in that order).

        Args:
            actions: a batch of ``len(env_ids)`` actions of the single action space.
            env_ids: the envs to step (default: those the last :meth:`recv` returned).

        Raises:
            ValueError: an unknown or repeated env id, an env in flight or whose result was
                not returned yet, an ended env with autoreset DISABLED, or a batch whose
                length is not ``len(env_ids)``; nothing is sent.
            AlreadyPendingCallError: a lock-step call is pending.
        """
        self._begin_async("send")
        ids = self._checked_ids(env_ids)
        k = len(ids)
        store_rows = self._store_action_rows
        per_env: list[Any]
        if store_rows is not None and store_rows(ids, actions):
            # In the envs' rows of the block (the usual batch): nothing to pickle per env.
            per_env = [_IN_BLOCK] * k
        else:
            space = self._action_spaces.get(k)
            if space is None:
                space = self._action_spaces[k] = batch_space(self.single_action_space, k)
            actions = without_tensors(self.single_action_space, actions)  # numpy, as the block's
            per_env = per_env_actions(space, actions, k, "one per env in env_ids")
        self._enter_async()
        self._stamp(ids)
        for env, action in zip(ids.tolist(), per_env):
            rebuilt = self._after_restart.pop(env, None)
            if rebuilt is not None:  # its env was rebuilt while idle: report that instead
                self._ready[env] = rebuilt
                continue
            self._queued.setdefault(self._units.index_of_env(env), {})[env] = action
        self._dispatch()

    def _checked_ids(self, env_ids: Any) -> np.ndarray:
        if env_ids is None:
            if self._last_ids is None:
                raise ValueError("send() needs env_ids: no recv() has returned envs yet")
            env_ids = self._last_ids
        checked = checked_env_ids(env_ids, self.num_envs, "send")
        assert checked is not None
        if not checked:
            raise ValueError("send: env_ids is empty: send() needs at least one env")
        ids = np.array(checked, dtype=np.int64)
        busy = set(self.in_flight_env_ids) | set(self._ready)
        taken = [int(e) for e in ids if int(e) in busy]
        if taken:
            raise ValueError(
                f"envs {taken} are in flight or hold a result no recv() returned yet: "
                "recv() them before sending them new actions"
            )
        if self.autoreset_mode is AutoresetMode.DISABLED:
            ended = [int(e) for e in ids if self._needs_reset[e]]
            if ended:
                raise ValueError(
                    f"envs {ended} terminated or truncated and autoreset_mode is DISABLED: "
                    "drain() and reset them (reset_mask) before stepping them again"
                )
        return ids

    def recv(
        self, min_envs: int | None = None, max_envs: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """The first ready envs' results.

        Args:
            min_envs: wait until this many are ready (default ``batch_size``; at most the
                envs in flight or held, since no others can become ready).
            max_envs: return at most this many (default ``max(batch_size, min_envs)``).
            timeout: seconds to wait (None: the constructor's ``timeout``).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)`` with one row per
            env; ``infos["env_id"]`` (an int array; for ``info_format="list"``, each dict's
            ``"env_id"``) names the env of each row.

        Raises:
            NoAsyncCallError: nothing is in flight or held.
            RecvTimeoutError: fewer than ``min_envs`` got ready in time (nothing is lost).
            EnvError: the step of an env this call would return raised (the other results
                stay held).
            WorkerDiedError: a worker died (with on_worker_failure="raise").
        """
        self._assert_is_running()
        if not self._outstanding():
            raise NoAsyncCallError(
                "Calling `recv` without any env in flight: call `async_reset` or `send` first.",
                "recv",
            )
        lo, hi = self._bounds(min_envs, max_envs)
        need = min(lo, len(self._ready) + len(self.in_flight_env_ids))
        if timeout is None:
            timeout = self.default_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._ready) < need:
            remaining = None if deadline is None else deadline - time.monotonic()
            expired = remaining is not None and remaining <= 0
            # Past the deadline, still take what is already there.
            self._collect_ready(
                0.0 if expired else remaining, wait=not expired, want=need - len(self._ready)
            )
            if expired and len(self._ready) < need:
                raise RecvTimeoutError(
                    f"recv: {len(self._ready)} of {need} envs ready after {timeout:g} s; "
                    f"envs {self.in_flight_env_ids} are still in flight (nothing is lost: "
                    "a later recv() returns them)",
                    env_indices=self.in_flight_env_ids,
                    timeout=timeout or 0.0,
                )
        if len(self._ready) < hi and self._flight:
            self._collect_ready(0.0, wait=False)
        return self._take(list(self._ready)[:hi])

    def drain(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Wait for everything in flight and return every held result as one recv-shaped
        batch (possibly of zero envs); the vector env is idle again, so ``step``, ``reset``
        and ``call`` work.

        Raises:
            EnvError: an env's step raised (the other results stay held: drain again).
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self._assert_is_running()
        while self._flight or any(self._queued.values()):
            want = sum(len(envs) for _, envs in self._flight.values())
            self._collect_ready(self.default_timeout, wait=True, want=want, hang=True)
        return self._take(list(self._ready))

    def _bounds(self, min_envs: int | None, max_envs: int | None) -> tuple[int, int]:
        n = self.num_envs
        for name, value in (("min_envs", min_envs), ("max_envs", max_envs)):
            if value is not None and (
                not isinstance(value, (int, np.integer)) or not 1 <= value <= n
            ):
                raise ValueError(f"{name} must be an int in [1, {n}] or None, got {value!r}")
        hi = max_envs if max_envs is not None else max(self.batch_size, min_envs or 0)
        lo = min_envs if min_envs is not None else min(self.batch_size, hi)
        if lo > hi:
            raise ValueError(f"min_envs={lo} exceeds max_envs={hi}")
        return int(lo), int(hi)

    # --- the mechanics -----------------------------------------------------------------------

    def _enter_async(self) -> None:
        if self._state is _State.IDLE:
            slots = self._obs_slots
            if slots is not None:  # the results are copied out: the block's own batch
                slots.cell[0] = 0
                self._obs_slot = 0
                self._observations = slots.batches[0]
            self._state = _State.ASYNC

    def _leave_async_if_done(self) -> None:
        if self._state is _State.ASYNC and not self._outstanding():
            self._state = _State.IDLE

    def _stamp(self, ids: np.ndarray) -> None:
        """Number the envs ``ids`` (in that order) after every env sent work before."""
        k = len(ids)
        self._sent_at[ids] = np.arange(self._sends, self._sends + k)
        self._sends += k

    def _dispatch(self) -> None:
        """Give every free unit that has actions queued one command for all of them (one
        ``send`` per backend), the unit whose queued action was sent first commanded first.

        The order matters when the parent waits for the first answers: a unit commanded
        earlier tends to answer earlier, and a unit that answers first every time has its
        envs back in its next command first every time (identical envs were served 2:1).
        Oldest first, the unit that answered late is commanded first the next time."""
        sent_at = self._sent_at
        free = [
            (min(sent_at[e] for e in queued), index)
            for index, queued in self._queued.items()
            if queued and index not in self._flight
        ]
        if not free:
            return
        payloads: dict[int, StepEnvsPayload] = {}
        for _, index in sorted(free):
            queued = self._queued[index]
            unit = self._units.unit(index)
            envs = sorted(queued)
            actions: list[Any] | None = [queued[e] for e in envs]
            assert actions is not None
            if all(a is _IN_BLOCK for a in actions):
                actions = None  # the worker reads them from the block
            elif any(a is _IN_BLOCK for a in actions):  # sends of both kinds: all by value
                read = self._read_action
                assert read is not None
                actions = [read(e) if a is _IN_BLOCK else a for e, a in zip(envs, actions)]
            payloads[index] = StepEnvsPayload([e - unit.lo for e in envs], actions)
            self._flight[index] = ("step", envs)
            queued.clear()
        for backend in self._backends:
            units = [
                u for u in map(self._units.unit, payloads) if self._units.backend(u) is backend
            ]
            if units:
                backend.send(Command.STEP_ENVS, per_unit=lambda u: payloads[u.index], units=units)

    def _collect_ready(
        self, timeout: float | None, *, wait: bool, want: int = 1, hang: bool = False
    ) -> None:
        """Collect the units that have answered: wait (up to ``timeout``) until units with
        at least ``want`` envs in flight answered when ``wait``, else take only what is
        there. With ``hang``, a unit silent past the timeout is a failure (as in lock-step),
        not a unit still in flight."""
        flight = self._flight
        failures: list[Failure] = []
        outcomes: dict[int, Outcome] = {}
        for backend in self._collect_order:
            mine = [u for u in backend.units if u.index in flight]
            if not mine:
                continue
            enough = 0
            if wait and want > 0:
                # The fewest of these units whose answers can bring ``want`` envs: waking
                # once for them, not once per answer, saves the parent's CPU.
                sizes = sorted((len(flight[u.index][1]) for u in mine), reverse=True)
                total = 0
                while enough < len(sizes) and total < want:
                    total += sizes[enough]
                    enough += 1
            got = backend.collect_ready(mine, enough, timeout, "waiting for recv")
            outcomes.update(got.outcomes)
            failures += got.failures
            want -= sum(len(flight[i][1]) for i in got.outcomes)
            want -= sum(len(flight[f.unit.index][1]) for f in got.failures)
            if hang and wait and not got.outcomes and not got.failures and timeout is not None:
                failures += [
                    Failure(u, "hung", f"no reply from {u.describe()} after {timeout:g} s")
                    for u in mine
                ]
        ready = self._ready
        before = len(ready)
        for index in outcomes:
            kind, envs = flight.pop(index)
            self._hold(self._units.unit(index), kind, envs, outcomes[index])
        if len(ready) - before > 1:
            # Seen in the same look, these became ready together as far as the parent can
            # tell: the env sent its work first goes first (not the lowest env index, which
            # served the first envs of every unit, and the first unit, more often).
            fresh = list(ready)[before:]
            oldest_first = sorted(fresh, key=self._sent_at.__getitem__)
            if oldest_first != fresh:
                for env in oldest_first:
                    ready[env] = ready.pop(env)
        if failures:
            self._async_failures(failures, timeout)
        self._dispatch()

    def _hold(self, unit: Unit, kind: str, envs: list[int], outcome: Outcome) -> None:
        """Copy each env's result out of the batch arrays and hold it for ``recv``."""
        status, value = outcome
        if status is Status.OK and self._obs_shared:  # the usual answer: all in the rows
            self._hold_in_block(kind == "reset", envs)
            return
        if status is Status.ERROR:  # the whole command failed: every env of it reports it
            for env in envs:
                self._ready[env] = EnvResult(None, 0.0, False, False, error=value)
            return
        reply: UnitReply | None = value if status is Status.OK_PAYLOAD else None
        events = events_by_env(unit.lo, reply)
        errors = {
            unit.lo + local: rebuild_remote_error(record, unit.pid)
            for local, record in (reply.errors if reply is not None else None) or ()
        }
        by_value = obs_by_env(unit.lo, reply)
        for env in envs:
            error = errors.get(env)
            if error is not None:
                self._ready[env] = EnvResult(None, 0.0, False, False, error=error)
                continue
            self._ready[env] = self._result(env, kind == "reset", events.get(env, []), by_value)

    def _hold_in_block(self, reset: bool, envs: list[int]) -> None:
        ready = self._ready
        if reset:
            for env in envs:
                ready[env] = _RESET_IN_BLOCK
            return
        disabled = self.autoreset_mode is AutoresetMode.DISABLED
        final_in_block = self._final_in_block
        for env in envs:
            if disabled or final_in_block:
                ended = bool(self._terminations[env] or self._truncations[env])
                if ended and final_in_block:  # its implicit final-obs event is built now
                    ready[env] = self._result(env, False, [], {})
                    continue
                if disabled:
                    self._needs_reset[env] = ended
            ready[env] = _STEP_IN_BLOCK

    def _materialise(self, envs: Iterable[int]) -> None:
        """Copy the held in-block results of ``envs`` out of the rows (before a restart
        rewrites them)."""
        ready = self._ready
        for env in envs:
            held = ready.get(env)
            if isinstance(held, _InBlock):
                ready[env] = self._result(env, held.reset, [], {})

    def _result(
        self, env: int, reset: bool, events: list[dict[str, Any]], by_value: dict[int, Any]
    ) -> EnvResult:
        if self._obs_shared:
            obs = _copy_row(self._observations, env)
        else:
            obs = deepcopy(by_value[env]) if env in by_value else self._env_obs[env]
            self._env_obs[env] = obs
            split = self._obs_split
            if split is not None:  # obs: its other leaves; the fixed-size ones are in the rows
                obs = split.build([leaf[env, ...].copy() for leaf in self._obs_fixed_now()], obs)
        if reset:
            return EnvResult(obs, 0.0, False, False, events)
        terminated = bool(self._terminations[env])
        truncated = bool(self._truncations[env])
        if self.autoreset_mode is AutoresetMode.DISABLED:
            self._needs_reset[env] = terminated or truncated
        if (terminated or truncated) and self._final_in_block:
            rows = self._final_obs_rows
            assert rows is not None
            first = events[0] if events else {}
            if "final_obs" not in first:  # an empty final info: the event was left implicit
                events.insert(0, final_event(None, rows, env))
            else:
                final_event(first, rows, env)
        reward = float(self._rewards[env])
        return EnvResult(obs, reward, terminated, truncated, events)

    def _async_failures(self, failures: list[Failure], timeout: float | None) -> None:
        """Dead (or, draining, hung) units: raise, or rebuild them and report their envs
        truncated with ``worker_restarted``, as lock-step does."""
        policy = self._policy
        if not policy.can_restart:
            for failure in failures:
                self._flight.pop(failure.unit.index, None)
            self._fail(failures, timeout)
        for failure in failures:
            index = failure.unit.index
            self._materialise(range(failure.unit.lo, failure.unit.hi))
            done = policy.restart(
                self._units,
                [failure],
                timeout,
                self._build_timeout(timeout),
                self._no_seeds,
                self._reset_options.stored,
            )
            if done.error is not None:
                self._flight.pop(index, None)
                self._break([index], done.reason)
                raise done.error
            got = done.outcomes
            unit = self._units.unit(index)
            _, flying = self._flight.pop(index, ("", []))
            queued = self._queued.pop(index, {})
            status, value = got[index]
            reply = value if status is Status.OK_PAYLOAD else None
            events = events_by_env(unit.lo, reply)
            by_value = obs_by_env(unit.lo, reply)
            for env in range(unit.lo, unit.hi):
                result = self._result(env, True, events.get(env, []), by_value)
                result.truncated, result.restarted = True, True
                if env in flying or env in queued:
                    self._ready[env] = result
                else:  # idle or held: reported when it is next sent an action
                    self._after_restart[env] = result

    @staticmethod
    def _no_seeds(unit: Unit) -> list[int | None]:
        return [None] * (unit.hi - unit.lo)

    def _take(self, ids: Sequence[int]) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Return the held results of ``ids`` as one batch (or raise the first's error)."""
        ready = self._ready
        for env in ids:
            held = ready[env]
            if isinstance(held, EnvResult) and held.error is not None:
                del ready[env]
                self._leave_async_if_done()
                raise held.error
        k = len(ids)
        env_ids = np.array(ids, dtype=np.int64)
        merger = self._mergers.get(k)
        if merger is None:
            merger = self._mergers[k] = make_merger(self.info_format, k)
        if k and all(isinstance(ready[env], _InBlock) for env in ids):
            resets = [row for row, env in enumerate(ids) if ready[env] is _RESET_IN_BLOCK]
            for env in ids:
                del ready[env]
            obs = _take_rows(self._observations, env_ids)
            rewards = self._rewards[env_ids]
            terminations = self._terminations[env_ids]
            truncations = self._truncations[env_ids]
            if resets:
                rewards[resets] = 0.0
                terminations[resets] = truncations[resets] = False
            infos = merger.merge([], [])
        else:
            results = []
            for env in ids:
                held = ready.pop(env)
                if isinstance(held, _InBlock):
                    held = self._result(env, held.reset, [], {})
                results.append(held)
            space = self.single_observation_space
            out = create_empty_array(space, n=k, fn=np.zeros)
            obs = concatenate(space, [r.obs for r in results], out) if k else out  # type: ignore[arg-type]
            rewards = np.array([r.reward for r in results], dtype=np.float64)
            terminations = np.array([r.terminated for r in results], dtype=np.bool_)
            truncations = np.array([r.truncated for r in results], dtype=np.bool_)
            parts = [
                (row, UnitReply([(0, e) for e in r.events], None))
                for row, r in enumerate(results)
                if r.events
            ]
            restarted = [row for row, r in enumerate(results) if r.restarted]
            infos = merger.merge(parts, restarted)
        self._leave_async_if_done()
        if self.info_format == "list":
            for row, info in enumerate(infos):
                info["env_id"] = int(env_ids[row])
        else:
            infos["env_id"] = env_ids
        self._last_ids = env_ids
        return obs, rewards, terminations, truncations, infos
