"""A lock-step step's results, as the front hands them out.

:class:`StepResults` is the component the front owns for them: the envs a restart cut short
written over (truncated, no reward), recycling's episode counts and same-step resets, the
final observations in their places, the observation batch, the infos merged in env order, and
copies of the flags and rewards. It holds the batch arrays it reads, and reads the restart
flags of the exchange (their writer); it holds no reference to the front.

The asynchronous engine's results are held and handed out by ``_front.held``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from subvec._batch import BatchViews
from subvec._front.ended import EndedEnvs
from subvec._front.merge import InfoMerger, Part
from subvec._front.observations import ObservationBatch
from subvec._front.recycle import Recycler
from subvec._front.results import final_obs_parts
from subvec._front.setup import Timeouts
from subvec._front.units import Units

if TYPE_CHECKING:
    from subvec._front.exchange import LockstepExchange

__all__ = ["StepResults"]


class StepResults:
    """A lock-step step's results; see the module docstring.

    Args:
        batch: the backend's batch arrays.
        final_in_block: whether the units leave the final observations in the block.
        units: the front's units.
        obs: the observation batch.
        merger: the info merger of the front's ``info_format``.
        exchange: the lock-step exchange (the restart flags' writer).
        ended: the envs that ended and wait for a reset (DISABLED refuses to step them).
        timeouts: the bound of a call given none (recycling's same-step resets).
    """

    def __init__(
        self,
        batch: BatchViews,
        final_in_block: bool,
        units: Units,
        obs: ObservationBatch,
        merger: InfoMerger,
        exchange: LockstepExchange,
        ended: EndedEnvs,
        timeouts: Timeouts,
    ) -> None:
        self.rewards = batch.rewards
        self.terminations = batch.terminations
        self.truncations = batch.truncations
        self.final_in_block = final_in_block
        self.final_obs_rows = batch.final_obs_rows
        self.units = units
        self.obs = obs
        self.merger = merger
        self.exchange = exchange
        self.ended = ended
        self.timeouts = timeouts
        #: the recycler, where the backend recycles
        self.recycler: Recycler | None = None

    def step(
        self, parts: Sequence[Part]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """``(observations, rewards, terminations, truncations, infos)`` of the step whose
        answers are ``parts`` (the fixed-size results are in the batch arrays already)."""
        # The batch arrays are not kept in this frame: if the merge raises, a traceback the
        # caller keeps would hold them, and through them the shared block, open after close().
        exchange = self.exchange
        restarted = exchange.restarted if exchange.any_restarted else None
        if restarted is not None:
            # Their episodes were cut short by the restart: truncated, with no reward.
            self.rewards[restarted] = 0.0
            self.terminations[restarted] = False
            self.truncations[restarted] = True
        recycler = self.recycler
        if recycler is not None:
            recycler.count_episodes(self.rewards, self.terminations, self.truncations, restarted)
        if self.final_in_block and self.any_ended():  # the final events, in their places
            assert self.final_obs_rows is not None
            ended = self.terminations | self.truncations
            parts = final_obs_parts(parts, self.units.all, ended, restarted, self.final_obs_rows)
        if recycler is not None:
            parts = recycler.same_step(
                parts, self.terminations, self.truncations, self.timeouts.reset
            )
        obs = self.obs.out(parts)
        infos = self.merge_infos(parts)
        self.ended.stepped(self.terminations, self.truncations)
        return (
            obs,
            self.rewards.copy(),
            self.terminations.copy(),
            self.truncations.copy(),
            infos,
        )

    def from_block(
        self, infos: dict[str, Any]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """:meth:`step`'s result where it has nothing to add to the block's: every env in a
        unit whose answer was a plain OK, none restarted or recycled, no final event, the
        observations one array in the block and ``infos`` merged already (the steady step's
        short form: on a cheap env the parent's Python is on the critical path)."""
        obs = self.obs
        observations = obs.observations
        return (
            observations.view() if obs.slot else observations.copy() if obs.copy else observations,
            self.rewards.copy(),
            self.terminations.copy(),
            self.truncations.copy(),
            infos,
        )

    def any_ended(self) -> bool:
        """Whether any env terminated or truncated in the last step. ``count_nonzero`` is a
        plain C call; ``ndarray.any()`` goes through the ufunc machinery (several times
        slower, twice a SAME_STEP step, on the partner's CPU)."""
        return bool(np.count_nonzero(self.terminations) or np.count_nonzero(self.truncations))

    def merge_infos(self, parts: Sequence[Part]) -> Any:
        """Merge the info events in env order, as SyncVectorEnv would."""
        exchange = self.exchange
        restarted = np.flatnonzero(exchange.restarted).tolist() if exchange.any_restarted else []
        return self.merger.merge(parts, restarted)

    def drop_views(self) -> None:
        """Drop the references to the block's arrays (a shared block unmaps without them)."""
        for name in ("rewards", "terminations", "truncations", "final_obs_rows"):
            self.__dict__.pop(name, None)
