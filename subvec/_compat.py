"""Every difference between the gymnasium versions subvec supports, in one place.

subvec runs on gymnasium 0.29.1 and on 1.0 to 1.4. The rest of the package imports the names
below from here and never reads gymnasium's version itself:

- ``GYM_VERSION``: the installed gymnasium, as ``(major, minor, micro)``.
- ``AutoresetMode``: gymnasium's own enum from 1.1 on. gymnasium 1.0 has none (its vector envs
  only reset on the step after an episode ends, the semantics 1.1 names NEXT_STEP), nor has
  0.29 (same step only), so this module defines an enum with the same members and values;
  subvec's envs accept it, its values and its names there as on 1.1+.
- ``NAMES_AUTORESET_MODE``: whether gymnasium itself knows autoreset modes (1.1+);
  ``vector_metadata`` puts ``"autoreset_mode"`` in a vector env's metadata where it does.
- ``add_info``: ``VectorEnv._add_info``, the merge of one env's info into a vector env's
  infos, as 1.1+ defines it: there ``final_obs`` (SAME_STEP's, which 1.0 has not) stays an
  object array of the envs' observations, where 1.0's would split a dict observation up.
- ``VectorEnvBase``: the base class of subvec's vector envs, gymnasium's ``VectorEnv``.
  0.29's is another class (``gym.Env`` with ``reset_async``/``step_wait``...), built with
  its spaces; subvec's sets them once the envs have said what they are.
- ``GYM_029``, ``DEFAULT_INFO_FORMAT``, ``default_autoreset_mode``, ``check_modes`` and
  ``check_observation_mode``: gymnasium 0.29 autoresets in the same step and reports
  ``final_observation``/``final_info`` (subvec's ``"legacy"`` infos, the default there); no
  other autoreset mode, nor 1.x's infos or ``observation_mode``, exists there, and asking
  for one is a ``ValueError`` naming the installed version.
- ``batch_differing_spaces``, ``is_space_dtype_shape_equiv``: gymnasium 1.x's, for
  ``observation_mode="different"``.
- ``get_env_attr``, ``set_env_attr``: what ``call``/``get_attr`` and ``set_attr`` do to one
  env: ``get_wrapper_attr``/``set_wrapper_attr`` on 1.x; on 0.29, as its vector envs do,
  ``getattr`` (through the wrappers, which warn about it there) and ``setattr``.
- ``reset_mask_error``: what a bad ``options["reset_mask"]`` raises: 1.4's ``TypeError`` or
  ``ValueError``; before 1.4 the ``AssertionError`` of 1.1-1.3's own asserts, worded as
  theirs (on 0.29 and 1.0, which have no masked reset, subvec's extension says the same).
- ``BatchDict``: the dict type of a batch of a Dict space (and of one env's Dict action), as
  ``create_empty_array`` and ``iterate`` make it: ``OrderedDict`` on 0.29, ``dict`` on 1.x.

An older gymnasium than subvec supports fails ``import subvec`` here with an error saying
what is installed and what to install, instead of a missing name deep in an import.
"""

from __future__ import annotations

import enum
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np

__all__ = [
    "DEFAULT_INFO_FORMAT",
    "GYM_029",
    "GYM_VERSION",
    "NAMES_AUTORESET_MODE",
    "AutoresetMode",
    "BatchDict",
    "VectorEnvBase",
    "add_info",
    "batch_differing_spaces",
    "check_modes",
    "check_observation_mode",
    "default_autoreset_mode",
    "get_env_attr",
    "gym_version",
    "is_space_dtype_shape_equiv",
    "reset_mask_error",
    "set_env_attr",
    "vector_metadata",
]

#: the oldest gymnasium subvec supports (and CI tests); the message below names it
OLDEST = (0, 29, 1)


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
        f"subvec needs gymnasium >= 0.29.1, and gymnasium {gymnasium.__version__} is "
        f'installed: pip install "gymnasium>=0.29.1"'
    )

# after the check: a gymnasium older than subvec supports may lack any of these
from gymnasium.vector.vector_env import VectorEnv  # noqa: E402

#: gymnasium 1.1 added ``AutoresetMode`` and ``metadata["autoreset_mode"]``
NAMES_AUTORESET_MODE = GYM_VERSION >= (1, 1, 0)
#: gymnasium 0.29: same-step autoreset, ``final_observation`` infos, another VectorEnv
GYM_029 = GYM_VERSION < (1, 0, 0)
#: the ``info_format`` a vector env has when none is given: the installed gymnasium's layout
DEFAULT_INFO_FORMAT = "legacy" if GYM_029 else "gymnasium"
_INSTALLED = f"gymnasium {gymnasium.__version__} is installed"
#: see the module docstring
BatchDict: type[dict[Any, Any]] = OrderedDict if GYM_029 else dict


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

if TYPE_CHECKING or not GYM_029:
    from gymnasium.spaces.utils import is_space_dtype_shape_equiv
    from gymnasium.vector.utils import batch_differing_spaces

    VectorEnvBase = VectorEnv[Any, Any, np.ndarray]
else:

    class VectorEnvBase(VectorEnv):  # type: ignore[misc]
        """gymnasium 0.29's ``VectorEnv``, built before its spaces are known (the front sets
        them from the envs' hellos, as on 1.x)."""

        def __init__(self) -> None:
            # what 0.29's VectorEnv.__init__ sets beside the spaces; its wrappers
            # (RecordEpisodeStatistics, NormalizeObservation...) read is_vector_env
            self.is_vector_env = True
            self.closed = False
            self.viewer = None

    def _needs_1_x(*args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"observation_mode='different' needs gymnasium >= 1.0; {_INSTALLED}")

    batch_differing_spaces = is_space_dtype_shape_equiv = _needs_1_x

if TYPE_CHECKING or NAMES_AUTORESET_MODE:
    from gymnasium.vector.vector_env import AutoresetMode

    add_info = VectorEnv._add_info
else:

    class AutoresetMode(enum.Enum):
        """gymnasium 1.1's ``AutoresetMode``, for gymnasium 1.0 and 0.29, which have none:
        the same members and values, so that code written for 1.1+
        (``autoreset_mode="SameStep"``) runs unchanged. gymnasium 1.0's own vector envs
        know NEXT_STEP only, and subvec's implement all three there; 0.29's know SAME_STEP
        only, and so do subvec's (``check_modes``)."""

        NEXT_STEP = "NextStep"
        SAME_STEP = "SameStep"
        DISABLED = "Disabled"

    add_info = _add_info_with_final_obs


if GYM_029:

    def get_env_attr(env: Any, name: str) -> Any:
        """``getattr(env, name)``, as gymnasium 0.29's vector envs read an env's attribute."""
        return getattr(env, name)

    def set_env_attr(env: Any, name: str, value: Any) -> None:
        """``setattr(env, name, value)``, as gymnasium 0.29's vector envs set one."""
        setattr(env, name, value)

else:

    def get_env_attr(env: Any, name: str) -> Any:
        """``env.get_wrapper_attr(name)``, as gymnasium 1.x's vector envs read an attribute."""
        return env.get_wrapper_attr(name)

    def set_env_attr(env: Any, name: str, value: Any) -> None:
        """``env.set_wrapper_attr(name, value)``, as gymnasium 1.x's vector envs set one."""
        env.set_wrapper_attr(name, value)


#: check -> (1.4's error, its message); before 1.4 each is an AssertionError worded as 1.1's
_RESET_MASK_ERRORS: dict[str, tuple[type[Exception], str]] = {
    "type": (TypeError, "must be a numpy array, got {got}"),
    "shape": (ValueError, "must have shape `({num_envs},)`, got {got}"),
    "dtype": (TypeError, "must have `dtype=np.bool_`, got {got}"),
    "empty": (ValueError, "must contain a boolean array{at_least_one}, got reset_mask={got}"),
}


def reset_mask_error(check: str, num_envs: int, got: Any) -> Exception:
    """The error the installed gymnasium's SyncVectorEnv raises for a bad reset mask.

    Args:
        check: ``"type"`` (not a numpy array), ``"shape"`` (not ``(num_envs,)``),
            ``"dtype"`` (not ``np.bool_``) or ``"empty"`` (no True in it).
        num_envs: the vector env's number of envs.
        got: what came (its type, shape, dtype or the mask itself).

    Returns:
        The exception to raise.
    """
    error, must = _RESET_MASK_ERRORS[check]
    if GYM_VERSION >= (1, 4, 0):
        text = must.format(num_envs=num_envs, got=got, at_least_one=" with at least one True value")
        return error(f"`options['reset_mask']` {text}")
    text = must.format(num_envs=num_envs, got=got, at_least_one="")
    return AssertionError(f"`options['reset_mask': mask]` {text}")


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


def default_autoreset_mode(info_format: str) -> AutoresetMode:
    """The autoreset mode of a vector env given none: SAME_STEP for the legacy infos (0.29's
    layout) and on gymnasium 0.29 (its only mode), else gymnasium 1.x's NEXT_STEP.

    Args:
        info_format: the vector env's ``info_format``.

    Returns:
        The mode.
    """
    if GYM_029 or info_format == "legacy":
        return AutoresetMode.SAME_STEP
    return AutoresetMode.NEXT_STEP


def check_modes(info_format: str, mode: AutoresetMode, *, freeze: bool = False) -> None:
    """Refuse what the installed gymnasium's vector envs cannot do: on 0.29, any autoreset
    but the same step's, and 1.x's infos.

    Args:
        info_format: the vector env's ``info_format``.
        mode: its autoreset mode.
        freeze: whether ``freeze=True`` asked for the mode (DISABLED), to name it.

    Raises:
        ValueError: on gymnasium 0.29, naming the installed version and what to do.
    """
    if not GYM_029:
        return
    if freeze and mode is AutoresetMode.DISABLED:
        raise ValueError(
            f"freeze=True keeps ended envs until the caller resets them (autoreset_mode "
            f"DISABLED), which needs gymnasium >= 1.0; {_INSTALLED}, whose vector envs reset "
            "in the same step: leave freeze out, or upgrade gymnasium"
        )
    if mode is not AutoresetMode.SAME_STEP:
        raise ValueError(
            f"autoreset_mode={mode.value!r} needs gymnasium >= 1.0 (1.1 for SAME_STEP and "
            f"DISABLED by name); {_INSTALLED}, whose vector envs reset in the same step: "
            "leave autoreset_mode out, or upgrade gymnasium"
        )
    if info_format == "gymnasium":
        raise ValueError(
            f"info_format='gymnasium' is gymnasium 1.x's infos layout; {_INSTALLED}: leave "
            "info_format out for 0.29's (final_observation/final_info), or pass 'list'"
        )


def check_observation_mode(mode: object) -> None:
    """Refuse an ``observation_mode`` but ``"same"`` on gymnasium 0.29, which has none.

    Args:
        mode: the vector env's ``observation_mode``.

    Raises:
        ValueError: on gymnasium 0.29, naming the installed version.
    """
    if GYM_029 and mode != "same":
        raise ValueError(f"observation_mode={mode!r} needs gymnasium >= 1.0; {_INSTALLED}")
