"""Infos on the wire: scalar columns built in a worker and merged in the parent (in-process)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from subvec._infos import InfoColumns, as_events, merge_columns, to_columns
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
