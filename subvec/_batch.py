"""The batch arrays the front reads and writes, whichever backend made them.

A backend hands the front its batch once (:class:`BatchViews`): rewards, flags, the
observation batch and the action store. The process backend binds them to its shared block
(``_process.block.bind_batch``), the in-process backend to the same layout in its own memory, Ray to
plain arrays its actors' answers are copied into. Observation slots (:class:`ObsSlots`) are
batches handed to the caller as views, picked by who still holds them. An action chunk's
per-sub-step arrays come from the backend too (:class:`ChunkBlock`, made by a
:class:`ChunkStore`; Ray's are :class:`PlainChunkStore`, the process backend's a
shared-memory segment, ``_process.chunks.SharedChunkStore``).

Nothing here knows how the arrays are shared: the front imports this module, never the
process backend's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from sys import getrefcount
from typing import Any, Protocol

import numpy as np
from gymnasium import Space

from subvec import _spaces
from subvec._commands import ChunkBlockSpec
from subvec._infos import InfoBlockReader

__all__ = [
    "BatchViews",
    "ChunkBlock",
    "ChunkStore",
    "ObsSlots",
    "PlainChunkBlock",
    "PlainChunkStore",
]


class ObsSlots:
    """Which of several observation batches the next command writes.

    ``step`` hands the caller a view of slot 1..S instead of a copy of the batch (a Pong batch
    of 8 envs: ~20 us of copying, on the CPU the partner steps on; decision 0012). Every view
    of a slot, and whatever keeps one alive (a torch tensor from ``from_numpy``, a slice),
    holds a reference to the slot's root array, so the root's refcount says whether the
    caller still holds anything of it. Only a slot back at its free count is written again.
    If the caller holds them all, the units write slot 0 and the batch is copied out, as
    without slots.

    A Dict/Tuple batch has a root per leaf, and a slot is free only when every leaf's is: a
    caller keeping one camera of a batch keeps the whole slot.

    Args:
        leaves: each slot's leaf arrays, slot 0 (the one copied out) first; a leaf's root
            (its ``base``) is the slot's memory.
        batches: each slot's batch as the caller sees it (a nest for Dict/Tuple spaces).
        cell: the cell the units read the slot number from.
    """

    def __init__(
        self, leaves: list[list[np.ndarray]], batches: list[Any], cell: memoryview
    ) -> None:
        self.leaves = leaves
        self.batches = batches
        #: the arrays their views hang from: one per slot (see :meth:`_roots`)
        self.roots = self._roots()
        self.cell = cell
        # Held by nobody but us (each leaf's root is held as often: by its region's array, our
        # list of roots, the batch's view of it)
        self.free = getrefcount(self.leaves[1][0].base)

    @staticmethod
    def of(leaves: list[list[np.ndarray]], batches: list[Any], cell: memoryview) -> ObsSlots:
        """The slots of one leaf, or of a Dict/Tuple nest of them (see the class)."""
        if len(leaves[0]) == 1:
            return ObsSlots(leaves, batches, cell)
        return _NestSlots(leaves, batches, cell)

    def _roots(self) -> list[Any]:
        return [leaves[0].base for leaves in self.leaves]

    def pick(self) -> int:
        """Name the first slot the caller holds nothing of in the cell, and return it."""
        roots, free = self.roots, self.free
        for slot in range(1, len(roots)):
            if getrefcount(roots[slot]) == free:
                break
        else:
            slot = 0
        self.cell[0] = slot
        return slot


class _NestSlots(ObsSlots):
    """The slots of a Dict/Tuple batch: a slot is free when none of its leaves is held."""

    def _roots(self) -> list[Any]:
        return [[leaf.base for leaf in leaves] for leaves in self.leaves]

    def pick(self) -> int:
        free = self.free
        for slot in range(1, len(self.roots)):
            roots = self.roots[slot]
            # roots[k] counted as a temporary, as the free count was (a loop variable
            # would hold one more reference)
            if all(getrefcount(roots[k]) == free for k in range(len(roots))):
                break
        else:
            slot = 0
        self.cell[0] = slot
        return slot


@dataclass
class BatchViews:
    """The front's views of the whole batch (for the process backend, in its shared block)."""

    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    #: ``store(actions)``: validate a batch of actions and write it, saying how (see
    #: ``_spaces.batch_setter``); None when the action space travels by value
    store_actions: Callable[[Any], _spaces.Stored] | None
    #: ``store_rows(env_ids, actions) -> bool``: asynchronous stepping's store of a few envs'
    #: actions in their rows, for the common case only (one leaf, an ndarray of exactly
    #: ``(len(env_ids), *shape)`` in the space's dtype); False: nothing written, they travel
    #: by value. None when the action space travels by value
    store_action_rows: Callable[[np.ndarray, Any], bool] | None
    #: ``read_action(env)``: env ``env``'s action in the batch, as its unit reads it
    read_action: Callable[[int], Any] | None
    #: the observation batch (a nest for Dict/Tuple; a split nest's other leaves are None),
    #: or None when observations travel by value
    observations: Any
    final_obs_rows: np.ndarray | None
    info_block: InfoBlockReader | None
    obs_slots: ObsSlots | None
    #: a split nest's fixed-size leaves in the batch, and the split (None: not split)
    obs_leaves: list[np.ndarray] | None = None
    obs_split: _spaces.ObsSplit | None = None


class ChunkBlock(Protocol):
    """An action chunk's per-sub-step arrays, as the front reads them: ``(n, K, ...)`` views
    for a chunk of K, and each env's executed sub-steps."""

    #: what the chunk command names (the units find the same arrays from it)
    spec: ChunkBlockSpec
    #: the action rows' single space (None: the chunk's actions travel in the command)
    action_space: Space[Any] | None

    @property
    def steps(self) -> np.ndarray:
        """The executed sub-steps of every env, ``(n,)``."""
        ...

    def batch(self, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        """``(rewards, terminations, truncations, observations)``, each ``(n, chunk, ...)``
        (observations None without observation rows)."""
        ...

    def actions(self, chunk: int) -> list[np.ndarray]:
        """The action leaves, ``(n, chunk, *shape)`` in the space's dtypes."""
        ...


class ChunkStore(Protocol):
    """Where a backend keeps a chunk's arrays: made on the first chunk, replaced by a larger
    one when a chunk needs more room; the backend owns and releases them."""

    def block_for(self, chunk: int, all_obs: bool) -> ChunkBlock:
        """The arrays for a chunk of ``chunk`` sub-steps (with ``all_obs``, every sub-step's
        observation where the backend keeps them)."""
        ...

    def drop(self) -> None:
        """Forget the arrays (the backend's close releases them)."""
        ...


class PlainChunkBlock:
    """A chunk's arrays in the front's own memory, for units that answer with theirs (Ray's
    actors): rewards, flags and progress counts; the actions and every sub-step's
    observation travel in the commands and replies."""

    action_space: Space[Any] | None = None

    def __init__(self, num_envs: int, capacity: int) -> None:
        self.spec = ChunkBlockSpec(None, num_envs, capacity, False)
        rows = num_envs * capacity
        self._rewards = np.zeros(rows, dtype=np.float64)
        self._terminations = np.zeros(rows, dtype=np.bool_)
        self._truncations = np.zeros(rows, dtype=np.bool_)
        self.steps = np.zeros(num_envs, dtype=np.int64)

    def batch(self, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        n = self.spec.num_envs
        rows = n * chunk
        return (
            self._rewards[:rows].reshape(n, chunk),
            self._terminations[:rows].reshape(n, chunk),
            self._truncations[:rows].reshape(n, chunk),
            None,
        )

    def actions(self, chunk: int) -> list[np.ndarray]:
        raise ValueError("a chunk's actions travel in its commands here: there are no rows")


class PlainChunkStore:
    """:class:`ChunkStore` of :class:`PlainChunkBlock`: replaced by a larger one when a chunk
    needs more sub-steps than the last held."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.current: PlainChunkBlock | None = None

    def block_for(self, chunk: int, all_obs: bool) -> PlainChunkBlock:
        current = self.current
        if current is None or current.spec.capacity < chunk:
            current = self.current = PlainChunkBlock(self.num_envs, chunk)
        return current

    def drop(self) -> None:
        self.current = None
