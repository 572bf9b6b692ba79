"""The public asynchronous calls of the front: ``async_reset``, ``send``, ``recv``, ``poll``,
``drain``, ``async_stats`` and what is in flight or held.

A mixin of :class:`subvec._front.front.VectorFront` that holds no state: each call checks the
front's state machine and hands over to the front's
:class:`~subvec._front.stepping.AsyncEngine`, which owns the envs in flight, the held results
and the order ``recv`` serves them in (docs/async.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from subvec._front.async_stats import AsyncStats
from subvec._front.options import ResetOptions
from subvec._front.setup import Timeouts
from subvec._front.stepping import AsyncEngine
from subvec._front.units import Units
from subvec._seeding import SeedArg

__all__ = ["AsyncCalls"]


class AsyncCalls:
    """The asynchronous calls of :class:`subvec._front.front.VectorFront` (a mixin)."""

    # The front's, declared for the type checker.
    _async: AsyncEngine
    _units: Units
    num_envs: int
    timeouts: Timeouts

    if TYPE_CHECKING:

        def _assert_is_running(self) -> None: ...
        def _begin_async(self, method: str) -> None: ...

    @property
    def in_flight_env_ids(self) -> list[int]:
        """The envs sent an action (or a reset) whose result no ``recv`` has collected yet."""
        return self._async.in_flight_env_ids

    @property
    def ready_env_ids(self) -> list[int]:
        """The envs whose results are held for the next ``recv``, in the order it serves them
        (sent their work first, first)."""
        return self._async.ready_env_ids

    def async_reset(self, seed: SeedArg = None, options: ResetOptions = None) -> None:
        """Start resetting every env (or those in ``options["reset_mask"]``); their results
        come back through :meth:`recv` (reward 0, both flags False, the reset's infos).

        Args:
            seed: as :meth:`reset`: None, an int (env ``i`` gets ``seed + i``) or one per env.
            options: as :meth:`reset`: a dict (``"reset_mask"`` included) or one dict (or
                None) per env; envs given none reset with their stored options.

        Raises:
            AlreadyPendingCallError: envs are in flight or held (``drain()`` first), or a
                lock-step call is pending.
            ValueError, TypeError: bad seeds, options or reset mask.
        """
        self._begin_async("async_reset")
        self._async.reset(seed, options)

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Start stepping the envs ``env_ids`` with ``actions`` (one each, in that order).

        Args:
            actions: a batch of ``len(env_ids)`` actions of the single action space.
            env_ids: the envs to step (default: those the last :meth:`recv` returned).

        Raises:
            ValueError: an unknown or repeated env id, an env in flight or whose result was
                not returned yet, an ended env with autoreset DISABLED, or a batch whose
                length is not ``len(env_ids)``; nothing is sent.
            AlreadyPendingCallError: a lock-step call is pending.
        """
        self._begin_async("send")
        self._async.send(actions, env_ids)

    def send_chunk(
        self,
        actions: Any,
        env_ids: Any = None,
        *,
        stop_on_done: bool = False,
        all_obs: bool = False,
    ) -> None:
        """Start an action chunk on the envs ``env_ids`` (K actions each, in that order) while
        others may be in flight; their results come back through :meth:`recv`. Per env, the
        chunk is exactly :meth:`step_chunk`'s (the same sub-steps, autoreset, ``stop_on_done``,
        ``all_obs`` and infos), and each worker gets one command for its envs of the chunk.

        Args:
            actions: ``(len(env_ids), K, *single_action_space.shape)`` (per leaf of a
                Dict/Tuple action), K >= 1.
            env_ids: the envs (default: those the last :meth:`recv` returned).
            stop_on_done, all_obs: as :meth:`step_chunk`.

        Returns:
            None. A :meth:`recv` returning these envs gives rewards and flags ``(n, K)``,
            observations ``(n, ...)`` (``all_obs``: ``(n, K, ...)``), and infos with the
            chunk axis, ``chunk_steps`` and ``env_id``; a batch holds results of one shape
            (the oldest held decides), so steps and chunks come back in separate batches.

        Raises:
            ValueError, TypeError: as :meth:`send`, or the batch is not chunks of the action
                space for these envs, or its K or ``all_obs`` differs from that of chunks
                still in flight (chunks in flight at once share K); nothing is sent.
            AlreadyPendingCallError: a lock-step call is pending.
        """
        self._begin_async("send_chunk")
        self._async.send_chunk(actions, env_ids, stop_on_done, all_obs)

    def recv(
        self,
        min_envs: int | None = None,
        max_envs: int | None = None,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        env_ids: Any = None,
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """The first ready envs' results (or those of ``env_ids``).

        Args:
            min_envs: wait until this many are ready (default ``batch_size``; at most the
                envs in flight or held, since no others can become ready). 0: wait for
                none; the batch may be empty.
            max_envs: return at most this many (default ``max(batch_size, min_envs)``).
            timeout: seconds to wait (None: the constructor's ``timeout``; of a per-command
                ``timeout``, the longest bound of the commands in flight, a reset's or a
                step's).
            deadline: once ``min_envs`` are ready, keep collecting until ``max_envs`` are, or
                until ``deadline`` seconds after the call began, whichever comes first (None:
                return at once with what is ready then).
            env_ids: wait until every one of these envs (in flight or held) is ready and
                return exactly them, in this order (one group of a staged loop); not with
                ``min_envs``, ``max_envs`` or ``deadline``.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)`` with one row per
            env; ``infos["env_id"]`` (an int array; for ``info_format="list"``, each dict's
            ``"env_id"``) names the env of each row.

        Raises:
            NoAsyncCallError: nothing is in flight or held.
            RecvTimeoutError: fewer than ``min_envs`` (or not all of ``env_ids``) got ready
                in time (nothing is lost).
            ValueError: ``env_ids`` names an env that is neither in flight nor held, or comes
                with ``min_envs``, ``max_envs`` or ``deadline``; bad ``min_envs``/``max_envs``.
            EnvError: the step of an env this call would return raised (the other results
                stay held).
            WorkerDiedError: a worker died (with on_worker_failure="raise").
        """
        self._assert_is_running()
        if timeout is None:  # the longest bound of the commands in flight
            timeout = self.timeouts.longest(self._async.in_flight_kinds())
        return self._async.recv(min_envs, max_envs, timeout, deadline, env_ids)

    def poll(
        self, max_envs: int | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """What is ready now, without waiting: ``recv(min_envs=0, max_envs=max_envs)``.

        Args:
            max_envs: return at most this many (default ``batch_size``).

        Returns:
            As :meth:`recv`; the batch may hold zero envs (arrays of length 0, correctly
            shaped and typed).

        Raises:
            NoAsyncCallError: nothing is in flight or held.
            EnvError: the step of an env this call would return raised.
            WorkerDiedError: a worker died (with on_worker_failure="raise").
        """
        self._assert_is_running()
        return self._async.recv(0, max_envs, 0.0)

    def env_groups(self, num_groups: int) -> list[list[int]]:
        """Split the envs into ``num_groups`` stages of whole workers, in env order, for a
        staged loop (``recv(env_ids=group)``, then ``send(actions, group)``, group by group).

        Args:
            num_groups: how many groups.

        Returns:
            ``num_groups`` lists of env ids; no worker holds envs of two of them.

        Raises:
            ValueError: the workers cannot be split into that many groups of whole workers
                (the message says which layout can).
        """
        units = self._units.all
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
            raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
        if len(units) % num_groups:
            sizes = sorted({u.hi - u.lo for u in units})
            raise ValueError(
                f"{len(units)} units (workers, or the parent's own envs; of {sizes} envs) "
                f"cannot be split into {num_groups} groups of whole units: a unit steps one "
                "command at a time, so a group sharing one would wait for the other's step. "
                f"Build with num_workers a multiple of {num_groups} (envs_per_worker dividing "
                f"{self.num_envs // num_groups})"
            )
        per = len(units) // num_groups
        return [
            list(range(units[g * per].lo, units[(g + 1) * per - 1].hi)) for g in range(num_groups)
        ]

    def async_stats(self, reset: bool = False) -> AsyncStats:
        """Who waits on whom in the asynchronous loop, readable at any time (also while envs
        are in flight): batches returned, their fill, queueing and policy times, the shares
        of time the consumer waited on the envs and the envs on the consumer, and a verdict.

        Args:
            reset: start a new window after reading this one.

        Returns:
            The window since the vector env was built or last reset (:class:`AsyncStats`;
            ``str()`` of it is one line).
        """
        recorder = self._async.recorder
        stats = recorder.snapshot()
        if reset:
            recorder.reset()
        return stats

    def drain(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Wait for everything in flight and return every held result as one recv-shaped
        batch (possibly of zero envs); the vector env is idle again, so ``step``, ``reset``
        and ``call`` work.

        Raises:
            EnvError: an env's step raised (the other results stay held: drain again).
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self._assert_is_running()
        return self._async.drain(self.timeouts.longest(self._async.in_flight_kinds()))
