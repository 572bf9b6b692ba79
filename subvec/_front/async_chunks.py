"""Action chunks in asynchronous stepping: ``send_chunk`` on any set of envs, results through
``recv``.

    ChunkWork         one ``send_chunk`` call: K, ``stop_on_done``, ``all_obs``, the chunk
                      arrays it runs in, and its actions (in those arrays' rows, or by value);
                      each unit of its envs gets one STEP_ENVS of K sub-steps for them
    chunk_results     a unit's answer to such a command, as one :class:`ChunkEnvResult` per
                      env, copied out of the chunk arrays at once
    ChunkInBlock      a held chunk result that is all in its env's rows (a plain OK): left
                      there, as a step's :data:`STEP_IN_BLOCK` is, until ``recv`` gathers it
                      or a chunk of another shape is about to reshape or replace the arrays
                      (then :func:`copied_chunk` copies it out)
    restarted_chunk   an env whose unit was rebuilt mid-chunk: the sub-steps before the loss,
                      then truncated with ``worker_restarted``, as ``step_chunk`` reports it
    chunk_batch       the batch ``recv`` returns for envs that ran chunks of the same shape
                      (:func:`chunk_batch_in_block` where every one is still in its rows)

Per env, the sub-steps are exactly those of ``step_chunk`` (``EnvSlab.step_chunk`` runs them),
so a chunk sent to some envs while others are in flight gives each env the trajectory it would
have had in lock-step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import Space
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from subvec._backend import Outcome, Unit
from subvec._batch import ChunkBlock
from subvec._commands import Status, StepEnvsPayload, UnitReply
from subvec._front.merge import merge_chunk_infos
from subvec._front.results import obs_by_env, reply_errors
from subvec._front.step_results import EnvResult, copy_row, take_rows
from subvec.errors import EnvError

__all__ = [
    "ChunkEnvResult",
    "ChunkInBlock",
    "ChunkWork",
    "chunk_batch",
    "chunk_batch_in_block",
    "chunk_results",
    "copied_chunk",
    "describe_shapes",
    "ended_at_last",
    "restarted_chunk",
]

#: a chunk result's shape: ``(K, all_obs)``; results of one shape batch together
ChunkShape = tuple[int, bool]


class ChunkWork:
    """One ``send_chunk`` call: its settings, the chunk arrays its units write, and its
    actions (None: in those arrays' action rows; else the checked leaves, ``(len(ids), K,
    ...)`` each, in the caller's dtypes, one row per env of ``ids`` in that order)."""

    __slots__ = ("all_obs", "chunk", "leaves", "rows_of", "stop_on_done", "views")

    def __init__(
        self,
        chunk: int,
        stop_on_done: bool,
        all_obs: bool,
        views: ChunkBlock,
        ids: Sequence[int],
        leaves: tuple[np.ndarray, ...] | None,
    ) -> None:
        self.chunk = chunk
        self.stop_on_done = stop_on_done
        self.all_obs = all_obs
        self.views = views
        self.leaves = leaves
        #: each env's row in ``leaves``
        self.rows_of = {int(env): row for row, env in enumerate(ids)}

    @property
    def shape(self) -> ChunkShape:
        return self.chunk, self.all_obs

    def payload(self, unit: Unit, envs: Sequence[int]) -> StepEnvsPayload:
        """The command of ``unit`` for its ``envs`` (global, ascending) of this chunk: the
        actions by value are the unit's rows of each leaf (rows of envs not run: zeros)."""
        local: Sequence[int] = [e - unit.lo for e in envs]
        if local[-1] == len(local) - 1:  # the unit's first envs: the few bytes of a chunk's
            local = range(len(local))  # own form, not a pickle (``_process.wire``)
        actions: list[np.ndarray] | None = None
        if self.leaves is not None:
            size = unit.hi - unit.lo
            rows = [self.rows_of[e] for e in envs]
            actions = []
            for leaf in self.leaves:
                mine = np.zeros((size, *leaf.shape[1:]), dtype=leaf.dtype)
                mine[local] = leaf[rows]
                actions.append(mine)
        return StepEnvsPayload(
            local, actions, self.chunk, self.stop_on_done, self.all_obs, self.views.spec
        )


@dataclass
class ChunkEnvResult:
    """One env's chunk result, copied out when its unit answered."""

    shape: ChunkShape
    #: the observation after its last executed sub-step; with ``all_obs``, every sub-step's
    #: (a nest of ``(K, ...)`` arrays, rows past an early stop repeating the last)
    obs: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    steps: int
    #: ``(sub-step, info)`` in order
    events: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def ended(self) -> bool:
        """Whether its last executed sub-step ended its episode."""
        return ended_at_last(self.terminations, self.truncations, self.steps)


def ended_at_last(terminations: np.ndarray, truncations: np.ndarray, steps: int) -> bool:
    """Whether the last executed sub-step of a chunk row (its ``(K,)`` flags, ``steps``
    executed; every env executes at least one) ended the episode."""
    last = max(steps, 1) - 1
    return bool(terminations[last] or truncations[last])


class ChunkInBlock:
    """A held chunk result that is all in its env's rows: the chunk arrays' rewards, flags
    and progress count, and the observation batch's row (a plain OK of a chunk without
    ``all_obs``). An env is sent nothing new before ``recv`` returns it, and a chunk of the
    same shape runs in the same arrays (other rows), so the rows stay as the unit wrote them;
    a chunk of another shape would reshape or replace the arrays, so the held results leave
    them first (``HeldResults.release_chunk_rows``)."""

    __slots__ = ("work",)

    def __init__(self, work: ChunkWork) -> None:
        self.work = work

    @property
    def shape(self) -> ChunkShape:
        return self.work.shape


def chunk_results(
    unit: Unit,
    envs: Sequence[int],
    work: ChunkWork,
    outcome: Outcome,
    space: Space[Any],
    last_obs: Callable[[int, dict[int, Any]], Any],
) -> dict[int, ChunkEnvResult]:
    """``unit``'s answer to its chunk command for ``envs``, per env.

    Args:
        unit, envs: the unit and the envs (global) it ran the chunk on.
        work: the chunk.
        outcome: the unit's answer.
        space: the single observation space.
        last_obs: ``last_obs(env, by_value)``: the env's observation after its last
            sub-step, from the batch arrays or the reply's by-value ones (global env ->
            obs), as an asynchronous step's result reads it.
    """
    status, value = outcome
    k = work.chunk
    if status is Status.ERROR:  # the whole command failed: every env of it reports it
        return {env: _failed(work, value) for env in envs}
    reply: UnitReply | None = value if status is Status.OK_PAYLOAD else None
    errors = reply_errors(unit, reply)
    for raised in errors.values():
        if isinstance(raised, EnvError):
            # A unit runs both kinds of chunk as one command; the caller's was this one.
            raised.command = "send_chunk"
    events: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    sub_obs: dict[int, list[Any]] = {}
    by_value = obs_by_env(unit.lo, reply)
    if reply is not None:
        for local, sub, info in reply.infos or ():
            events.setdefault(unit.lo + local, []).append((sub, info))
        for local, seen in reply.sub_obs or ():
            sub_obs[unit.lo + local] = seen
    arrays = None if reply is None else reply.arrays
    obs_rows = None if arrays is not None else work.views.batch(k)[3]
    results: dict[int, ChunkEnvResult] = {}
    for pos, env in enumerate(envs):
        error = errors.get(env)
        if error is not None:
            results[env] = _failed(work, error)
            continue
        # a unit that keeps no block rows (Ray) answers with its arrays, rows in envs' order
        ob = None if arrays is None else arrays[4]
        if ob is not None:
            obs = copy_row(ob, pos)
        elif not work.all_obs:
            obs = last_obs(env, by_value)
        elif obs_rows is not None:
            obs = copy_row(obs_rows, env)
        else:  # every sub-step's observation came by value
            seen = sub_obs[env]
            seen = seen + [seen[-1]] * (k - len(seen))
            obs = concatenate(space, seen, create_empty_array(space, n=k))  # type: ignore[arg-type]
        if arrays is None:
            results[env] = copied_chunk(work, env, obs, events.get(env, []))
            continue
        r, te, tr, st, _ = arrays
        results[env] = ChunkEnvResult(
            work.shape,
            obs,
            np.array(r[pos], dtype=np.float64),
            np.array(te[pos], dtype=np.bool_),
            np.array(tr[pos], dtype=np.bool_),
            int(st[pos]),
            events.get(env, []),
        )
    return results


def copied_chunk(
    work: ChunkWork, env: int, obs: Any, events: list[tuple[int, dict[str, Any]]]
) -> ChunkEnvResult:
    """Env ``env``'s chunk result, its rewards, flags and progress count copied out of the
    chunk arrays, with its observation ``obs`` and info ``events``."""
    rewards, terms, truncs, _ = work.views.batch(work.chunk)
    return ChunkEnvResult(
        work.shape,
        obs,
        rewards[env].copy(),
        terms[env].copy(),
        truncs[env].copy(),
        int(work.views.steps[env]),
        events,
    )


def _failed(work: ChunkWork, error: BaseException) -> ChunkEnvResult:
    k = work.chunk
    zeros = np.zeros(k, dtype=np.bool_)
    return ChunkEnvResult(work.shape, None, np.zeros(k), zeros, zeros.copy(), 0, [], error=error)


def restarted_chunk(
    work: ChunkWork, env: int, reset: EnvResult, space: Space[Any], lost: bool
) -> ChunkEnvResult:
    """Env ``env``'s chunk when its unit was rebuilt: the sub-steps before the one it was lost
    at keep what the unit wrote (``lost``: it was running; else it had not started, and is
    lost at sub-step 0), and that sub-step is truncated with the replacement's reset
    (``reset``: its observation and events) and ``worker_restarted``."""
    k = work.chunk
    rewards = np.zeros(k, dtype=np.float64)
    terms = np.zeros(k, dtype=np.bool_)
    truncs = np.zeros(k, dtype=np.bool_)
    views = work.views
    # The progress count the unit wrote after each sub-step (zeroed as the chunk was sent;
    # a unit that answers with its arrays, Ray's, writes none: lost at sub-step 0).
    j = min(int(views.steps[env]), k - 1) if lost else 0
    all_rewards, all_terms, all_truncs, obs_rows = views.batch(k)
    rewards[:j] = all_rewards[env, :j]
    terms[:j] = all_terms[env, :j]
    truncs[:j] = all_truncs[env, :j]
    truncs[j] = True
    events = [(j, info) for info in reset.events]
    events.append((j, {"worker_restarted": True}))
    obs = reset.obs
    if work.all_obs:
        # the sub-steps before the loss as the unit wrote them (where the block has the rows;
        # by value they were lost with it), then the reset's observation
        mine = copy_row(obs_rows, env) if obs_rows is not None else None
        seen = [copy_row(mine, s) for s in range(j)] if mine is not None else []
        seen += [obs] * (k - len(seen))
        obs = concatenate(space, seen, create_empty_array(space, n=k))  # type: ignore[arg-type]
    return ChunkEnvResult(work.shape, obs, rewards, terms, truncs, j + 1, events)


def chunk_batch(
    space: Space[Any], results: Sequence[ChunkEnvResult], info_format: str
) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
    """The batch of chunk ``results`` of one shape, in their order, as ``step_chunk``'s:
    rewards and flags ``(n, K)``, observations ``(n, ...)`` (``all_obs``: ``(n, K, ...)``),
    infos with the chunk axis and ``chunk_steps``."""
    k, all_obs = results[0].shape
    n = len(results)
    row_space = batch_space(space, k) if all_obs else space
    out = create_empty_array(row_space, n=n, fn=np.zeros)
    obs = concatenate(row_space, [r.obs for r in results], out)  # type: ignore[arg-type]
    rewards = np.stack([r.rewards for r in results])
    terms = np.stack([r.terminations for r in results])
    truncs = np.stack([r.truncations for r in results])
    steps = np.array([r.steps for r in results], dtype=np.int64)
    events = [(row, sub, info) for row, r in enumerate(results) for sub, info in r.events]
    infos = merge_chunk_infos(info_format, events, n, k, steps)
    return obs, rewards, terms, truncs, infos


def chunk_batch_in_block(
    work: ChunkWork, env_ids: np.ndarray, observations: Any, info_format: str
) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
    """:func:`chunk_batch` of envs whose results are all in their rows (each
    :class:`ChunkInBlock` of chunks of ``work``'s arrays and shape): one fancy index per
    array, the observations from ``observations``, the observation batch's rows."""
    rewards, terms, truncs, _ = work.views.batch(work.chunk)
    steps = work.views.steps[env_ids]
    infos = merge_chunk_infos(info_format, (), len(env_ids), work.chunk, steps)
    return (
        take_rows(observations, env_ids),
        rewards[env_ids],
        terms[env_ids],
        truncs[env_ids],
        infos,
    )


def describe_shapes(shapes: dict[ChunkShape | None, list[int]]) -> str:
    """Which envs hold results of which shape (None: a step's), for an error message."""
    return "; ".join(
        f"envs {envs}: "
        + (
            "a step's"
            if shape is None
            else f"a chunk of K={shape[0]}" + (" with all_obs" if shape[1] else "")
        )
        for shape, envs in shapes.items()
    )
