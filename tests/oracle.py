"""gymnasium's own SyncVectorEnv as the oracle, on whichever gymnasium is installed.

gymnasium 1.0's SyncVectorEnv takes no ``autoreset_mode``: it resets on the step after an
episode ends (the mode 1.1 names NEXT_STEP); 0.29's resets in the same step (SAME_STEP, with
0.29's infos). There a test asking for another mode has no oracle and is skipped, saying so;
subvec's own code for that mode is the same on every gymnasium and is checked against 1.1+'s
oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium as gym
import pytest

from subvec._compat import (
    DEFAULT_INFO_FORMAT,
    GYM_029,
    GYM_VERSION,
    NAMES_AUTORESET_MODE,
    AutoresetMode,
    check_modes,
    default_autoreset_mode,
)

#: the modes the installed gymnasium's SyncVectorEnv has
ORACLE_MODES = (
    set(AutoresetMode)
    if NAMES_AUTORESET_MODE
    else {AutoresetMode.SAME_STEP if GYM_029 else AutoresetMode.NEXT_STEP}
)


def _offered(info_format: str, mode: AutoresetMode) -> bool:
    """Whether subvec takes ``info_format`` with ``mode`` on the installed gymnasium: asked of
    the one check that refuses what a version has not (``_compat.check_modes``)."""
    try:
        check_modes(info_format, mode)
    except ValueError:
        return False
    return True


#: the autoreset modes subvec offers on the installed gymnasium (0.29: the same step's only)
OFFERED_MODES = frozenset(mode for mode in AutoresetMode if _offered("list", mode))
#: the info formats subvec offers on the installed gymnasium (0.29 has not 1.x's layout)
OFFERED_FORMATS = frozenset(
    f for f in ("gymnasium", "legacy", "list") if _offered(f, AutoresetMode.SAME_STEP)
)
#: a vector env's mode where none is asked for (0.29: the same step's; 1.x: the next step's)
DEFAULT_MODE = default_autoreset_mode(DEFAULT_INFO_FORMAT)
#: where a same-step reset puts the ended episode's last observation in the infos
FINAL_OBS = "final_observation" if GYM_029 else "final_obs"
_INSTALLED = f"gymnasium {'.'.join(map(str, GYM_VERSION))} is installed"


def _refused(what: object) -> str:
    return f"{_INSTALLED}: subvec refuses {what} there"


def require_offered(autoreset_mode: Any = None, info_format: str | None = None) -> None:
    """Skip the test where subvec refuses ``autoreset_mode`` or ``info_format`` on the
    installed gymnasium (tests/test_gym029.py checks the refusals themselves)."""
    if autoreset_mode is not None and AutoresetMode(autoreset_mode) not in OFFERED_MODES:
        pytest.skip(_refused(AutoresetMode(autoreset_mode)))
    if info_format is not None and info_format not in OFFERED_FORMATS:
        pytest.skip(_refused(f"info_format={info_format!r}"))


def offered_modes(modes: Iterable[AutoresetMode] = AutoresetMode) -> list[Any]:
    """``modes`` as ``parametrize`` values, those subvec refuses on the installed gymnasium
    marked to skip, saying why."""
    return [
        pytest.param(
            mode,
            marks=pytest.mark.skipif(mode not in OFFERED_MODES, reason=_refused(mode)),
        )
        for mode in modes
    ]


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
