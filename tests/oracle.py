"""gymnasium's own SyncVectorEnv as the oracle, on whichever gymnasium is installed.

gymnasium 1.0's SyncVectorEnv takes no ``autoreset_mode``: it resets on the step after an
episode ends (the mode 1.1 names NEXT_STEP). There a test asking for another mode has no
oracle and is skipped, saying so; subvec's own code for that mode is the same on every
gymnasium and is checked against 1.1+'s oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import pytest

from subvec._compat import GYM_VERSION, NAMES_AUTORESET_MODE, AutoresetMode


def require_oracle(autoreset_mode: Any) -> None:
    """Skip the test where the installed gymnasium's SyncVectorEnv has no ``autoreset_mode``."""
    if NAMES_AUTORESET_MODE or AutoresetMode(autoreset_mode) is AutoresetMode.NEXT_STEP:
        return
    pytest.skip(
        f"gymnasium {'.'.join(map(str, GYM_VERSION))}'s SyncVectorEnv resets on the next "
        f"step only: no oracle for {AutoresetMode(autoreset_mode)}"
    )


def sync_vector_env(
    fns: Sequence[Callable[[], Any]], autoreset_mode: Any = None, **kwargs: Any
) -> gym.vector.SyncVectorEnv:
    """gymnasium's ``sync_vector_env(fns, autoreset_mode=..., **kwargs)``, or a skip of the test
    where the installed gymnasium has no SyncVectorEnv for that mode."""
    if autoreset_mode is not None:
        require_oracle(autoreset_mode)
        if NAMES_AUTORESET_MODE:
            kwargs["autoreset_mode"] = autoreset_mode
    return gym.vector.SyncVectorEnv(fns, **kwargs)
