"""The results the asynchronous engine holds: each env's, from its unit's answer until a
``recv`` returns it, and the batch a ``recv`` returns of them.

    hold      a unit's answer, per env: :class:`InRows` where the result is all in the env's
              rows of the batch (and chunk) arrays: a plain OK; else an :class:`EnvResult`
              copied out at once
    take      the held results of some envs as one batch: their rows, one index per array,
              with the copied results written over theirs; each handed out (or the first's
              error raised)

A step's result and a chunk's are held and batched alike; a chunk's has the chunk axis after
the env axis and its progress count. :class:`HeldResults` holds the batch arrays it reads and
no reference to the engine or the front.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import Space
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from subvec._backend import Outcome, Unit
from subvec._batch import BatchViews
from subvec._commands import Status, UnitReply
from subvec._front.async_chunks import (
    ChunkShape,
    ChunkWork,
    cut_short,
    ended_at_last,
    sub_step_obs,
)
from subvec._front.ended import EndedEnvs
from subvec._front.merge import InfoMerger, make_merger, merge_chunk_infos
from subvec._front.observations import ObservationBatch
from subvec._front.results import events_by_env, obs_by_env, reply_errors, with_final_event
from subvec._spaces import map_leaves, nest_leaves
from subvec.errors import EnvError

__all__ = ["EnvResult", "HeldResults", "InRows", "restarted_chunk"]


@dataclass
class EnvResult:
    """One env's result of a reset, step or chunk, copied out of the batch arrays when its
    unit answered (or made when its unit was rebuilt)."""

    #: the observation (a chunk's with ``all_obs``: every sub-step's, a nest of ``(K, ...)``
    #: arrays, rows past an early stop repeating the last)
    obs: Any
    #: a step's float and bools; a chunk's ``(K,)`` arrays
    reward: Any
    terminated: Any
    truncated: Any
    #: ``(sub-step, info)`` in order (a step's and a reset's at sub-step 0)
    events: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    error: BaseException | None = None
    #: a step cut short by a restart (a chunk's says so in its events)
    restarted: bool = False
    #: None for a step's or a reset's; ``(K, all_obs)`` for a chunk's
    shape: ChunkShape | None = None
    #: the sub-steps a chunk executed
    steps: int = 1

    @property
    def ended(self) -> bool:
        """Whether its (last executed) step ended its episode."""
        if self.shape is None:
            return bool(self.terminated or self.truncated)
        return ended_at_last(self.terminated, self.truncated, self.steps)


class InRows:
    """A held result that is all in its env's rows of the batch arrays (and of the chunk
    arrays of ``work``): a plain OK, no infos, no error. Nothing overwrites those rows until
    ``recv`` returns it, since an env is sent nothing new before then, and a chunk of the same
    shape runs in the same arrays (other rows). A restart about to rewrite a unit's rows, or a
    chunk of another shape about to reshape or replace the chunk arrays, copies it out first
    (:meth:`HeldResults.materialise`, :meth:`HeldResults.release_chunk_rows`)."""

    __slots__ = ("reset", "work")

    def __init__(self, reset: bool, work: ChunkWork | None = None) -> None:
        self.reset = reset
        self.work = work

    @property
    def shape(self) -> ChunkShape | None:
        return None if self.work is None else self.work.shape


STEP_IN_ROWS, RESET_IN_ROWS = InRows(False), InRows(True)

#: one env's held result
Held = EnvResult | InRows


def copy_row(batch: Any, i: int) -> Any:
    """Row ``i`` of every leaf of ``batch``, copied (one env's held result)."""
    # [i, ...]: a 0-d leaf's row stays an array, as SyncVectorEnv's iterate hands it out
    return map_leaves(lambda leaf: _copied(leaf[i, ...]), batch)


def _copied(row: Any) -> Any:
    return row.copy() if isinstance(row, np.ndarray) else row


class HeldResults:
    """The held results; see the module docstring.

    The one writer of :attr:`ready` (the engine reads it); it tells ``ended`` which envs'
    steps ended.

    Args:
        batch: the batch arrays the units write.
        final_in_block: whether SAME_STEP final observations are in the block's rows.
        obs: the front's observation batch (each env's by-value observation kept there).
        ended: the envs that ended and wait for a reset (DISABLED).
        space: the single observation space.
        info_format: the front's setting.
    """

    def __init__(
        self,
        *,
        batch: BatchViews,
        final_in_block: bool,
        obs: ObservationBatch,
        ended: EndedEnvs,
        space: Space[Any],
        info_format: str,
    ) -> None:
        #: env -> its held result
        self.ready: dict[int, Held] = {}
        self._space = space
        self._info_format = info_format
        self._obs = obs
        self._ended = ended
        self._final_in_block = final_in_block
        self._rewards = batch.rewards
        self._terminations = batch.terminations
        self._truncations = batch.truncations
        self._final_obs_rows = batch.final_obs_rows
        slots = batch.obs_slots
        self._obs_split = batch.obs_split
        #: observations entirely in the block
        self._obs_shared = batch.observations is not None and self._obs_split is None
        # The front writes observation slot 0 (the block's own batch) while envs are in
        # flight (``FrontHooks.enter``): the rows results are read from.
        self._observations = slots.batches[0] if slots is not None else batch.observations
        self._obs_fixed = slots.leaves[0] if slots is not None else batch.obs_leaves
        self._mergers: dict[int, InfoMerger] = {}

    def drop_views(self) -> None:
        """Drop the references to the batch arrays (so that a shared block can unmap)."""
        for name in (
            "_rewards",
            "_terminations",
            "_truncations",
            "_final_obs_rows",
            "_observations",
            "_obs_fixed",
        ):
            self.__dict__.pop(name, None)

    # --- hold ---------------------------------------------------------------------------

    def put(self, env: int, result: Held) -> None:
        """Hold ``result`` for ``env`` (one its unit did not answer: a restart's)."""
        self.ready[env] = result

    def hold(
        self, unit: Unit, envs: list[int], reset: bool, work: ChunkWork | None, outcome: Outcome
    ) -> None:
        """Hold each env's result of ``unit``'s answer ``outcome`` to its reset (``reset``),
        step or chunk (``work``) of ``envs``."""
        ready = self.ready
        status, value = outcome
        if status is Status.OK and self._obs_shared and (work is None or not work.all_obs):
            self._hold_in_rows(reset, work, envs)  # the usual answer
            return
        if status is Status.ERROR:  # the whole command failed: every env of it reports it
            for env in envs:
                ready[env] = _failed(work, value)
            return
        reply: UnitReply | None = value if status is Status.OK_PAYLOAD else None
        errors = reply_errors(unit, reply)
        by_value = obs_by_env(unit.lo, reply)
        if work is not None:
            for raised in errors.values():
                if isinstance(raised, EnvError):
                    # A unit runs both kinds of chunk as one command; the caller's was this.
                    raised.command = "send_chunk"
            got = self._chunk_results(unit, envs, work, reply, errors, by_value)
        else:
            events = events_by_env(unit.lo, reply)
            got = {
                env: (
                    _failed(None, errors[env])
                    if env in errors
                    else self.result(env, reset, events.get(env, []), by_value)
                )
                for env in envs
            }
        for env, result in got.items():
            if work is not None and result.error is None:
                self._ended.answered(env, result.ended)
            ready[env] = result

    def _hold_in_rows(self, reset: bool, work: ChunkWork | None, envs: list[int]) -> None:
        ready = self.ready
        if work is not None:
            if self._ended.tracked:
                _, terms, truncs, _ = work.views.batch(work.chunk)
                steps = work.views.steps
                for env in envs:
                    ended = ended_at_last(terms[env], truncs[env], int(steps[env]))
                    self._ended.answered(env, ended)
            held = InRows(False, work)
            for env in envs:
                ready[env] = held
            return
        if reset:
            for env in envs:
                ready[env] = RESET_IN_ROWS
            return
        tracked = self._ended.tracked
        final_in_block = self._final_in_block
        for env in envs:
            if tracked or final_in_block:
                ended = bool(self._terminations[env] or self._truncations[env])
                if ended and final_in_block:  # its implicit final-obs event is built now
                    ready[env] = self.result(env, False, [], {})
                    continue
                self._ended.answered(env, ended)
            ready[env] = STEP_IN_ROWS

    def _chunk_results(
        self,
        unit: Unit,
        envs: Sequence[int],
        work: ChunkWork,
        reply: UnitReply | None,
        errors: dict[int, BaseException],
        by_value: dict[int, Any],
    ) -> dict[int, EnvResult]:
        """``unit``'s answer ``reply`` to its chunk command for ``envs``, per env, copied out
        of the chunk arrays (or of the arrays a unit that keeps no block rows, Ray's, answers
        with, rows in ``envs``' order)."""
        k = work.chunk
        space = self._space
        events: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        sub_obs: dict[int, list[Any]] = {}
        if reply is not None:
            for local, sub, info in reply.infos or ():
                events.setdefault(unit.lo + local, []).append((sub, info))
            for local, seen in reply.sub_obs or ():
                sub_obs[unit.lo + local] = seen
        arrays = None if reply is None else reply.arrays
        obs_rows = None if arrays is not None else work.views.batch(k)[3]
        results: dict[int, EnvResult] = {}
        for pos, env in enumerate(envs):
            error = errors.get(env)
            if error is not None:
                results[env] = _failed(work, error)
                continue
            ob = None if arrays is None else arrays[4]
            if ob is not None:
                obs = copy_row(ob, pos)
            elif not work.all_obs:
                obs = self.last_obs(env, by_value)
            elif obs_rows is not None:
                obs = copy_row(obs_rows, env)
            else:  # every sub-step's observation came by value
                obs = sub_step_obs(space, sub_obs[env], k)
            if arrays is None:
                results[env] = copied_chunk(work, env, obs, events.get(env, []))
                continue
            r, te, tr, st, _ = arrays
            results[env] = EnvResult(
                obs,
                np.array(r[pos], dtype=np.float64),
                np.array(te[pos], dtype=np.bool_),
                np.array(tr[pos], dtype=np.bool_),
                events.get(env, []),
                shape=work.shape,
                steps=int(st[pos]),
            )
        return results

    # --- copy out -----------------------------------------------------------------------

    def materialise(self, envs: Iterable[int]) -> None:
        """Copy the held in-rows results of ``envs`` out of the rows (before a restart
        rewrites them)."""
        ready = self.ready
        for env in envs:
            held = ready.get(env)
            if type(held) is InRows:
                ready[env] = self._copied(held, env)

    def release_chunk_rows(self, shape: ChunkShape) -> None:
        """Copy out the held in-rows chunk results of another shape than ``shape``: a chunk
        of that shape is about to run in arrays reshaped or replaced for it."""
        ready = self.ready
        for env, held in ready.items():
            if type(held) is InRows and held.work is not None and held.shape != shape:
                ready[env] = self._copied(held, env)

    def _copied(self, held: InRows, env: int) -> EnvResult:
        if held.work is None:
            return self.result(env, held.reset, [], {})
        return copied_chunk(held.work, env, copy_row(self._observations, env), [])

    def last_obs(self, env: int, by_value: dict[int, Any]) -> Any:
        """Env ``env``'s observation, copied out of the batch arrays or (kept first) out of
        the reply's by-value ones ``by_value`` (global env -> obs)."""
        if self._obs_shared:
            return copy_row(self._observations, env)
        if env in by_value:
            self._obs.keep(env, deepcopy(by_value[env]))
        obs = self._obs.env_obs[env]
        split = self._obs_split
        if split is not None:  # obs: its other leaves; the fixed-size ones are in the rows
            fixed = self._obs_fixed
            assert fixed is not None
            obs = split.build([leaf[env, ...].copy() for leaf in fixed], obs)
        return obs

    def result(
        self, env: int, reset: bool, events: list[dict[str, Any]], by_value: dict[int, Any]
    ) -> EnvResult:
        """Env ``env``'s result of its reset (``reset``) or step, read from the batch arrays,
        with its info ``events`` and the reply's by-value observations ``by_value``."""
        obs = self.last_obs(env, by_value)
        if reset:
            return EnvResult(obs, 0.0, False, False, [(0, info) for info in events])
        terminated = bool(self._terminations[env])
        truncated = bool(self._truncations[env])
        self._ended.answered(env, terminated or truncated)
        if (terminated or truncated) and self._final_in_block:
            rows = self._final_obs_rows
            assert rows is not None
            with_final_event(events, rows, env)
        reward = float(self._rewards[env])
        return EnvResult(obs, reward, terminated, truncated, [(0, info) for info in events])

    # --- take ---------------------------------------------------------------------------

    def take(
        self, ids: Sequence[int], env_ids: np.ndarray
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Hand out the held results of ``ids`` (of one shape; ``env_ids`` as an array) as one
        batch, the infos naming each row's ``env_id``.

        Raises:
            BaseException: the first of them that holds an error (that one is handed out, the
                others stay held).
        """
        ready = self.ready
        for env in ids:
            held = ready[env]
            if type(held) is EnvResult and held.error is not None:
                del ready[env]
                raise held.error
        results = [ready.pop(env) for env in ids]
        n = len(results)
        shape = results[0].shape if n else None
        in_rows = next((h for h in results if type(h) is InRows), None)
        if in_rows is not None:  # the rows, one index per array; the copies written over
            obs, rewards, terms, truncs, steps = self._rows(in_rows, env_ids)
        else:  # every result copied out (observations by value, or none left in its rows)
            obs, rewards, terms, truncs, steps = self._empty(shape, results)
        events: list[tuple[int, int, dict[str, Any]]] = []
        restarted: list[int] = []
        for row, held in enumerate(results):
            if type(held) is InRows:
                if held.reset:  # a reset's reward and flags
                    rewards[row] = 0.0
                    terms[row] = truncs[row] = False
                continue
            assert type(held) is EnvResult
            rewards[row], terms[row], truncs[row] = held.reward, held.terminated, held.truncated
            if steps is not None:
                steps[row] = held.steps
            if in_rows is not None:
                for leaf, value in zip(nest_leaves(obs), nest_leaves(held.obs)):
                    leaf[row] = value
            events += [(row, sub, info) for sub, info in held.events]
            if held.restarted:
                restarted.append(row)
        infos = self._infos(shape, events, restarted, n, steps)
        if self._info_format == "list":
            for row, info in enumerate(infos):
                info["env_id"] = int(env_ids[row])
        else:
            infos["env_id"] = env_ids
        return obs, rewards, terms, truncs, infos

    def _rows(self, held: InRows, env_ids: np.ndarray) -> tuple[Any, ...]:
        """The rows ``env_ids`` of the arrays ``held`` is in, copied (a fancy index)."""
        obs = map_leaves(lambda leaf: leaf[env_ids], self._observations)
        work = held.work
        if work is None:
            rewards, terms, truncs = self._rewards, self._terminations, self._truncations
            steps = None
        else:
            rewards, terms, truncs, _ = work.views.batch(work.chunk)
            steps = work.views.steps[env_ids]
        return obs, rewards[env_ids], terms[env_ids], truncs[env_ids], steps

    def _empty(self, shape: ChunkShape | None, results: Sequence[Held]) -> tuple[Any, ...]:
        """Arrays for a batch of copied ``results`` of ``shape``, their observations in."""
        n = len(results)
        space = self._space
        if shape is not None and shape[1]:
            space = batch_space(space, shape[0])
        obs = create_empty_array(space, n=n, fn=np.zeros)
        if n:
            obs = concatenate(space, [r.obs for r in results], obs)  # type: ignore[union-attr, arg-type]
        rows = (n,) if shape is None else (n, shape[0])
        steps = None if shape is None else np.zeros(n, dtype=np.int64)
        return obs, np.zeros(rows), np.zeros(rows, np.bool_), np.zeros(rows, np.bool_), steps

    def _infos(
        self,
        shape: ChunkShape | None,
        events: list[tuple[int, int, dict[str, Any]]],
        restarted: list[int],
        n: int,
        steps: np.ndarray | None,
    ) -> Any:
        """A batch's infos merged from its rows' ``events`` (``(row, sub-step, info)``) as
        SyncVectorEnv would, a chunk's with the chunk axis (``merge_chunk_infos``)."""
        if shape is not None:
            assert steps is not None
            return merge_chunk_infos(self._info_format, events, n, shape[0], steps)
        merger = self._mergers.get(n)
        if merger is None:
            merger = self._mergers[n] = make_merger(self._info_format, n)
        by_row: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        for row, _, info in events:
            by_row.setdefault(row, []).append((0, info))
        return merger.merge(
            [(row, UnitReply(mine, None)) for row, mine in by_row.items()], restarted
        )


def copied_chunk(
    work: ChunkWork, env: int, obs: Any, events: list[tuple[int, dict[str, Any]]]
) -> EnvResult:
    """Env ``env``'s chunk result, its rewards, flags and progress count copied out of the
    chunk arrays, with its observation ``obs`` and info ``events``."""
    rewards, terms, truncs, _ = work.views.batch(work.chunk)
    return EnvResult(
        obs,
        rewards[env].copy(),
        terms[env].copy(),
        truncs[env].copy(),
        events,
        shape=work.shape,
        steps=int(work.views.steps[env]),
    )


def _failed(work: ChunkWork | None, error: BaseException) -> EnvResult:
    if work is None:
        return EnvResult(None, 0.0, False, False, error=error)
    k = work.chunk
    zeros = np.zeros(k, dtype=np.bool_)
    return EnvResult(None, np.zeros(k), zeros, zeros.copy(), error=error, shape=work.shape, steps=0)


def restarted_chunk(
    work: ChunkWork, env: int, reset: EnvResult, space: Space[Any], lost: bool
) -> EnvResult:
    """Env ``env``'s chunk when its unit was rebuilt: the sub-steps before the one it was lost
    at keep what the unit wrote (``lost``: it was running; else it had not started, and is
    lost at sub-step 0), and that sub-step is truncated with the replacement's reset
    (``reset``: its observation and events) and ``worker_restarted``."""
    k = work.chunk
    views = work.views
    all_rewards, all_terms, all_truncs, obs_rows = views.batch(k)
    rewards = all_rewards[env].copy()
    terms = all_terms[env].copy()
    truncs = all_truncs[env].copy()
    # The progress count the unit wrote after each sub-step (zeroed as the chunk was sent;
    # a unit that answers with its arrays, Ray's, writes none: lost at sub-step 0).
    j = cut_short(rewards, terms, truncs, int(views.steps[env]) if lost else 0)
    events = [(j, info) for _, info in reset.events]
    events.append((j, {"worker_restarted": True}))
    obs = reset.obs
    if work.all_obs:
        # the sub-steps before the loss as the unit wrote them (where the block has the rows;
        # by value they were lost with it), then the reset's observation
        mine = copy_row(obs_rows, env) if obs_rows is not None else None
        seen = [copy_row(mine, s) for s in range(j)] if mine is not None else []
        obs = sub_step_obs(space, [*seen, obs], k)
    return EnvResult(obs, rewards, terms, truncs, events, shape=work.shape, steps=j + 1)
