"""Action chunks on the front: ``step_chunk``, over every backend.

    step_chunk(actions)  check the batch of chunks (nothing is sent if it is wrong)
                         make room in the chunk block (``_chunks``), zero its progress counts
                         the core's step command to every unit: its envs, K sub-steps
                         (STEP_ENVS with substeps = K), stop_on_done, all_obs, the block
    collect              the front's one wait: failures and the failure policy as for a step
    results              each unit's events (env, sub-step, info), by-value observations and,
                         from a Ray actor, its arrays; envs a restart cut short come back
                         truncated with ``worker_restarted`` at the sub-step they were lost

The units run the sub-steps (``EnvSlab.step_chunk``): one command and one reply per unit per
chunk. The autoreset bookkeeping (DISABLED's refusal of ended envs) reads as after the
``step()`` calls the chunk stands for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import Space
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array
from gymnasium.vector.vector_env import AutoresetMode

from subvec import _spaces
from subvec._chunks import ChunkViews, capacity_for, plan_chunk_block
from subvec._commands import ChunkBlockSpec, Command, StepEnvsPayload, UnitReply
from subvec._infos import as_events
from subvec._merge import Part, merge_chunk_infos, with_chunk_axis
from subvec._shm import BlockLayout
from subvec._state import _State

__all__ = ["ChunkStepping"]

ChunkResults = tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]


class ChunkStepping:
    """``step_chunk`` for :class:`subvec._front.VectorFront` (a mixin: it uses the front's
    units, sending and collecting, batch arrays and state)."""

    # The front's, declared for the type checker.
    num_envs: int
    autoreset_mode: AutoresetMode
    info_format: str
    copy: bool
    single_observation_space: Space[Any]
    single_action_space: Space[Any]
    _state: Any
    _observations: Any
    _obs_shared: bool
    _obs_split: Any
    _rewards: np.ndarray
    _terminations: np.ndarray
    _truncations: np.ndarray
    _needs_reset: np.ndarray
    _restarted: np.ndarray
    _any_restarted: bool
    _recycler: Any
    #: the chunk block's views (None until the first chunk)
    _chunk_views: ChunkViews | None = None

    if TYPE_CHECKING:  # the front's methods

        def _begin_chunk(self) -> None: ...

        def _prepare_step(self) -> None: ...

        def _send(self, command: Command, payload: Any = None, per_unit: Any = None) -> None: ...

        def _collect(self, state: _State, timeout: float | None) -> list[Part]: ...

        def _observations_out(self, parts: Sequence[Part]) -> Any: ...

        def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]: ...

    def step_chunk(
        self, actions: Any, stop_on_done: bool = False, all_obs: bool = False
    ) -> ChunkResults:
        """Run K actions of each env inside the units: one command per unit, K sub-steps
        of each env, one reply.

        Sub-step k of env i is exactly the k-th ``step()`` that env would have had, under
        the vector env's ``autoreset_mode`` (NEXT_STEP: the sub-step after an episode end is
        the reset step; SAME_STEP: the env resets at the ending sub-step). ``step`` and
        ``step_chunk`` can be interleaved on one trajectory.

        Args:
            actions: the batch with a chunk axis after the env axis: ``(num_envs, K,
                *single_action_space.shape)``, the same leading ``(num_envs, K)`` on every
                leaf of a Dict/Tuple action; K >= 1 and may change between calls.
            stop_on_done: an env whose episode ends at sub-step j executes none of its
                later actions (their rewards 0, flags False); implied with
                ``autoreset_mode=DISABLED``.
            all_obs: return every sub-step's observation, ``(num_envs, K, *obs_shape)``
                (per leaf), rows after an early stop repeating the env's last one; else
                each env's observation after its last executed sub-step, as ``step()``.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``: rewards and flags
            ``(num_envs, K)``; ``infos["chunk_steps"]`` the sub-steps each env executed, and
            each info key with the chunk axis (``(num_envs, K, ...)``, masks ``(num_envs,
            K)``; docs/api.md).

        Raises:
            ValueError, TypeError: the batch is not chunks of the action space (the message
                names the expected and the given shape), ``all_obs`` with observations that
                are not fixed-size, recycling configured, or (DISABLED) an ended env was not
                reset; nothing is sent.
            AlreadyPendingCallError: another call is pending, or envs are stepping
                asynchronously (``drain()`` first).
            EnvError: an env raised (its type kept, naming the env and the sub-step).
            WorkerDiedError, WorkerTimeoutError: a unit died or did not answer in time.
        """
        if self._state is not _State.IDLE or self._recycler is not None:
            self._begin_chunk()  # raises, naming step_chunk (step() checks the rest again)
            if self._recycler is not None:
                raise ValueError(
                    "step_chunk is not available with recycle_every or worker_max_rss "
                    "(recycling counts episodes one step at a time); use step()"
                )
        batch = self._chunk_checker(actions)
        if all_obs and not _spaces.is_shareable(self.single_observation_space):
            raise ValueError(
                "all_obs needs a fixed-size observation space (Box, Discrete, MultiDiscrete, "
                f"MultiBinary, or Dict/Tuple nests of them); the envs' is "
                f"{self.single_observation_space}"
            )
        chunk = batch.chunk
        if chunk == 1:
            # One sub-step is one step(): the backends' quickest round trip, one command per
            # unit all the same.
            return self._one_step_chunk(batch, all_obs)
        self._begin_chunk()
        views = self._chunk_room(chunk, all_obs)
        views.steps[:] = 0  # the progress counts: a unit lost mid-chunk leaves its own
        spec = views.spec
        leaves = batch.leaves
        in_block = views.action_space is not None and (
            leaves[0].dtype == self._chunk_leaves[0].dtype
            if len(leaves) == 1
            else all(leaf.dtype == s.dtype for leaf, s in zip(leaves, self._chunk_leaves))
        )
        if in_block:
            for target, leaf in zip(views.actions(chunk), leaves):
                np.copyto(target, leaf)
        # The core's step command, with K sub-steps of every env of the unit.
        made: dict[int, StepEnvsPayload] = {}

        def per_unit(unit: Any) -> StepEnvsPayload:
            size = unit.hi - unit.lo
            if in_block:  # the same for every unit of this size
                found = made.get(size)
                if found is None:
                    found = made[size] = StepEnvsPayload(
                        range(size), None, chunk, stop_on_done, all_obs, spec
                    )
                return found
            rows = batch.rows(unit.lo, unit.hi).leaves
            return StepEnvsPayload(range(size), rows, chunk, stop_on_done, all_obs, spec)

        self._prepare_step()
        parts = self._chunk_exchange(per_unit) if in_block else None
        if parts is None:
            self._send(Command.STEP_ENVS, per_unit=per_unit)
            self._state = _State.WAITING_CHUNK
            parts = self._collect(_State.WAITING_CHUNK, None)
        return self._chunk_results(parts, views, chunk, all_obs)

    def _one_step_chunk(self, batch: _spaces.ChunkBatch, all_obs: bool) -> ChunkResults:
        """A chunk of one sub-step as the ``step()`` it stands for, its results given the
        chunk axis."""
        leaves = batch.leaves
        if len(leaves) == 1 and not self._chunk_leaves[0].path:
            actions: Any = leaves[0][:, 0]
        else:
            actions = _spaces.build_views(self.single_action_space, (f[:, 0] for f in leaves))
        obs, rewards, terms, truncs, infos = self.step(actions)
        if all_obs:
            obs = _with_axis(obs)
        if self.info_format == "list":
            infos = [{"chunk_steps": 1, "infos": [info]} for info in infos]
        else:
            if infos:
                infos = with_chunk_axis(infos, self.num_envs, 1)
            infos["chunk_steps"] = self._chunk_ones.copy()
        return obs, rewards[:, None], terms[:, None], truncs[:, None], infos

    # --- the chunk block -----------------------------------------------------------------

    def _chunk_exchange(self, per_unit: Callable[[Any], StepEnvsPayload]) -> list[Part] | None:
        """A backend's quick round trip for a chunk command that is the same for every unit
        (the process backend's: the pool's per-step exchange, with the command's bytes); its
        parts, or None where it does not apply (then the front's send and collect run)."""
        return None

    @functools.cached_property
    def _chunk_leaves(self) -> list[_spaces.LeafSpec]:
        return _spaces.leaf_specs(self.single_action_space)

    @functools.cached_property
    def _chunk_rows(self) -> np.ndarray:
        return np.arange(self.num_envs)

    @functools.cached_property
    def _chunk_checker(self) -> _spaces.ChunkChecker:
        return _spaces.ChunkChecker(self.single_action_space, self.num_envs)

    @functools.cached_property
    def _chunk_ones(self) -> np.ndarray:
        return np.ones(self.num_envs, dtype=np.int64)

    def _chunk_act_rows(self) -> bool:
        """Whether the chunk's actions go to the chunk block (else they travel in the
        commands): the process backend's."""
        return False

    def _chunk_obs_rows(self) -> bool:
        """Whether the units write every sub-step's observation into the chunk block (else
        they send them by value): the process backend's, with observations in its block."""
        return False

    def _new_chunk_block(self, layout: BlockLayout) -> tuple[str | None, dict[str, np.ndarray]]:
        """A chunk block of ``layout``: its name and views. Here, arrays of the front's own
        (a backend whose units return their arrays: Ray); the process backend's is a
        shared-memory segment."""
        views = {r.name: np.zeros(r.shape, dtype=r.dtype) for r in layout.regions}
        return None, views

    def _chunk_room(self, chunk: int, all_obs: bool) -> ChunkViews:
        """The chunk block, replaced by a larger one when it cannot hold ``chunk`` sub-steps
        (or, with ``all_obs``, their observations)."""
        obs_rows = all_obs and self._chunk_obs_rows()
        if self._chunk_views is not None:
            spec = self._chunk_views.spec
            if spec.capacity >= chunk and (spec.obs_rows or not obs_rows):
                return self._chunk_views
            obs_rows = obs_rows or spec.obs_rows
            chunk = max(chunk, spec.capacity)
        # (no view of the old block is held here: it unmaps as it is replaced)
        capacity = capacity_for(chunk)
        space = self.single_observation_space if obs_rows else None
        actions = self.single_action_space if self._chunk_act_rows() else None
        layout = plan_chunk_block(self.num_envs, capacity, space, actions)
        name, raw = self._new_chunk_block(layout)
        spec = ChunkBlockSpec(name, self.num_envs, capacity, obs_rows)
        self._chunk_views = ChunkViews(raw, spec, space, actions)
        return self._chunk_views

    # --- results ---------------------------------------------------------------------------

    def _chunk_results(
        self, parts: Sequence[Part], views: ChunkViews, chunk: int, all_obs: bool
    ) -> ChunkResults:
        n = self.num_envs
        rewards, terms, truncs, obs_rows = views.batch(chunk)
        steps = views.steps
        if not parts and not self._any_restarted and not all_obs:
            # The usual chunk: every result in the blocks, nothing else said.
            if self.autoreset_mode is AutoresetMode.DISABLED:
                self._chunk_ended(terms, truncs, steps)
            infos = merge_chunk_infos(self.info_format, (), n, chunk, steps)
            obs = self._observations_out(parts)
            return obs, rewards.copy(), terms.copy(), truncs.copy(), infos
        events: list[tuple[int, int, dict[str, Any]]] = []
        #: the by-value observations, for the front's observation batch
        obs_parts: list[Part] = []
        sub_obs: dict[int, list[Any]] = {}
        arrays_obs: list[tuple[int, Any]] = []
        resets: dict[int, list[dict[str, Any]]] = {}
        restarting = self._restarted if self._any_restarted else None
        for lo, data in parts:
            if restarting is None or not restarting[lo]:
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
        restarted = np.flatnonzero(self._restarted).tolist() if self._any_restarted else []
        lost_at: dict[int, int] = {}
        for i in restarted:
            # The sub-step it was lost at: the sub-steps before it keep what the unit wrote.
            j = lost_at[i] = min(int(steps[i]), chunk - 1)
            rewards[i, j:], terms[i, j:], truncs[i, j:] = 0.0, False, False
            truncs[i, j] = True
            steps[i] = j + 1
            events += [(i, j, info) for info in resets.get(i, ())]
            events.append((i, j, {"worker_restarted": True}))
        events.sort(key=lambda e: (e[0], e[1]))  # env-major; stable within a sub-step
        if not all_obs:
            for lo, ob in arrays_obs:
                _assign_rows(self._observations, ob, lo)
            obs = self._observations_out(obs_parts)
        else:
            obs = self._all_obs_out(views, chunk, obs_rows, sub_obs, arrays_obs, obs_parts, lost_at)
        if self.autoreset_mode is AutoresetMode.DISABLED:
            self._chunk_ended(terms, truncs, steps)
        infos = merge_chunk_infos(self.info_format, events, n, chunk, steps)
        return obs, rewards.copy(), terms.copy(), truncs.copy(), infos

    def _chunk_ended(self, terms: np.ndarray, truncs: np.ndarray, steps: np.ndarray) -> None:
        """DISABLED: the envs whose last executed sub-step ended their episode wait for a
        reset (every env executes at least one sub-step)."""
        last = steps - 1
        every = self._chunk_rows
        np.logical_or(terms[every, last], truncs[every, last], out=self._needs_reset)

    def _all_obs_out(
        self,
        views: ChunkViews,
        chunk: int,
        obs_rows: Any,
        sub_obs: dict[int, list[Any]],
        arrays_obs: list[tuple[int, Any]],
        obs_parts: list[Part],
        lost_at: dict[int, int],
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
                seen = seen + [seen[-1]] * (chunk - len(seen))
                concatenate(space, seen, _row_view(obs_rows, i))
        if lost_at:
            # Their rows from the sub-step they were lost at: the reset's observation.
            current = self._observations_out(obs_parts)
            for i, j in lost_at.items():
                _fill_from(obs_rows, current, i, j)
        if fresh:
            return obs_rows
        return deepcopy(obs_rows) if self.copy else obs_rows


def _with_axis(batch: Any) -> Any:
    """``batch`` (a nest of ``(n, ...)`` arrays) as ``(n, 1, ...)`` views."""
    if isinstance(batch, dict):
        return {k: _with_axis(v) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_with_axis(v) for v in batch)
    return batch[:, None]


def _row_view(batch: Any, i: int) -> Any:
    if isinstance(batch, dict):
        return {k: _row_view(v, i) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_row_view(v, i) for v in batch)
    return batch[i]


def _assign_rows(batch: Any, rows: Any, lo: int) -> None:
    """``batch[lo:lo + len(rows)] = rows``, leaf by leaf."""
    if isinstance(batch, dict):
        for key, value in batch.items():
            _assign_rows(value, rows[key], lo)
    elif isinstance(batch, tuple):
        for value, part in zip(batch, rows):
            _assign_rows(value, part, lo)
    else:
        batch[lo : lo + len(rows)] = rows


def _fill_from(obs_rows: Any, current: Any, i: int, j: int) -> None:
    """Rows ``j..`` of env ``i`` in ``obs_rows`` (``(n, K, ...)``) set to its observation in
    ``current`` (``(n, ...)``)."""
    if isinstance(obs_rows, dict):
        for key, value in obs_rows.items():
            _fill_from(value, current[key], i, j)
    elif isinstance(obs_rows, tuple):
        for value, part in zip(obs_rows, current):
            _fill_from(value, part, i, j)
    else:
        obs_rows[i, j:] = current[i]
