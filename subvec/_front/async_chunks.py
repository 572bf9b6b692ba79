"""Action chunks in asynchronous stepping: ``send_chunk`` on any set of envs, results through
``recv``.

    ChunkWork         one ``send_chunk`` call: K, ``stop_on_done``, ``all_obs``, the chunk
                      arrays it runs in, and its actions (in those arrays' rows, or by value);
                      each unit of its envs gets one STEP_ENVS of K sub-steps for them
    ended_at_last     whether a chunk row's last executed sub-step ended its episode
    cut_short         a chunk row a restart cut short at the sub-step it was lost at
    sub_step_obs      every sub-step's observation, of those that came by value
    describe_shapes   which envs hold results of which shape, for an error message

Each env's result of a chunk is held and handed out with the steps' (``_front.held``). Per
env, the sub-steps are exactly those of ``step_chunk`` (``EnvSlab.step_chunk`` runs them), so a
chunk sent to some envs while others are in flight gives each env the trajectory it would have
had in lock-step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import Space
from gymnasium.vector.utils import concatenate, create_empty_array

from subvec._backend import Unit
from subvec._batch import ChunkBlock
from subvec._commands import StepEnvsPayload

__all__ = [
    "ChunkShape",
    "ChunkWork",
    "cut_short",
    "describe_shapes",
    "ended_at_last",
    "sub_step_obs",
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


def ended_at_last(terminations: np.ndarray, truncations: np.ndarray, steps: int) -> bool:
    """Whether the last executed sub-step of a chunk row (its ``(K,)`` flags, ``steps``
    executed; every env executes at least one) ended the episode."""
    last = max(steps, 1) - 1
    return bool(terminations[last] or truncations[last])


def cut_short(
    rewards: np.ndarray, terminations: np.ndarray, truncations: np.ndarray, steps: int
) -> int:
    """Cut a chunk row (its ``(K,)`` arrays, changed in place) short where a restart lost it:
    at the sub-step its unit was running (``steps`` executed before it, as the unit's progress
    count says), truncated and with no reward, and nothing after it.

    Returns:
        The sub-step it was lost at (its row executes up to and including it).
    """
    j = min(steps, len(rewards) - 1)
    rewards[j:] = 0.0
    terminations[j:] = False
    truncations[j:] = False
    truncations[j] = True
    return j


def sub_step_obs(space: Space[Any], seen: list[Any], chunk: int, out: Any = None) -> Any:
    """A chunk row's observations as one ``(K, ...)`` nest of ``space`` (into ``out``, where
    given) from ``seen``, those of the sub-steps it executed: the rows past an early stop
    repeat the last."""
    seen = seen + [seen[-1]] * (chunk - len(seen))
    if out is None:
        out = create_empty_array(space, n=chunk)
    return concatenate(space, seen, out)


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
