"""Action chunks on the front: ``step_chunk``, over every backend.

    step_chunk(actions)  check the batch of chunks (nothing is sent if it is wrong); a chunk
                         of one sub-step goes to the ``step()`` it stands for
                         room for the chunk's arrays (the backend's ``_batch.ChunkStore``:
                         the process backend's chunk block), zero their progress counts
                         (the usual chunk's load is kept for the next of its kind)
                         the core's step command to every unit: its envs, K sub-steps
                         (STEP_ENVS with substeps = K), stop_on_done, all_obs, the block
    collect              the front's one wait: failures and the failure policy as for a step
    results              each unit's events (env, sub-step, info), by-value observations and,
                         from a Ray actor, its arrays; envs a restart cut short come back
                         truncated with ``worker_restarted`` at the sub-step they were lost

The units run the sub-steps (``EnvSlab.step_chunk``): one command and one reply per unit per
chunk. The autoreset bookkeeping (DISABLED's refusal of ended envs) reads as after the
``step()`` calls the chunk stands for.

:class:`ChunkStepper` is a component of the front: it holds named references to the front's
hooks it calls (the state checks, the restart bookkeeping, the round trip, the observation
batch) and to the backend's chunk arrays, and none to the front itself.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium import Space
from gymnasium.vector.utils import batch_space, create_empty_array

from subvec import _chunk_actions, _spaces
from subvec._batch import ChunkBlock, ChunkStore
from subvec._commands import StepEnvsPayload, UnitReply
from subvec._compat import AutoresetMode
from subvec._front.async_chunks import ChunkWork, cut_short, sub_step_obs
from subvec._front.ended import EndedEnvs
from subvec._front.merge import Part, merge_chunk_infos, with_chunk_axis
from subvec._infos import as_events

__all__ = ["ChunkResults", "ChunkStepper", "PerUnit"]

ChunkResults = tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]
#: ``per_unit(unit)``: a unit's chunk command
PerUnit = Callable[[Any], StepEnvsPayload]


class ChunkStepper:
    """``step_chunk``'s work for :class:`subvec._front.front.VectorFront`, whose ``step_chunk``
    drives it: the front checks its state, sends and collects; this checks the batch, loads
    the chunk's arrays and builds the results. It holds the vector env's settings and the
    backend's chunk arrays, and no reference to the front (what a call needs of the front's
    state is handed to it).

    Args:
        num_envs, single_observation_space, single_action_space, autoreset_mode,
            info_format, copy: the vector env's.
        store: the backend's chunk arrays.
    """

    def __init__(
        self,
        num_envs: int,
        single_observation_space: Space[Any],
        single_action_space: Space[Any],
        autoreset_mode: AutoresetMode,
        info_format: str,
        copy: bool,
        store: ChunkStore,
    ) -> None:
        self.num_envs = num_envs
        self.single_observation_space = single_observation_space
        self.single_action_space = single_action_space
        self.autoreset_mode = autoreset_mode
        self.info_format = info_format
        self.copy = copy
        self.store = store
        #: the last chunk's load when it was the usual one, for the next of the same kind
        self._kept: _KeptLoad | None = None
        #: ``send_chunk``'s checks, by the number of envs sent
        self._checkers: dict[int, _chunk_actions.ChunkChecker] = {}

    def drop_views(self) -> None:
        """Forget the chunk arrays (the backend releases them as it closes)."""
        self._kept = None
        self.store.drop()

    def check(self, actions: Any, all_obs: bool) -> tuple[_chunk_actions.ChunkBatch | None, Any]:
        """The batch of chunks, checked (see the front's ``step_chunk`` for what it must be).

        Returns:
            ``(batch, None)`` for a chunk of K > 1 sub-steps; ``(None, actions)`` for a chunk
            of one, ``actions`` the batch of the ``step()`` it stands for.

        Raises:
            ValueError, TypeError: it is not chunks of the action space, or ``all_obs`` with
                observations that are not fixed-size.
        """
        checker = self._checker
        if (
            type(actions) is np.ndarray
            and actions.shape == checker.one_shape
            and actions.dtype == checker.dtype
            and not all_obs
        ):
            # The usual chunk of one sub-step: the checker's first case, without its batch
            # (a cheap env's K = 1 chunk costs what its step costs, and little more).
            return None, actions[:, 0]
        batch = checker(actions)
        self._check_all_obs(all_obs)
        if batch.chunk > 1:
            return batch, None
        leaves = batch.leaves
        if len(leaves) == 1 and self._one_leaf:
            return None, leaves[0][:, 0]
        return None, _spaces.build_views(self.single_action_space, (f[:, 0] for f in leaves))

    def _check_all_obs(self, all_obs: bool) -> None:
        if all_obs and not _spaces.is_shareable(self.single_observation_space):
            raise ValueError(
                "all_obs needs a fixed-size observation space (Box, Discrete, MultiDiscrete, "
                f"MultiBinary, or Dict/Tuple nests of them); the envs' is "
                f"{self.single_observation_space}"
            )

    def work(
        self,
        actions: Any,
        ids: np.ndarray,
        stop_on_done: bool,
        all_obs: bool,
        in_flight: ChunkWork | None,
        release: Callable[[tuple[int, bool]], None],
    ) -> ChunkWork:
        """``send_chunk``'s chunk for the envs ``ids``: checked, its actions stored where the
        units read them (the chunk arrays' rows of ``ids``, their progress counts zeroed).

        Args:
            actions: ``(len(ids), K, ...)`` per leaf.
            ids: the envs, in the batch's order.
            stop_on_done, all_obs: as ``step_chunk``.
            in_flight: a chunk in flight or queued (None: none): the new one runs in the
                same arrays, so it must have its K and ``all_obs``.
            release: ``release((K, all_obs))``, called before arrays for the chunk are
                chosen with none in flight: held results of another shape leave theirs.

        Raises:
            ValueError, TypeError: not chunks of the action space for ``len(ids)`` envs,
                ``all_obs`` with observations that are not fixed-size, or another K or
                ``all_obs`` than the chunks in flight.
        """
        k = len(ids)
        checker = self._checkers.get(k)
        if checker is None:
            checker = self._checkers[k] = _chunk_actions.ChunkChecker(self.single_action_space, k)
        batch = checker(actions)
        self._check_all_obs(all_obs)
        chunk = batch.chunk
        if in_flight is not None:
            if (in_flight.chunk, in_flight.all_obs) != (chunk, all_obs):
                raise ValueError(
                    f"send_chunk: chunks of K={in_flight.chunk} (all_obs={in_flight.all_obs}) "
                    f"are in flight and this one is K={chunk} (all_obs={all_obs}): chunks in "
                    "flight at once share their arrays, so K and all_obs; recv() those first"
                )
            views = in_flight.views
        else:
            release((chunk, all_obs))
            views = self.store.block_for(chunk, all_obs)
            if self._kept is not None and self._kept.views is not views:
                self._kept = None  # step_chunk's kept load names the arrays replaced
        leaves = batch.leaves
        views.steps[ids] = 0
        actions_in_block = views.action_space is not None and all(
            leaf.dtype == spec.dtype for leaf, spec in zip(leaves, self._leaves)
        )
        if actions_in_block:
            for target, leaf in zip(views.actions(chunk), leaves):
                target[ids] = leaf
        return ChunkWork(
            chunk, stop_on_done, all_obs, views, ids.tolist(), None if actions_in_block else leaves
        )

    def load(
        self, batch: _chunk_actions.ChunkBatch, stop_on_done: bool, all_obs: bool
    ) -> tuple[ChunkBlock, PerUnit, bool]:
        """Room for a chunk of ``batch.chunk`` sub-steps, its progress counts zeroed and its
        actions stored where the units read them.

        Returns:
            ``(views, per_unit, same)``: the chunk's arrays, each unit's command, and whether
            that command is the same for every unit of a size (the actions in the arrays).
        """
        chunk = batch.chunk
        leaves = batch.leaves
        kept = self._kept
        if (
            kept is not None
            and len(leaves) == 1
            and kept.key == (chunk, stop_on_done, all_obs, leaves[0].dtype, self.store)
        ):
            # The same kind of chunk as the last: the same arrays and commands.
            kept.steps.fill(0)
            np.copyto(kept.target, leaves[0])
            return kept.views, kept.per_unit, True
        # No array of the chunk block is kept while the store may replace it.
        self._kept = None
        views = self.store.block_for(chunk, all_obs)
        views.steps[:] = 0  # the progress counts: a unit lost mid-chunk leaves its own
        spec = views.spec
        actions_in_block = views.action_space is not None and (
            leaves[0].dtype == self._leaves[0].dtype
            if len(leaves) == 1
            else all(leaf.dtype == s.dtype for leaf, s in zip(leaves, self._leaves))
        )
        if actions_in_block:
            for target, leaf in zip(views.actions(chunk), leaves):
                np.copyto(target, leaf)
        # The core's step command, with K sub-steps of every env of the unit.
        made: dict[int, StepEnvsPayload] = {}

        def per_unit(unit: Any) -> StepEnvsPayload:
            size = unit.hi - unit.lo
            if actions_in_block:  # the same for every unit of this size
                found = made.get(size)
                if found is None:
                    found = made[size] = StepEnvsPayload(
                        range(size), None, chunk, stop_on_done, all_obs, spec
                    )
                return found
            rows = batch.rows(unit.lo, unit.hi).leaves
            return StepEnvsPayload(range(size), rows, chunk, stop_on_done, all_obs, spec)

        if actions_in_block and len(leaves) == 1:
            key = (chunk, stop_on_done, all_obs, leaves[0].dtype, self.store)
            self._kept = _KeptLoad(key, views, views.actions(chunk)[0], per_unit)
        return views, per_unit, actions_in_block

    def one_step(self, results: ChunkResults, all_obs: bool) -> ChunkResults:
        """A chunk of one sub-step's results: those of the ``step()`` it stood for (the
        actions :meth:`check` gave), given the chunk axis (views: a step's are fresh)."""
        obs, rewards, terms, truncs, infos = results
        if all_obs:
            obs = _spaces.map_leaves(lambda leaf: leaf[:, None], obs)
        if self.info_format == "list":
            infos = [{"chunk_steps": 1, "infos": [info]} for info in infos]
        else:
            if infos:
                infos = with_chunk_axis(infos, self.num_envs, 1)
            infos["chunk_steps"] = self._ones.copy()
        return obs, rewards[:, None], terms[:, None], truncs[:, None], infos

    @functools.cached_property
    def _leaves(self) -> list[_spaces.LeafSpec]:
        return _spaces.leaf_specs(self.single_action_space)

    @functools.cached_property
    def _one_leaf(self) -> bool:
        """Whether the action space is one array (not a Dict/Tuple nest)."""
        return not self._leaves[0].path

    @functools.cached_property
    def _rows(self) -> np.ndarray:
        return np.arange(self.num_envs)

    @functools.cached_property
    def _checker(self) -> _chunk_actions.ChunkChecker:
        return _chunk_actions.ChunkChecker(self.single_action_space, self.num_envs)

    @functools.cached_property
    def _ones(self) -> np.ndarray:
        return np.ones(self.num_envs, dtype=np.int64)

    # --- results ---------------------------------------------------------------------------

    def results(
        self,
        parts: Sequence[Part],
        views: ChunkBlock,
        chunk: int,
        all_obs: bool,
        *,
        observations: Any,
        observations_out: Callable[[Sequence[Part]], Any],
        restarted: np.ndarray | None,
        ended: EndedEnvs,
    ) -> ChunkResults:
        """The chunk's results out of its arrays and the units' parts.

        Args:
            parts: the units' answers that say something, in env order.
            views: the chunk's arrays.
            chunk: K.
            all_obs: as the front's ``step_chunk``.
            observations: the front's observation batch the units wrote (a unit answering
                with arrays has its rows copied in).
            observations_out: the front's observation batch out of parts, as a step's.
            restarted: the envs a restart cut short in this chunk (None: none).
            ended: the envs that ended and wait for a reset (DISABLED), told here.
        """
        n = self.num_envs
        rewards, terms, truncs, obs_rows = views.batch(chunk)
        steps = views.steps
        if not parts and restarted is None and not all_obs:
            # The usual chunk: every result in the blocks, nothing else said.
            if ended.tracked:
                self._ended(terms, truncs, steps, ended)
            infos = merge_chunk_infos(self.info_format, (), n, chunk, steps)
            obs = observations_out(parts)
            return obs, rewards.copy(), terms.copy(), truncs.copy(), infos
        events: list[tuple[int, int, dict[str, Any]]] = []
        #: the by-value observations, for the front's observation batch
        obs_parts: list[Part] = []
        sub_obs: dict[int, list[Any]] = {}
        arrays_obs: list[tuple[int, Any]] = []
        resets: dict[int, list[dict[str, Any]]] = {}
        for lo, data in parts:
            if restarted is None or not restarted[lo]:
                events += [(lo + i, k, info) for i, k, info in data.infos]
                for i, seen in data.sub_obs or ():
                    sub_obs[lo + i] = seen
                if data.arrays is not None:  # a unit that keeps no block rows (Ray)
                    r, te, tr, st, ob = data.arrays
                    hi = lo + len(st)
                    rewards[lo:hi], terms[lo:hi], truncs[lo:hi], steps[lo:hi] = r, te, tr, st
                    if ob is not None:
                        arrays_obs.append((lo, ob))
                obs_parts.append((lo, UnitReply(None, data.obs)))
            else:  # a restarted unit's answer: its reset's (events, by-value observations)
                for local, info in as_events(data.infos) if data.infos else ():
                    resets.setdefault(lo + local, []).append(info)
                obs_parts.append((lo, UnitReply(None, data.obs)))
        lost_at: dict[int, int] = {}
        for i in [] if restarted is None else np.flatnonzero(restarted).tolist():
            # The sub-step it was lost at: the sub-steps before it keep what the unit wrote.
            j = lost_at[i] = cut_short(rewards[i], terms[i], truncs[i], int(steps[i]))
            steps[i] = j + 1
            events += [(i, j, info) for info in resets.get(i, ())]
            events.append((i, j, {"worker_restarted": True}))
        events.sort(key=lambda e: (e[0], e[1]))  # env-major; stable within a sub-step
        if not all_obs:
            for lo, ob in arrays_obs:
                _assign_rows(observations, ob, lo)
            obs = observations_out(obs_parts)
        else:
            obs = self._all_obs_out(
                chunk, obs_rows, sub_obs, arrays_obs, obs_parts, lost_at, observations_out
            )
        if ended.tracked:
            self._ended(terms, truncs, steps, ended)
        infos = merge_chunk_infos(self.info_format, events, n, chunk, steps)
        return obs, rewards.copy(), terms.copy(), truncs.copy(), infos

    def _ended(
        self, terms: np.ndarray, truncs: np.ndarray, steps: np.ndarray, ended: EndedEnvs
    ) -> None:
        """DISABLED: the envs whose last executed sub-step ended their episode wait for a
        reset (every env executes at least one sub-step)."""
        last = steps - 1
        every = self._rows
        ended.stepped(terms[every, last], truncs[every, last])

    def _all_obs_out(
        self,
        chunk: int,
        obs_rows: Any,
        sub_obs: dict[int, list[Any]],
        arrays_obs: list[tuple[int, Any]],
        obs_parts: list[Part],
        lost_at: dict[int, int],
        observations_out: Callable[[Sequence[Part]], Any],
    ) -> Any:
        """Every sub-step's observations, ``(num_envs, K, ...)``: from the chunk block's
        rows, or put together from the units' by-value lists or arrays."""
        space = self.single_observation_space
        fresh = obs_rows is None
        if fresh:
            obs_rows = create_empty_array(batch_space(space, chunk), n=self.num_envs)
            for lo, ob in arrays_obs:
                _assign_rows(obs_rows, ob, lo)
            for i, seen in sub_obs.items():
                sub_step_obs(
                    space, seen, chunk, _spaces.map_leaves(operator.itemgetter(i), obs_rows)
                )
        if lost_at:
            # Their rows from the sub-step they were lost at: the reset's observation.
            current = observations_out(obs_parts)
            for i, j in lost_at.items():
                _fill_from(obs_rows, current, i, j)
        if fresh:
            return obs_rows
        return deepcopy(obs_rows) if self.copy else obs_rows


class _KeptLoad:
    """The load of a usual chunk (one action leaf, stored in the chunk block), kept for the
    next chunk of the same K, ``stop_on_done``, ``all_obs``, actions' dtype and store: the
    store hands out the same arrays for it, and the units get the same commands (the backend
    may keep their bytes: ``per_unit`` gives the same objects)."""

    __slots__ = ("key", "per_unit", "steps", "target", "views")

    def __init__(
        self, key: tuple[Any, ...], views: ChunkBlock, target: np.ndarray, per_unit: PerUnit
    ) -> None:
        self.key = key
        self.views = views
        self.steps = views.steps
        self.target = target
        self.per_unit = per_unit


def _assign_rows(batch: Any, rows: Any, lo: int) -> None:
    """``batch[lo:lo + len(rows)] = rows``, leaf by leaf."""
    for leaf, part in zip(_spaces.nest_leaves(batch), _spaces.nest_leaves(rows)):
        leaf[lo : lo + len(part)] = part


def _fill_from(obs_rows: Any, current: Any, i: int, j: int) -> None:
    """Rows ``j..`` of env ``i`` in ``obs_rows`` (``(n, K, ...)``) set to its observation in
    ``current`` (``(n, ...)``)."""
    for leaf, now in zip(_spaces.nest_leaves(obs_rows), _spaces.nest_leaves(current)):
        leaf[i, j:] = now[i]
