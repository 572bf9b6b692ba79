"""One info merger per ``info_format``, chosen when the vector env is built.

A merger turns the infos of one call into what the caller sees, exactly as SyncVectorEnv (or
gymnasium 0.29, for ``"legacy"``) would have built them. Its input is the call's *parts*:
``(first env index, (infos, observations) or None)`` per unit that said something, in env
order, where ``infos`` are a unit's events ``(local env, info)`` or its :class:`InfoColumns`;
and the envs a worker restart cut short, which report ``worker_restarted``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from subvec._compat import add_info
from subvec._infos import InfoColumns, as_events, merge_columns, merge_scalar_events

__all__ = [
    "GymnasiumInfos",
    "InfoMerger",
    "LegacyInfos",
    "ListInfos",
    "Part",
    "make_merger",
    "merge_chunk_infos",
    "with_chunk_axis",
]

#: (first env index of a unit, what it said beyond the batch arrays: a step's or a reset's
#: :class:`UnitReply`, a call's results, or None)
Part = tuple[int, Any]
#: gymnasium's ``VectorEnv._add_info`` (as 1.1+ defines it), bound to a vector env
AddInfo = Callable[[dict[str, Any], dict[str, Any], int], dict[str, Any]]


class _Rows:
    """Stands for a vector env of ``num_envs`` rows in gymnasium's ``_add_info``. A merger
    binds that to this, never to the vector env that keeps the merger: the env would then be
    in a reference cycle and wait for the cycle collector to be freed, its workers or actors
    with it."""

    _add_info = add_info

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


class InfoMerger(ABC):
    """Merge the parts of a call into the infos the caller gets."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs

    @abstractmethod
    def merge(self, parts: Sequence[Part], restarted: Sequence[int]) -> Any:
        """The infos of one call.

        Args:
            parts: the units' parts, in env order.
            restarted: the envs a worker restart ended, in order.

        Returns:
            The infos in this merger's format.
        """


class GymnasiumInfos(InfoMerger):
    """gymnasium 1.x: one dict, each key an array over the envs with its ``_key`` mask."""

    def __init__(self, num_envs: int, add_info: AddInfo) -> None:
        super().__init__(num_envs)
        self._add_info = add_info

    def merge(self, parts: Sequence[Part], restarted: Sequence[int]) -> dict[str, Any]:
        if not parts and not restarted:
            return {}  # the usual cheap-env step: no env said anything
        sent = [(lo, data.infos) for lo, data in parts if data is not None]
        if not restarted and all(type(infos) is InfoColumns for _, infos in sent):
            merged = merge_columns(sent, self.num_envs)  # the workers' scalar infos
            if merged is not None:
                return merged
        events = [(lo + local, info) for lo, infos in sent for local, info in as_events(infos)]
        events += [(i, {"worker_restarted": True}) for i in restarted]
        scalar = merge_scalar_events(events, self.num_envs)
        if scalar is not None:
            return scalar
        infos: dict[str, Any] = {}
        for env_index, info in events:
            try:
                infos = self._add_info(infos, info, env_index)
            except OverflowError as exc:
                raise _overflow(infos, info, env_index, "gymnasium's merge") from exc
        return infos


class ListInfos(InfoMerger):
    """One dict per env (what Stable-Baselines3 expects)."""

    def merge(self, parts: Sequence[Part], restarted: Sequence[int]) -> list[dict[str, Any]]:
        per_env: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for lo, data in parts:
            for local, info in as_events(data.infos) if data is not None else ():
                per_env[lo + local].update(info)
        for i in restarted:
            per_env[i]["worker_restarted"] = True
        return per_env


class LegacyInfos(InfoMerger):
    """gymnasium 0.29: ``final_observation``/``final_info`` object arrays, no recursion."""

    def merge(self, parts: Sequence[Part], restarted: Sequence[int]) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        if not parts and not restarted:
            return infos
        for lo, data in parts:
            if data is not None:
                for env_index, info in _legacy_events(as_events(data.infos), lo):
                    try:
                        infos = _add_info_legacy(infos, info, env_index, self.num_envs)
                    except OverflowError as exc:
                        raise _overflow(infos, info, env_index, "gymnasium 0.29's merge") from exc
        for i in restarted:
            infos = _add_info_legacy(infos, {"worker_restarted": True}, i, self.num_envs)
        return infos


def make_merger(info_format: str, num_envs: int) -> InfoMerger:
    """The merger for ``info_format`` ("gymnasium", "list" or "legacy") over ``num_envs``."""
    if info_format == "list":
        return ListInfos(num_envs)
    if info_format == "legacy":
        return LegacyInfos(num_envs)
    return GymnasiumInfos(num_envs, _Rows(num_envs)._add_info)


def merge_chunk_infos(
    info_format: str,
    events: Sequence[tuple[int, int, dict[str, Any]]],
    num_envs: int,
    chunk: int,
    steps: np.ndarray,
) -> Any:
    """The infos of an action chunk: each sub-step's infos as that ``step()`` would have
    merged them, with the chunk axis after the env axis.

    gymnasium and legacy: every array (and its ``_key`` mask) gains the chunk axis, shape
    ``(num_envs, chunk, ...)``: the merge runs over ``num_envs * chunk`` rows, row ``i *
    chunk + k`` being env i's sub-step k, with the format's own rules (an array's dtype is
    that of the first value of its key in env-major order), then each array is reshaped.
    list: one dict per env, ``{"chunk_steps": s, "infos": [one dict per executed
    sub-step]}``. gymnasium and legacy add ``chunk_steps``, the ``(num_envs,)`` executed
    counts.

    Args:
        info_format: "gymnasium", "legacy" or "list".
        events: ``(env, sub-step, info)``, env-major, sub-steps in order.
        num_envs: envs in the vector env.
        chunk: K.
        steps: the sub-steps each env executed.
    """
    if not events and info_format != "list":  # the usual chunk of a cheap env
        return {"chunk_steps": np.asarray(steps, dtype=np.int64).copy()}
    if info_format == "list":
        per_env: list[dict[str, Any]] = [
            {"chunk_steps": int(s), "infos": [{} for _ in range(int(s))]} for s in steps
        ]
        for i, k, info in events:
            sub = per_env[i]["infos"]
            if k >= len(sub):  # a frozen env's event, at sub-step 0 of none executed
                sub.extend({} for _ in range(k + 1 - len(sub)))
            sub[k].update(info)
        return per_env
    rows = num_envs * chunk
    infos: dict[str, Any] = {}
    if info_format == "legacy":
        flat = [(i * chunk + k, info) for i, k, info in events]
        for row, info in _legacy_events(flat, 0):
            infos = _add_info_legacy(infos, info, row, rows)
    else:
        add_info = _Rows(rows)._add_info
        for i, k, info in events:
            try:
                infos = add_info(infos, info, i * chunk + k)
            except OverflowError as exc:
                raise _overflow(infos, info, i, "gymnasium's merge") from exc
    infos = with_chunk_axis(infos, num_envs, chunk)
    infos["chunk_steps"] = np.asarray(steps, dtype=np.int64).copy()
    return infos


def with_chunk_axis(infos: dict[str, Any], num_envs: int, chunk: int) -> dict[str, Any]:
    """``infos`` merged over ``num_envs * chunk`` rows (gymnasium or legacy format) with
    every array and mask reshaped ``(num_envs, chunk, ...)``."""
    return {
        key: with_chunk_axis(value, num_envs, chunk)
        if isinstance(value, dict)
        else value.reshape(num_envs, chunk, *value.shape[1:])
        for key, value in infos.items()
    }


def _legacy_events(
    events: Sequence[tuple[int, dict[str, Any]]], lo: int
) -> list[tuple[int, dict[str, Any]]]:
    """Fold same-step events of one env into the gymnasium 0.29 shape: the reset info plus
    ``final_observation`` and ``final_info`` of the episode that just ended."""
    folded: dict[int, dict[str, Any]] = {}
    for local, info in events:
        entry = folded.setdefault(local, {})
        if "final_obs" in info and "final_info" in info and "_final" not in entry:
            entry["_final"] = (info["final_obs"], info["final_info"])
        else:
            entry.update(info)
    out = []
    for local, entry in folded.items():
        final = entry.pop("_final", None)
        if final is not None:
            entry["final_observation"], entry["final_info"] = final
        out.append((lo + local, entry))
    return out


def _add_info_legacy(
    infos: dict[str, Any], info: dict[str, Any], env_index: int, num_envs: int
) -> dict[str, Any]:
    """gymnasium 0.29's info layout: numbers in typed arrays, anything else (dicts, arrays,
    observations) in object arrays, each key with a boolean ``_key`` mask; no recursion."""
    for key, value in info.items():
        if key not in infos:
            if type(value) in (int, float, bool) or isinstance(value, np.number):
                infos[key] = np.zeros(num_envs, dtype=type(value))
            else:
                infos[key] = np.full(num_envs, None, dtype=object)
            infos[f"_{key}"] = np.zeros(num_envs, dtype=np.bool_)
        infos[key][env_index] = value
        infos[f"_{key}"][env_index] = True
    return infos


def _overflow(
    infos: dict[str, Any], info: dict[str, Any], env_index: int, merge: str
) -> OverflowError:
    """The error for an int that the typed array of its key cannot hold (``2**70`` in an
    int64 array): gymnasium's merge, and so SyncVectorEnv, raise a bare ``OverflowError``
    there; this one names the env, the key and the array."""
    found = _overflowing(infos, info, ())
    if found is None:  # not an int of ours: say what we know
        return OverflowError(f"env {env_index}: an info value does not fit {merge}'s arrays")
    path, value, dtype = found
    key = " -> ".join(repr(k) for k in path)
    return OverflowError(
        f"env {env_index}: info {key} = {value!r} does not fit the {dtype} array that {merge} "
        "stores this key in (SyncVectorEnv raises a bare OverflowError here); report it as a "
        "float or a str, or use info_format='list'"
    )


def _overflowing(
    infos: dict[str, Any], info: dict[str, Any], path: tuple[Any, ...]
) -> tuple[tuple[Any, ...], int, np.dtype[Any]] | None:
    """The first int of ``info`` (nested dicts included) that the array its key goes to (the
    one in ``infos``, or a new one of the value's own type) cannot hold."""
    for key, value in info.items():
        if key == "final_obs":
            continue
        target = infos.get(key) if isinstance(infos, dict) else None
        if isinstance(value, dict):
            inner = _overflowing(target if isinstance(target, dict) else {}, value, (*path, key))
            if inner is not None:
                return inner
            continue
        if type(value) is not int:
            continue
        dtype = target.dtype if isinstance(target, np.ndarray) else np.dtype(int)
        if dtype.kind in "iu" and not np.iinfo(dtype).min <= value <= np.iinfo(dtype).max:
            return (*path, key), value, dtype
    return None
