"""Infos on the wire: scalar columns built in a worker and merged in the parent (in-process)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from subvec._infos import (
    MAX_INFO_KEYS,
    InfoBlockReader,
    InfoBlockWriter,
    InfoColumns,
    as_events,
    info_block_regions,
    merge_columns,
    to_columns,
)
from tests.helpers import assert_same


def _sync_merge(events: list[tuple[int, dict[str, Any]]], num_envs: int) -> dict[str, Any]:
    # gymnasium's own merge, as SyncVectorEnv applies it to every env's info in env order
    sync = SyncVectorEnv.__new__(SyncVectorEnv)
    sync.num_envs = num_envs
    merged: dict[str, Any] = {}
    for env, info in events:
        merged = sync._add_info(merged, info, env)
    return merged


def test_columns_keep_types_and_order_through_a_round_trip() -> None:
    events = [
        (0, {"b": np.float32(1.5), "a": 3}),
        (2, {"a": 4, "c": True, "b": np.float32(-2.0)}),
        (3, {"d": np.int64(7)}),
    ]
    columns = to_columns(events)
    assert isinstance(columns, InfoColumns)
    assert [key for key, *_ in columns] == ["b", "a", "c", "d"]
    back = as_events(columns)
    assert [env for env, _ in back] == [0, 2, 3]
    for (_, want), (_, got) in zip(events, back):
        assert set(got) == set(want)
        for key, value in want.items():
            assert_same(got[key], value, key)


@pytest.mark.parametrize(
    "bad",
    [{"x": np.zeros(2)}, {"x": {"nested": 1}}, {"x": np.bool_(True)}, {"x": 2**70}, {"x": "s"}],
    ids=["array", "dict", "numpy_bool", "huge_int", "str"],
)
def test_what_is_not_one_scalar_type_per_key_stays_events(bad: dict[str, Any]) -> None:
    assert to_columns([(0, {"x": 1.0}), (1, bad)]) is None
    assert to_columns([(0, {"x": 1}), (1, {"x": 1.0})]) is None  # the type changes
    assert to_columns([(0, {"x": 1.0}), (0, {"x": 2.0})]) is None  # one env twice


def test_merged_columns_equal_gymnasiums_merge() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        num_envs = int(rng.integers(2, 7))
        lo_split = int(rng.integers(1, num_envs))
        events = []
        for env in range(num_envs):
            info: dict[str, Any] = {}
            for key, make in (
                ("f64", lambda: np.float64(rng.random())),
                ("f32", lambda: np.float32(rng.random())),
                ("i", lambda: int(rng.integers(100))),
                ("flag", lambda: bool(rng.random() > 0.5)),
            ):
                if rng.random() < 0.7:
                    info[key] = make()
            if info:
                events.append((env, info))
        parts = [
            (0, to_columns([(e, i) for e, i in events if e < lo_split])),
            (lo_split, to_columns([(e - lo_split, i) for e, i in events if e >= lo_split])),
        ]
        merged = merge_columns([(lo, c) for lo, c in parts if c], num_envs)
        assert merged is not None
        assert_same(merged, _sync_merge(events, num_envs), "merge")
        for key in merged:
            assert merged[key].flags.writeable, key


def test_a_type_that_differs_between_workers_is_left_to_the_events() -> None:
    first, second = to_columns([(0, {"x": 1.0})]), to_columns([(0, {"x": 2})])
    assert first is not None and second is not None
    assert merge_columns([(0, first), (1, second)], 2) is None


# --- infos in the block ----------------------------------------------------------------------


def _block(num_envs: int, bounds: list[tuple[int, int]]) -> tuple[list[Any], InfoBlockReader]:
    """Plain arrays shaped as the block's info regions, a writer per worker and the reader."""
    views = {
        name: np.zeros(shape, dtype=dtype)
        for name, dtype, shape in info_block_regions(num_envs, len(bounds))
    }
    workers = [
        SimpleNamespace(index=i, lo=lo, hi=hi, writer=InfoBlockWriter(views, i, lo, hi))
        for i, (lo, hi) in enumerate(bounds)
    ]
    return workers, InfoBlockReader(views, num_envs)


def _steady_events(rng: np.random.Generator, num_envs: int) -> list[tuple[int, dict[str, Any]]]:
    events = []
    for env in range(num_envs):
        u = float(rng.random())
        # numpy and Python scalars of every size the cells hold
        info = {
            "f64": np.float64(u),
            "f32": np.float32(-u),
            "i": int(u * 1000) - 500,
            "i8": np.int8(int(u * 100)),
            "u16": np.uint16(int(u * 60000)),
            "flag": u > 0.5,
            "speed": u * 3.0,
        }
        events.append((env, info))
    return events


def test_block_infos_equal_gymnasiums_merge() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        num_envs = int(rng.integers(2, 8))
        split = int(rng.integers(1, num_envs))
        workers, reader = _block(num_envs, [(0, split), (split, num_envs)])
        events = _steady_events(rng, num_envs)
        for w in workers:
            mine = [(env - w.lo, info) for env, info in events if w.lo <= env < w.hi]
            assert w.writer.put(mine)
        assert reader.flagged()
        want = _sync_merge(events, num_envs)
        merged = reader.merged(workers)
        assert merged is not None
        assert_same(merged, want, "merged")
        assert list(merged) == list(want)  # keys, then masks, in Sync's order
        for key in merged:
            assert merged[key].flags.writeable and merged[key].flags.c_contiguous, key
        # One worker's infos in the block, the other's sent: the columns merge as Sync's.
        columns = [(w.lo, reader.columns(w)) for w in workers]
        assert_same(merge_columns(columns, num_envs), want, "columns")


@pytest.mark.parametrize(
    "odd",
    ["missing_env", "extra_key", "missing_key", "type_change", "huge_int", "array", "numpy_bool"],
)
def test_what_the_block_cannot_hold_clears_the_flag(odd: str) -> None:
    workers, reader = _block(3, [(0, 3)])
    (worker,) = workers
    rng = np.random.default_rng(0)
    assert worker.writer.put(_steady_events(rng, 3))
    assert reader.merged(workers) is not None
    events = _steady_events(rng, 3)
    info = events[1][1]
    if odd == "missing_env":
        del events[1]
    elif odd == "extra_key":
        info["bonus"] = 1.0
    elif odd == "missing_key":
        del info["f32"]
    elif odd == "type_change":
        info["speed"] = 2  # an int where env 0 has a float: Sync's merge decides
    elif odd == "huge_int":
        info["i"] = 2**70
    elif odd == "array":
        info["f64"] = np.zeros(2)
    else:
        info["flag"] = np.bool_(True)  # not a number: the events keep it as it is
    assert not worker.writer.put(events)
    assert not reader.flagged() and reader.merged(workers) is None
    assert reader.columns(worker) is None


def test_an_env_with_its_keys_in_another_order_is_sent() -> None:
    # Each env's own key order matters to info_format="list" (and env 0's to the merge).
    workers, reader = _block(3, [(0, 3)])
    steady = [(0, {"a": 1.0, "b": 2}), (1, {"a": 4.0, "b": 3}), (2, {"a": 5.0, "b": 6})]
    assert workers[0].writer.put(steady)
    merged = reader.merged(workers)
    assert merged is not None and list(merged) == ["a", "_a", "b", "_b"]
    reordered = [steady[0], (1, {"b": 3, "a": 4.0}), steady[2]]
    assert not workers[0].writer.put(reordered)
    assert not reader.flagged()


def test_schema_changes_and_a_replaced_worker_are_followed() -> None:
    views = {name: np.zeros(shape, dtype=dtype) for name, dtype, shape in info_block_regions(2, 1)}
    reader = InfoBlockReader(views, 2)
    a = [(0, {"x": 1.0}), (1, {"x": 2.0})]
    b = [(0, {"y": np.int32(3), "x": 4.0}), (1, {"y": np.int32(5), "x": 6.0})]
    first = SimpleNamespace(index=0, lo=0, hi=2, writer=InfoBlockWriter(views, 0, 0, 2))
    assert first.writer.put(a)
    assert_same(reader.merged([first]), _sync_merge(a, 2), "the first schema")
    # A restarted worker's first schema has the version its predecessor's first had: the
    # reader must not take it for the one it knew.
    second = SimpleNamespace(index=0, lo=0, hi=2, writer=InfoBlockWriter(views, 0, 0, 2))
    assert not reader.flagged()  # a new writer starts with its flag clear
    for events in (b, a, b):
        assert second.writer.put(events)
        assert_same(reader.merged([second]), _sync_merge(events, 2), "after a change")
    # No infos at all: the flag is cleared and the step says nothing.
    assert second.writer.put([]) and not reader.flagged()


def test_more_keys_than_the_block_has_slots_are_sent() -> None:
    workers, reader = _block(2, [(0, 2)])
    info = {f"k{j}": float(j) for j in range(MAX_INFO_KEYS + 1)}
    assert not workers[0].writer.put([(0, info), (1, dict(info))])
    assert not reader.flagged()


def test_a_key_pickle_refuses_is_sent() -> None:
    # The schema is pickled; a key only cloudpickle can send must leave the infos to the reply
    # instead of failing the step.
    workers, reader = _block(2, [(0, 2)])

    def key() -> None:
        return None

    assert not workers[0].writer.put([(0, {key: 1.0}), (1, {key: 2.0})])
    assert not reader.flagged()
