"""Reset options: the forms ``reset(options=...)`` takes, the reset mask, the options each env
stored (``set_reset_options``), and the ``ResetPayload`` each unit gets.

Lock-step ``reset`` and asynchronous ``async_reset`` read their arguments here
(:meth:`EnvResetOptions.request`) and build every unit's payload with
:meth:`ResetRequest.payload`; a replacement's reset (a restart, a rebuild, a recycled
worker) takes the stored options from :meth:`EnvResetOptions.stored`. The front sends and
collects; this module only checks and slices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from subvec._backend import Unit
from subvec._commands import ResetOptionsPayload, ResetPayload
from subvec._compat import reset_mask_error
from subvec._front.ended import EndedEnvs
from subvec._seeding import SeedArg, per_env_seeds

__all__ = ["EnvOptions", "EnvResetOptions", "ResetOptions", "ResetRequest", "unit_options"]

#: ``reset(options=...)``: one dict for every env, one dict (or None) per env, or None
ResetOptions = dict[str, Any] | Sequence[dict[str, Any] | None] | None
#: the options that go to the envs: a dict for all, a checked per-env list, or None
EnvOptions = dict[str, Any] | list[dict[str, Any] | None] | None


def unit_options(options: EnvOptions, unit: Unit) -> EnvOptions:
    """The part of a reset's options that goes to ``unit``: a per-env list is sliced."""
    return options[unit.lo : unit.hi] if isinstance(options, list) else options


@dataclass(frozen=True)
class ResetRequest:
    """One reset's checked arguments: a seed per env, the reset mask (None: every env), and
    the options the envs see (the caller's dict without the mask, or the per-env list)."""

    seeds: list[int | None]
    #: a copy of the caller's mask; the front may add envs to it (rebuilt units)
    mask: np.ndarray | None
    options: EnvOptions

    def envs(self, unit: Unit) -> list[int]:
        """The envs of ``unit`` this reset resets."""
        mask = self.mask
        return [e for e in range(unit.lo, unit.hi) if mask is None or mask[e]]

    def include(self, units: Iterable[Unit]) -> None:
        """Reset ``units``' envs too, whatever the mask says (rebuilt units: fresh envs have
        no state to keep)."""
        if self.mask is not None:
            for unit in units:
                self.mask[unit.lo : unit.hi] = True

    def done(self, ended: EndedEnvs) -> None:
        """The reset is over: the envs it reset no longer wait for one (``ended``)."""
        ended.reset(self.mask)

    def payload(self, unit: Unit, stored: Sequence[dict[str, Any] | None] | None) -> ResetPayload:
        """``unit``'s RESET payload; ``stored``: its envs' stored options, which go along
        (a unit rebuilt or recycled just now has none yet)."""
        mask = self.mask
        sub_mask = None if mask is None else [bool(m) for m in mask[unit.lo : unit.hi]]
        return ResetPayload(
            self.seeds[unit.lo : unit.hi], unit_options(self.options, unit), sub_mask, stored
        )


class EnvResetOptions:
    """The options each env's resets get when none are named, and the checks of every form
    of reset options."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        #: per env: the options its resets get when none are named (``set_reset_options``)
        self.per_env: list[dict[str, Any] | None] = [None] * num_envs

    def request(self, seed: SeedArg, options: ResetOptions) -> ResetRequest:
        """Per-env seeds, the checked ``reset_mask`` (or None), and the options the envs see:
        the caller's dict without the mask (never mutated), or the per-env list, checked.

        Raises:
            TypeError, ValueError: bad seeds, or options that are none of the forms
                ``reset`` takes.
        """
        seeds = per_env_seeds(seed, self.num_envs)
        if options is None:
            return ResetRequest(seeds, None, None)
        if isinstance(options, (list, tuple)):
            return ResetRequest(seeds, None, self.checked(options, "reset(options=...)"))
        if not isinstance(options, dict):
            raise TypeError(
                "reset(options=...) takes a dict (every env), a list or tuple of "
                f"{self.num_envs} dicts or None (one per env), or None; got "
                f"{type(options).__name__}"
            )
        if "reset_mask" not in options:
            return ResetRequest(seeds, None, options)
        mask = self.checked_mask(options["reset_mask"])
        return ResetRequest(seeds, mask, {k: v for k, v in options.items() if k != "reset_mask"})

    def checked(
        self, options: Sequence[Any], where: str, env_ids: Sequence[int] | None = None
    ) -> list[dict[str, Any] | None]:
        """``options`` checked as one dict (or None) per env of ``env_ids`` (None: every env),
        each a shallow copy (later changes to the caller's dicts do not reach the envs).

        Raises:
            ValueError: not one entry per env, or an entry holding ``"reset_mask"``.
            TypeError: an entry that is neither a dict nor None.
        """
        what = "num_envs" if env_ids is None else "len(env_ids)"
        expected = self.num_envs if env_ids is None else len(env_ids)
        if len(options) != expected:
            raise ValueError(
                f"{where}: a list or tuple of options needs one entry per env ({what} = "
                f"{expected}), got {len(options)}"
            )
        checked: list[dict[str, Any] | None] = []
        for j, entry in enumerate(options):
            env = j if env_ids is None else env_ids[j]
            if entry is None:
                checked.append(None)
                continue
            if not isinstance(entry, dict):
                raise TypeError(
                    f"{where}: the options of env {env} (entry {j}) must be a dict or None, "
                    f"got {type(entry).__name__}"
                )
            if "reset_mask" in entry:
                raise ValueError(
                    f"{where}: the options of env {env} (entry {j}) hold 'reset_mask', which "
                    "is not an option of one env's reset: pass options={'reset_mask': mask} "
                    "(gymnasium's form), and per-env options with set_reset_options()"
                )
            checked.append(dict(entry))
        return checked

    def store(self, options: Any, ids: Sequence[int]) -> None:
        """Check ``options`` (what ``set_reset_options`` takes) for the envs ``ids`` and keep
        them; nothing changes when they are refused.

        Raises:
            ValueError, TypeError: a list whose length is not ``len(ids)``, or an entry that
                is not a dict or None.
        """
        where = "set_reset_options"
        if options is None or isinstance(options, dict):
            per_env = self.checked([options] * len(ids), where, ids)
        elif isinstance(options, (list, tuple)):
            per_env = self.checked(options, where, ids)
        else:
            raise TypeError(
                "set_reset_options(options) takes a dict (every env of env_ids), a list or "
                "tuple of one dict or None per env of env_ids, or None (clears); got "
                f"{type(options).__name__}"
            )
        for env, opts in zip(ids, per_env):
            self.per_env[env] = opts

    def stored(self, unit: Unit) -> list[dict[str, Any] | None] | None:
        """What ``unit``'s envs have stored (for a replacement), or None when nothing is."""
        stored = self.per_env[unit.lo : unit.hi]
        return stored if any(o is not None for o in stored) else None

    def store_payload(self, unit: Unit, envs: Sequence[int]) -> ResetOptionsPayload:
        """``unit``'s SET_RESET_OPTIONS payload: what ``envs`` (global indices) have stored."""
        return ResetOptionsPayload([e - unit.lo for e in envs], [self.per_env[e] for e in envs])

    def store_payloads(
        self, targets: Mapping[int, Sequence[int]]
    ) -> Callable[[Unit], ResetOptionsPayload]:
        """Each unit's SET_RESET_OPTIONS payload, for ``targets`` (unit index -> its envs)."""
        return lambda unit: self.store_payload(unit, targets[unit.index])

    def payloads(self, request: ResetRequest) -> Callable[[Unit], ResetPayload]:
        """Each unit's RESET payload for ``request``, with what its envs have stored."""
        return lambda unit: request.payload(unit, self.stored(unit))

    def checked_mask(self, reset_mask: Any) -> np.ndarray:
        """``options["reset_mask"]`` checked (gymnasium's messages), as a copy.

        Raises:
            TypeError: not a numpy array of ``np.bool_`` (gymnasium 1.4).
            ValueError: not of shape ``(num_envs,)``, or no env in it (gymnasium 1.4).
            AssertionError: any of those before gymnasium 1.4, as its SyncVectorEnv asserts.
        """
        if not isinstance(reset_mask, np.ndarray):
            raise reset_mask_error("type", self.num_envs, type(reset_mask))
        if reset_mask.shape != (self.num_envs,):
            raise reset_mask_error("shape", self.num_envs, reset_mask.shape)
        if reset_mask.dtype != np.bool_:
            raise reset_mask_error("dtype", self.num_envs, reset_mask.dtype)
        if not np.any(reset_mask):
            raise reset_mask_error("empty", self.num_envs, reset_mask)
        return np.array(reset_mask, dtype=np.bool_)
