"""The observations the front hands out of a lock-step reset or step.

:class:`ObservationBatch` is the component the front owns for them: the batch the units write
(one of several slots where the backend keeps them, see ``_batch.ObsSlots``), each env's
observation where it travels by value (``env_obs``: the other components read it and hand
what they receive to :meth:`ObservationBatch.keep`, its one writer), and the batch returned to
the caller (a view of the caller's own slot, a copy, or the batch ``concatenate`` builds). It
holds the batch arrays and no reference to the front.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium import Space
from gymnasium.vector.utils import concatenate, create_empty_array

from subvec._backend import Unit
from subvec._batch import BatchViews
from subvec._front.merge import Part
from subvec._front.results import split_batch
from subvec._front.setup import copy_nest, view_nest

__all__ = ["ObservationBatch"]


class ObservationBatch:
    """The observation batch of the front's lock-step calls; see the module docstring.

    Args:
        batch: the backend's batch arrays.
        space: the single observation space.
        num_envs: how many envs.
        copy: whether the caller gets a copy of the batch (else the batch itself).
    """

    def __init__(self, batch: BatchViews, space: Space[Any], num_envs: int, copy: bool) -> None:
        n = num_envs
        self.space = space
        #: each env's observation where they travel by value
        self.env_obs: list[Any] = [None] * n
        self.copy = copy
        self.slots = batch.obs_slots
        #: the slot the units write (0: the block's own batch, copied out)
        self.slot = 0
        #: a split nest: its fixed-size leaves are in the block, its others travel by value
        #: and ``env_obs`` holds each env's (see ``_spaces.ObsSplit``)
        self.split = batch.obs_split
        #: observations entirely in the block
        self.shared = batch.observations is not None and self.split is None
        #: the batch the units write (or ``concatenate`` fills)
        self.observations: Any = (
            batch.observations
            if batch.observations is not None
            else create_empty_array(space, n=n, fn=np.zeros)
        )
        #: the split nest's fixed-size leaves in the block's own batch (slot 0)
        self.fixed: list[np.ndarray] | None = None
        self.loose_out: list[Any] = []
        if self.split is not None:
            assert batch.obs_leaves is not None
            self.fixed = batch.obs_leaves
            self.loose_out = self.split.empty_loose(n)

    def pick_slot(self) -> None:
        """Point the units at a batch of observations the caller holds nothing of."""
        slots = self.slots
        assert slots is not None
        self.slot = slot = slots.pick()
        self.observations = slots.batches[slot]

    def fresh_slot(self, units: Iterable[Unit] | None = None) -> None:
        """:meth:`pick_slot`, keeping the observations of the current batch in the new one:
        all of them, or those of ``units``' envs (those the command leaves alone)."""
        slots = self.slots
        assert slots is not None
        previous = self.slot
        self.pick_slot()
        if self.slot == previous:
            return
        spans = None if units is None else [(unit.lo, unit.hi) for unit in units]
        for old, new in zip(slots.leaves[previous], slots.leaves[self.slot]):
            if spans is None:
                np.copyto(new, old)
            else:
                for lo, hi in spans:
                    new[lo:hi] = old[lo:hi]

    def first_slot(self) -> None:
        """The units write the block's own batch (slot 0) from now on."""
        slots = self.slots
        if slots is not None:
            slots.cell[0] = 0
            self.slot = 0
            self.observations = slots.batches[0]

    def out(self, parts: Sequence[Part]) -> Any:
        """The batch handed to the caller, the observations of ``parts`` in it."""
        if not self.shared:
            for lo, data in parts:
                if data is not None:
                    for local, value in data.obs or ():
                        self.keep(lo + local, value)
            env_obs = self.env_obs
            if self.split is not None:
                return self._split_out()
            self.observations = concatenate(self.space, env_obs, self.observations)
            return deepcopy(self.observations) if self.copy else self.observations
        if self.slot:  # the caller's own batch (see _batch.ObsSlots)
            obs = self.observations
            return obs.view() if type(obs) is np.ndarray else view_nest(obs)
        return copy_nest(self.observations) if self.copy else self.observations

    def keep(self, env: int, value: Any) -> None:
        """Keep ``value`` as env ``env``'s by-value observation: what a reset or the next step
        shows for it."""
        self.env_obs[env] = value

    def _split_out(self) -> Any:
        """A split nest's batch (``_front.results.split_batch``) from the batch the units write."""
        assert self.split is not None
        slots, slot = self.slots, self.slot
        fixed = self.fixed if slots is None else slots.leaves[slot]
        assert fixed is not None
        return split_batch(
            self.split, self.env_obs, self.loose_out, fixed, in_slot=bool(slot), copy=self.copy
        )

    def drop_views(self) -> None:
        """Drop the references to the block's arrays (a shared block unmaps without them)."""
        self.slots = None
        if self.shared or self.split is not None:
            self.observations = None
            self.fixed = None
