"""The rows' infos of a multi-agent vector env: each agent's info on its row, ``active`` on
every row, and SAME_STEP's final observations per row (``subvec.multiagent``)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from subvec._front.merge import _add_info_legacy, _legacy_events, _Rows
from subvec._infos import merge_scalar_events
from subvec._spaces import map_leaves

__all__ = ["RowInfos", "row_of"]


def row_of(leaf: np.ndarray, row: int, copy: bool = False) -> Any:
    """Row ``row`` of ``leaf`` (a copy with ``copy``)."""
    return leaf[row].copy() if copy else leaf[row]


class RowInfos:
    """Lays the ParallelEnvs' per-agent infos out per row, in ``info_format``.

    Args:
        possible_agents: every env's possible agents; row ``i * A + j`` is agent ``j`` of env
            ``i``.
        info_format: ``"gymnasium"``, ``"list"`` or ``"legacy"``.
        num_rows: the vector env's rows (``n * A``).
    """

    def __init__(self, possible_agents: Sequence[str], info_format: str, num_rows: int) -> None:
        self.possible_agents = list(possible_agents)
        self.agents_per_env = len(self.possible_agents)
        self.info_format = info_format
        self.num_rows = num_rows
        self._add_row = _Rows(num_rows)._add_info

    def same_step_finals(
        self,
        finals: list[int],
        env_infos: Sequence[dict[str, Any]],
        row_obs: Any,
        rewards: np.ndarray,
        terms: np.ndarray,
        truncs: np.ndarray,
        events: list[tuple[int, dict[str, Any]]],
    ) -> list[tuple[int, dict[str, Any]]]:
        """SAME_STEP: an env that ended and reset reports its rows' last step (rewards and
        flags) from its final observation; every row that ended carries ``final_obs`` and
        ``final_info`` (a row whose agent left a running env: its observation, its info)."""
        a = self.agents_per_env
        by_row = dict(events)
        for i in finals:
            final = env_infos[i]["final_obs"]
            lo = i * a
            rewards[lo : lo + a] = final["reward"]
            terms[lo : lo + a] = final["terminated"]
            truncs[lo : lo + a] = final["truncated"]
        final_of = {i: env_infos[i] for i in finals}
        for r in np.flatnonzero(terms | truncs):
            i, j = divmod(int(r), a)
            agent = self.possible_agents[j]
            if i in final_of:
                info = final_of[i]
                last = map_leaves(partial(row_of, row=j), info["final_obs"]["obs"])
                last_info = dict(info.get("final_info", {}).get(agent, {}))
                row = dict(by_row.get(int(r), {}))
            else:
                last = map_leaves(partial(row_of, row=int(r), copy=True), row_obs)
                last_info = by_row.get(int(r), {})
                row = {}
            row["final_obs"] = last
            row["final_info"] = last_info
            by_row[int(r)] = row
        return sorted(by_row.items())

    def events(
        self, env_infos: Sequence[dict[str, Any]], only: np.ndarray | None
    ) -> list[tuple[int, dict[str, Any]]]:
        """``(row, info)`` for each agent that said something (env-major)."""
        events = []
        index = {agent: j for j, agent in enumerate(self.possible_agents)}
        a = self.agents_per_env
        for i, info in enumerate(env_infos):
            if not info or (only is not None and not only[i]):
                continue
            rows = [
                (i * a + index[agent], dict(value))
                for agent, value in info.items()
                if agent in index and isinstance(value, dict)
            ]
            events += sorted(rows, key=lambda e: e[0])
        return events

    def merge(
        self, events: list[tuple[int, dict[str, Any]]], active: np.ndarray, rows: int | None = None
    ) -> Any:
        """The rows' infos in ``info_format``, with ``"active"`` for every row (``rows``: all
        of them, or a recv's)."""
        rows = self.num_rows if rows is None else rows
        active = np.array(active, dtype=np.bool_)
        if self.info_format == "list":
            per_row: list[dict[str, Any]] = [{"active": bool(x)} for x in active]
            for r, info in events:
                per_row[r].update(info)
            return per_row
        infos: dict[str, Any] = {}
        if self.info_format == "legacy":
            for r, info in _legacy_events(events, 0):
                infos = _add_info_legacy(infos, info, r, rows)
        elif events:
            # scalar infos (the usual ones) a column at a time, as the core merges them
            merged = merge_scalar_events(events, rows)
            if merged is not None:
                infos = merged
            else:
                add_info = self._add_row if rows == self.num_rows else _Rows(rows)._add_info
                for r, info in events:
                    infos = add_info(infos, info, r)
        infos["active"] = active
        infos["_active"] = np.ones(rows, dtype=np.bool_)
        return infos
