"""NUMA topology discovery and worker placement (stub; full version: issue 4).

Interface used by the rest of subvec:

- ``plan_placement(numa, num_workers, pin)`` -> ``list[Placement] | None`` (parent side)
- ``apply_placement(placement)`` -> ``PlacementReport`` (worker side, first thing it does)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Placement:
    """Where one worker should run: its NUMA node and the CPUs it may use (None: unpinned)."""

    worker: int
    node: int | None
    cpus: tuple[int, ...] | None


@dataclass(frozen=True)
class PlacementReport:
    """What a worker reports in its ready handshake: where it actually runs."""

    pid: int
    node: int | None
    cpus: tuple[int, ...]


def plan_placement(numa: Any, num_workers: int, pin: str = "node") -> list[Placement] | None:
    """Return one Placement per worker, or None when no placement is wanted."""
    if numa is None or numa is False:
        return None
    return None


def apply_placement(placement: Placement | None) -> PlacementReport:
    """Pin the calling process (all its threads) as planned and report the result."""
    return PlacementReport(
        pid=os.getpid(),
        node=None if placement is None else placement.node,
        cpus=tuple(sorted(os.sched_getaffinity(0))),
    )
