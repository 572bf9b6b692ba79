"""gymnasium's own SyncVectorEnv as the oracle, on whichever gymnasium is installed.

gymnasium 1.0's SyncVectorEnv takes no ``autoreset_mode``: it resets on the step after an
episode ends (the mode 1.1 names NEXT_STEP); 0.29's resets in the same step (SAME_STEP, with
0.29's infos). There a test asking for another mode has no oracle and is skipped, saying so;
subvec's own code for that mode is the same on every gymnasium and is checked against 1.1+'s
oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import pytest

from subvec._compat import GYM_029, GYM_VERSION, NAMES_AUTORESET_MODE, AutoresetMode

#: the modes the installed gymnasium's SyncVectorEnv has
ORACLE_MODES = (
    set(AutoresetMode)
    if NAMES_AUTORESET_MODE
    else {AutoresetMode.SAME_STEP if GYM_029 else AutoresetMode.NEXT_STEP}
)


def require_oracle(autoreset_mode: Any) -> None:
    """Skip the test where the installed gymnasium's SyncVectorEnv has no ``autoreset_mode``."""
    if AutoresetMode(autoreset_mode) in ORACLE_MODES:
        return
    pytest.skip(
        f"gymnasium {'.'.join(map(str, GYM_VERSION))}'s SyncVectorEnv has "
        f"{' '.join(m.value for m in ORACLE_MODES)} only: no oracle for "
        f"{AutoresetMode(autoreset_mode)}"
    )


def sync_vector_env(
    fns: Sequence[Callable[[], Any]], autoreset_mode: Any = None, **kwargs: Any
) -> gym.vector.SyncVectorEnv:
    """gymnasium's ``SyncVectorEnv(fns, autoreset_mode=..., **kwargs)``, or a skip of the test
    where the installed gymnasium has no SyncVectorEnv for that mode."""
    if autoreset_mode is not None:
        require_oracle(autoreset_mode)
        if NAMES_AUTORESET_MODE:
            kwargs["autoreset_mode"] = autoreset_mode
    return gym.vector.SyncVectorEnv(fns, **kwargs)
