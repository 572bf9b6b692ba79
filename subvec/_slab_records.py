"""What an ``EnvSlab`` is given and what it gives back: the batch arrays it writes its envs'
results into (``SlabArrays``, and ``ChunkArrays`` for an action chunk), the records of what
goes beside them (``SlabResult``, ``ChunkResult``: info events, by-value observations, the envs
that raised), and a final observation kept in the block (``final_obs_store``,
``FinalObsInBlock``).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from subvec._commands import ErrorRecord

__all__ = [
    "ChunkArrays",
    "ChunkEvent",
    "ChunkResult",
    "FinalObsInBlock",
    "InfoEvent",
    "SlabArrays",
    "SlabResult",
    "final_obs_store",
]

InfoEvent = tuple[int, dict[str, Any]]
#: (local env, sub-step, info) of an action chunk
ChunkEvent = tuple[int, int, dict[str, Any]]


@dataclass
class SlabArrays:
    """The slab's slices of the batch arrays (length k along the first axis).

    ``write_obs``/``read_action`` are None when observations/actions travel by value instead
    (spaces that cannot be shared): then observations are returned in ``SlabResult.obs`` and
    actions are passed to ``step``.
    """

    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    write_obs: Callable[[Any, int], None] | None = None
    #: a split nest (``_spaces.ObsSplit``), instead of ``write_obs``: ``split(obs, i)`` writes
    #: the fixed-size leaves and returns the others, which go in ``SlabResult.obs``
    split_obs: Callable[[Any, int], Any] | None = None
    read_action: Callable[[int], Any] | None = None
    #: ``action_reader(dtypes)``: a ``read_action`` for a batch the parent stored in other
    #: dtypes than the space's (one per leaf; see ``_process.block.ActionRegions``)
    action_reader: Callable[[tuple[str, ...]], Callable[[int], Any]] | None = None
    #: SAME_STEP: ``store(final_obs, i) -> bool`` keeps an ended env's final observation in
    #: the block when it fits it exactly (type, dtype, shape); see :class:`FinalObsInBlock`
    store_final_obs: Callable[[Any, int], bool] | None = None


class FinalObsInBlock:
    """Stands for an ended env's final observation that ``store_final_obs`` kept in the block
    (SAME_STEP). An ended env whose final info is also empty reports no event at all: its
    ``{"final_obs": ..., "final_info": {}}`` is implied by its termination or truncation
    flag, and the reader rebuilds it, in the same place among the events."""


@dataclass
class _EnvErrors:
    """The envs whose step raised in one command; the others went on."""

    #: ``(local env, exception)`` (None: none)
    errors: list[tuple[int, Exception]] | None = None

    def error_records(
        self, first_index: int, command: str = "step"
    ) -> list[tuple[int, ErrorRecord]] | None:
        """The envs that raised as ``(local env, ErrorRecord)`` naming their global index
        (the first env's is ``first_index``) and ``command``; None: none. Each exception's
        frames are cleared once captured: its traceback holds the step's frame, which holds
        this result, and through its arrays the shared block, which would stay mapped until
        the cycle collector ran."""
        if not self.errors:
            return None
        records = []
        for local, exc in self.errors:
            records.append((local, ErrorRecord.capture(exc, first_index + local, command)))
            traceback.clear_frames(exc.__traceback__)
        self.errors = None
        return records


@dataclass
class SlabResult(_EnvErrors):
    infos: list[InfoEvent] = field(default_factory=list)
    #: by-value observations (local env, obs); of a split nest, (local env, its other leaves)
    obs: list[tuple[int, Any]] | None = None

    def is_empty(self) -> bool:
        return not self.infos and not self.obs and not self.errors


@dataclass
class ChunkArrays:
    """Where an action chunk's per-sub-step results go: rows are the slab's local envs, the
    second axis the chunk's K sub-steps.

    ``write_sub_obs(obs, i, k)`` writes env ``i``'s observation after sub-step ``k`` (with
    ``all_obs``); None: those observations travel by value in ``ChunkResult.sub_obs``. The
    rewards and flags are C-contiguous (the sub-step loop stores through flat views).
    """

    rewards: np.ndarray  # (k, K) float64
    terminations: np.ndarray  # (k, K) bool
    truncations: np.ndarray  # (k, K) bool
    steps: np.ndarray  # (k,) integer: the sub-steps each env executed
    write_sub_obs: Callable[[Any, int, int], None] | None = None


@dataclass
class ChunkResult(_EnvErrors):
    """What an action chunk says beyond its arrays (and, in ``errors``, the envs that raised:
    each stopped at the sub-step that raised, the others ran their chunk)."""

    #: ``(local env, sub-step, info)``, env-major, sub-steps in order
    infos: list[ChunkEvent] = field(default_factory=list)
    #: the last observation of each env, by value ``(local env, obs)`` (without ``all_obs``,
    #: when the bound arrays take no observations; of a split nest, its other leaves)
    obs: list[tuple[int, Any]] | None = None
    #: with ``all_obs`` and no ``write_sub_obs``: ``(local env, [obs after each sub-step it
    #: executed])``; the reader repeats the last one over the sub-steps it did not execute
    sub_obs: list[tuple[int, list[Any]]] | None = None
    #: sub-steps executed, all envs together (``stats()`` counts them as steps)
    executed: int = 0

    def is_empty(self) -> bool:
        return not self.infos and not self.obs and not self.sub_obs and not self.errors


def final_obs_store(rows: np.ndarray) -> Callable[[Any, int], bool]:
    """``store(obs, i)``: copy ``obs`` into ``rows[i]`` if it is an ndarray of exactly the
    rows' dtype and shape, and say whether it did. Anything else travels in the final event
    by value, so the reader gets the very object SyncVectorEnv would report."""
    dtype, shape = rows.dtype, rows.shape[1:]

    def store(obs: Any, i: int) -> bool:
        if type(obs) is np.ndarray and obs.dtype == dtype and obs.shape == shape:
            rows[i] = obs
            return True
        return False

    return store
