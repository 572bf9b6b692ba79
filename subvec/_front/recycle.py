"""Recycling: replacing a worker between two episodes, because its env leaks.

Opt-in with ``recycle_every`` (episodes per env) and ``worker_max_rss`` (bytes). The front's
:class:`Recycler` counts the episodes that end in each step and, when a worker is due,
replaces it (a new process, its env rebuilt from its factory) at the episode boundary, so no
episode is cut short:

- NEXT_STEP: the step after the end is the reset step: the replacement's reset is that step's
  result (reward 0, both flags False, the reset's infos), in place of the old env's autoreset;
- SAME_STEP: the step that ended reports the old env's final observation and info, and the
  replacement's reset observation and info, as its autoreset;
- DISABLED: the caller's ``reset`` of the ended env goes to the replacement.

Only one env per worker can be recycled exactly: in lock-step, the envs of one worker do not end
their episodes at the same step, and a process holds all of them. So recycling needs one env
per worker (the default layout when it is asked for).

Seeds: a rebuilt env's first reset takes the caller's seed when that reset is the caller's
(DISABLED) and it gives one; otherwise it is derived from the seed of the env's last seeded
reset and how many times the env has been rebuilt since
(``SeedSequence([seed, rebuilds]).generate_state(1)[0]``), so a seeded run recycles the same
way every time. An env never seeded is rebuilt with fresh entropy (``seed=None``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from subvec._backend import Collected, Failure, Outcome, RestartRecord, Unit
from subvec._commands import ResetPayload, Status, UnitReply, raise_first
from subvec._compat import AutoresetMode
from subvec._front.merge import Part
from subvec._front.units import Units
from subvec._infos import as_events
from subvec.errors import first_line

__all__ = ["RecyclePolicy", "Recycler", "RssReader"]

#: ``rss_of(unit)``: the resident memory of ``unit``'s process in bytes, None if unknown
RssReader = Callable[[Unit], int | None]


def _check_count(name: str, value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int ({what}) or None, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1 ({what}) or None (never), got {value}")
    return int(value)


@dataclass
class RecyclePolicy:
    """``recycle_every`` / ``worker_max_rss``, the episodes counted and the recycles made."""

    every: int | None
    max_rss: int | None
    #: every replacement made, oldest first
    records: list[RestartRecord] = field(default_factory=list)
    #: unit index -> (pid counted for, episodes ended since that process started)
    _episodes: dict[int, tuple[int | None, int]] = field(default_factory=dict)
    #: unit index -> (pid that is due, why): replaced at its next episode boundary
    due: dict[int, tuple[int | None, str]] = field(default_factory=dict)
    #: env -> seed of its last seeded reset, and rebuilds since then
    _seeds: dict[int, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def create(cls, recycle_every: Any, worker_max_rss: Any) -> RecyclePolicy | None:
        """The policy for these arguments, or None when neither asks for recycling.

        Raises:
            TypeError: an argument is not an int or None.
            ValueError: an argument is below 1.
        """
        every = _check_count("recycle_every", recycle_every, "episodes per env")
        max_rss = _check_count("worker_max_rss", worker_max_rss, "bytes")
        if every is None and max_rss is None:
            return None
        return cls(every, max_rss)

    def layout(
        self,
        num_envs: int,
        num_workers: int | None,
        envs_per_worker: int | None,
        parent_envs: int,
    ) -> tuple[int | None, int | None]:
        """``(num_workers, envs_per_worker)`` for the layout plan: one env per worker.

        Raises:
            ValueError: the arguments ask for more than one env per worker, or parent envs.
        """
        why = (
            "recycling replaces a worker process between two episodes of its env, and the "
            "envs of one worker do not end their episodes at the same step"
        )
        if envs_per_worker is not None and envs_per_worker != 1:
            raise ValueError(
                f"recycle_every/worker_max_rss need one env per worker, got "
                f"envs_per_worker={envs_per_worker}: {why}. Pass envs_per_worker=1 (the "
                "default when recycling)"
            )
        if num_workers is not None and num_workers != num_envs - parent_envs:
            raise ValueError(
                f"recycle_every/worker_max_rss need one env per worker, got "
                f"num_workers={num_workers} for {num_envs} envs: {why}. Pass "
                "envs_per_worker=1 (the default when recycling)"
            )
        if parent_envs:
            raise ValueError(
                f"recycle_every/worker_max_rss replace worker processes; parent_envs="
                f"{parent_envs} envs run in the parent, which cannot be replaced. Pass "
                "parent_envs=0"
            )
        return None, 1

    # --- counting ---------------------------------------------------------------------------

    def count(self, units: Sequence[Unit], ended: np.ndarray, rss_of: RssReader) -> None:
        """Count the episodes that ended in a step (``ended``: per env, not ended by a
        restart) and mark the workers that are now due (``rss_of``: the backend's reader of
        a unit's resident memory)."""
        for i in np.flatnonzero(ended).tolist():
            unit = next(u for u in units if u.lo <= i < u.hi)
            pid = unit.pid
            counted_pid, episodes = self._episodes.get(unit.index, (pid, 0))
            if counted_pid != pid:  # a replaced process starts from zero
                episodes = 0
            episodes += 1
            self._episodes[unit.index] = (pid, episodes)
            if self.every is not None and episodes >= self.every:
                self.due[unit.index] = (pid, f"recycled after {episodes} episodes")
                continue
            if self.max_rss is not None:
                rss = rss_of(unit)
                if rss is not None and rss > self.max_rss:
                    reason = f"recycled: resident memory {rss} bytes > worker_max_rss"
                    self.due[unit.index] = (pid, f"{reason}={self.max_rss}")

    def take_due(
        self, units: Sequence[Unit], envs: np.ndarray | None = None
    ) -> list[tuple[Unit, str]]:
        """The due units (whose envs are all in ``envs``, a bool mask; None: any) and why,
        no longer due. A unit whose process was replaced meanwhile is fresh: dropped."""
        taken = []
        for index, (pid, reason) in list(self.due.items()):
            unit = next(u for u in units if u.index == index)
            if unit.pid != pid:
                del self.due[index]
            elif envs is None or envs[unit.lo : unit.hi].all():
                del self.due[index]
                taken.append((unit, reason))
        return taken

    # --- seeds and records ------------------------------------------------------------------

    def seeded(self, seeds: Sequence[int | None], mask: np.ndarray | None) -> None:
        """A reset with these per-env seeds (only where ``mask``): the base of later rebuilds."""
        for i, seed in enumerate(seeds):
            if seed is not None and (mask is None or mask[i]):
                self._seeds[i] = (seed, 0)

    def seed_for(self, env: int) -> int | None:
        """The seed of the first reset of env ``env`` rebuilt (see the module docstring)."""
        base = self._seeds.get(env)
        if base is None:
            return None
        seed, rebuilds = base
        self._seeds[env] = (seed, rebuilds + 1)
        state = np.random.SeedSequence([seed, rebuilds + 1]).generate_state(1)
        return int(state[0])

    def record(self, old: Unit, old_pid: int | None, new: Unit, reason: str) -> None:
        envs = tuple(range(new.lo, new.hi))
        why = f"{reason} (pid {old_pid} -> {new.pid})"
        self.records.append(RestartRecord(new.index, envs, why, time.monotonic()))
        self._episodes.pop(old.index, None)


class Recycler:
    """Recycling for :class:`subvec._front.front.VectorFront`: the front calls its hooks only when
    recycling is configured, and hands it the batch arrays each hook reads.

    Args:
        policy: the recycling arguments, episode counts and records.
        units: the front's units (recycling replaces them through it).
        num_envs: the vector env's.
        autoreset_mode: the vector env's.
        rss_of: the backend's reader of a unit's resident memory (``worker_max_rss``).
        build_timeout: the front's bound on building a replacement, given the call's.
        stored_options: the options a unit's envs reset with when none are named.
        fail: the front's failure policy for units that died or hung (it raises).
        break_env: the front's ``break``: the vector env is broken, these units lost.
    """

    def __init__(
        self,
        policy: RecyclePolicy,
        units: Units,
        num_envs: int,
        autoreset_mode: AutoresetMode,
        *,
        rss_of: RssReader,
        build_timeout: Callable[[float | None], float | None],
        stored_options: Callable[[Unit], list[dict[str, Any] | None] | None],
        fail: Callable[[list[Failure], float | None], None],
        break_env: Callable[[list[int], str], None],
    ) -> None:
        self.policy = policy
        self.units = units
        self.autoreset_mode = autoreset_mode
        self.rss_of = rss_of
        self.build_timeout = build_timeout
        self.stored_options = stored_options
        self.fail = fail
        self.break_env = break_env
        #: the envs whose answer to this step is a recycled worker's reset (NEXT_STEP)
        self.recycled = np.zeros(num_envs, dtype=np.bool_)
        self.any_recycled = False

    @property
    def records(self) -> list[RestartRecord]:
        """Every replacement made, oldest first."""
        return self.policy.records

    def _recycle(self, unit: Unit, reason: str, timeout: float | None) -> Unit:
        """Replace ``unit`` by a new process with its envs rebuilt (not reset).

        Raises:
            EnvError, WorkerDiedError, WorkerTimeoutError: the replacement failed to start;
                the vector env is broken (``reset()`` rebuilds it).
        """
        policy = self.policy
        old_pid = unit.pid
        try:
            new = self.units.replace(unit, self.build_timeout(timeout))
        except BaseException as exc:
            failed = f"{reason}; its replacement failed: {first_line(exc)}"
            policy.records.append(
                RestartRecord(unit.index, tuple(range(unit.lo, unit.hi)), failed, time.monotonic())
            )
            self.break_env([unit.index], f"recycling {unit.describe()} failed: {exc}")
            raise
        policy.record(unit, old_pid, new, reason)
        return new

    def _reset_recycled(self, unit: Unit, timeout: float | None) -> Outcome:
        """Recycle ``unit`` and reset its new envs (the autoreset's place); their outcome."""
        seeds = [self.policy.seed_for(i) for i in range(unit.lo, unit.hi)]
        payload = ResetPayload(seeds, None, None, self.stored_options(unit))
        got = self.units.reset(unit, payload, timeout, "resetting a recycled worker")
        if isinstance(got, Collected):
            self.fail(got.failures, timeout)  # raises
            raise AssertionError("unreachable")
        return got

    def before_step(self, timeout: float | None, *, into: dict[int, Outcome]) -> None:
        """NEXT_STEP, before a step is sent: each due worker is replaced and its reset is this
        step's answer for its envs (the step after the end is the reset step), put ``into``
        the front's answers by unit index (the step is not sent to those units)."""
        if self.any_recycled:
            self.recycled[:] = False
            self.any_recycled = False
        policy = self.policy
        if not policy.due or self.autoreset_mode is not AutoresetMode.NEXT_STEP:
            return
        for unit, reason in policy.take_due(self.units.all):
            new = self._recycle(unit, reason, timeout)
            into[new.index] = self._reset_recycled(new, timeout)
            self.recycled[new.lo : new.hi] = True
            self.any_recycled = True

    def on_reset(
        self, seeds: list[int | None], mask: np.ndarray | None, timeout: float | None
    ) -> None:
        """A reset of the caller's: due workers whose envs it resets are replaced first, and
        get its seeds (derived ones where it gives None, written into ``seeds``)."""
        policy = self.policy
        policy.seeded(seeds, mask)
        if not policy.due:
            return
        for unit, reason in policy.take_due(self.units.all, mask):
            new = self._recycle(unit, reason, timeout)
            for i in range(new.lo, new.hi):
                if seeds[i] is None:
                    seeds[i] = policy.seed_for(i)

    def count_episodes(
        self,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        restarted: np.ndarray | None,
    ) -> None:
        """After a step: the recycled envs' reset step reads reward 0 and no flags (written
        into the step's arrays); count the episodes that ended (not those a restart cut
        short: ``restarted``, None when none was)."""
        if self.any_recycled:
            rewards[self.recycled] = 0.0
            terminations[self.recycled] = False
            truncations[self.recycled] = False
        ended = terminations | truncations
        if restarted is not None:
            ended &= ~restarted
        if ended.any():
            self.policy.count(self.units.all, ended, self.rss_of)

    def same_step(
        self,
        parts: Sequence[Part],
        terminations: np.ndarray,
        truncations: np.ndarray,
        timeout: float | None,
    ) -> Sequence[Part]:
        """SAME_STEP, a step's parts (final observations resolved): each due worker whose env
        ended in it is replaced, and its new env's reset observation and info take the place
        of the old env's autoreset; the final observation and info stay the old env's."""
        policy = self.policy
        if not policy.due or self.autoreset_mode is not AutoresetMode.SAME_STEP:
            return parts
        by_lo: dict[int, Any] = dict(parts)
        errors = []
        for unit, reason in policy.take_due(self.units.all):
            lo, hi = unit.lo, unit.hi
            # The reset clears the rows' flags in the block; this step's are the old env's end.
            flags = terminations[lo:hi].copy(), truncations[lo:hi].copy()
            new = self._recycle(unit, reason, timeout)
            status, value = self._reset_recycled(new, timeout)
            terminations[lo:hi], truncations[lo:hi] = flags
            if status is Status.ERROR:
                errors.append(value)
                continue
            old = by_lo.get(new.lo)
            events = list(as_events(old.infos)) if old is not None and old.infos else []
            # One env per worker: its first event with a final observation is the end's; the
            # events after it were the old env's reset info.
            final = [e for e in events if "final_obs" in e[1]][:1]
            if status is Status.OK_PAYLOAD:
                reply: UnitReply = value
                events = final + list(as_events(reply.infos) if reply.infos else ())
                by_lo[new.lo] = UnitReply(events, reply.obs)
            else:
                by_lo[new.lo] = UnitReply(final, None)
        raise_first(errors)
        return sorted(by_lo.items())
