"""Action chunks on a unit: the chunk block's layout and views, and running one chunk.

A chunk of K actions per env runs inside the unit (a worker, or the parent for its own envs):
one command, K sub-steps of each env (``EnvSlab.step_chunk``), one reply. Its per-sub-step
results do not fit the main block, whose rows hold one step, so they go to a second segment,
the *chunk block*, that the parent creates on the first ``step_chunk`` (nothing for a vector
env that never chunks) and replaces when a chunk needs more room (:class:`SharedChunkStore`, the
front's ``_batch.ChunkStore`` of the backends whose units map it)::

    c_rewards       (n * C,) float64   viewed as (n, K) for a chunk of K <= C
    c_terminations  (n * C,) bool      "
    c_truncations   (n * C,) bool      "
    c_steps         (n,) int64         sub-steps each env executed, written after each one
    c_act<k>        (n * C * leaf,)    the chunk's actions in the action space's dtypes
    c_obs<k>        (n * C * leaf,)    all_obs only: every sub-step's observation, (n, K, *leaf)

``C`` (the capacity) is at least :data:`MIN_CAPACITY` and a power of two, so that a loop whose
K varies a little does not replace the block each call. Each region is read as its first
``n * K`` rows reshaped ``(n, K, ...)``: contiguous for every K, and a unit's rows ``lo..hi``
are one contiguous slice. The observation rows exist once a chunk asks for ``all_obs`` (their
cost: ``n * C`` observations, e.g. 8 Pong envs with C = 16: 12.9 MB); the last observation of
a chunk without ``all_obs`` goes to the main block's rows, as a step's does.

``c_steps`` is written after every sub-step, so that after a worker's death the parent knows
the sub-step at which each of its envs was lost.

A chunk is the step command of the front's core with K sub-steps (``StepEnvsPayload`` with
``substeps`` = K, addressing every env of the unit). The actions go to the ``c_act<k>``
regions when every leaf of the batch is in the space's dtype (the usual case), and the command
is then a few bytes, the same for every unit of a size; a batch in other dtypes travels in
the command instead (the unit's rows, one array per leaf, kept in the caller's dtype, as
``step()`` hands them over). Measured on CartPole x 4 (2
workers): ~11 us of pickling per worker per chunk with the arrays in the command, ~2.5 us
without (decision 0026).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import Space

from subvec import _chunk_actions, _spaces
from subvec._commands import ChunkBlockSpec, StepEnvsPayload
from subvec._process.shm import BlockLayout, SharedBlock
from subvec._slab import EnvSlab
from subvec._slab_records import ChunkArrays, ChunkResult

__all__ = [
    "MIN_CAPACITY",
    "ChunkAttachment",
    "ChunkViews",
    "SharedChunkStore",
    "capacity_for",
    "plan_chunk_block",
    "run_chunk",
    "scalar_rows",
]

#: The chunk block holds at least this many sub-steps per env.
MIN_CAPACITY = 8

REWARDS, TERMINATIONS, TRUNCATIONS, STEPS = (
    "c_rewards",
    "c_terminations",
    "c_truncations",
    "c_steps",
)


def _obs(k: int) -> str:
    return f"c_obs{k}"


def _act(k: int) -> str:
    return f"c_act{k}"


def _shaped(region: np.ndarray, n: int, chunk: int, shape: tuple[int, ...]) -> np.ndarray:
    """The first ``n * chunk`` rows of a flat region as ``(n, chunk, *shape)``."""
    size = int(np.prod(shape, dtype=np.int64))
    return region[: n * chunk * size].reshape(n, chunk, *shape)


def capacity_for(chunk: int) -> int:
    """The capacity of a block that holds chunks of ``chunk``: a power of two, at least
    :data:`MIN_CAPACITY`."""
    return max(MIN_CAPACITY, 1 << (chunk - 1).bit_length())


def plan_chunk_block(
    num_envs: int,
    capacity: int,
    observation_space: Space[Any] | None,
    action_space: Space[Any] | None,
) -> BlockLayout:
    """The chunk block's layout for ``num_envs`` envs, chunks of up to ``capacity``, the
    observation rows of ``observation_space`` (None: no observation rows) and the action rows
    of ``action_space`` (None: actions travel in the command)."""
    rows = num_envs * capacity
    regions: list[tuple[str, np.dtype[Any], tuple[int, ...]]] = [
        (REWARDS, np.dtype(np.float64), (rows,)),
        (TERMINATIONS, np.dtype(np.bool_), (rows,)),
        (TRUNCATIONS, np.dtype(np.bool_), (rows,)),
        (STEPS, np.dtype(np.int64), (num_envs,)),
    ]
    for name, space in ((_act, action_space), (_obs, observation_space)):
        if space is not None:
            for k, leaf in enumerate(_spaces.leaf_specs(space)):
                size = int(np.prod(leaf.shape, dtype=np.int64))
                regions.append((name(k), leaf.dtype, (rows * size,)))
    return BlockLayout.plan(regions)


class ChunkViews:
    """The chunk block's regions seen for a chunk of K: ``(n, K, ...)`` arrays, and a unit's
    rows of them. Both sides use it: the parent for the whole batch, a unit for its rows."""

    def __init__(
        self,
        views: dict[str, np.ndarray],
        spec: ChunkBlockSpec,
        observation_space: Space[Any] | None,
        action_space: Space[Any] | None,
    ) -> None:
        self.spec = spec
        #: the observation rows' single space (None: no observation rows)
        self.observation_space = observation_space if spec.obs_rows else None
        #: the action rows' single space (None: actions travel in the command)
        self.action_space = action_space
        self.raw = views
        self._batches: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, Any]] = {}
        self._rows: dict[tuple[int, int, int, bool], ChunkArrays] = {}
        self._actions: dict[int, list[np.ndarray]] = {}
        self._readers: dict[tuple[int, int, int], Callable[[int, int], Any]] = {}
        self._env_actions: dict[tuple[int, int, int], Callable[[int], Any] | None] = {}

    @property
    def steps(self) -> np.ndarray:
        """The executed sub-steps of every env, ``(n,)``."""
        return self.raw[STEPS]

    def batch(self, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        """``(rewards, terminations, truncations, observations)`` of the whole batch for a
        chunk of ``chunk``, each ``(n, chunk, ...)`` (observations a nest of such arrays, None
        without observation rows)."""
        found = self._batches.get(chunk)
        if found is not None:
            return found
        n, views = self.spec.num_envs, self.raw
        shaped = [
            views[name][: n * chunk].reshape(n, chunk)
            for name in (REWARDS, TERMINATIONS, TRUNCATIONS)
        ]
        obs = None
        space = self.observation_space
        if space is not None:
            leaves = [
                _shaped(views[_obs(k)], n, chunk, leaf.shape)
                for k, leaf in enumerate(_spaces.leaf_specs(space))
            ]
            obs = _spaces.build_views(space, iter(leaves))
        found = self._batches[chunk] = (shaped[0], shaped[1], shaped[2], obs)
        return found

    def actions(self, chunk: int) -> list[np.ndarray]:
        """The action leaves of the whole batch for a chunk of ``chunk``, ``(n, chunk,
        *shape)`` in the space's dtypes (``leaf_specs`` order)."""
        found = self._actions.get(chunk)
        if found is None:
            assert self.action_space is not None
            n = self.spec.num_envs
            found = self._actions[chunk] = [
                _shaped(self.raw[_act(k)], n, chunk, leaf.shape)
                for k, leaf in enumerate(_spaces.leaf_specs(self.action_space))
            ]
        return found

    def reader(self, lo: int, hi: int, chunk: int) -> Callable[[int, int], Any]:
        """``read(i, k)`` of rows ``lo..hi`` of the actions (``_chunk_actions.chunk_reader``)."""
        key = (lo, hi, chunk)
        found = self._readers.get(key)
        if found is None:
            assert self.action_space is not None
            rows = tuple(leaf[lo:hi] for leaf in self.actions(chunk))
            batch = _chunk_actions.ChunkBatch(chunk, rows)
            found = self._readers[key] = _chunk_actions.chunk_reader(self.action_space, batch)
        return found

    def env_actions(self, lo: int, hi: int, chunk: int) -> Callable[[int], Any] | None:
        """:func:`scalar_rows` of rows ``lo..hi`` of the action rows."""
        key = (lo, hi, chunk)
        if key in self._env_actions:
            return self._env_actions[key]
        leaves = [leaf[lo:hi] for leaf in self.actions(chunk)]
        found = self._env_actions[key] = scalar_rows(self.action_space, leaves)
        return found

    def rows(self, lo: int, hi: int, chunk: int, all_obs: bool) -> ChunkArrays:
        """Rows ``lo..hi`` as the arrays ``EnvSlab.step_chunk`` writes (with ``all_obs`` and
        observation rows, a writer of each sub-step's observation)."""
        key = (lo, hi, chunk, all_obs)
        found = self._rows.get(key)
        if found is not None:
            return found
        rewards, terms, truncs, obs = self.batch(chunk)
        write_sub = None
        space = self.observation_space
        if all_obs and space is not None:
            write_sub = _sub_writer(space, obs, lo, hi, chunk)
        found = self._rows[key] = ChunkArrays(
            rewards=rewards[lo:hi],
            terminations=terms[lo:hi],
            truncations=truncs[lo:hi],
            steps=self.raw[STEPS][lo:hi],
            write_sub_obs=write_sub,
        )
        return found


def _sub_writer(
    space: Space[Any], obs: Any, lo: int, hi: int, chunk: int
) -> Callable[[Any, int, int], None]:
    """``write(obs, i, k)``: env ``lo + i``'s observation after sub-step ``k``, written with
    the checks of a step's (``_spaces.row_writer``: shape, ``same_kind`` cast, the env named)."""
    leaves = _spaces.nest_leaves(obs)
    writers = [
        _spaces.row_writer(
            space, _spaces.build_views(space, iter([leaf[lo:hi, k] for leaf in leaves])), lo
        )
        for k in range(chunk)
    ]
    return lambda value, i, k: writers[k](value, i)


class SharedChunkStore:
    """The chunk block of a backend whose units map it (``_batch.ChunkStore``): made on the
    first chunk, replaced by a larger one when a chunk needs more sub-steps (or, with
    ``all_obs``, observation rows it lacks). The backend's ``make`` allocates each block and
    releases the one before; nothing here holds a view of a replaced block.

    Args:
        num_envs: the vector env's.
        observation_space: the single observation space when observations are in the
            blocks (every sub-step's, with ``all_obs``); None: they travel by value.
        action_space: the single action space (the chunk's actions go to the block).
        make: ``make(layout) -> (name, views)``: a new block of ``layout`` (name None: not
            a shared segment) and its regions' arrays.
        adopt: called with each new block's views (the parent's own envs, which map no
            segment of their own: ``_process.local.LocalShare.adopt_chunks``).
    """

    def __init__(
        self,
        num_envs: int,
        observation_space: Space[Any] | None,
        action_space: Space[Any],
        make: Callable[[BlockLayout], tuple[str | None, dict[str, np.ndarray]]],
        adopt: Callable[[ChunkViews], None] | None = None,
    ) -> None:
        self.num_envs = num_envs
        self.observation_space = observation_space
        self.action_space = action_space
        self.make = make
        self.adopt = adopt
        self.views: ChunkViews | None = None

    def block_for(self, chunk: int, all_obs: bool) -> ChunkViews:
        """The block, replaced by a larger one when it cannot hold ``chunk`` sub-steps (or,
        with ``all_obs``, their observations)."""
        obs_rows = all_obs and self.observation_space is not None
        if self.views is not None:
            spec = self.views.spec
            if spec.capacity >= chunk and (spec.obs_rows or not obs_rows):
                return self.views
            obs_rows = obs_rows or spec.obs_rows
            chunk = max(chunk, spec.capacity)
        self.views = None  # no view of the old block is held here: it unmaps as it is replaced
        capacity = capacity_for(chunk)
        space = self.observation_space if obs_rows else None
        layout = plan_chunk_block(self.num_envs, capacity, space, self.action_space)
        name, raw = self.make(layout)
        spec = ChunkBlockSpec(name, self.num_envs, capacity, obs_rows)
        self.views = ChunkViews(raw, spec, space, self.action_space)
        if self.adopt is not None:
            self.adopt(self.views)
        return self.views

    def drop(self) -> None:
        """Forget the block's views (the backend's release closes the block)."""
        self.views = None


class ChunkAttachment:
    """A unit's mapping of the chunk block named in its last chunk command: the parent
    replaces the block when a chunk needs more room, and the next command names the new one."""

    def __init__(self) -> None:
        self.block: SharedBlock | None = None
        self.views: ChunkViews | None = None

    def get(
        self,
        spec: ChunkBlockSpec,
        observation_space: Space[Any] | None,
        action_space: Space[Any] | None,
    ) -> ChunkViews:
        """The views of the block ``spec`` names (attached now if it is a new one).

        Args:
            spec: the block, as the chunk command names it.
            observation_space: the unit's single observation space when observations are in
                the blocks (None: they travel by value).
            action_space: the unit's single action space when actions are in the blocks.
        """
        if self.views is not None and self.views.spec == spec:
            return self.views
        self.close()  # no view of the old block may be left here: it unmaps now
        assert spec.name is not None
        space = observation_space if spec.obs_rows else None
        layout = plan_chunk_block(spec.num_envs, spec.capacity, space, action_space)
        self.block = SharedBlock.attach(spec.name, layout)
        self.views = ChunkViews(self.block.views, spec, space, action_space)
        return self.views

    def adopt(self, views: ChunkViews) -> None:
        """Use ``views`` (the front's own arrays, no segment: the unit runs in the front's
        process with nothing else to map) for the chunks that name their spec."""
        if self.views is not views:
            self.close()
            self.views = views

    def close(self) -> None:
        block, self.block, self.views = self.block, None, None
        if block is not None:
            block.close()


def run_chunk(slab: EnvSlab, payload: StepEnvsPayload, views: ChunkViews) -> ChunkResult:
    """Run the chunk ``payload`` describes (a STEP_ENVS of ``substeps`` > 1) on ``slab``'s
    envs ``payload.envs``, into its rows of ``views``.

    Raises:
        Exception: what an env raised (see ``EnvSlab.step_chunk``).
    """
    lo = slab.first_index
    hi = lo + len(slab.envs)
    chunk = payload.substeps
    out = views.rows(lo, hi, chunk, payload.all_obs)
    if payload.actions is None:  # in the chunk block: the same views every chunk of K
        read = views.reader(lo, hi, chunk)
        env_actions = views.env_actions(lo, hi, chunk)
    else:
        space = slab.envs[0].action_space
        leaves = list(payload.actions)
        read = _chunk_actions.chunk_reader(space, _chunk_actions.ChunkBatch(chunk, tuple(leaves)))
        env_actions = scalar_rows(space, leaves)
    envs = payload.envs
    assert envs is not None  # a chunk names its envs
    return slab.step_chunk(
        out,
        read,
        chunk,
        stop_on_done=payload.stop_on_done,
        all_obs=payload.all_obs,
        envs=None if len(envs) == hi - lo else envs,
        env_actions=env_actions,
    )


def scalar_rows(space: Space[Any] | None, leaves: list[np.ndarray]) -> Callable[[int], Any] | None:
    """For a space whose action is one numpy scalar (Discrete): ``rows(i)``, env ``i``'s K
    actions as a row whose items are the numpy scalars ``read(i, k)`` gives (indexing one
    row per sub-step is cheaper than a call); None for any other space. The rows are views
    made here, once: over the chunk block, they read every later chunk's actions too."""
    if space is None or len(leaves) != 1 or leaves[0].ndim != 2:
        return None
    specs = _spaces.leaf_specs(space)
    if len(specs) != 1 or specs[0].path or specs[0].shape:
        return None
    return list(leaves[0]).__getitem__
