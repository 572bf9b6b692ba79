"""The public asynchronous calls of the front: ``async_reset``, ``send``, ``recv``, ``drain``
and what is in flight or held.

A mixin of :class:`subvec._front.front.VectorFront` that holds no state: each call checks the
front's state machine and hands over to the front's
:class:`~subvec._front.stepping.AsyncEngine`, which owns the envs in flight, the held results
and the order ``recv`` serves them in (docs/async.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from subvec._front.options import ResetOptions
from subvec._front.setup import Timeouts
from subvec._front.stepping import AsyncEngine
from subvec._seeding import SeedArg

__all__ = ["AsyncCalls"]


class AsyncCalls:
    """The asynchronous calls of :class:`subvec._front.front.VectorFront` (a mixin)."""

    # The front's, declared for the type checker.
    _async: AsyncEngine
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

    def recv(
        self, min_envs: int | None = None, max_envs: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """The first ready envs' results.

        Args:
            min_envs: wait until this many are ready (default ``batch_size``; at most the
                envs in flight or held, since no others can become ready).
            max_envs: return at most this many (default ``max(batch_size, min_envs)``).
            timeout: seconds to wait (None: the constructor's ``timeout``; of a per-command
                ``timeout``, the longest bound of the commands in flight, a reset's or a
                step's).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)`` with one row per
            env; ``infos["env_id"]`` (an int array; for ``info_format="list"``, each dict's
            ``"env_id"``) names the env of each row.

        Raises:
            NoAsyncCallError: nothing is in flight or held.
            RecvTimeoutError: fewer than ``min_envs`` got ready in time (nothing is lost).
            EnvError: the step of an env this call would return raised (the other results
                stay held).
            WorkerDiedError: a worker died (with on_worker_failure="raise").
        """
        self._assert_is_running()
        if timeout is None:  # the longest bound of the commands in flight
            timeout = self.timeouts.longest(self._async.in_flight_kinds())
        return self._async.recv(min_envs, max_envs, timeout)

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
