"""Asynchronous first-k-ready stepping: the engine behind the front's ``async_reset``,
``send``, ``recv`` and ``drain``.

    send(actions, env_ids) ─► queue each env's action on its unit; a free unit gets one
                              STEP_ENVS command for every env it has an action for
    recv(min, max, timeout) ◄─ collect the units that answered (waiting for the first ones
                              only as long as fewer than ``min`` envs are ready), copy each
                              env's result out of the batch arrays, return the first ready

The unit of scheduling is a unit (a worker and its envs): it has at most one command in
flight and steps the subset of its envs that have actions, then answers once. The unit of the
API is an env: each env's result (observation, reward, flags, infos, or the exception its step
raised) is copied out of the block as soon as its unit answers and held until a ``recv``
returns it (``_front.held``). Nothing ready is ever dropped, and ``recv`` hands out the held
results of the envs sent their work first, so no env starves. Per env, the trajectory is
SyncVectorEnv's for the same seed and the same actions: the envs run the same code as in
``step()`` (``EnvSlab.step``), one env at a time in their unit, whatever the others do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import numpy as np
from gymnasium import Space
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector.utils import batch_space

from subvec._backend import Backend, Failure, Outcome
from subvec._batch import BatchViews
from subvec._commands import Command, Status, StepEnvsPayload
from subvec._compat import AutoresetMode
from subvec._front.async_chunks import ChunkWork, describe_shapes
from subvec._front.async_stats import AsyncRecorder
from subvec._front.calls import checked_env_ids
from subvec._front.chunk import ChunkStepper
from subvec._front.ended import EndedEnvs
from subvec._front.held import EnvResult, HeldResults, restarted_chunk
from subvec._front.observations import ObservationBatch
from subvec._front.options import EnvResetOptions, ResetOptions
from subvec._front.recovery import FailurePolicy
from subvec._front.results import events_by_env, obs_by_env
from subvec._front.units import Units
from subvec._seeding import SeedArg
from subvec._spaces import per_env_actions, without_tensors
from subvec.errors import RecvTimeoutError

__all__ = ["AsyncEngine", "EnvResult", "FrontHooks"]

#: give the CPU to another runnable process once (a no-op where the call does not exist)
_yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: None)

#: a queued env's action that is in its row of the block (``send`` stored the batch there)
_IN_BLOCK: Any = object()


class _Flight(NamedTuple):
    """A unit's command in flight: a ``"step"``, a ``"reset"`` or a ``"chunk"`` (``work``) of
    ``envs``, the oldest of which was sent its work at ``oldest`` (its place in the send
    order)."""

    kind: str
    envs: list[int]
    oldest: int
    work: ChunkWork | None = None

    @property
    def substeps(self) -> int:
        """Sub-steps each env runs: a chunk's K, else 1."""
        return 1 if self.work is None else self.work.chunk


@dataclass(frozen=True)
class FrontHooks:
    """What the engine asks of the front, which owns the call state, the observation slot
    and the broken state."""

    #: envs are about to go in flight: from idle, the front enters its asynchronous state
    #: and points the units at its own observation batch (the results are copied out)
    enter: Callable[[], None]
    #: nothing is in flight or held any more: the front is idle again
    leave: Callable[[], None]
    #: raise the error of failures that are not restarted (breaking the front, or idle)
    fail: Callable[[list[Failure], float | None], NoReturn]
    #: the front is broken: these units (by index) are lost, for this reason
    broken: Callable[[list[int], str], None]
    #: the bound on building a replacement's envs, given the bound of the call
    build_timeout: Callable[[float | None], float | None]


class AsyncEngine:
    """Asynchronous first-k-ready stepping for :class:`subvec._front.front.VectorFront`, which
    keeps the public calls and checks its own state before delegating here.

    Args:
        units: the front's map of its units (replacements refresh it in place).
        collect_order: the backends in the order they are collected (inline ones first).
        batch: the batch arrays the units write (rewards, flags, observations, action rows).
        final_in_block: whether SAME_STEP final observations are in the block's rows.
        obs: the front's observation batch (each env's by-value observation kept there).
        ended: the envs that ended and wait for a reset (reset here for the resets sent;
            the held results report the steps answered).
        reset_options: the envs' stored options and the reset forms' checks.
        policy: the failure policy (restarts are made through it).
        spaces: the single observation and action spaces.
        autoreset_mode, info_format, batch_size: the front's settings.
        chunks: the front's ``step_chunk`` work (its checks and the chunk arrays).
        refuses_ended: whether an ended env is refused work until reset (DISABLED without
            freeze).
        hooks: what the front does for the engine (see :class:`FrontHooks`).
    """

    def __init__(
        self,
        *,
        units: Units,
        collect_order: Sequence[Backend],
        batch: BatchViews,
        final_in_block: bool,
        obs: ObservationBatch,
        ended: EndedEnvs,
        reset_options: EnvResetOptions,
        policy: FailurePolicy,
        spaces: tuple[Space[Any], Space[Any]],
        autoreset_mode: AutoresetMode,
        info_format: str,
        batch_size: int,
        hooks: FrontHooks,
        chunks: ChunkStepper,
        refuses_ended: bool = False,
    ) -> None:
        self._units = units
        self._collect_order = collect_order
        self._hooks = hooks
        self._reset_options = reset_options
        self._policy = policy
        self._chunks = chunks
        self.single_observation_space, self.single_action_space = spaces
        self.num_envs = len(ended.flags)
        self.autoreset_mode = autoreset_mode
        #: DISABLED without freeze: an ended env is not sent work until it is reset
        self._refuses_ended = refuses_ended
        self.info_format = info_format
        self.batch_size = batch_size
        self._ended = ended
        self._store_action_rows = batch.store_action_rows
        self._read_action = batch.read_action
        #: the results held for ``recv`` (their one writer); ``recv`` serves them in the
        #: order their envs were sent work
        self._held = HeldResults(
            batch=batch,
            final_in_block=final_in_block,
            obs=obs,
            ended=ended,
            space=self.single_observation_space,
            info_format=info_format,
        )
        self._ready = self._held.ready
        self._flight: dict[int, _Flight] = {}  # unit index -> its command in flight
        # unit index -> {env: its action, or the chunk (ChunkWork) it is to run}
        self._queued: dict[int, dict[int, Any]] = {}
        self._after_restart: dict[int, EnvResult] = {}  # idle envs whose unit was rebuilt
        self._last_ids: np.ndarray | None = None
        # Each env's place in the order envs were sent work (a send, a reset): held results
        # are handed out, and queued work is dispatched, oldest first (see ``recv`` and
        # ``_dispatch``).
        self._sent_at = [0] * self.num_envs
        self._sends = 0
        self._action_spaces: dict[int, Space[Any]] = {}
        #: whether ``send_chunk`` was ever called: until then every result is a step's, and
        #: a unit's queue holds one kind of work (no shapes to sort out)
        self._chunks_sent = False
        #: who waits on whom (``VectorFront.async_stats``)
        self.recorder = AsyncRecorder(self.num_envs)

    def drop_views(self) -> None:
        """Drop the references to the batch arrays (so that a shared block can unmap)."""
        self.__dict__.pop("_store_action_rows", None)
        self.__dict__.pop("_read_action", None)
        self._held.drop_views()

    # --- introspection -----------------------------------------------------------------------

    @property
    def in_flight_env_ids(self) -> list[int]:
        """The envs sent an action (or a reset) whose result no ``recv`` has collected yet."""
        ids = [e for flight in self._flight.values() for e in flight.envs]
        ids += [e for queued in self._queued.values() for e in queued]
        return sorted(ids)

    @property
    def ready_env_ids(self) -> list[int]:
        """The envs whose results are held for the next ``recv``, in the order it serves them."""
        return self._oldest_first()

    def _oldest_first(self) -> list[int]:
        """The held envs in the order they were sent their work: the order ``recv`` serves."""
        return sorted(self._ready, key=self._sent_at.__getitem__)

    def in_flight_kinds(self) -> list[tuple[str, int]]:
        """The commands in flight and queued, ``(kind, substeps)`` (``("reset", 1)``,
        ``("step", 1)``, ``("chunk", K)``); with none, ``[("step", 1)]`` (what a wait
        would be for)."""
        kinds = [(flight.kind, flight.substeps) for flight in self._flight.values()]
        if self._chunks_sent:
            kinds += [("chunk", work.chunk) for work in self._queued_chunks()]
        return kinds or [("step", 1)]

    def _queued_chunks(self) -> Iterator[ChunkWork]:
        """The chunk of each env queued to run one."""
        for queued in self._queued.values():
            for action in queued.values():
                if isinstance(action, ChunkWork):
                    yield action

    def _chunk_in_flight(self) -> ChunkWork | None:
        """A chunk in flight or queued (they all share K and ``all_obs``), if any."""
        for flight in self._flight.values():
            if flight.work is not None:
                return flight.work
        return next(self._queued_chunks(), None)

    def _outstanding(self) -> bool:
        return bool(self._flight or any(self._queued.values()) or self._ready)

    # --- the calls ---------------------------------------------------------------------------

    def reset(self, seed: SeedArg, options: ResetOptions) -> None:
        """``VectorFront.async_reset``, once the front allows it.

        Raises:
            AlreadyPendingCallError: envs are in flight or held.
            ValueError, TypeError: bad seeds, options or reset mask.
        """
        if self._outstanding():
            raise AlreadyPendingCallError(
                "async_reset while envs are in flight or held "
                f"(in flight: {self.in_flight_env_ids}, ready: {self.ready_env_ids}); "
                "call drain() first",
                "async",
            )
        request = self._reset_options.request(seed, options)
        mask = request.mask
        self._hooks.enter()
        started = np.arange(self.num_envs) if mask is None else np.flatnonzero(mask)
        self._stamp(started)
        self.recorder.sent(started.tolist())
        for unit in self._units.all:
            envs = request.envs(unit)
            if not envs:
                continue
            payload = request.payload(unit, self._reset_options.stored(unit))
            self._units.backend(unit).send(Command.RESET, payload, units=[unit])
            self._flight[unit.index] = _Flight("reset", envs, min(self._sent_at[e] for e in envs))
            self._ended.reset(envs)

    def send(self, actions: Any, env_ids: Any) -> None:
        """``VectorFront.send``, once the front allows it.

        Raises:
            ValueError: bad env ids or actions (nothing is sent).
        """
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
        self._hooks.enter()
        self._stamp(ids)
        self.recorder.sent(ids.tolist())
        for env, action in zip(ids.tolist(), per_env):
            rebuilt = self._after_restart.pop(env, None)
            if rebuilt is not None:  # its env was rebuilt while idle: report that instead
                self._held.put(env, rebuilt)
                continue
            self._queued.setdefault(self._units.index_of_env(env), {})[env] = action
        self._dispatch()

    def send_chunk(self, actions: Any, env_ids: Any, stop_on_done: bool, all_obs: bool) -> None:
        """``VectorFront.send_chunk``, once the front allows it.

        Raises:
            ValueError, TypeError: bad env ids, or a batch that is not chunks of the action
                space for them, or a K (or ``all_obs``) other than that of the chunks in
                flight; nothing is sent.
        """
        ids = self._checked_ids(env_ids, "send_chunk")
        work = self._chunks.work(
            actions,
            ids,
            stop_on_done,
            all_obs,
            self._chunk_in_flight(),
            self._held.release_chunk_rows,
        )
        self._chunks_sent = True
        self._hooks.enter()
        self._stamp(ids)
        self.recorder.sent(ids.tolist())
        for env in ids.tolist():
            rebuilt = self._after_restart.pop(env, None)
            if rebuilt is not None:  # its env was rebuilt while idle: report that instead
                space = self.single_observation_space
                self._held.put(env, restarted_chunk(work, env, rebuilt, space, lost=False))
                continue
            self._queued.setdefault(self._units.index_of_env(env), {})[env] = work
        self._dispatch()

    def _checked_ids(self, env_ids: Any, method: str = "send") -> np.ndarray:
        if env_ids is None:
            if self._last_ids is None:
                raise ValueError(f"{method}() needs env_ids: no recv() has returned envs yet")
            env_ids = self._last_ids
        checked = checked_env_ids(env_ids, self.num_envs, method)
        assert checked is not None
        if not checked:
            raise ValueError(f"{method}: env_ids is empty: {method}() needs at least one env")
        ids = np.array(checked, dtype=np.int64)
        taken = [e for e in checked if self._busy(e)]
        if taken:
            raise ValueError(
                f"envs {taken} are in flight or hold a result no recv() returned yet: "
                "recv() them before sending them new actions"
            )
        if self._refuses_ended:
            ended = [int(e) for e in ids if self._ended.flags[e]]
            if ended:
                raise ValueError(
                    f"envs {ended} terminated or truncated and autoreset_mode is DISABLED: "
                    "drain() and reset them (reset_mask) before stepping them again"
                )
        return ids

    def _busy(self, env: int) -> bool:
        """Whether ``env`` is in flight, queued, or holds a result."""
        if env in self._ready:
            return True
        index = self._units.index_of_env(env)
        flight = self._flight.get(index)
        return env in self._queued.get(index, ()) or (flight is not None and env in flight.envs)

    def _in_flight_count(self) -> int:
        queued = sum(len(q) for q in self._queued.values())
        return queued + sum(len(f.envs) for f in self._flight.values())

    def recv(
        self,
        min_envs: int | None,
        max_envs: int | None,
        timeout: float | None,
        deadline: float | None = None,
        env_ids: Any = None,
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """``VectorFront.recv`` (``timeout``: the call's, the front's default applied)."""
        began = time.perf_counter()
        if not self._outstanding():
            raise NoAsyncCallError(
                "Calling `recv` without any env in flight: call `async_reset` or `send` first.",
                "recv",
            )
        if env_ids is not None:
            if min_envs is not None or max_envs is not None or deadline is not None:
                raise ValueError(
                    "recv: env_ids names the envs to return; min_envs, max_envs and deadline "
                    "do not apply to it"
                )
            ids = self._awaited_ids(env_ids)
            self._wait_for(lambda: all(e in self._ready for e in ids), len(ids), timeout, ids)
            self._one_shape(ids, "recv(env_ids=...)")
            return self._returned(ids, len(ids), began)
        lo, hi = self._bounds(min_envs, max_envs)
        need = min(lo, len(self._ready) + self._in_flight_count())
        self._wait_for(lambda: len(self._ready) >= need, need, timeout, None)
        if deadline is not None:
            # Enough: keep filling the batch until max_envs or the deadline, whichever first.
            until = began + deadline
            while len(self._ready) < hi and self._in_flight_count():
                remaining = until - time.perf_counter()
                if remaining <= 0:
                    break
                self._collect_ready(remaining, wait=True, want=hi - len(self._ready))
        chosen = self._served(hi)
        flight = self._flight
        if flight and chosen:
            sent_at = self._sent_at
            # An env in flight was sent its work before one about to be handed out: take
            # every answer already there, so that the oldest requests among all that is
            # ready go out. Yield the CPU first: a worker that shares it with the parent
            # runs only while the parent sleeps, and a recv that finds enough results held
            # does not sleep, so that worker's envs would keep being passed over.
            passed_over = min(f.oldest for f in flight.values()) < sent_at[chosen[-1]]
            if passed_over:
                _yield_cpu()
            if passed_over or len(chosen) < hi:
                self._collect_ready(0.0, wait=False)
                chosen = self._served(hi)
        elif flight:  # nothing ready yet (min_envs=0): take what has come in since
            self._collect_ready(0.0, wait=False)
            chosen = self._served(hi)
        return self._returned(chosen, hi, began)

    def _served(self, most: int) -> list[int]:
        """The held envs the next batch returns: oldest first, up to ``most``, those whose
        results have the shape of the oldest's (a step's, or a chunk's of one K and
        ``all_obs``: a batch holds one shape)."""
        order = self._oldest_first()
        chosen = order[:most]
        if chosen and self._chunks_sent:
            ready = self._ready
            shape = ready[chosen[0]].shape
            if any(ready[e].shape != shape for e in chosen[1:]):
                chosen = [e for e in order if ready[e].shape == shape][:most]
        return chosen

    def _one_shape(self, ids: Sequence[int], method: str) -> None:
        """Raise unless the held results of ``ids`` batch together (nothing is lost).

        Raises:
            ValueError: some are chunks' and others steps', or chunks of another K or
                ``all_obs``.
        """
        if not self._chunks_sent:  # every result is a step's
            return
        shapes: dict[Any, list[int]] = {}
        for env in ids:
            shapes.setdefault(self._ready[env].shape, []).append(env)
        if len(shapes) > 1:
            raise ValueError(
                f"{method}: the results held are of different shapes ({describe_shapes(shapes)}); "
                "a batch holds one: recv(env_ids=...) each set (nothing is lost)"
            )

    def _returned(
        self, ids: Sequence[int], max_envs: int, began: float
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        result = self._take(ids)
        self.recorder.returned(list(ids), max_envs, began)
        return result

    def _awaited_ids(self, env_ids: Any) -> list[int]:
        """``recv(env_ids=)``'s envs, each in flight or held."""
        checked = checked_env_ids(env_ids, self.num_envs, "recv")
        assert checked is not None
        if not checked:
            raise ValueError("recv: env_ids is empty")
        idle = [e for e in checked if not self._busy(e)]
        if idle:
            raise ValueError(
                f"recv: envs {idle} are neither in flight nor holding a result: send() them "
                "work first"
            )
        return list(checked)

    def _wait_for(
        self,
        done: Callable[[], bool],
        need: int,
        timeout: float | None,
        ids: list[int] | None,
    ) -> None:
        """Collect answers until ``done()``, raising :class:`RecvTimeoutError` (losing
        nothing) when ``timeout`` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            remaining = None if deadline is None else deadline - time.monotonic()
            expired = remaining is not None and remaining <= 0
            # Past the deadline, still take what is already there.
            want = (
                need - len(self._ready) if ids is None else sum(e not in self._ready for e in ids)
            )
            self._collect_ready(0.0 if expired else remaining, wait=not expired, want=want)
            if expired and not done():
                waited = (
                    f"{len(self._ready)} of {need} envs ready"
                    if ids is None
                    else f"envs {[e for e in ids if e not in self._ready]} of {ids} not ready"
                )
                raise RecvTimeoutError(
                    f"recv: {waited} after {timeout:g} s; envs {self.in_flight_env_ids} are "
                    "still in flight (nothing is lost: a later recv() returns them)",
                    env_indices=self.in_flight_env_ids,
                    timeout=timeout or 0.0,
                )

    def drain(self, timeout: float | None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """``VectorFront.drain``; ``timeout`` bounds each wait for a unit."""
        while self._flight or any(self._queued.values()):
            want = sum(len(flight.envs) for flight in self._flight.values())
            self._collect_ready(timeout, wait=True, want=want, hang=True)
        ids = self._oldest_first()
        self._one_shape(ids, "drain")
        return self._take(ids)

    def _bounds(self, min_envs: int | None, max_envs: int | None) -> tuple[int, int]:
        n = self.num_envs
        for name, value, least in (("min_envs", min_envs, 0), ("max_envs", max_envs, 1)):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, np.integer))
                or not least <= value <= n
            ):
                raise ValueError(f"{name} must be an int in [{least}, {n}] or None, got {value!r}")
        hi = max_envs if max_envs is not None else max(self.batch_size, min_envs or 0)
        lo = min_envs if min_envs is not None else min(self.batch_size, hi)
        if lo > hi:
            raise ValueError(f"min_envs={lo} exceeds max_envs={hi}")
        return int(lo), int(hi)

    # --- the mechanics -----------------------------------------------------------------------

    def _leave_if_done(self) -> None:
        if not self._outstanding():
            self._hooks.leave()

    def _stamp(self, ids: np.ndarray) -> None:
        """Number the envs ``ids`` (in that order) after every env sent work before."""
        sent_at, sends = self._sent_at, self._sends
        for env in ids.tolist():
            sent_at[env] = sends
            sends += 1
        self._sends = sends

    def _dispatch(self) -> None:
        """Give every free unit that has actions queued one command for all of them (one
        ``send`` per backend), the unit whose queued action was sent first commanded first.

        The order matters when the parent waits for the first answers: a unit commanded
        earlier tends to answer earlier, and a unit that answers first every time has its
        envs back in its next command first every time (identical envs were served 2:1).
        Oldest first, the unit that answered late is commanded first the next time."""
        sent_at = self._sent_at
        free = [
            (min([sent_at[e] for e in queued]), index)
            for index, queued in self._queued.items()
            if queued and index not in self._flight
        ]
        if not free:
            return
        payloads: dict[int, StepEnvsPayload] = {}
        for oldest, index in sorted(free):
            queued = self._queued[index]
            unit = self._units.unit(index)
            work = None
            if self._chunks_sent:
                # One command: the steps queued, or the envs of one chunk; the oldest env's
                # decides which, the others wait for the next.
                head = queued[min(queued, key=sent_at.__getitem__)]
                work = head if isinstance(head, ChunkWork) else None
                envs = sorted(
                    e
                    for e, a in queued.items()
                    if (a is work if work is not None else not isinstance(a, ChunkWork))
                )
            else:
                envs = sorted(queued)
            actions: list[Any] | None = [queued.pop(e) for e in envs]
            if work is not None:
                payloads[index] = work.payload(unit, envs)
                self._flight[index] = _Flight("chunk", envs, oldest, work)
                continue
            assert actions is not None
            if all(a is _IN_BLOCK for a in actions):
                actions = None  # the worker reads them from the block
            elif any(a is _IN_BLOCK for a in actions):  # sends of both kinds: all by value
                read = self._read_action
                assert read is not None
                actions = [read(e) if a is _IN_BLOCK else a for e, a in zip(envs, actions)]
            payloads[index] = StepEnvsPayload([e - unit.lo for e in envs], actions)
            self._flight[index] = _Flight("step", envs, oldest)
        for backend in self._units.backends:
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
                sizes = sorted((len(flight[u.index].envs) for u in mine), reverse=True)
                total = 0
                while enough < len(sizes) and total < want:
                    total += sizes[enough]
                    enough += 1
            got = backend.collect_ready(mine, enough, timeout, "waiting for recv")
            outcomes.update(got.outcomes)
            failures += got.failures
            want -= sum(len(flight[i].envs) for i in got.outcomes)
            want -= sum(len(flight[f.unit.index].envs) for f in got.failures)
            if hang and wait and not got.outcomes and not got.failures and timeout is not None:
                failures += [
                    Failure(u, "hung", f"no reply from {u.describe()} after {timeout:g} s")
                    for u in mine
                ]
        for index in outcomes:
            gone = flight.pop(index)
            self.recorder.ready(gone.envs)
            self._held.hold(
                self._units.unit(index), gone.envs, gone.kind == "reset", gone.work, outcomes[index]
            )
        if failures:
            self._async_failures(failures, timeout)
        self._dispatch()

    def _async_failures(self, failures: list[Failure], timeout: float | None) -> None:
        """Dead (or, draining, hung) units: raise, or rebuild them and report their envs
        truncated with ``worker_restarted``, as lock-step does."""
        policy = self._policy
        if not policy.can_restart:
            for failure in failures:
                self._flight.pop(failure.unit.index, None)
            self._hooks.fail(failures, timeout)
        for failure in failures:
            index = failure.unit.index
            self._held.materialise(range(failure.unit.lo, failure.unit.hi))
            done = policy.restart(
                self._units,
                [failure],
                timeout,
                self._hooks.build_timeout(timeout),
                lambda unit: [None] * (unit.hi - unit.lo),  # fresh entropy
                self._reset_options.stored,
            )
            if done.error is not None:
                self._flight.pop(index, None)
                self._hooks.broken([index], done.reason)
                raise done.error
            got = done.outcomes
            unit = self._units.unit(index)
            gone = self._flight.pop(index, None)
            flying = gone.envs if gone is not None else []
            queued = self._queued.pop(index, {})
            status, value = got[index]
            reply = value if status is Status.OK_PAYLOAD else None
            events = events_by_env(unit.lo, reply)
            by_value = obs_by_env(unit.lo, reply)
            space = self.single_observation_space
            for env in range(unit.lo, unit.hi):
                result = self._held.result(env, True, events.get(env, []), by_value)
                result.truncated, result.restarted = True, True
                waiting = queued.get(env)
                if gone is not None and gone.work is not None and env in flying:
                    self._held.put(env, restarted_chunk(gone.work, env, result, space, lost=True))
                elif isinstance(waiting, ChunkWork):
                    self._held.put(env, restarted_chunk(waiting, env, result, space, lost=False))
                elif env in flying or env in queued:
                    self._held.put(env, result)
                else:  # idle or held: reported when it is next sent an action
                    self._after_restart[env] = result

    def _take(self, ids: Sequence[int]) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Return the held results of ``ids`` as one batch (or raise the first's error)."""
        env_ids = np.array(ids, dtype=np.int64)
        try:
            batch = self._held.take(ids, env_ids)
        finally:
            self._leave_if_done()
        self._last_ids = env_ids
        return batch
