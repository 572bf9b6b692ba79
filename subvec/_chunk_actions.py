"""Action chunks: K actions per env in one batch, checked before anything is sent, and read
back one env's sub-step at a time in the form ``step()`` hands an action over.

A batch of chunks is the action batch of ``step()`` with a chunk axis after the env axis:
``(num_envs, K, *single_shape)`` on every leaf (``subvec._spaces`` has the leaves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from subvec._spaces import (
    build_views,
    is_shareable,
    leaf_specs,
    leaves_of,
    path_text,
    row_reader,
)
from subvec._tensors import tensor_as_array

__all__ = ["ChunkBatch", "ChunkChecker", "chunk_actions", "chunk_reader"]


@dataclass(slots=True)  # made per chunk: a frozen one's __init__ costs twice as much
class ChunkBatch:
    """A checked batch of action chunks: each leaf an ndarray ``(num_envs, K, *shape)`` in
    ``leaf_specs`` order, in the caller's dtype (a torch tensor's: the space's)."""

    chunk: int
    leaves: tuple[np.ndarray, ...]

    def rows(self, lo: int, hi: int) -> ChunkBatch:
        """The chunks of envs ``lo..hi`` (views)."""
        return ChunkBatch(self.chunk, tuple(leaf[lo:hi] for leaf in self.leaves))


def _shape_text(num_envs: int, shape: tuple[int, ...]) -> str:
    return "(" + ", ".join([str(num_envs), "K", *map(str, shape)]) + ")"


#: the spaces that are one fixed-size leaf
_LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def chunk_actions(space: spaces.Space[Any], actions: Any, num_envs: int) -> ChunkBatch:
    """Check a batch of action chunks before anything is sent, and give its leaves as arrays.

    The batch is the action batch of ``step()`` with a chunk axis after the env axis: shape
    ``(num_envs, K, *single_shape)`` for a Box/Discrete/MultiDiscrete/MultiBinary space, the
    same leading ``(num_envs, K)`` on every leaf of a Dict/Tuple. Arrays keep their dtype (as
    ``step()`` hands each env the caller's dtype); lists become arrays; a CPU torch tensor
    becomes an array in the space's dtype.

    Args:
        space: the single action space.
        actions: the caller's batch of chunks.
        num_envs: the envs the batch is for.

    Returns:
        The leaves and K.

    Raises:
        TypeError: the space is not fixed-size (Text, Sequence, ... actions have no chunk
            form), the nest is wrong, or a leaf's dtype does not cast ``same_kind`` to the
            space's (floats for a Discrete space, objects).
        ValueError: a leaf's shape is not ``(num_envs, K, *single_shape)`` with K >= 1, or
            the leaves disagree on K; the message names the expected and the given shape.
    """
    if not is_shareable(space):
        raise TypeError(
            f"step_chunk needs a fixed-size action space (Box, Discrete, MultiDiscrete, "
            f"MultiBinary, or Dict/Tuple nests of them); the envs' is {space}"
        )
    specs = leaf_specs(space)
    given = [leaf for _, _, leaf in leaves_of(space, actions)]
    leaves: list[np.ndarray] = []
    chunk = 0
    for spec, value in zip(specs, given):
        where = f"actions{path_text(spec.path)}"
        expected = _shape_text(num_envs, spec.shape)
        array = tensor_as_array(value, spec.dtype, where)
        if array is not None:
            array = array.astype(spec.dtype, copy=False)
        else:
            array = value if type(value) is np.ndarray else np.asarray(value)
        if array.dtype != spec.dtype and not (
            array.dtype.kind in "biuf" and np.can_cast(array.dtype, spec.dtype, "same_kind")
        ):
            raise TypeError(
                f"{where}: chunks of dtype {array.dtype} cannot be cast to the action space's "
                f"dtype {spec.dtype} (same_kind casting); expected shape {expected}"
            )
        if (
            array.ndim != 2 + len(spec.shape)
            or array.shape[0] != num_envs
            or array.shape[2:] != spec.shape
        ):
            hint = ""
            if array.shape == (num_envs, *spec.shape):
                hint = "; this is one action per env: add the chunk axis, e.g. actions[:, None]"
            raise ValueError(
                f"{where}: expected a chunk of K actions per env, shape {expected}, "
                f"got shape {array.shape}{hint}"
            )
        if array.shape[1] == 0:
            raise ValueError(f"{where}: expected shape {expected} with K >= 1, got K = 0")
        if chunk and array.shape[1] != chunk:
            raise ValueError(
                f"{where}: expected K = {chunk} as in the leaves before it (shape "
                f"{_shape_text(num_envs, spec.shape).replace('K', str(chunk))}), "
                f"got shape {array.shape}"
            )
        chunk = array.shape[1]
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        leaves.append(array)
    return ChunkBatch(chunk, tuple(leaves))


class ChunkChecker:
    """:func:`chunk_actions` for one space and env count, with the usual batch (one ndarray
    leaf of exactly the space's dtype and shape after the two leading axes) taken without
    converting anything: a chunk of one sub-step on a cheap env costs about a step."""

    def __init__(self, space: spaces.Space[Any], num_envs: int) -> None:
        self.space = space
        self.num_envs = num_envs
        leaf = isinstance(space, _LEAF_SPACES)
        #: the dtype of the usual batch (None: the space is a nest)
        self.dtype = np.dtype(space.dtype) if leaf else None
        self._ndim = 2 + len(space.shape or ()) if leaf else -1
        self._tail = tuple(space.shape or ()) if leaf else ()
        #: the shape of the usual batch of one sub-step (None: the space is a nest)
        self.one_shape = (num_envs, 1, *self._tail) if leaf else None

    def __call__(self, actions: Any) -> ChunkBatch:
        """The checked batch; raises as :func:`chunk_actions`."""
        if (
            type(actions) is np.ndarray
            and actions.dtype == self.dtype
            and actions.ndim == self._ndim
            and actions.shape[0] == self.num_envs
            and actions.shape[1] > 0
            and actions.shape[2:] == self._tail
        ):
            return ChunkBatch(actions.shape[1], (actions,))
        return chunk_actions(self.space, actions, self.num_envs)


def chunk_reader(space: spaces.Space[Any], batch: ChunkBatch) -> Callable[[int, int], Any]:
    """Return ``read(i, k)``: env ``i``'s (row ``i`` of ``batch``) action for sub-step ``k``,
    in the form ``step()`` hands it over (see :func:`row_reader`: a numpy scalar for
    Discrete, a copied array row otherwise, dicts and tuples for nests)."""
    chunk = batch.chunk
    if isinstance(space, _LEAF_SPACES):  # one array: one call and one index per action
        array = batch.leaves[0]
        if array.ndim == 2:
            return lambda i, k: array[i, k]  # a numpy scalar: immutable, no copy needed
        return lambda i, k: array[i, k].copy()
    flat = [leaf.reshape(leaf.shape[0] * chunk, *leaf.shape[2:]) for leaf in batch.leaves]
    read = row_reader(space, build_views(space, iter(flat)))
    return lambda i, k: read(i * chunk + k)
