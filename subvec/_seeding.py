"""Seed -> per-env seeds: one rule for every backend (gymnasium's)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SeedArg", "per_env_seeds"]

SeedArg = int | Sequence[int | None] | None


def per_env_seeds(seed: SeedArg, num_envs: int) -> list[int | None]:
    """``None`` -> each env keeps its own entropy; ``int`` s -> env i gets ``s + i`` (gymnasium's
    rule); a sequence -> one seed per env, its length checked."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(num_envs)]
    if isinstance(seed, (str, bytes)) or not isinstance(seed, Sequence | np.ndarray):
        raise TypeError(f"seed must be None, an int or a list of ints/None, got {seed!r}")
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(
            f"If seeds are passed as a list the length must match num_envs={num_envs} "
            f"but got length={len(seeds)}."
        )
    out: list[int | None] = []
    for i, s in enumerate(seeds):
        if s is None:
            out.append(None)
        elif isinstance(s, (int, np.integer)) and not isinstance(s, bool):
            out.append(int(s))
        else:
            raise TypeError(f"seed for env {i} must be an int or None, got {s!r}")
    return out
