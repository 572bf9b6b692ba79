"""What the front is built from: the units' hellos, the checked options every backend shares,
and the spaces they make.

A unit says once what its envs are (:class:`EnvsHello`: a worker's ``WorkerHello``, a Ray
actor's hello mapping, the parent's own envs described in place by :class:`Hello`); the front
takes the spaces and metadata from those hellos (:func:`batched_spaces` checks every env's
against env 0's, as gymnasium's vector envs do). The option checks here run before any backend
starts. The nest copy and view helpers serve the front's observations out of the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from gymnasium import Env, Space
from gymnasium.vector.utils import batch_space

from subvec._compat import (
    AutoresetMode,
    batch_differing_spaces,
    check_modes,
    default_autoreset_mode,
    is_space_dtype_shape_equiv,
)
from subvec._compat import (
    check_observation_mode as supported_observation_mode,
)
from subvec._slab import env_metadata
from subvec._spaces import map_leaves

__all__ = [
    "COMMAND_TIMEOUTS",
    "EnvsHello",
    "Hello",
    "ObservationMode",
    "Spaces",
    "TimeoutArg",
    "Timeouts",
    "batched_spaces",
    "check_batch_size",
    "check_freeze",
    "check_info_format",
    "check_observation_mode",
    "check_timeouts",
    "copy_nest",
    "parse_autoreset",
    "view_nest",
]

#: ``observation_mode``: ``"same"``, ``"different"`` or ``(observation_space, single_space)``
ObservationMode = str | tuple[Space[Any], Space[Any]]


class EnvsHello(Protocol):
    """What a unit says once its envs are built: each env's spaces, and its first env's
    metadata and render mode (a worker's ``WorkerHello``, an actor's hello, the parent's own
    envs described in place)."""

    @property
    def observation_spaces(self) -> Sequence[Space[Any]]: ...

    @property
    def action_spaces(self) -> Sequence[Space[Any]]: ...

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    @property
    def render_mode(self) -> str | None: ...


@dataclass(frozen=True)
class Hello:
    """An :class:`EnvsHello` made here: of envs at hand, or of an actor's hello mapping."""

    observation_spaces: Sequence[Space[Any]]
    action_spaces: Sequence[Space[Any]]
    metadata: Mapping[str, Any]
    render_mode: str | None

    @classmethod
    def of_envs(cls, envs: Sequence[Env[Any, Any]]) -> Hello:
        """What a worker's hello would say of ``envs``."""
        return cls(
            [env.observation_space for env in envs],
            [env.action_space for env in envs],
            env_metadata(envs[0]),
            envs[0].render_mode,
        )

    @classmethod
    def of_mapping(cls, hello: Mapping[str, Any]) -> Hello:
        """The same keys, in a mapping (a Ray actor's hello)."""
        return cls(
            hello["observation_spaces"],
            hello["action_spaces"],
            hello["metadata"],
            hello["render_mode"],
        )


#: the commands a ``timeout=`` mapping may bound, each by its own key
COMMAND_TIMEOUTS = ("reset", "step", "call")
#: ``timeout=``: seconds for every wait, None (no bound), or seconds per command
TimeoutArg = float | Mapping[str, float | None] | None


@dataclass(frozen=True)
class Timeouts:
    """The default bound of each command's wait (None: wait forever), from ``timeout=``.

    ``reset`` bounds ``reset``/``reset_wait`` and async resets; ``step`` bounds ``step``,
    ``step_wait`` and each async step's wait, and a chunk of K sub-steps ``K * step``
    (:meth:`chunk`); ``call`` bounds ``call``, ``get_attr``, ``set_attr``, ``render``,
    ``set_reset_options`` and ``stats``. A wait given its own ``timeout`` uses that."""

    reset: float | None = None
    step: float | None = None
    call: float | None = None

    def of(self, command: str) -> float | None:
        """The bound of ``command`` (``"reset"``, ``"call"``; anything else is a step)."""
        if command == "reset":
            return self.reset
        if command == "call":
            return self.call
        return self.step

    def chunk(self, substeps: int) -> float | None:
        """The bound of an action chunk of ``substeps`` sub-steps: ``substeps * step``."""
        return None if self.step is None else self.step * substeps

    def longest(self, kinds: Sequence[tuple[str, int]]) -> float | None:
        """The longest bound of the commands ``kinds``, ``(kind, substeps)`` (a reset's, or
        a step's or chunk's of that many sub-steps; None when any is unbounded, or for no
        command): what one wait for all of them is given."""
        bounds = [self.reset if kind == "reset" else self.chunk(k) for kind, k in kinds]
        if not bounds or any(b is None for b in bounds):
            return None
        return max(b for b in bounds if b is not None)


def check_freeze(freeze: object, autoreset_mode: AutoresetMode) -> bool:
    """``freeze`` if it goes with ``autoreset_mode`` (only DISABLED: the other modes reset an
    ended env themselves).

    Raises:
        ValueError: freeze with NEXT_STEP or SAME_STEP.
        TypeError: not a bool.
    """
    if not isinstance(freeze, (bool, np.bool_)):
        raise TypeError(f"freeze must be True or False, got {freeze!r}")
    if freeze and autoreset_mode is not AutoresetMode.DISABLED:
        raise ValueError(
            f"freeze=True freezes ended envs until the caller resets them, which needs "
            f"autoreset_mode=DISABLED (or no autoreset_mode); got {autoreset_mode}, which "
            "resets them itself"
        )
    return bool(freeze)


def check_timeouts(timeout: object) -> Timeouts:
    """``timeout=`` as :class:`Timeouts`: a number (or None) for every command alike, or a
    mapping of ``"reset"``, ``"step"`` and ``"call"`` to seconds (a command not named, or
    given None, is not bounded).

    Raises:
        ValueError: an unknown key, or a negative bound.
        TypeError: a bound that is not a number.
    """

    def seconds(value: object, where: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(
                f"timeout{where} must be a number of seconds or None, got {value!r} "
                f"({type(value).__name__})"
            )
        if not value >= 0:
            raise ValueError(f"timeout{where} must be seconds (>= 0) or None, got {value!r}")
        return float(value)

    if isinstance(timeout, Mapping):
        unknown = sorted(str(k) for k in timeout if k not in COMMAND_TIMEOUTS)
        if unknown:
            raise ValueError(
                f"timeout: unknown command(s) {unknown}; a timeout mapping takes the keys "
                f"{list(COMMAND_TIMEOUTS)} (a chunk's bound is K times the step's)"
            )
        return Timeouts(**{k: seconds(v, f"[{k!r}]") for k, v in timeout.items()})
    bound = seconds(timeout, "")
    return Timeouts(bound, bound, bound)


def check_observation_mode(mode: object) -> ObservationMode:
    """``mode`` if it is a valid ``observation_mode`` (gymnasium's three forms).

    Raises:
        ValueError: neither ``"same"``, ``"different"`` nor a pair (gymnasium's wording, so
            that code matching on it keeps working, then the expected form); or not
            ``"same"`` on a gymnasium without observation modes (0.29).
        TypeError: a pair whose elements are not both spaces.
    """
    supported_observation_mode(mode)
    if isinstance(mode, tuple) and len(mode) == 2:
        if not isinstance(mode[0], Space) or not isinstance(mode[1], Space):
            raise TypeError(
                "Expected both elements of observation_mode to be Spaces, "
                f"got {type(mode[0])} and {type(mode[1])}"
            )
        return (mode[0], mode[1])
    if isinstance(mode, str) and mode in ("same", "different"):
        return mode
    raise ValueError(
        "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single "
        f"and batch observation space, actual got {mode} (observation_mode must be "
        "'same', 'different' or a tuple (observation_space, single_observation_space))"
    )


def parse_autoreset(mode: str | AutoresetMode) -> AutoresetMode:
    """An ``AutoresetMode`` from itself, its value or its name, in any case."""
    if isinstance(mode, AutoresetMode):
        return mode
    for member in AutoresetMode:
        if mode in (member.value, member.name) or str(mode).lower() in (
            member.value.lower(),
            member.name.lower(),
        ):
            return member
    raise ValueError(
        f"autoreset_mode must be one of {[m.value for m in AutoresetMode]} or an AutoresetMode, "
        f"got {mode!r}"
    )


def check_info_format(
    info_format: str, autoreset_mode: str | AutoresetMode | None, *, freeze: bool = False
) -> AutoresetMode:
    """The autoreset mode for ``info_format`` (None: the installed gymnasium's default,
    ``_compat.default_autoreset_mode``; SAME_STEP is the legacy format's only mode).
    ``freeze``: ``freeze=True`` asked for the mode (to name it in a refusal).

    Raises:
        ValueError: an unknown info format or autoreset mode, or the legacy format with
            another mode than SAME_STEP.
    """
    if info_format not in ("gymnasium", "legacy", "list"):
        raise ValueError(
            f"info_format must be 'gymnasium', 'legacy' or 'list', got {info_format!r}"
        )
    if autoreset_mode is None:
        autoreset_mode = default_autoreset_mode(info_format)
    mode = parse_autoreset(autoreset_mode)
    check_modes(info_format, mode, freeze=freeze)
    if info_format == "legacy" and mode is not AutoresetMode.SAME_STEP:
        raise ValueError(
            "info_format='legacy' reproduces gymnasium 0.29, which reset envs in the same "
            f"step; drop autoreset_mode={mode.value!r} or pass SAME_STEP"
        )
    return mode


def check_batch_size(batch_size: int | None, num_envs: int) -> int:
    """How many envs ``recv()`` returns by default (None: every env).

    Raises:
        ValueError: not an int in ``[1, num_envs]``.
    """
    if batch_size is None:
        return num_envs
    if not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= num_envs:
        raise ValueError(
            f"batch_size must be an int in [1, num_envs] = [1, {num_envs}] or None, "
            f"got {batch_size!r}"
        )
    return int(batch_size)


@dataclass(frozen=True)
class Spaces:
    """A vector env's spaces: single and batched."""

    single_observation_space: Space[Any]
    observation_space: Space[Any]
    single_action_space: Space[Any]
    action_space: Space[Any]


def batched_spaces(
    obs_spaces: Sequence[Space[Any]],
    act_spaces: Sequence[Space[Any]],
    mode: ObservationMode,
    name: str,
) -> Spaces:
    """The single and batched spaces (as ``observation_mode`` says), checked env by env
    against env 0's; ``obs_spaces`` and ``act_spaces`` hold every env's, in env order;
    ``name``: the vector env's class, for the errors.

    Raises:
        RuntimeError: an env's spaces differ from env 0's where they may not (gymnasium's
            wording, naming the env).
    """
    num_envs = len(obs_spaces)
    single_action_space = act_spaces[0]
    action_space = batch_space(single_action_space, num_envs)
    if isinstance(mode, tuple):
        observation_space, single_observation_space = mode
    elif mode == "same":
        single_observation_space = obs_spaces[0]
        observation_space = batch_space(single_observation_space, num_envs)
    else:
        single_observation_space = obs_spaces[0]
        observation_space = batch_differing_spaces(obs_spaces)
    for i, (obs_space, act_space) in enumerate(zip(obs_spaces, act_spaces)):
        if mode == "same":
            if obs_space != single_observation_space:
                raise RuntimeError(
                    f"{name}(..., observation_mode='same') however some of the "
                    f"sub-environments observation spaces are not equivalent: env {i} has "
                    f"{obs_space} but env 0 has {single_observation_space}. If this is "
                    "intentional, use `observation_mode='different'` instead."
                )
        elif not is_space_dtype_shape_equiv(obs_space, single_observation_space):
            raise RuntimeError(
                f"{name}(..., observation_mode='different' or custom space) however the "
                "sub-environment's observation spaces do not share a common shape and "
                f"dtype: env {i} has {obs_space}, env 0 has {single_observation_space}."
            )
        if act_space != single_action_space:
            raise RuntimeError(
                "Some environments have an action space different from "
                f"`{single_action_space}`: env {i} has {act_space}. In order to batch "
                "actions, the action spaces from all environments must be equal."
            )
    return Spaces(single_observation_space, observation_space, single_action_space, action_space)


def copy_nest(obs: Any) -> Any:
    """A copy of a batch of observations: each array copied, anything else deep-copied."""
    return map_leaves(
        lambda leaf: leaf.copy() if isinstance(leaf, np.ndarray) else deepcopy(leaf), obs
    )


def view_nest(obs: Any) -> Any:
    """A new view of each array of a batch in an observation slot (see _batch.ObsSlots)."""
    return map_leaves(np.ndarray.view, obs)
