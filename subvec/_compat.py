"""Every difference between the gymnasium versions subvec supports, in one place.

subvec runs on gymnasium 0.29.1 and on 1.0 to 1.4. The rest of the package imports the names
below from here and never reads gymnasium's version itself:

- ``GYM_VERSION``: the installed gymnasium, as ``(major, minor, micro)``.
- ``AutoresetMode``: gymnasium's own enum from 1.1 on. gymnasium 1.0 has none (its vector envs
  only reset on the step after an episode ends, the semantics 1.1 names NEXT_STEP), so this
  module defines an enum with the same members and values; subvec's envs accept it, its
  values and its names there as on 1.1+.
- ``NAMES_AUTORESET_MODE``: whether gymnasium itself knows autoreset modes (1.1+);
  ``vector_metadata`` puts ``"autoreset_mode"`` in a vector env's metadata where it does.
- ``add_info``: ``VectorEnv._add_info``, the merge of one env's info into a vector env's
  infos, as 1.1+ defines it: there ``final_obs`` (SAME_STEP's, which 1.0 has not) stays an
  object array of the envs' observations, where 1.0's would split a dict observation up.

An older gymnasium than subvec supports fails ``import subvec`` here with an error saying
what is installed and what to install, instead of a missing name deep in an import.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np

__all__ = [
    "GYM_VERSION",
    "NAMES_AUTORESET_MODE",
    "AutoresetMode",
    "add_info",
    "gym_version",
    "vector_metadata",
]

#: the oldest gymnasium subvec supports (and CI tests); the message below names it
OLDEST = (1, 0, 0)


def gym_version(text: str) -> tuple[int, int, int]:
    """``(major, minor, micro)`` of a gymnasium version string (``"1.1.0a1"``: ``(1, 1, 0)``).

    Args:
        text: ``gymnasium.__version__``.

    Returns:
        The three leading numbers, missing ones as 0.

    Raises:
        ImportError: ``text`` does not start with a version number.
    """
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    if match is None:
        raise ImportError(f"subvec cannot read the installed gymnasium's version {text!r}")
    major, minor, micro = (int(part) if part else 0 for part in match.groups())
    return major, minor, micro


GYM_VERSION = gym_version(getattr(gymnasium, "__version__", ""))

if GYM_VERSION < OLDEST:
    raise ImportError(
        f"subvec needs gymnasium >= 1.0, and gymnasium {gymnasium.__version__} is installed: "
        f'pip install "gymnasium>=1.0". For a script written for gymnasium 0.29, '
        f'SubprocVectorEnv(..., info_format="legacy") keeps the infos layout of 0.29 '
        f"(final_observation/final_info, as CleanRL's scripts read them)"
    )

# after the check: a gymnasium older than subvec supports may lack any of these
from gymnasium.vector.vector_env import VectorEnv  # noqa: E402

#: gymnasium 1.1 added ``AutoresetMode`` and ``metadata["autoreset_mode"]``
NAMES_AUTORESET_MODE = GYM_VERSION >= (1, 1, 0)


def _add_info_with_final_obs(
    self: Any, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int
) -> dict[str, Any]:
    """gymnasium 1.1's ``VectorEnv._add_info``, for gymnasium 1.0: ``self`` is anything with
    a ``num_envs``. Each key gets an array over the envs and a ``_key`` mask; a dict value is
    merged recursively, except ``final_obs``, whose envs' observations stay whole."""
    for key, value in env_info.items():
        if key == "final_obs":
            if key in vector_infos:
                array = vector_infos[key]
            else:
                array = np.full(self.num_envs, fill_value=None, dtype=object)
            array[env_num] = value
        elif isinstance(value, dict):
            array = _add_info_with_final_obs(self, vector_infos.get(key, {}), value, env_num)
        else:
            if key in vector_infos:
                array = vector_infos[key]
            elif type(value) in (int, float, bool) or issubclass(type(value), np.number):
                array = np.zeros(self.num_envs, dtype=type(value))
            elif isinstance(value, np.ndarray):
                array = np.zeros((self.num_envs, *value.shape), dtype=value.dtype)
            else:
                array = np.full(self.num_envs, fill_value=None, dtype=object)
            array[env_num] = value
        mask = vector_infos.get(f"_{key}", np.zeros(self.num_envs, dtype=np.bool_))
        mask[env_num] = True
        vector_infos[key], vector_infos[f"_{key}"] = array, mask
    return vector_infos


#: ``add_info(vector_env, infos, env_info, env_index) -> infos``; see the module docstring
add_info: Callable[[Any, dict[str, Any], dict[str, Any], int], dict[str, Any]]

if TYPE_CHECKING or NAMES_AUTORESET_MODE:
    from gymnasium.vector.vector_env import AutoresetMode

    add_info = VectorEnv._add_info
else:

    class AutoresetMode(enum.Enum):
        """gymnasium 1.1's ``AutoresetMode``, for gymnasium 1.0, which has none: the same
        members and values, so that code written for 1.1+ (``autoreset_mode="SameStep"``,
        ``AutoresetMode.SAME_STEP``) runs unchanged. gymnasium 1.0's own vector envs know
        NEXT_STEP only; subvec's envs implement all three."""

        NEXT_STEP = "NextStep"
        SAME_STEP = "SameStep"
        DISABLED = "Disabled"

    add_info = _add_info_with_final_obs


def vector_metadata(env_metadata: Mapping[str, Any], mode: AutoresetMode) -> dict[str, Any]:
    """The metadata of a vector env over envs with ``env_metadata``, as the installed
    gymnasium's own vector envs carry it: with ``"autoreset_mode"`` from 1.1 on (its wrappers
    read it there), without on 1.0, whose SyncVectorEnv has the env's metadata only.

    Args:
        env_metadata: the first env's ``metadata``.
        mode: the vector env's autoreset mode.

    Returns:
        A new dict.
    """
    metadata = dict(env_metadata)
    if NAMES_AUTORESET_MODE:
        metadata["autoreset_mode"] = mode
    return metadata
