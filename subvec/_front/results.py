"""Per-env results out of a unit's reply, shared by lock-step and asynchronous stepping.

A unit answers with a :class:`~subvec._commands.UnitReply` (local env indices); both paths
read it here: its info events, by-value observations and env errors keyed by global env, and the
final-observation event of an env that ended with SAME_STEP and its final observation in the
block (left implicit by the unit when the final info is empty, or carrying a stand-in).

For lock-step results off the steady path it also gives the parts of units that left their
infos in the block (:func:`block_parts`), a step's parts with the final events
(:func:`final_obs_parts`), and a split nest's batch (:func:`split_batch`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from copy import deepcopy
from typing import Any

import numpy as np

from subvec._backend import Unit
from subvec._commands import UnitReply, rebuild_remote_error
from subvec._infos import InfoBlockReader, as_events
from subvec._slab_records import FinalObsInBlock
from subvec._spaces import ObsSplit

__all__ = [
    "block_parts",
    "events_by_env",
    "final_event",
    "final_obs_parts",
    "obs_by_env",
    "reply_errors",
    "split_batch",
    "with_final_event",
    "with_final_obs",
]


def events_by_env(lo: int, reply: UnitReply | None) -> dict[int, list[dict[str, Any]]]:
    """The reply's info events by global env (a unit's first env is ``lo``), in order."""
    events: dict[int, list[dict[str, Any]]] = {}
    if reply is not None and reply.infos:
        for local, info in as_events(reply.infos):
            events.setdefault(lo + local, []).append(info)
    return events


def reply_errors(unit: Unit, reply: UnitReply | None) -> dict[int, BaseException]:
    """The errors of the reply's envs whose step raised, by global env: each rebuilt as the
    env raised it (its type kept, naming the env and the unit's pid)."""
    if reply is None or not reply.errors:
        return {}
    return {
        unit.lo + local: rebuild_remote_error(record, unit.pid) for local, record in reply.errors
    }


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


def with_final_event(
    events: list[dict[str, Any]], rows: np.ndarray, env: int
) -> list[dict[str, Any]]:
    """An ended env's info events (``events``, changed in place) with its final event first:
    the one the unit sent (a stand-in filled from the block's row), or a new one for the empty
    final info the unit left implicit."""
    if events and "final_obs" in events[0] and "final_info" in events[0]:
        final_event(events[0], rows, env)
    else:
        events.insert(0, final_event(None, rows, env))
    return events


def with_final_obs(
    parts: Sequence[tuple[int, Any]], units: Iterable[Unit], ended: Sequence[int], rows: np.ndarray
) -> list[tuple[int, Any]]:
    """A lock-step step's parts (``(first env, UnitReply or None)`` per unit) with the final
    event of each env in ``ended`` (sorted) in the place SyncVectorEnv gives it: after the
    events of the envs before it, before its own reset info."""
    sent = dict(parts)
    out: list[tuple[int, Any]] = []
    for unit in units:
        lo, hi = unit.lo, unit.hi
        data = sent.get(lo)
        mine = [e for e in ended if lo <= e < hi]
        if not mine:
            if data is not None:
                out.append((lo, data))
            continue
        by_env = events_by_env(lo, data)
        for env in mine:
            by_env[env] = with_final_event(by_env.get(env, []), rows, env)
        events = [(env - lo, info) for env in sorted(by_env) for info in by_env[env]]
        out.append((lo, UnitReply(events, data.obs if data is not None else None)))
    return out


def final_obs_parts(
    parts: Sequence[tuple[int, Any]],
    units: Iterable[Unit],
    ended: np.ndarray,
    restarted: np.ndarray | None,
    rows: np.ndarray,
) -> Sequence[tuple[int, Any]]:
    """SAME_STEP with final observations kept in the block: a lock-step step's parts with
    each ended env's final event (:func:`with_final_obs`). ``ended``: the envs that
    terminated or truncated (a new mask); ``restarted``: those a worker restart ended, which
    have no final observation (None: none)."""
    if restarted is not None:
        ended &= ~restarted
    envs = np.flatnonzero(ended).tolist()
    if not envs:
        return parts
    return with_final_obs(parts, units, envs, rows)


def block_parts(
    units: Iterable[Unit], info_units: Collection[int], info_block: InfoBlockReader | None
) -> list[tuple[int, Any]]:
    """The parts of those ``units`` that answered a step with a plain OK and left their
    infos in the block (as the columns they would have sent); ``info_units``: the indices of
    the units that write infos there."""
    if info_block is None:
        return []
    parts: list[tuple[int, Any]] = []
    for unit in units:
        if unit.index in info_units:
            columns = info_block.columns(unit)
            if columns is not None:
                parts.append((unit.lo, UnitReply(columns, None)))
    return parts


def split_batch(
    split: ObsSplit,
    env_obs: Sequence[Any],
    loose_out: Sequence[Any],
    fixed: list[np.ndarray],
    *,
    in_slot: bool,
    copy: bool,
) -> Any:
    """A split nest's batch: its fixed-size leaves from the block (``fixed``: views of the
    caller's observation slot when ``in_slot``, else copied with ``copy=True``) and its other
    leaves batched with gymnasium's ``concatenate`` from ``env_obs`` into ``loose_out`` (and
    deep-copied with ``copy=True``), as SyncVectorEnv batches the whole nest."""
    loose = split.loose_batches(env_obs, loose_out)
    if in_slot:
        fixed = [leaf.view() for leaf in fixed]
    elif copy:
        fixed = [leaf.copy() for leaf in fixed]
    if copy:
        loose = deepcopy(loose)
    return split.build(fixed, loose)
