"""subvec._spaces in-process: which spaces share memory, their leaves, and the readers and
writers of one env's row, against gymnasium's own batching (create_empty_array, iterate)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from subvec._spaces import (
    BY_VALUE,
    LeafSpec,
    ObservationShapeError,
    ObsSplit,
    batch_setter,
    build_views,
    is_shareable,
    leaf_specs,
    leaves_of,
    map_leaves,
    nest_leaves,
    row_reader,
    row_writer,
)
from tests.envs import CounterSpace, space_zoo
from tests.helpers import assert_same

N = 3
BOX = spaces.Box(0, 9, shape=(2,), dtype=np.float32)
NEST = spaces.Dict(
    {
        "pos": BOX,
        "flag": spaces.Discrete(2),
        "inner": spaces.Tuple((spaces.MultiBinary(3), spaces.Box(0, 5, (2,), np.uint8))),
    }
)
SHAREABLE = {
    "box": BOX,
    "box_scalar": spaces.Box(-1.0, 1.0, shape=(), dtype=np.float64),
    "box_u8_image": spaces.Box(0, 255, shape=(4, 3, 3), dtype=np.uint8),
    "box_bool": spaces.Box(0, 1, shape=(4,), dtype=np.bool_),
    "discrete": spaces.Discrete(5, start=-2),
    "multidiscrete": spaces.MultiDiscrete([[3, 4], [5, 2]]),
    "multibinary": spaces.MultiBinary([2, 3]),
    "dict": NEST,
    "tuple": spaces.Tuple((spaces.Discrete(4), spaces.Dict({"a": BOX}))),
}


def _batch(space: spaces.Space[Any]) -> Any:
    return create_empty_array(space, N)


# --- is_shareable, leaf_specs, build_views ------------------------------------------------


@pytest.mark.parametrize("name", list(SHAREABLE))
def test_fixed_size_spaces_are_shareable(name: str) -> None:
    assert is_shareable(SHAREABLE[name])


UNSHAREABLE: dict[str, spaces.Space[Any]] = {
    "text": spaces.Text(max_length=4),
    "sequence": spaces.Sequence(BOX),
    "graph": spaces.Graph(node_space=BOX, edge_space=spaces.Discrete(3)),
    "custom": CounterSpace(),
    "dict_with_text": spaces.Dict({"x": BOX, "t": spaces.Text(max_length=4)}),
    "deep_sequence": spaces.Tuple((BOX, spaces.Tuple((spaces.Discrete(2), spaces.Sequence(BOX))))),
}
if hasattr(spaces, "OneOf"):  # gymnasium 1.0 and later
    UNSHAREABLE["oneof"] = spaces.OneOf((spaces.Discrete(2), BOX))


@pytest.mark.parametrize("name", list(UNSHAREABLE))
def test_spaces_without_a_fixed_layout_are_not_shareable(name: str) -> None:
    space = UNSHAREABLE[name]
    assert not is_shareable(space)
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        with pytest.raises(TypeError, match="cannot be shared"):
            leaf_specs(space)


def test_a_subclass_of_a_fixed_size_space_is_shareable() -> None:
    class Clipped(spaces.Box):
        def sample(self, mask: Any = None, probability: Any = None) -> Any:
            return np.clip(super().sample(), 1, 2)

    assert is_shareable(Clipped(0, 9, (2,), np.float32))
    assert is_shareable(spaces.Dict({"c": Clipped(0, 9, (2,), np.float32)}))


def test_the_zoo_shares_exactly_its_fixed_size_spaces() -> None:
    unshared = {"text", "sequence", "graph", "dict_with_text", "cameras_text", "custom"}
    split = {"dict_with_text", "cameras_text"}  # nests of both kinds of leaves
    for name, space in space_zoo().items():
        assert is_shareable(space) is (name not in unshared), name
        assert ObsSplit.applies(space) is (name in split), name


def test_leaf_specs_walk_the_nest_depth_first() -> None:
    # gymnasium sorts a Dict's keys: flag, inner, pos
    assert leaf_specs(NEST) == [
        LeafSpec(("flag",), np.dtype(np.int64), ()),
        LeafSpec(("inner", 0), np.dtype(np.int8), (3,)),
        LeafSpec(("inner", 1), np.dtype(np.uint8), (2,)),
        LeafSpec(("pos",), np.dtype(np.float32), (2,)),
    ]
    assert leaf_specs(spaces.MultiDiscrete([[3, 4], [5, 2]])) == [
        LeafSpec((), np.dtype(np.int64), (2, 2))
    ]
    assert leaf_specs(spaces.MultiBinary([2, 3]))[0].nbytes(5) == 5 * 6
    assert LeafSpec((), np.dtype(np.float64), (4, 3)).nbytes(2) == 2 * 8 * 12
    assert LeafSpec((), np.dtype(np.float32), ()).nbytes(7) == 28


@pytest.mark.parametrize("name", list(SHAREABLE))
def test_leaves_match_gymnasiums_batch_and_build_views_rebuilds_it(name: str) -> None:
    space = SHAREABLE[name]
    want = _batch(space)
    leaves = [np.zeros((N, *spec.shape), dtype=spec.dtype) for spec in leaf_specs(space)]
    views = build_views(space, iter(leaves))
    assert_same(views, want)  # same nest, same dtypes and shapes
    # the views are the leaf arrays themselves, in leaf_specs order
    flat: list[np.ndarray] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, tuple):
            for v in x:
                walk(v)
        else:
            flat.append(x)

    walk(views)
    assert len(flat) == len(leaves) and all(a is b for a, b in zip(flat, leaves))


# --- leaves_of, map_leaves, nest_leaves ----------------------------------------------------


@pytest.mark.parametrize("name", list(SHAREABLE))
def test_the_walkers_list_a_batch_in_leaf_specs_order(name: str) -> None:
    space = SHAREABLE[name]
    leaves = [
        np.full((N, *spec.shape), k, dtype=spec.dtype) for k, spec in enumerate(leaf_specs(space))
    ]
    batch = build_views(space, iter(leaves))
    walked = list(leaves_of(space, batch))
    assert [path for path, _, _ in walked] == [spec.path for spec in leaf_specs(space)]
    assert all(got is want for (_, _, got), want in zip(walked, leaves))
    assert all(got is want for got, want in zip(nest_leaves(batch), leaves))
    # map_leaves keeps the nest as gymnasium builds it (its dict type too): rows 2 and 0
    # taken leaf by leaf are gymnasium's batch of those two envs' values
    rows = map_leaves(lambda leaf: leaf[[2, 0]], batch)
    per_env = list(iterate(batch_space(space, N), batch))
    assert_same(rows, concatenate(space, [per_env[2], per_env[0]], create_empty_array(space, 2)))
    assert type(rows) is type(batch)


def test_leaves_of_names_where_a_nest_does_not_fit_its_space() -> None:
    good = {"pos": 1, "flag": 2, "inner": (3, 4)}
    assert [v for _, _, v in leaves_of(NEST, good)] == [2, 3, 4, 1]
    cases = [
        (
            [1, 2],
            TypeError,
            r"^actions: expected a dict with keys \['flag', 'inner', 'pos'\], got list$",
        ),
        ({"pos": 1, "inner": (3, 4)}, ValueError, r"^actions: missing key 'flag'$"),
        (
            {**good, "inner": 3},
            TypeError,
            r"^actions\['inner'\]: expected a tuple of 2 items, got int$",
        ),
        (
            {**good, "inner": (3,)},
            ValueError,
            r"^actions\['inner'\]: expected a tuple of 2 items, got 1$",
        ),
    ]
    for value, error, match in cases:
        with pytest.raises(error, match=match):
            list(leaves_of(NEST, value))
    with pytest.raises(ValueError, match=r"^actions\[4\]: missing key 'flag'$"):
        list(leaves_of(NEST, {"pos": 1}, "actions[4]"))
    # extra keys are passed over (as gymnasium's iterate does), a list stands for a tuple
    assert [v for _, _, v in leaves_of(NEST, {**good, "inner": [3, 4], "x": 9})] == [2, 3, 4, 1]


# --- row_writer and row_reader ------------------------------------------------------------


@pytest.mark.parametrize("name", list(SHAREABLE))
def test_rows_round_trip_as_gymnasium_batches_and_iterates(name: str) -> None:
    space = SHAREABLE[name]
    space.seed(4)
    samples = [space.sample() for _ in range(N)]
    batch = _batch(space)
    write = row_writer(space, batch)
    for row in (2, 0, 1):
        write(samples[row], row)
    assert_same(batch, concatenate(space, samples, _batch(space)))
    read = row_reader(space, batch)
    # each env's row in the form SyncVectorEnv hands its env an action
    for row, want in enumerate(iterate(batch_space(space, N), batch)):
        assert_same(read(row), want, f"row {row}")


def test_a_read_row_is_a_copy() -> None:
    batch = _batch(NEST)
    row_writer(NEST, batch)(NEST.sample(), 1)
    got = row_reader(NEST, batch)(1)
    got["pos"][:] = 7.0
    got["inner"][0][:] = 0
    assert not (batch["pos"][1] == 7.0).all()
    assert got["pos"].base is None


def test_the_row_writer_casts_like_sync_and_refuses_other_shapes() -> None:
    batch = _batch(BOX)
    write = row_writer(BOX, batch, env_offset=10)
    write(np.array([1.5, 2.5], dtype=np.float64), 0)  # same kind: cast as np.stack would
    write([3, 4], 1)  # a list of ints
    assert batch.dtype == np.float32 and batch[:2].tolist() == [[1.5, 2.5], [3.0, 4.0]]
    with pytest.raises(ObservationShapeError, match=r"env 12: observation has shape \(3,\)"):
        write(np.zeros(3, dtype=np.float32), 2)
    with pytest.raises(ObservationShapeError, match=r"env 12: .*shape \(1, 2\)"):
        write(np.zeros((1, 2), dtype=np.float32), 2)  # np.copyto would broadcast it
    with pytest.raises(TypeError, match=r"env 11: observation of dtype complex128 cannot"):
        write(np.zeros(2, dtype=np.complex128), 1)
    assert batch[2].tolist() == [0.0, 0.0]
    ints = _batch(spaces.Discrete(4))
    with pytest.raises(TypeError, match="float64 cannot be cast"):
        row_writer(spaces.Discrete(4), ints)(1.5, 0)


def test_the_row_writer_names_the_leaf_in_a_nest() -> None:
    batch = _batch(NEST)
    write = row_writer(NEST, batch, env_offset=3)
    good = NEST.sample()
    bad = {**good, "inner": (good["inner"][0], np.zeros(5, dtype=np.uint8))}
    with pytest.raises(ObservationShapeError, match=r"env 4: observation\['inner'\]\[1\]"):
        write(bad, 1)
    with pytest.raises(ObservationShapeError, match=r"\['inner'\] has 1 elements, expected 2"):
        write({**good, "inner": (good["inner"][0],)}, 1)


def test_a_zero_dimensional_leaf_is_written_in_place() -> None:
    space = spaces.Box(-1.0, 1.0, shape=(), dtype=np.float32)
    batch = _batch(space)
    write = row_writer(space, batch)
    write(np.float64(0.25), 1)  # a cast: goes through copyto on a 0-d view
    write(np.array(0.5, dtype=np.float32), 2)
    assert batch.tolist() == [0.0, 0.25, 0.5]
    with pytest.raises(ObservationShapeError):
        write(np.zeros(1, dtype=np.float32), 0)


# --- batch_setter -------------------------------------------------------------------------


class _Views:
    """The block's action leaves as ``batch_setter`` sees them: one array per leaf and dtype
    (native numeric dtypes of up to 8 bytes, as the block holds them), made on demand."""

    def __init__(self, space: spaces.Space[Any]) -> None:
        self.leaves = leaf_specs(space)
        self.arrays: dict[tuple[int, str], np.ndarray] = {}

    def __call__(self, k: int, dtype: np.dtype[Any]) -> np.ndarray | None:
        if dtype.kind not in "biufc" or dtype.itemsize > 8 or not dtype.isnative:
            return None
        key = (k, dtype.str)
        if key not in self.arrays:
            self.arrays[key] = np.zeros((N, *self.leaves[k].shape), dtype=dtype)
        return self.arrays[key]

    def default(self, k: int) -> np.ndarray:
        view = self(k, self.leaves[k].dtype)
        assert view is not None
        return view


def test_batch_setter_stores_valid_batches_in_their_own_dtype() -> None:
    views = _Views(NEST)
    store = batch_setter(NEST, views, N)
    actions = batch_space(NEST, N).sample()
    assert store(actions) is None  # every leaf in the space's dtype: a plain STEP
    stored = [views.default(k) for k in range(len(views.leaves))]
    assert_same(stored, [v for v in _leaf_values(NEST, actions)])
    # a float64 batch for the float32 leaf is kept as float64 (the dtypes travel with STEP)
    odd = {**actions, "pos": np.full((N, 2), 0.1, dtype=np.float64)}
    dtypes = store(odd)
    pos = [leaf.path for leaf in views.leaves].index(("pos",))
    assert dtypes is not None and dtypes[pos] == np.dtype(np.float64).str
    assert views(pos, np.dtype(np.float64)).tobytes() == odd["pos"].tobytes()
    # a list leaf: the batch travels by value and nothing is written
    flag = [leaf.path for leaf in views.leaves].index(("flag",))
    before = views.default(flag).copy()
    assert store({**actions, "flag": [1 - int(f) for f in actions["flag"]]}) is BY_VALUE
    assert_same(views.default(flag), before)


def _leaf_values(space: spaces.Space[Any], actions: Any) -> list[np.ndarray]:
    if isinstance(space, spaces.Dict):
        return [v for key, sub in space.spaces.items() for v in _leaf_values(sub, actions[key])]
    if isinstance(space, spaces.Tuple):
        return [v for i, sub in enumerate(space.spaces) for v in _leaf_values(sub, actions[i])]
    return [actions]


def test_batch_setter_of_one_leaf_copies_an_exact_array_and_checks_the_rest() -> None:
    space = spaces.Discrete(4)
    views = _Views(space)
    store = batch_setter(space, views, N)
    assert store(np.array([3, 2, 1])) is None
    assert views.default(0).tolist() == [3, 2, 1]
    assert store(np.array([1, 1, 1], dtype=np.int32)) == (np.dtype(np.int32).str,)
    assert views(0, np.dtype(np.int32)).tolist() == [1, 1, 1]
    assert store([0, 1, 2]) is BY_VALUE
    with pytest.raises(ValueError, match=r"expected a batch of 3 actions \(shape \(3,\)\), got 2"):
        store(np.array([1, 2]))
    with pytest.raises(TypeError, match="got a 0-d array"):
        store(np.array(1))
    assert store(np.array([1, 2, 3], dtype=">i8")) is BY_VALUE  # not a dtype the block holds
    assert views.default(0).tolist() == [3, 2, 1]


@pytest.mark.parametrize(
    ("actions", "error", "match"),
    [
        (lambda a: [a["flag"], a["inner"], a["pos"]], TypeError, "expected a dict with keys"),
        (lambda a: {"flag": a["flag"], "pos": a["pos"]}, ValueError, "missing key 'inner'"),
        (
            lambda a: {**a, "inner": a["inner"][:1]},
            ValueError,
            r"actions\['inner'\]: expected a tuple of 2 items, got 1",
        ),
        (
            lambda a: {**a, "pos": a["pos"][:2]},
            ValueError,
            r"actions\['pos'\]: expected a batch of 3 actions",
        ),
        (
            lambda a: {**a, "pos": a["pos"][:, :1]},
            ValueError,
            r"actions\['pos'\]: expected shape \(3, 2\), got \(3, 1\)",
        ),
        (
            lambda a: {**a, "pos": np.zeros(3, dtype=np.float32)},
            ValueError,
            r"actions\['pos'\]: expected shape \(3, 2\), got \(3,\)",
        ),
    ],
    ids=["not_a_dict", "missing_key", "short_tuple", "short_batch", "bad_shape", "flat"],
)
def test_batch_setter_validates_every_leaf_before_writing_any(
    actions: Any, error: type[Exception], match: str
) -> None:
    views = _Views(NEST)
    store = batch_setter(NEST, views, N)
    before = batch_space(NEST, N).sample()
    store(before)
    good = batch_space(NEST, N).sample()
    good["flag"] = 1 - before["flag"]  # every leaf differs from what is stored
    good["pos"] = before["pos"] + 1.0
    good["inner"] = (1 - before["inner"][0], before["inner"][1] + 1)
    with pytest.raises(error, match=match):
        store(actions(good))
    stored = [views.default(k) for k in range(len(views.leaves))]
    assert_same(stored, _leaf_values(NEST, before))  # no leaf was written, not even the first


MIXED = spaces.Dict(
    {
        "cam": spaces.Box(0, 255, (4, 3, 3), np.uint8),
        "task": spaces.Text(max_length=8),
        "arm": spaces.Tuple(
            (
                spaces.Box(-1.0, 1.0, (2,), np.float32),
                spaces.Sequence(spaces.Discrete(3)),
                spaces.Discrete(4),
            )
        ),
    }
)


def test_a_split_nest_writes_its_fixed_leaves_and_returns_the_others() -> None:
    split = ObsSplit(MIXED)
    # depth-first, gymnasium's sorted keys: arm (0, 1, 2), cam, task
    assert [leaf.path for leaf in split.fixed] == [("arm", 0), ("arm", 2), ("cam",)]
    assert split.loose == [MIXED["arm"][1], MIXED["task"]]
    rows = [np.zeros((N, *leaf.shape), dtype=leaf.dtype) for leaf in split.fixed]
    write = split.writer(rows)
    MIXED.seed(0)
    samples = [MIXED.sample() for _ in range(N)]
    loose = [write(obs, i) for i, obs in enumerate(samples)]
    assert loose == [(obs["arm"][1], obs["task"]) for obs in samples]
    # the fixed rows and the other leaves batched make exactly gymnasium's batch of the nest
    want = concatenate(MIXED, samples, create_empty_array(MIXED, N))
    got = split.build(rows, split.loose_batches(loose, split.empty_loose(N)))
    assert_same(got, want)


def test_a_split_nest_checks_its_fixed_leaves_like_a_row_writer() -> None:
    split = ObsSplit(MIXED)
    write = split.writer(
        [np.zeros((N, *leaf.shape), dtype=leaf.dtype) for leaf in split.fixed], env_offset=5
    )
    obs = MIXED.sample()
    obs["cam"] = np.zeros((4, 3), np.uint8)
    with pytest.raises(ObservationShapeError, match=r"env 6: observation\['cam'\] has shape"):
        write(obs, 1)
