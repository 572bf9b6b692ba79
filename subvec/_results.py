"""Per-env results out of a unit's reply, shared by lock-step and asynchronous stepping.

A unit answers with a :class:`~subvec._commands.UnitReply` (local env indices); both paths
read it here: its info events and by-value observations keyed by global env, and the
final-observation event of an env that ended with SAME_STEP and its final observation in the
block (left implicit by the unit when the final info is empty, or carrying a stand-in).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from subvec._commands import UnitReply
from subvec._infos import as_events
from subvec._slab import FinalObsInBlock

__all__ = ["events_by_env", "final_event", "obs_by_env"]


def events_by_env(lo: int, reply: UnitReply | None) -> dict[int, list[dict[str, Any]]]:
    """The reply's info events by global env (a unit's first env is ``lo``), in order."""
    events: dict[int, list[dict[str, Any]]] = {}
    if reply is not None and reply.infos:
        for local, info in as_events(reply.infos):
            events.setdefault(lo + local, []).append(info)
    return events


def obs_by_env(lo: int, reply: UnitReply | None) -> dict[int, Any]:
    """The reply's by-value observations by global env."""
    if reply is None or not reply.obs:
        return {}
    return {lo + local: obs for local, obs in reply.obs}


def final_event(info: dict[str, Any] | None, rows: np.ndarray, env: int) -> dict[str, Any]:
    """An ended env's final event with its final observation: ``info`` (the event the unit
    sent) with a stand-in filled from the block's final-observation row, or a new event for
    an empty final info when ``info`` is None."""
    if info is None:
        info = {"final_obs": FinalObsInBlock, "final_info": {}}
    if info["final_obs"] is FinalObsInBlock:
        info["final_obs"] = rows[env, ...].copy()  # [i, ...]: a 0-d leaf stays an array
    return info
