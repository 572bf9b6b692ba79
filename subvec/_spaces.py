"""Space -> shared-memory layout, and the per-space readers and writers built on it.

Every nest is walked here, in one order (Dict keys, then Tuple items, depth first): a space's
leaves by :func:`walk`, a value along its space, checked, by :func:`leaves_of`, a value's own
dicts and tuples (a batch, a row) by :func:`map_leaves` and :func:`nest_leaves`. Whether a leaf
is fixed-size is one registered function per space type (``functools.singledispatch``), so
supporting a new fixed-size space is one registration, not a branch.

Fixed-size spaces (Box of any dtype, Discrete, MultiDiscrete, MultiBinary, and Dict/Tuple
nests of them) live in shared memory. Anything else (Text, Sequence, Graph, OneOf, custom
spaces) is *not shareable* and travels pickled over the pipe; it is never silently zeroed.

A Dict/Tuple nest that mixes both kinds is *split* (:class:`ObsSplit`): its fixed-size leaves
live in shared memory and only the others travel by value.

Leaves are laid out leaf-major: each leaf is one contiguous ``(num_envs, *shape)`` array, so the
batch the parent returns is a plain view of the block (zero copies with ``copy=False``).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array, iterate

from subvec._compat import BatchDict
from subvec._tensors import tensor_as_array

__all__ = [
    "BY_VALUE",
    "LeafSpec",
    "ObsSplit",
    "Stored",
    "batch_setter",
    "build_views",
    "check_batch_layout",
    "filled",
    "fixed_leaves",
    "is_shareable",
    "leaf_specs",
    "leaves_of",
    "map_leaves",
    "nest_leaves",
    "path_text",
    "row_reader",
    "row_writer",
    "walk",
    "without_tensors",
]


@dataclass(frozen=True)
class LeafSpec:
    """One fixed-size leaf of a space: where it is in the nest, its dtype and per-env shape."""

    path: tuple[str | int, ...]
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    def nbytes(self, n: int) -> int:
        return int(n * self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64)))


# --- the leaves of a nest ------------------------------------------------------------------

Path = tuple[str | int, ...]


def walk(space: spaces.Space[Any], path: Path = ()) -> Iterator[tuple[Path, spaces.Space[Any]]]:
    """The leaves of ``space`` in depth-first order (Dict keys and Tuple items in order), as
    ``(path, leaf space)``: every other function here that lays out a nest walks it so. Any
    space but a Dict or Tuple is one leaf, whatever it holds (a Text, Sequence, Graph, ...)."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from walk(sub, (*path, key))
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from walk(sub, (*path, i))
    else:
        yield path, space


def leaves_of(
    space: spaces.Space[Any], value: Any, where: str = "actions", path: Path = ()
) -> Iterator[tuple[Path, spaces.Space[Any], Any]]:
    """The leaves of ``value`` (a value of ``space``, or a batch of its values) in
    :func:`walk` order, as ``(path, leaf space, leaf value)``, the nest checked on the way:
    ``value[key]`` down a Dict, ``value[i]`` down a Tuple.

    Args:
        space: the space ``value`` nests as.
        value: the value.
        where: what ``value`` is, for the messages (``"actions"``, ``"actions[3]"``).
        path: where ``value`` sits in a larger nest (for the messages).

    Raises:
        TypeError: a Dict's value that is not a mapping, a Tuple's that is not a tuple or list.
        ValueError: a Dict's value without one of its keys, a Tuple's of another length.
    """
    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping):
            raise TypeError(
                f"{where}{path_text(path)}: expected a dict with keys {list(space.spaces)}, "
                f"got {type(value).__name__}"
            )
        for key, sub in space.spaces.items():
            if key not in value:
                raise ValueError(f"{where}{path_text(path)}: missing key {key!r}")
            yield from leaves_of(sub, value[key], where, (*path, key))
    elif isinstance(space, spaces.Tuple):
        n = len(space.spaces)
        if not isinstance(value, (tuple, list)):
            raise TypeError(
                f"{where}{path_text(path)}: expected a tuple of {n} items, "
                f"got {type(value).__name__}"
            )
        if len(value) != n:
            raise ValueError(
                f"{where}{path_text(path)}: expected a tuple of {n} items, got {len(value)}"
            )
        for i, sub in enumerate(space.spaces):
            yield from leaves_of(sub, value[i], where, (*path, i))
    else:
        yield path, space, value


def map_leaves(fn: Callable[[Any], Any], nest: Any) -> Any:
    """``fn`` applied to every leaf of a value nested in dicts and tuples (a batch, a row, an
    observation), the nest kept: a dict of the same type (gymnasium 0.29's OrderedDict stays
    one), a tuple for a tuple."""
    if isinstance(nest, dict):
        out = {key: map_leaves(fn, item) for key, item in nest.items()}
        return out if type(nest) is dict else type(nest)(out)
    if isinstance(nest, tuple):
        return tuple(map_leaves(fn, item) for item in nest)
    return fn(nest)


def nest_leaves(nest: Any) -> list[Any]:
    """The leaves of a value nested in dicts and tuples, in order (for a nest built from a
    space, :func:`walk` order)."""
    if isinstance(nest, dict):
        return [leaf for item in nest.values() for leaf in nest_leaves(item)]
    if isinstance(nest, tuple):
        return [leaf for item in nest for leaf in nest_leaves(item)]
    return [nest]


def filled(space: spaces.Space[Any], rows: tuple[int, ...], fill: float) -> Any:
    """A nest of ``space``'s fixed-size leaves, each ``(*rows, *leaf.shape)`` of its dtype and
    filled with ``fill`` (``rows=()``: one value of the space)."""
    leaves = []
    for _, leaf in walk(space):
        assert leaf.shape is not None and leaf.dtype is not None
        leaves.append(np.full((*rows, *leaf.shape), fill, dtype=leaf.dtype))
    return build_views(space, iter(leaves))


@singledispatch
def _fixed_size(space: spaces.Space[Any]) -> bool:
    """True for a leaf space with a fixed dtype and shape (registered per space type)."""
    return False


@_fixed_size.register(spaces.Box)
@_fixed_size.register(spaces.Discrete)
@_fixed_size.register(spaces.MultiDiscrete)
@_fixed_size.register(spaces.MultiBinary)
def _(space: spaces.Space[Any]) -> bool:
    # Subclasses of these spaces may change sample()/contains() but not the dtype/shape
    # contract, so they share memory too.
    return space.dtype is not None and space.shape is not None


def is_shareable(space: spaces.Space[Any]) -> bool:
    """True when every leaf of ``space`` has a fixed dtype and shape."""
    return all(_fixed_size(leaf) for _, leaf in walk(space))


def leaf_specs(space: spaces.Space[Any]) -> list[LeafSpec]:
    """The leaves of a shareable space in :func:`walk` order.

    Raises:
        TypeError: a leaf has no fixed dtype and shape.
    """
    specs = []
    for path, leaf in walk(space):
        if leaf.dtype is None or leaf.shape is None:
            raise TypeError(f"space {leaf!r} has no fixed dtype/shape and cannot be shared")
        specs.append(LeafSpec(path, np.dtype(leaf.dtype), tuple(leaf.shape)))
    return specs


def build_views(space: spaces.Space[Any], leaves: Iterator[np.ndarray]) -> Any:
    """Arrange leaf arrays (in ``leaf_specs`` order) into the nest gymnasium returns: a dict for
    Dict, a tuple for Tuple, the array itself for a leaf (as ``create_empty_array`` does)."""
    if isinstance(space, spaces.Dict):
        return BatchDict((key, build_views(sub, leaves)) for key, sub in space.spaces.items())
    if isinstance(space, spaces.Tuple):
        return tuple(build_views(sub, leaves) for sub in space.spaces)
    return next(leaves)


# --- split nests: fixed-size leaves in the block, the others by value ---------------------


def _split(space: spaces.Space[Any]) -> tuple[list[tuple[Path, Any]], list[tuple[Path, Any]]]:
    """The leaves of ``space`` in :func:`walk` order, as ``(path, space)``: the fixed-size ones
    and the others."""
    fixed: list[tuple[Path, Any]] = []
    loose: list[tuple[Path, Any]] = []
    for path, leaf in walk(space):
        (fixed if _fixed_size(leaf) else loose).append((path, leaf))
    return fixed, loose


def fixed_leaves(space: spaces.Space[Any]) -> list[LeafSpec]:
    """The fixed-size leaves of ``space`` (every leaf when it is shareable), in the order
    ``leaf_specs`` gives them."""
    return [LeafSpec(path, np.dtype(sub.dtype), tuple(sub.shape)) for path, sub in _split(space)[0]]


def _getter(path: Path) -> Callable[[Any], Any]:
    if len(path) == 1:
        return operator.itemgetter(path[0])

    def get(obs: Any) -> Any:
        for key in path:
            obs = obs[key]
        return obs

    return get


def _nest_builder(space: spaces.Space[Any]) -> Callable[[Sequence[Any], Sequence[Any]], Any]:
    """``build(fixed, loose)``: the nest of ``space`` with ``fixed[k]`` at its k-th fixed-size
    leaf and ``loose[j]`` at its j-th other leaf (``_split`` order)."""
    counts = [0, 0]

    def make(sub: spaces.Space[Any]) -> Callable[[Sequence[Any], Sequence[Any]], Any]:
        if isinstance(sub, spaces.Dict):
            parts = [(key, make(item)) for key, item in sub.spaces.items()]
            if BatchDict is not dict:  # gymnasium 0.29's OrderedDict
                return lambda f, lo: BatchDict((key, build(f, lo)) for key, build in parts)
            return lambda f, lo: {key: build(f, lo) for key, build in parts}
        if isinstance(sub, spaces.Tuple):
            items = [make(item) for item in sub.spaces]
            return lambda f, lo: tuple(build(f, lo) for build in items)
        kind = 0 if is_shareable(sub) else 1
        index = counts[kind]
        counts[kind] += 1
        if kind == 0:
            return lambda f, lo: f[index]
        return lambda f, lo: lo[index]

    return make(space)


class ObsSplit:
    """A Dict/Tuple observation space whose fixed-size leaves (images, vectors) live in the
    block while its other leaves (a Text instruction, a Sequence, a Graph) travel by value.

    A worker writes an env's fixed-size leaves into their rows and sends the others, one
    tuple per env (:meth:`writer`); the parent batches those with gymnasium's own
    ``concatenate``, leaf by leaf, as SyncVectorEnv batches the whole nest
    (:meth:`loose_batches`), and puts the nest together (:meth:`build`).

    Attributes:
        space: the single observation space.
        fixed: its fixed-size leaves (``leaf_specs`` order).
        loose: its other leaves' spaces, in the same depth-first order.
    """

    def __init__(self, space: spaces.Space[Any]) -> None:
        fixed, loose = _split(space)
        self.space = space
        self.fixed = fixed_leaves(space)
        self._fixed_spaces = [sub for _, sub in fixed]
        self.loose = [sub for _, sub in loose]
        self._loose_paths = [path for path, _ in loose]
        #: ``build(fixed, loose)``: the nest, from one value per fixed-size and other leaf
        self.build = _nest_builder(space)

    @staticmethod
    def applies(space: spaces.Space[Any]) -> bool:
        """Whether ``space`` is a nest with leaves of both kinds."""
        fixed, loose = _split(space)
        return bool(fixed) and bool(loose)

    def writer(self, rows: Sequence[np.ndarray], env_offset: int = 0) -> Callable[[Any, int], Any]:
        """``write(obs, row) -> loose``: copy one env's fixed-size leaves into row ``row`` of
        ``rows`` (one array per fixed-size leaf, checked as :func:`row_writer` checks) and
        return its other leaves as a tuple."""
        fixed = [
            (_getter(leaf.path), _row_writer(sub, array, leaf.path, env_offset))
            for leaf, sub, array in zip(self.fixed, self._fixed_spaces, rows)
        ]
        loose = [_getter(path) for path in self._loose_paths]

        def write(obs: Any, row: int) -> Any:
            for get, put in fixed:
                put(get(obs), row)
            return tuple(get(obs) for get in loose)

        return write

    def empty_loose(self, num_envs: int) -> list[Any]:
        """``concatenate``'s ``out`` for each other leaf (gymnasium's ``create_empty_array``)."""
        return [create_empty_array(sub, n=num_envs, fn=np.zeros) for sub in self.loose]

    def loose_batches(self, per_env: Sequence[Any], outs: Sequence[Any]) -> list[Any]:
        """Each other leaf batched over the envs (``per_env``: each env's tuple), with
        gymnasium's ``concatenate``, as SyncVectorEnv batches them."""
        return [
            concatenate(sub, [values[j] for values in per_env], outs[j])
            for j, sub in enumerate(self.loose)
        ]


# --- worker side: write one env's observation, read one env's action -----------------------


class ObservationShapeError(ValueError):
    """An env returned an observation whose shape does not match its space."""


def path_text(path: tuple[str | int, ...]) -> str:
    """A leaf's path in a nest as an index expression, ``['pos'][0]`` (empty for the root)."""
    return "".join(f"[{p!r}]" for p in path)


def row_writer(
    space: spaces.Space[Any], batch: Any, env_offset: int = 0
) -> Callable[[Any, int], None]:
    """Return ``write(obs, row)`` that copies one env's observation into row ``row`` of the batch
    views, casting like ``np.stack(..., out=)`` does in SyncVectorEnv (``same_kind``) and refusing
    any shape mismatch (``np.copyto`` alone would broadcast it silently). Error messages name
    the global env index ``env_offset + row``."""
    return _row_writer(space, batch, (), env_offset)


def _row_writer(
    space: spaces.Space[Any], batch: Any, path: tuple[str | int, ...], env_offset: int
) -> Callable[[Any, int], None]:
    if isinstance(space, spaces.Dict):
        parts = [
            (key, _row_writer(sub, batch[key], (*path, key), env_offset))
            for key, sub in space.spaces.items()
        ]

        def write_dict(obs: Any, row: int) -> None:
            for key, write in parts:
                write(obs[key], row)

        return write_dict
    if isinstance(space, spaces.Tuple):
        tparts = [
            _row_writer(sub, batch[i], (*path, i), env_offset) for i, sub in enumerate(space.spaces)
        ]

        def write_tuple(obs: Any, row: int) -> None:
            if len(obs) != len(tparts):
                raise ObservationShapeError(
                    f"env {env_offset + row}: observation{path_text(path)} has {len(obs)} "
                    f"elements, expected {len(tparts)} for {space}"
                )
            for write, item in zip(tparts, obs):
                write(item, row)

        return write_tuple

    array: np.ndarray = batch
    expected = array.shape[1:]
    dtype = array.dtype

    def write_leaf(obs: Any, row: int) -> None:
        value = obs if type(obs) is np.ndarray else np.asarray(obs)
        if value.shape != expected:
            raise ObservationShapeError(
                f"env {env_offset + row}: observation{path_text(path)} has shape {value.shape}, "
                f"expected {expected} (dtype {array.dtype}) from {space}"
            )
        if value.dtype == dtype:
            array[row] = value  # same dtype and shape: no cast to check, the cheapest copy
            return
        try:
            # [row, ...] is a view even for a 0-d leaf (array[row] would be a scalar copy)
            np.copyto(array[row, ...], value, casting="same_kind")
        except TypeError as exc:
            raise TypeError(
                f"env {env_offset + row}: observation{path_text(path)} of dtype {value.dtype} "
                f"cannot be cast to the space's dtype {array.dtype}: {exc}"
            ) from None

    return write_leaf


def row_reader(space: spaces.Space[Any], batch: Any) -> Callable[[int], Any]:
    """Return ``read(row)`` giving one env's action in the form SyncVectorEnv hands its envs
    (``iterate`` over the batched space): a scalar for Discrete, an array row otherwise, dicts and
    tuples for nests. Rows are copied so an env that keeps its action never sees it change."""
    if isinstance(space, spaces.Dict):
        parts = [(key, row_reader(sub, batch[key])) for key, sub in space.spaces.items()]
        if BatchDict is not dict:  # gymnasium 0.29's OrderedDict
            return lambda row: BatchDict((key, read(row)) for key, read in parts)
        return lambda row: {key: read(row) for key, read in parts}
    if isinstance(space, spaces.Tuple):
        tparts = [row_reader(sub, batch[i]) for i, sub in enumerate(space.spaces)]
        return lambda row: tuple(read(row) for read in tparts)
    array: np.ndarray = batch
    if array.ndim == 1:
        return lambda row: array[row]  # a numpy scalar: immutable, no copy needed
    return lambda row: array[row].copy()


# --- parent side: validate and store a batch of actions ------------------------------------


class _ByValue:
    """What ``store`` returns when the actions must travel by value (see :func:`batch_setter`)."""

    def __repr__(self) -> str:
        return "BY_VALUE"


#: ``store(actions)`` stored nothing: the actions travel by value, exactly as given.
BY_VALUE = _ByValue()

#: What ``store(actions)`` did: None (every leaf in the block, in its space's dtype), a tuple
#: with each leaf's dtype (``np.dtype.str``) when some leaf came in another dtype and is in the
#: block in that dtype, or :data:`BY_VALUE`.
Stored = tuple[str, ...] | _ByValue | None


def batch_setter(
    space: spaces.Space[Any],
    view: Callable[[int, np.dtype[Any]], np.ndarray | None],
    num_envs: int,
) -> Callable[[Any], Stored]:
    """Return ``store(actions)`` that validates a batch of actions against the *single* space
    and copies it into the block, keeping the caller's dtype: SyncVectorEnv hands each env
    ``iterate(action_space, actions)``, so a float64 batch for a float32 Box reaches the envs as
    float64, a list as its items.

    Args:
        space: the single action space (shareable).
        view: ``view(leaf, dtype)``: the ``(num_envs, *shape)`` array of leaf ``leaf``
            (``leaf_specs`` order) in the block in ``dtype``, or None when the block cannot
            hold the leaf in that dtype.
        num_envs: the batch size.

    Returns:
        ``store(actions) -> Stored``: an ndarray leaf of the right shape is copied in (in its
        own dtype where the block can hold it); a leaf that is not an ndarray (a list, a
        scalar, a tensor) or whose dtype the block cannot hold makes the whole batch travel
        by value, and nothing is written. Raises (before anything is written) when an ndarray
        leaf has the wrong shape or the nest is wrong, so a rejected batch leaves the previous
        actions intact.
    """
    leaves = leaf_specs(space)
    defaults = [view(k, leaf.dtype) for k, leaf in enumerate(leaves)]

    def store(actions: Any) -> Stored:
        check_batch_layout(space, actions, num_envs)  # never transpose per-env tuples
        given = [leaf for _, _, leaf in leaves_of(space, actions)]
        targets: list[np.ndarray] = []
        odd = False
        for k, (spec, value) in enumerate(zip(leaves, given)):
            where = f"actions{path_text(spec.path)}"
            tensor = None
            if type(value) is not np.ndarray:
                # A CPU torch tensor goes in the block in the space's dtype: the envs get
                # numpy values, as the space declares (not tensor slices, as from Sync).
                tensor = tensor_as_array(value, spec.dtype, where)
                if tensor is None:
                    # iterate() hands the envs its items as they are (tensors among them
                    # become numpy values first: LockstepExchange.send_step)
                    return BY_VALUE
                value = given[k] = tensor
            expected = (num_envs, *spec.shape)
            if value.shape != expected:
                if value.ndim == 0:
                    # As iterate() over a 0-d batch: a TypeError, it is not a batch at all
                    raise TypeError(
                        f"{where}: expected a batch of {num_envs} actions (shape {expected}), "
                        f"got a 0-d array {value!r}"
                    )
                if value.shape[0] != num_envs:
                    raise ValueError(
                        f"{where}: expected a batch of {num_envs} actions (shape {expected}), "
                        f"got {value.shape[0]} (shape {value.shape})"
                    )
                raise ValueError(f"{where}: expected shape {expected}, got {value.shape}")
            if tensor is not None or value.dtype == spec.dtype:
                target = defaults[k]
            else:
                target = view(k, value.dtype)
            if target is None:
                return BY_VALUE
            odd = odd or target is not defaults[k]
            targets.append(target)
        for target, value in zip(targets, given):
            np.copyto(target, value)  # same shape; the same dtype, or a checked cast
        return tuple(t.dtype.str for t in targets) if odd else None

    if len(leaves) != 1 or leaves[0].path:
        return store
    # The common case (one Box/Discrete/... leaf): an ndarray of exactly the right shape and
    # dtype is copied straight in; anything else takes the checked path.
    target = defaults[0]
    assert target is not None

    def store_exact(actions: Any) -> Stored:
        if (
            type(actions) is np.ndarray
            and actions.shape == target.shape
            and actions.dtype == target.dtype
        ):
            np.copyto(target, actions)
            return None
        return store(actions)

    return store_exact


def without_tensors(space: spaces.Space[Any], actions: Any) -> Any:
    """``actions`` (a batch of ``space``) with each CPU torch tensor at a fixed-size leaf
    replaced by a numpy array in the leaf's dtype: for a batch that travels by value, so that
    its envs get numpy values as the block's would. Anything else is left as it is.

    Raises:
        ValueError, TypeError: as :func:`tensor_as_array`.
    """
    if "torch" not in sys.modules:
        return actions
    return _untensor(space, actions, ())


def _untensor(space: spaces.Space[Any], actions: Any, path: Path) -> Any:
    if isinstance(space, spaces.Dict) and isinstance(actions, dict):
        return {
            key: _untensor(space.spaces[key], value, (*path, key)) if key in space.spaces else value
            for key, value in actions.items()
        }
    if isinstance(space, spaces.Tuple) and isinstance(actions, (tuple, list)):
        if len(actions) != len(space.spaces):
            return actions  # not a batch of this space: its own error follows
        items = [_untensor(sub, a, (*path, i)) for i, (sub, a) in enumerate(zip(space, actions))]
        return type(actions)(items)
    if not is_shareable(space):
        return actions
    array = tensor_as_array(actions, np.dtype(space.dtype), f"actions{path_text(path)}")
    return actions if array is None else array.astype(space.dtype, copy=False)


def check_batch_layout(space: spaces.Space[Any], actions: Any, num_envs: int) -> None:
    """Refuse a batch of actions laid out one action per env where the space's batched form is
    one batch per key or sub-space (see ``_refuse_per_env_tuples``). For actions that travel by
    value, whose leaves are not checked against a block.

    Raises:
        TypeError: ``actions`` is a sequence of per-env dicts or tuples.
    """
    _check_layout(space, actions, (), num_envs)


def _check_layout(
    space: spaces.Space[Any], actions: Any, path: tuple[str | int, ...], num_envs: int
) -> None:
    if isinstance(space, spaces.Dict):
        if not isinstance(actions, dict):
            _refuse_per_env_dicts(space, actions, path, num_envs)
            return  # gymnasium's own error follows
        for key, sub in space.spaces.items():
            if key in actions:
                _check_layout(sub, actions[key], (*path, key), num_envs)
    elif isinstance(space, spaces.Tuple):
        _refuse_per_env_tuples(space, actions, path, num_envs)
        if isinstance(actions, (tuple, list)) and len(actions) == len(space.spaces):
            for i, sub in enumerate(space.spaces):
                _check_layout(sub, actions[i], (*path, i), num_envs)


def _refuse_per_env_dicts(
    space: spaces.Dict, actions: Any, path: tuple[str | int, ...], num_envs: int
) -> None:
    if isinstance(actions, (tuple, list)) and actions and all(type(a) is dict for a in actions):
        raise TypeError(
            f"actions{path_text(path)}: got a {type(actions).__name__} of {len(actions)} dicts, "
            "one action per env (Stable-Baselines3's layout); a vector env takes a dict of "
            f"batches, one per key of {list(space.spaces)}, each with {num_envs} actions: "
            "{key: np.stack([a[key] for a in per_env]) for key in space}"
        )


def _refuse_per_env_tuples(
    space: spaces.Tuple,  # type: ignore[type-arg]
    actions: Any,
    path: tuple[str | int, ...],
    num_envs: int,
) -> None:
    """A sequence of tuples of ``len(space)`` items reads two ways: as one tuple per env
    (Stable-Baselines3's layout), or, when there are ``len(space)`` of them, as one batch per
    sub-space. The second reading hands env 0 the first item of every env's tuple: wrong
    actions, and no error when the shapes fit. gymnasium batches a fixed-size leaf as an array,
    so a tuple where such a leaf's batch belongs is taken for the first reading and refused
    rather than transposed; a leaf's batch given as an array or a list reads as before."""
    m = len(space.spaces)
    if not isinstance(actions, (tuple, list)) or not actions:
        return
    if not all(type(a) is tuple and len(a) == m for a in actions):
        return
    leaves = [
        i
        for i, sub in enumerate(space.spaces)
        if not isinstance(sub, (spaces.Tuple, spaces.Dict)) and is_shareable(sub)
    ]
    if not leaves:
        return
    raise TypeError(
        f"actions{path_text(path)}: got a {type(actions).__name__} of {len(actions)} tuples of "
        f"{m} items, which reads as one action per env (Stable-Baselines3's layout); a vector env "
        f"takes a tuple of {m} batches, one per sub-space, each with {num_envs} actions (sub-space "
        f"{leaves[0]}, {space.spaces[leaves[0]]}, would get a tuple instead of an array): "
        "tuple(np.stack(batch) for batch in zip(*per_env))"
    )


def per_env_actions(batch_space: spaces.Space[Any], actions: Any, n: int, whose: str) -> list[Any]:
    """Each env's action of a batch that travels by value: its item of ``iterate(batch_space,
    actions)``, exactly as SyncVectorEnv hands it over.

    Args:
        batch_space: the batched action space of the ``n`` envs addressed.
        actions: the caller's batch.
        n: how many envs the batch is for.
        whose: who the actions are for, for the messages ("one per env").

    Returns:
        One action per env, in order.

    Raises:
        TypeError: ``actions`` cannot be iterated as a batch (a scalar where a batch of shape
            ``(n, ...)`` is expected); the message names the shape expected and what came.
        ValueError: not one action per env.
    """
    try:
        per_env = list(iterate(batch_space, actions))
    except TypeError as exc:
        shape = getattr(batch_space, "shape", None)
        expected = f"a batch of shape {shape}" if shape else f"a batch of {n} actions"
        came = getattr(actions, "shape", None)
        what = f"an array of shape {came}" if came is not None else type(actions).__name__
        raise TypeError(f"actions: expected {expected}, {whose}, got {actions!r} ({what})") from exc
    if len(per_env) != n:
        raise ValueError(f"expected {n} actions, {whose}, got {len(per_env)}")
    return per_env
