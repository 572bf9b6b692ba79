"""CPU torch tensors as numpy arrays, for batches of actions given as tensors. torch is never
imported here: a tensor can only exist once its caller has imported it."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["tensor_as_array"]


def tensor_as_array(value: Any, dtype: np.dtype[Any], where: str) -> np.ndarray | None:
    """A CPU torch tensor as a numpy array sharing its memory, to be stored in ``dtype``;
    None when ``value`` is no tensor.

    Args:
        value: one leaf of a batch of actions.
        dtype: the action space's dtype, which the workers will read the batch in.
        where: the leaf, for error messages.

    Raises:
        ValueError: the tensor is on another device than the CPU (the workers read actions
            from shared memory, which a GPU does not write).
        TypeError: its dtype does not cast to ``dtype`` (``same_kind``, e.g. floats for a
            Discrete space).
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    _check_device(value, where)
    tensor = value.detach()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
        tensor = tensor.float()
    array: np.ndarray = tensor.resolve_conj().resolve_neg().numpy()
    if not np.can_cast(array.dtype, dtype, "same_kind"):
        raise TypeError(
            f"{where}: a torch tensor of dtype {value.dtype} cannot be cast to the action "
            f"space's dtype {dtype} (same_kind casting); convert the batch first"
        )
    return array


def _check_device(tensor: Any, where: str) -> None:
    if tensor.device.type != "cpu":
        raise ValueError(
            f"{where}: a torch tensor on device {tensor.device}; the workers read actions "
            "from shared memory on the CPU: move the batch there first, e.g. actions.cpu()"
        )
