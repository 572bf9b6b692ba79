"""The shared block's schema: which regions it holds, and how each side binds its rows.

This module is the one owner of the block's layout. The parent plans it (:func:`plan_block`)
and binds the whole batch (:func:`bind_batch`, as the front's ``_batch.BatchViews``); a
worker, and the parent for its own envs (``parent_envs``), bind rows ``lo..hi`` with the same
function (:func:`bind_rows`), so the two sides cannot disagree on a region's name, shape or
meaning.

Regions (``n`` envs; leaves of a Dict/Tuple space are numbered in ``_spaces.leaf_specs`` order):

    rewards (n,) float64, terminations (n,) bool, truncations (n,) bool
    act<k> (n * leaf size * W,) bytes  actions, when the action space is shareable: room for
                                       the batch in any numeric dtype of up to W = max(8, the
                                       leaf's itemsize) bytes (see :class:`ActionRegions`)
    obs<k> (n, *leaf shape)            observations, when shareable and shared_memory=True;
                                       of a split nest (``_spaces.ObsSplit``), its fixed-size
                                       leaves (the others travel by value)
    final_obs (n, *shape)              SAME_STEP, one leaf: ended envs' final observations
    obs<k>_slot1..obs<k>_slotS         extra observation batches (every leaf k in the block)
    obs_slot                           and the cell naming the one each command writes (see
                                       ``_batch.ObsSlots``)
    info_values, info_flags, info_schema   scalar infos of a fixed schema (see ``_infos``)
    wake, wake_cmd, wake_mark          the futex protocol's words (see ``_process.wake``)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import Space

from subvec import _spaces
from subvec._batch import BatchViews, ObsSlots
from subvec._infos import InfoBlockReader, info_block_regions
from subvec._process import wake as _wake
from subvec._process.shm import BlockLayout, has_free_space
from subvec._process.wire import AttachSpec
from subvec._slab_records import SlabArrays, final_obs_store
from subvec._tensors import tensor_as_array

__all__ = [
    "ACTION_ITEMSIZE",
    "OBS_SLOTS",
    "OBS_SLOT_MAX_BYTES",
    "OBS_SLOT_MIN_BYTES",
    "ActionRegions",
    "BlockPlan",
    "bind_batch",
    "bind_obs_slots",
    "bind_rows",
    "plan_block",
    "slot_writers",
]

#: Observation batches of at least this many bytes are handed to the caller in slots of the
#: block instead of copied out (see :class:`ObsSlots`); smaller ones cost less to copy.
OBS_SLOT_MIN_BYTES = 16 * 1024
#: How many batches the caller may hold at once before the next one is copied out again...
OBS_SLOTS = 3
#: ...within this many bytes of block for them (/dev/shm is often small in containers).
OBS_SLOT_MAX_BYTES = 64 * 2**20

#: Each action region has room for this many bytes per element (or the leaf's own itemsize
#: if larger), so a batch in another dtype than the space's (float64 for a float32 Box, int64
#: for MultiBinary's int8) stays in the block in the caller's dtype.
ACTION_ITEMSIZE = 8

REWARDS, TERMINATIONS, TRUNCATIONS = "rewards", "terminations", "truncations"
FINAL_OBS = "final_obs"
OBS_SLOT_CELL = "obs_slot"

#: (name, dtype, shape) of an array in the shared block
Region = tuple[str, np.dtype[Any], tuple[int, ...]]


def _act(k: int) -> str:
    return f"act{k}"


def _obs(k: int) -> str:
    return f"obs{k}"


def _slot(k: int, s: int) -> str:
    # slot 0 is the block's own observation batch
    return _obs(k) if s == 0 else f"obs{k}_slot{s}"


@dataclass(frozen=True)
class BlockPlan:
    """What the block holds, decided once at construction.

    Attributes:
        layout: the regions and their offsets.
        obs_shared: observations are in the block (else they travel by value): all of
            them, or with ``obs_split`` the fixed-size leaves of a nest.
        obs_split: the observations are a split nest (``_spaces.ObsSplit``).
        act_shared: actions are in the block (else they travel by value).
        final_obs: SAME_STEP final observations stay in the block.
        obs_slots: extra observation batches (0: the batch is copied out).
        info_block: scalar infos of a fixed schema stay in the block.
        wake: the block holds the futex protocol's words.
    """

    layout: BlockLayout
    obs_shared: bool
    obs_split: bool
    act_shared: bool
    final_obs: bool
    obs_slots: int
    info_block: bool
    wake: bool = False

    def attach_spec(
        self,
        block_name: str,
        num_envs: int,
        observation_space: Space[Any],
        action_space: Space[Any],
        *,
        spin_us: tuple[float, ...] = (),
        info_columns: bool = False,
    ) -> AttachSpec:
        """The ATTACH payload that binds a worker (or the parent's own envs) to this block."""
        return AttachSpec(
            block_name=block_name,
            layout=self.layout,
            num_envs=num_envs,
            observation_space=observation_space if self.obs_shared else None,
            action_space=action_space if self.act_shared else None,
            spin_us=spin_us,
            info_columns=info_columns,
            final_obs=self.final_obs,
            info_block=self.info_block,
            obs_slots=self.obs_slots,
            wake=self.wake,
        )


def _slot_regions(num_envs: int, leaves: list[_spaces.LeafSpec]) -> list[Region]:
    """The observation slots' regions (each slot holds every leaf in the block), or none
    where copying out is as cheap."""
    if not leaves:
        return []
    nbytes = sum(leaf.nbytes(num_envs) for leaf in leaves)
    if nbytes < OBS_SLOT_MIN_BYTES or nbytes * OBS_SLOTS > OBS_SLOT_MAX_BYTES:
        return []
    regions = [
        (_slot(k, s), leaf.dtype, (num_envs, *leaf.shape))
        for s in range(1, OBS_SLOTS + 1)
        for k, leaf in enumerate(leaves)
    ]
    return [*regions, (OBS_SLOT_CELL, np.dtype(np.int32), (1,))]


def plan_block(
    num_envs: int,
    num_workers: int,
    observation_space: Space[Any],
    action_space: Space[Any],
    *,
    shared_memory: bool,
    same_step: bool,
    slots: bool,
    info_block: bool,
    wake: bool = False,
) -> BlockPlan:
    """Plan the block for ``num_envs`` envs.

    Args:
        num_envs: envs in the vector env (every per-env region has this many rows).
        num_workers: worker processes (the info block has a flag and a schema per worker).
        observation_space: the single observation space.
        action_space: the single action space.
        shared_memory: observations in the block when their space allows it (the
            fixed-size leaves of a nest that also holds others).
        same_step: SAME_STEP autoreset (final observations may stay in the block).
        slots: observation slots are wanted (``copy=True``, no envs in the parent).
        info_block: scalar infos of a fixed schema in the block (needs at least one worker).
        wake: room for the futex protocol's words (``_process.wake.control_regions``).

    Returns:
        The plan; the slots are left out when /dev/shm has no room for them.
    """
    obs_split = shared_memory and _spaces.ObsSplit.applies(observation_space)
    obs_shared = obs_split or (shared_memory and _spaces.is_shareable(observation_space))
    act_shared = _spaces.is_shareable(action_space)
    n = num_envs
    arrays: list[Region] = [*(_wake.control_regions(num_workers) if wake else [])]
    arrays += [
        (REWARDS, np.dtype(np.float64), (n,)),
        (TERMINATIONS, np.dtype(np.bool_), (n,)),
        (TRUNCATIONS, np.dtype(np.bool_), (n,)),
    ]
    if act_shared:
        for k, leaf in enumerate(_spaces.leaf_specs(action_space)):
            room = n * int(np.prod(leaf.shape, dtype=np.int64)) * _action_itemsize(leaf)
            arrays.append((_act(k), np.dtype(np.uint8), (room,)))
    leaves = _spaces.fixed_leaves(observation_space) if obs_shared else []
    for k, leaf in enumerate(leaves):
        arrays.append((_obs(k), leaf.dtype, (n, *leaf.shape)))
    #: ended envs leave their final observation in the block, and those whose final info is
    #: empty send nothing (see _slab_records.FinalObsInBlock)
    final_obs = same_step and len(leaves) == 1 and not leaves[0].path
    if final_obs:
        arrays.append((FINAL_OBS, leaves[0].dtype, (n, *leaves[0].shape)))
    slot_regions = _slot_regions(n, leaves) if slots else []
    arrays += slot_regions
    info_block = info_block and num_workers > 0
    if info_block:
        arrays += info_block_regions(n, num_workers)
    layout = BlockLayout.plan(arrays)
    if slot_regions and not has_free_space(layout.size):  # the slots are only a speed-up
        layout = BlockLayout.plan([a for a in arrays if a not in slot_regions])
        slot_regions = []
    return BlockPlan(
        layout=layout,
        obs_shared=obs_shared,
        obs_split=obs_split,
        act_shared=act_shared,
        final_obs=final_obs,
        obs_slots=(len(slot_regions) - 1) // len(leaves) if slot_regions else 0,
        info_block=info_block,
        wake=wake,
    )


def _leaf_rows(
    views: dict[str, np.ndarray], name: Callable[[int], str], space: Space[Any], lo: int, hi: int
) -> list[np.ndarray]:
    """Rows ``lo..hi`` of each of ``space``'s leaves in the block (``name(k)``: leaf k's)."""
    return [views[name(k)][lo:hi] for k in range(len(_spaces.fixed_leaves(space)))]


def _leaf_views(
    views: dict[str, np.ndarray], name: Callable[[int], str], space: Space[Any], lo: int, hi: int
) -> Any:
    """The nest of those rows; a split nest's other leaves are None in it."""
    leaves = _leaf_rows(views, name, space, lo, hi)
    if _spaces.ObsSplit.applies(space):
        split = _spaces.ObsSplit(space)
        return split.build(leaves, [None] * len(split.loose))
    return _spaces.build_views(space, iter(leaves))


def _obs_writer(
    space: Space[Any], views: dict[str, np.ndarray], name: Callable[[int], str], lo: int, hi: int
) -> Callable[[Any, int], Any]:
    """The row writer of rows ``lo..hi``: a split nest's returns its other leaves."""
    if _spaces.ObsSplit.applies(space):
        return _spaces.ObsSplit(space).writer(_leaf_rows(views, name, space, lo, hi), lo)
    return _spaces.row_writer(space, _leaf_views(views, name, space, lo, hi), env_offset=lo)


def _action_itemsize(leaf: _spaces.LeafSpec) -> int:
    return max(leaf.dtype.itemsize, ACTION_ITEMSIZE)


class ActionRegions:
    """The action regions, seen in whichever dtype a batch was stored in.

    SyncVectorEnv hands each env its action in the caller's dtype, so the parent stores a
    batch in its own dtype (``_spaces.batch_setter``) and tells the workers which one when it
    is not the space's (a STEP payload); both sides view the same bytes through this class.
    A region holds its leaf's own dtype, and any native bool, integer, float or complex dtype
    of up to its itemsize.
    """

    def __init__(self, views: dict[str, np.ndarray], space: Space[Any], num_envs: int) -> None:
        self.space = space
        self.num_envs = num_envs
        self.leaves = _spaces.leaf_specs(space)
        self.raws = [views[_act(k)] for k in range(len(self.leaves))]
        self._views: dict[tuple[int, str], np.ndarray] = {}
        self._readers: dict[tuple[tuple[str, ...] | None, int, int], Callable[[int], Any]] = {}

    def view(self, k: int, dtype: np.dtype[Any]) -> np.ndarray | None:
        """Leaf ``k``'s ``(num_envs, *shape)`` batch in ``dtype``; None if it cannot hold it."""
        key = (k, dtype.str)
        found = self._views.get(key)
        if found is not None:
            return found
        leaf = self.leaves[k]
        if dtype != leaf.dtype and (
            dtype.kind not in "biufc"
            or not dtype.isnative
            or dtype.itemsize > _action_itemsize(leaf)
        ):
            return None
        count = self.num_envs * int(np.prod(leaf.shape, dtype=np.int64))
        raw = self.raws[k][: count * dtype.itemsize]
        array = raw.view(dtype).reshape(self.num_envs, *leaf.shape)
        self._views[key] = array
        return array

    def reader(self, dtypes: tuple[str, ...] | None, lo: int, hi: int) -> Callable[[int], Any]:
        """``read(row)`` of rows ``lo..hi`` (row 0 is env ``lo``) stored in ``dtypes`` (one per
        leaf; None: the space's), as ``_spaces.row_reader`` reads them."""
        key = (dtypes, lo, hi)
        found = self._readers.get(key)
        if found is not None:
            return found
        if dtypes is None:
            dtypes = tuple(leaf.dtype.str for leaf in self.leaves)
        rows = []
        for k, name in enumerate(dtypes):
            batch = self.view(k, np.dtype(name))
            if batch is None:
                raise ValueError(f"action leaf {k} cannot be held in dtype {name}")
            rows.append(batch[lo:hi])
        read = _spaces.row_reader(self.space, _spaces.build_views(self.space, iter(rows)))
        self._readers[key] = read
        return read


def _row_setter(regions: ActionRegions) -> Callable[[np.ndarray, Any], bool] | None:
    """``store_rows(env_ids, actions)`` for a one-leaf action space (see ``_batch.BatchViews``)."""
    leaves = regions.leaves
    if len(leaves) != 1 or leaves[0].path:
        return None
    target = regions.view(0, leaves[0].dtype)
    assert target is not None
    shape, dtype = tuple(leaves[0].shape), leaves[0].dtype

    def store_rows(env_ids: np.ndarray, actions: Any) -> bool:
        if type(actions) is not np.ndarray:
            # A CPU torch tensor goes in the space's dtype, as in a lock-step batch
            tensor = tensor_as_array(actions, dtype, "actions")
            if tensor is None or tensor.shape != (len(env_ids), *shape):
                return False
            target[env_ids] = tensor
            return True
        if actions.dtype != dtype or actions.shape != (len(env_ids), *shape):
            return False
        target[env_ids] = actions
        return True

    return store_rows


def bind_rows(views: dict[str, np.ndarray], spec: AttachSpec, lo: int, hi: int) -> SlabArrays:
    """The rows ``lo..hi`` of the block, as the arrays an ``EnvSlab`` steps into.

    Both sides use this: a worker for its envs, the parent for its own (``parent_envs``)."""
    write_obs = split_obs = read_action = None
    space = spec.observation_space
    if space is not None:
        if _spaces.ObsSplit.applies(space):
            split_obs = _obs_writer(space, views, _obs, lo, hi)
        else:
            write_obs = _obs_writer(space, views, _obs, lo, hi)
    reader_for = None
    if spec.action_space is not None:
        regions = ActionRegions(views, spec.action_space, spec.num_envs)
        read_action = regions.reader(None, lo, hi)

        def reader_for(dtypes: tuple[str, ...]) -> Callable[[int], Any]:
            return regions.reader(dtypes, lo, hi)

    return SlabArrays(
        rewards=views[REWARDS][lo:hi],
        terminations=views[TERMINATIONS][lo:hi],
        truncations=views[TRUNCATIONS][lo:hi],
        write_obs=write_obs,
        split_obs=split_obs,
        read_action=read_action,
        action_reader=reader_for,
        store_final_obs=final_obs_store(views[FINAL_OBS][lo:hi]) if spec.final_obs else None,
    )


def slot_writers(
    views: dict[str, np.ndarray], spec: AttachSpec, lo: int, hi: int
) -> tuple[list[Callable[[Any, int], None]], memoryview | None]:
    """With observation slots: one row writer per slot (slot 0 first) for rows ``lo..hi``
    (those of a split nest return its other leaves), and the cell that names the slot each
    command writes. Without: ``([], None)``."""
    if not spec.obs_slots:
        return [], None
    space = spec.observation_space
    writers = [
        _obs_writer(space, views, lambda k, s=s: _slot(k, s), lo, hi)  # type: ignore[misc]
        for s in range(spec.obs_slots + 1)
    ]
    return writers, memoryview(views[OBS_SLOT_CELL])  # type: ignore[arg-type]


def bind_obs_slots(views: dict[str, np.ndarray], slots: int, space: Space[Any]) -> ObsSlots:
    """The parent's side of the observation slots (``slots`` of them besides slot 0) of
    ``space``'s batches: one leaf, or a Dict/Tuple nest of them (see ``_batch.ObsSlots``)."""
    n = len(views[REWARDS])
    count = len(_spaces.fixed_leaves(space))
    leaves = [[views[_slot(k, s)] for k in range(count)] for s in range(slots + 1)]
    batches = [
        _leaf_views(views, lambda k, s=s: _slot(k, s), space, 0, n)  # type: ignore[misc]
        for s in range(slots + 1)
    ]
    return ObsSlots.of(leaves, batches, memoryview(views[OBS_SLOT_CELL]))  # type: ignore[arg-type]


def bind_batch(views: dict[str, np.ndarray], plan: BlockPlan, spec: AttachSpec) -> BatchViews:
    """The parent's views of the whole batch in the block (``views``: its regions)."""
    n = spec.num_envs
    store = store_rows = read_action = observations = None
    leaves = split = None
    if spec.action_space is not None:
        regions = ActionRegions(views, spec.action_space, n)
        store = _spaces.batch_setter(spec.action_space, regions.view, n)
        store_rows = _row_setter(regions)
        read_action = regions.reader(None, 0, n)
    space = spec.observation_space
    if space is not None:
        observations = _leaf_views(views, _obs, space, 0, n)
        if plan.obs_split:
            split = _spaces.ObsSplit(space)
            leaves = _leaf_rows(views, _obs, space, 0, n)
    return BatchViews(
        rewards=views[REWARDS],
        terminations=views[TERMINATIONS],
        truncations=views[TRUNCATIONS],
        store_actions=store,
        store_action_rows=store_rows,
        read_action=read_action,
        observations=observations,
        final_obs_rows=views[FINAL_OBS] if plan.final_obs else None,
        info_block=InfoBlockReader(views, n) if plan.info_block else None,
        obs_slots=bind_obs_slots(views, plan.obs_slots, space) if plan.obs_slots else None,
        obs_leaves=leaves,
        obs_split=split,
    )
