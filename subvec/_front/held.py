"""The results the asynchronous engine holds: each env's, from its unit's answer until a
``recv`` returns it, and the batch a ``recv`` returns of them.

    hold      a unit's answer, per env: :data:`STEP_IN_BLOCK` / :data:`RESET_IN_BLOCK` (a
              chunk's :class:`ChunkInBlock`) where the result is all in the env's rows of the
              batch (and chunk) arrays: a plain OK; else an :class:`EnvResult` (a chunk's
              :class:`ChunkEnvResult`) copied out at once
    take      the held results of some envs as one batch, each handed out (or the first's
              error raised)

:class:`HeldResults` holds the batch arrays it reads and no reference to the engine or the
front.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium import Space

from subvec._backend import Outcome, Unit
from subvec._batch import BatchViews
from subvec._commands import Status, UnitReply
from subvec._compat import AutoresetMode
from subvec._front.async_chunks import (
    ChunkEnvResult,
    ChunkInBlock,
    ChunkWork,
    chunk_batch,
    chunk_batch_in_block,
    chunk_results,
    copied_chunk,
    ended_at_last,
)
from subvec._front.ended import EndedEnvs
from subvec._front.merge import InfoMerger, make_merger
from subvec._front.observations import ObservationBatch
from subvec._front.results import events_by_env, obs_by_env, reply_errors, with_final_event
from subvec._front.step_results import (
    RESET_IN_BLOCK,
    STEP_IN_BLOCK,
    EnvResult,
    InBlock,
    batch_of,
    copy_row,
    take_rows,
)

__all__ = ["Held", "HeldResults", "shape_of"]

#: one env's held result
Held = EnvResult | InBlock | ChunkEnvResult | ChunkInBlock


def shape_of(held: Held) -> tuple[int, bool] | None:
    """A held result's shape: None for a step's or a reset's, ``(K, all_obs)`` for a chunk's."""
    return held.shape if type(held) is ChunkEnvResult or type(held) is ChunkInBlock else None


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
        autoreset_mode, info_format: the front's settings.
    """

    def __init__(
        self,
        *,
        batch: BatchViews,
        final_in_block: bool,
        obs: ObservationBatch,
        ended: EndedEnvs,
        space: Space[Any],
        autoreset_mode: AutoresetMode,
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

    def put(self, env: int, result: Held) -> None:
        """Hold ``result`` for ``env`` (one its unit did not answer: a restart's)."""
        self.ready[env] = result

    def hold(
        self, unit: Unit, envs: list[int], reset: bool, work: ChunkWork | None, outcome: Outcome
    ) -> None:
        """Hold each env's result of ``unit``'s answer ``outcome`` to its reset (``reset``),
        step or chunk (``work``) of ``envs``, copied out of the batch arrays."""
        ready = self.ready
        if work is not None:
            if outcome[0] is Status.OK and self._obs_shared and not work.all_obs:
                self._hold_chunk_in_block(work, envs)
                return
            got = chunk_results(unit, envs, work, outcome, self._space, self.last_obs)
            for env, result in got.items():
                if result.error is None:
                    self._ended.answered(env, result.ended)
            ready.update(got)
            return
        status, value = outcome
        if status is Status.OK and self._obs_shared:  # the usual answer: all in the rows
            self._hold_in_block(reset, envs)
            return
        if status is Status.ERROR:  # the whole command failed: every env of it reports it
            for env in envs:
                ready[env] = EnvResult(None, 0.0, False, False, error=value)
            return
        reply: UnitReply | None = value if status is Status.OK_PAYLOAD else None
        events = events_by_env(unit.lo, reply)
        errors = reply_errors(unit, reply)
        by_value = obs_by_env(unit.lo, reply)
        for env in envs:
            error = errors.get(env)
            if error is not None:
                ready[env] = EnvResult(None, 0.0, False, False, error=error)
                continue
            ready[env] = self.result(env, reset, events.get(env, []), by_value)

    def _hold_in_block(self, reset: bool, envs: list[int]) -> None:
        ready = self.ready
        if reset:
            for env in envs:
                ready[env] = RESET_IN_BLOCK
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
            ready[env] = STEP_IN_BLOCK

    def _hold_chunk_in_block(self, work: ChunkWork, envs: list[int]) -> None:
        if self._ended.tracked:
            _, terms, truncs, _ = work.views.batch(work.chunk)
            steps = work.views.steps
            for env in envs:
                self._ended.answered(env, ended_at_last(terms[env], truncs[env], int(steps[env])))
        held = ChunkInBlock(work)
        ready = self.ready
        for env in envs:
            ready[env] = held

    def materialise(self, envs: Iterable[int]) -> None:
        """Copy the held in-block results of ``envs`` out of the rows (before a restart
        rewrites them)."""
        ready = self.ready
        for env in envs:
            held = ready.get(env)
            if isinstance(held, InBlock):
                ready[env] = self.result(env, held.reset, [], {})
            elif type(held) is ChunkInBlock:
                ready[env] = self._copied_chunk(held, env)

    def release_chunk_rows(self, shape: tuple[int, bool]) -> None:
        """Copy out the held in-block chunk results of another shape than ``shape``: a chunk
        of that shape is about to run in arrays reshaped or replaced for it."""
        ready = self.ready
        for env, held in ready.items():
            if type(held) is ChunkInBlock and held.shape != shape:
                ready[env] = self._copied_chunk(held, env)

    def _copied_chunk(self, held: ChunkInBlock, env: int) -> ChunkEnvResult:
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
            return EnvResult(obs, 0.0, False, False, events)
        terminated = bool(self._terminations[env])
        truncated = bool(self._truncations[env])
        self._ended.answered(env, terminated or truncated)
        if (terminated or truncated) and self._final_in_block:
            rows = self._final_obs_rows
            assert rows is not None
            with_final_event(events, rows, env)
        reward = float(self._rewards[env])
        return EnvResult(obs, reward, terminated, truncated, events)

    def take(
        self, ids: Sequence[int], env_ids: np.ndarray
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Hand out the held results of ``ids`` (``env_ids`` as an array) as one batch, the
        infos naming each row's ``env_id``.

        Raises:
            BaseException: the first of them that holds an error (that one is handed out, the
                others stay held).
        """
        ready = self.ready
        for env in ids:
            held = ready[env]
            if isinstance(held, (EnvResult, ChunkEnvResult)) and held.error is not None:
                del ready[env]
                raise held.error
        k = len(ids)
        merger = self._mergers.get(k)
        if merger is None:
            merger = self._mergers[k] = make_merger(self._info_format, k)
        first = ready[ids[0]] if k else None
        if type(first) is ChunkInBlock and all(type(ready[env]) is ChunkInBlock for env in ids):
            # the usual batch of chunks, all in their rows (of one shape, so of one arrays)
            for env in ids:
                del ready[env]
            obs, rewards, terminations, truncations, infos = chunk_batch_in_block(
                first.work, env_ids, self._observations, self._info_format
            )
        elif first is not None and shape_of(first) is not None:  # chunks of one shape
            chunks = []
            for env in ids:
                held = ready.pop(env)
                chunks.append(self._copied_chunk(held, env) if type(held) is ChunkInBlock else held)
            obs, rewards, terminations, truncations, infos = chunk_batch(
                self._space,
                chunks,  # type: ignore[arg-type]
                self._info_format,
            )
        elif k and all(isinstance(ready[env], InBlock) for env in ids):
            # each handed out (popped), the rows of the resets among them
            resets = [row for row, env in enumerate(ids) if ready.pop(env) is RESET_IN_BLOCK]
            obs = take_rows(self._observations, env_ids)
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
                if isinstance(held, InBlock):
                    held = self.result(env, held.reset, [], {})
                assert isinstance(held, EnvResult)
                results.append(held)
            obs, rewards, terminations, truncations, infos = batch_of(self._space, results, merger)
        if self._info_format == "list":
            for row, info in enumerate(infos):
                info["env_id"] = int(env_ids[row])
        else:
            infos["env_id"] = env_ids
        return obs, rewards, terminations, truncations, infos
