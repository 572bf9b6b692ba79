"""The front: gymnasium's VectorEnv contract over backends that run the envs.

    caller ──► VectorFront: state machine, payloads, result assembly, info merge, autoreset
                 │          bookkeeping, error surfacing, failure policy
                 │  send(command, payloads) / collect(timeout) -> outcomes + failures
                 ├── WorkerPool (``_process.pool``): worker processes, pipes, sentinels
                 ├── LocalShare (``_process.local``): the parent's own envs, run inside collect
                 └── RayActors (``_ray``): Ray actors, each holding a SubprocVectorEnv

The front owns its state and the components that act on it, each in a module of this package
and none holding a strong reference back: the lock-step exchange (``exchange``, the writer of
the restart flags), recovery (``recovery``), the observation batch (``observations``, the
writer of each env's by-value observation), a step's results (``step_results``), reset
options (``options``), the asynchronous engine (``stepping``), recycling (``recycle``) and
action chunks (``chunk``); the front calls them directly. Its mixins hold no state of their
own: its construction, which builds those components (``start``), the public asynchronous
calls, each handing over to the engine (``async_calls``), calls and attributes (``calls``),
the swap of envs inside the live units (``reconfigure``), and ending and restarting the units
between rollouts (``suspend``). This module is the one writer of the call state (``_state``,
the states of ``state``): the mixins and the backends' classes change it through
:meth:`VectorFront._enter`, :meth:`VectorFront._settle` and the failure hooks. The options'
checks are ``setup``; its units and every replacement of one go through ``units``. The batch
arrays are the backend's, seen through ``subvec._batch``.

The front knows no pipes and no processes (tests/test_rooms.py holds it to that). Every
fixed-size result of a call is already in the batch arrays when a unit answers (for the
process backend those are views of the shared block); a unit that has more to say (infos,
observations that travel by value, call results, an env's exception) answers with an
outcome, and the front assembles them in env order, as SyncVectorEnv would. A subclass
builds the backends and binds the batch arrays (:meth:`_start`), then every call below works
the same over any set of backends.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, TypeVar

import numpy as np
from gymnasium import logger
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError

from subvec._backend import Collected, Failure
from subvec._commands import Command
from subvec._compat import VectorEnvBase
from subvec._front.async_calls import AsyncCalls
from subvec._front.calls import EnvCalls, EnvIds
from subvec._front.chunk import ChunkResults, PerUnit
from subvec._front.merge import Part
from subvec._front.options import ResetOptions, ResetRequest
from subvec._front.reconfigure import EnvReconfigure
from subvec._front.start import FrontStart, public_name
from subvec._front.state import _ASYNC_NAME, _State, pending_call
from subvec._front.suspend import Suspension
from subvec._kwargs import accepts_any_keyword, check_kwargs, options_of
from subvec._seeding import SeedArg
from subvec._spaces import BY_VALUE, Stored
from subvec.errors import BrokenVectorEnvError
from subvec.proxy import RemoteProxy

__all__ = ["EnvIds", "ResetOptions", "VectorFront"]

_Front = TypeVar("_Front", bound="VectorFront")

#: keywords of gymnasium 0.29's AsyncVectorEnv that subvec does not take, and what to do
_SPACE_HINT = (
    "gymnasium 0.29's AsyncVectorEnv took the spaces; subvec reads them from the envs (each "
    "env's checked against env 0's): drop it"
)
_FOREIGN_KEYWORDS = {"observation_space": _SPACE_HINT, "action_space": _SPACE_HINT}

#: after Ctrl-C interrupted a call, how long the next call waits for the units still running
#: it before it says so
INTERRUPTED_NOTICE_S = 1.0
#: how long close() waits for them before it ends their workers
INTERRUPTED_CLOSE_WAIT_S = 1.0


class VectorFront(FrontStart, AsyncCalls, EnvCalls, EnvReconfigure, Suspension, VectorEnvBase):
    """The gymnasium VectorEnv contract over backends; see the module docstring. The
    asynchronous calls (``async_reset``, ``send``, ``recv``, ``drain``; ``AsyncCalls``)
    delegate to an :class:`~subvec._front.stepping.AsyncEngine`."""

    _state = _State.IDLE
    #: ``make_vec``'s seed for the first reset that names none (:meth:`seed_first_reset`);
    #: forgotten once a reset was sent
    _first_reset_seed: int | None = None
    #: the interrupted call (its state's name) and when it was interrupted (monotonic), while
    #: the state is INTERRUPTED
    _interrupted_call = ""
    _interrupted_at = 0.0

    def __new__(cls: type[_Front], *args: Any, **kwargs: Any) -> _Front:
        # Python's own message for a mistyped option names no alternative; this one names
        # the closest option, as make_vec and the SB3 face do, before anything starts.
        if not accepts_any_keyword(cls):
            check_kwargs(
                kwargs,
                ("env_fns", *options_of(cls)),
                f"{public_name(cls)}()",
                hints=_FOREIGN_KEYWORDS,
            )
        return super().__new__(cls)

    # --- state checks ------------------------------------------------------------------------

    def _assert_open(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"Trying to operate on `{public_name(type(self))}`, after a call to `close()`."
            )

    def _assert_is_running(self) -> None:
        self._assert_open()
        if self._state is _State.SUSPENDED and self._unstarted:
            self._start_lazily()  # start="lazy": the first call starts the units
        if self._state is _State.SUSPENDED:
            raise RuntimeError(
                "the vector env is suspended: resume() starts its units again (or close() it)"
            )
        if self._state is _State.BROKEN:
            raise BrokenVectorEnvError(
                f"the vector env is broken ({self._recovery.broken_reason}); reset() rebuilds "
                "the failed workers and resets every env, or close() it"
            )

    def _begin(self, state: _State) -> None:
        self._assert_is_running()
        if self._state is _State.INTERRUPTED:
            self._settle_interrupted(_ASYNC_NAME[state].removesuffix("_async"))
        if self._state is _State.ASYNC:
            raise AlreadyPendingCallError(
                f"Calling `{_ASYNC_NAME[state]}` while envs are stepping asynchronously (in "
                f"flight: {self.in_flight_env_ids}, ready: {self.ready_env_ids}); call "
                "`drain()` first",
                str(self._state.value),
            )
        if self._state is not _State.IDLE:
            raise pending_call(_ASYNC_NAME[state], self._state)

    def _begin_async(self, method: str) -> None:
        self._assert_is_running()
        if self._state is _State.INTERRUPTED:
            self._settle_interrupted(method)
        if self._recycler is not None:
            raise ValueError(
                f"{method}: asynchronous stepping is not available with recycle_every or "
                "worker_max_rss (recycling keeps episode boundaries in lock-step); use "
                "reset()/step(), or build the vector env without recycling"
            )
        if self._state not in (_State.IDLE, _State.ASYNC):
            raise pending_call(method, self._state)

    def _finish(self, state: _State, method: str) -> None:
        self._assert_is_running()
        if self._state is not state:
            raise NoAsyncCallError(
                f"Calling `{method}` without any prior call to `{_ASYNC_NAME[state]}`.",
                state.value,
            )

    def _interrupted(self, state: _State) -> None:
        """Ctrl-C interrupted the wait of the lock-step call of ``state``: units may still be
        running it (the one writer of this state, with the time it was entered)."""
        self._state = _State.INTERRUPTED
        self._interrupted_call = state.value
        self._interrupted_at = time.monotonic()

    def _settle_interrupted(self, before: str | None) -> bool:
        """Wait for the units still running an interrupted call, their results discarded:
        silently for up to :data:`INTERRUPTED_NOTICE_S`, then with a warning that names them,
        what waits and how to stop waiting, for up to the constructor's ``timeout``.

        Args:
            before: the call that waits (named in the warning); None for ``close()``, which
                waits silently for :data:`INTERRUPTED_CLOSE_WAIT_S` at most.

        Returns:
            True once no unit runs the interrupted call any more (the vector env is idle
            again); False when some still did when ``close()`` stopped waiting.

        Raises:
            KeyboardInterrupt: Ctrl-C again while waiting (still interrupted: the next call
                waits again, ``close()`` ends those workers).
            WorkerTimeoutError: they were still running it after ``timeout`` (still
                interrupted).
        """
        what = f"finishing the interrupted {self._interrupted_call}"
        first_wait = INTERRUPTED_CLOSE_WAIT_S if before is None else INTERRUPTED_NOTICE_S
        for backend in self._backends:
            owing = backend.owing()
            if not owing:
                continue
            got = backend.collect(first_wait, what, units=owing)
            still = [f.unit for f in got.failures if f.kind == "hung"] if got else []
            if not still:
                continue
            if before is None:
                return False
            ago = time.monotonic() - self._interrupted_at
            logger.warn(
                f"`{before}` waits for {', '.join(u.describe() for u in still)} to finish the "
                f"{self._interrupted_call} interrupted {ago:.1f} s ago (its results are "
                "discarded). Press Ctrl-C again to stop waiting; close() then ends those "
                "workers within seconds."
            )
            bound = self.timeouts.of(self._interrupted_call)
            got = backend.collect(bound, what, units=still)
            hung = [f for f in got.failures if f.kind == "hung"] if got else []
            if hung:
                raise hung[0].to_error(bound or 0.0)
        self._state = _State.IDLE
        return True

    def _break(self, units: Iterable[int], reason: str) -> None:
        """Broken: every call but ``close()`` and a rebuilding ``reset()`` raises."""
        self._state = _State.BROKEN
        self._recovery.broke(units, reason)

    def _fail(self, failures: list[Failure], timeout: float | None) -> NoReturn:
        """Raise the error of ``failures`` (units that died or hung, not restarted) as the
        policy says: a death breaks the vector env, a hang leaves it idle (the stuck units'
        late replies are dropped by seq)."""
        error, broken = self._policy.error(failures, timeout)
        if broken:
            self._break([f.unit.index for f in failures], failures[0].message)
        else:
            self._state = _State.IDLE
        raise error

    def _enter(self, state: _State) -> None:
        """Enter ``state``: a lock-step call of it went out (pending until :meth:`_settle`),
        or another state the front's calls lead to. This module is the one writer of the
        call state (``_state``): the mixins and the backends' classes change it through
        these methods."""
        self._state = state

    def _settle(self, state: _State) -> None:
        """The answers to the call of ``state`` are in, or it raised: idle again, unless it
        broke the vector env or Ctrl-C interrupted its wait."""
        if self._state is state:
            self._state = _State.IDLE

    def _collect(
        self,
        state: _State,
        timeout: float | None = None,
        only: frozenset[int] | None = None,
        request: ResetRequest | None = None,
    ) -> list[Part]:
        """Wait for the answers to the pending call of ``state`` (``LockstepExchange.collect``)."""
        try:
            return self._exchange.collect(state, timeout, only, request)
        finally:
            self._settle(state)

    def _answered(
        self, state: _State, collected: Collected, timeout: float | None, restart: bool
    ) -> list[Part]:
        """The parts of the answers a backend's own round trip ``collected`` for the call of
        ``state`` (``LockstepExchange.parts``)."""
        try:
            return self._exchange.parts(state, collected, timeout, restart)
        finally:
            self._settle(state)

    def _send_step(self, actions: Any, stored: Stored, per_env: list[Any] | None = None) -> None:
        """Send the step of ``actions`` (``LockstepExchange.send_step``): pending from now on."""
        self._exchange.send_step(actions, stored, per_env)
        self._enter(_State.WAITING_STEP)

    # --- reset -------------------------------------------------------------------------------

    def reset(
        self, *, seed: SeedArg = None, options: ResetOptions = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``) and return the batch.

        Args:
            seed: None, an int (env ``i`` gets ``seed + i``) or one seed (or None) per env.
            options: a dict passed to every env's ``reset``, whose ``"reset_mask"`` (a bool
                array of ``num_envs``) resets only those envs and is not passed on; or a
                list/tuple of ``num_envs`` dicts (or None), env ``i`` getting ``options[i]``
                (every env resets: a mask is a key of the dict form). An env given no
                options (None, an empty dict, or a dict holding only the mask) resets with
                the options :meth:`set_reset_options` stored for it, if any.

        Returns:
            ``(observations, infos)`` as SyncVectorEnv returns them.

        After a worker died (the vector env broken), the failed workers are rebuilt first
        (their factories run again) and their envs reset too, whatever the mask says;
        ``rebuilds`` records them.

        Raises:
            AlreadyPendingCallError: another call is pending.
            ValueError, TypeError: bad seeds, options or reset mask (nothing is sent).
            EnvError: an env's reset raised (its type kept, naming the env), or a rebuilt
                worker's factory raised (the vector env stays broken).
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: SeedArg = None, options: ResetOptions = None) -> None:
        """Start resetting; :meth:`reset_wait` returns the result.

        Args:
            seed: as :meth:`reset`.
            options: as :meth:`reset`.

        A broken vector env (a worker died) rebuilds its failed workers here, as
        :meth:`reset` says.

        Raises:
            AlreadyPendingCallError: another call is pending.
            ClosedEnvironmentError: the vector env is closed.
            ValueError, TypeError: bad seeds, options or reset mask (nothing is sent).
            EnvError, WorkerDiedError, WorkerTimeoutError: rebuilding a failed worker failed
                (the vector env stays broken).
        """
        broken = self._state is _State.BROKEN and not self.closed
        if not broken:
            self._begin(_State.WAITING_RESET)
        if seed is None:
            seed = self._first_reset_seed
        request = self._reset_options.request(seed, options)
        if broken:
            request.include(self._recovery.rebuild(self._build_timeout(self.timeouts.reset)))
            self._state = _State.IDLE
        if self._recycler is not None:  # before the slot pick: the units change
            self._recycler.on_reset(request.seeds, request.mask, self.timeouts.reset)
        self._reset_request = request
        self._exchange.send_reset(request, self._reset_options.payloads(request))
        self._enter(_State.WAITING_RESET)
        self._first_reset_seed = None  # only once the reset was sent: a refused one keeps it

    def seed_first_reset(self, seed: int) -> None:
        """Seed the first reset that is given no seed, as ``make_vec(seed=)`` does.

        Env i gets ``seed + i``, exactly as ``reset(seed=seed)``; an explicit seed at that
        first reset wins. Either way the stored seed is then forgotten, so later resets keep
        each env's own stream.

        Args:
            seed: the base seed.
        """
        self._first_reset_seed = seed

    def set_reset_options(
        self,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None,
        env_ids: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Store the options that the envs ``env_ids`` reset with from now on whenever no
        options are named for them: their automatic resets (every autoreset mode), the
        reset of a restarted or rebuilt worker, and ``reset()`` calls that name no options for
        them (``options=None``, a None entry, an empty dict or a dict holding only
        ``"reset_mask"``).

        Args:
            options: one dict for every env of ``env_ids``, a list/tuple of one dict (or None)
                per env of ``env_ids``, or None, which clears the stored options.
            env_ids: the envs (default: every env).

        Raises:
            ValueError, TypeError: an unknown or repeated env id, a list whose length is not
                ``len(env_ids)``, or an entry that is not a dict or None (nothing changes).
            AlreadyPendingCallError: another call is pending.
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self._begin(_State.WAITING_CALL)
        ids = self._checked_env_ids(env_ids, "set_reset_options")
        if ids is None:
            ids = list(range(self.num_envs))
        self._reset_options.store(options, ids)
        if not ids:
            return
        targets = self._by_unit(ids)
        payloads = self._reset_options.store_payloads(targets)
        only = frozenset(targets)
        self._exchange.send(Command.SET_RESET_OPTIONS, per_unit=payloads, only=only)
        self._enter(_State.WAITING_CALL)
        self._collect(_State.WAITING_CALL, None, only)

    @property
    def reset_options(self) -> tuple[dict[str, Any] | None, ...]:
        """The options each env's resets get when none are named (:meth:`set_reset_options`)."""
        return tuple(self._reset_options.per_env)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset :meth:`reset_async` started.

        Args:
            timeout: seconds to wait (None: the constructor's ``timeout``).

        Returns:
            ``(observations, infos)``.

        Raises:
            NoAsyncCallError: no reset is pending.
            EnvError: an env's reset raised (its type kept, naming the env).
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self._finish(_State.WAITING_RESET, "reset_wait")
        request = self._reset_request
        assert request is not None
        parts = self._collect(_State.WAITING_RESET, timeout, request=request)
        request.done(self._ended)
        self._reset_request = None
        return self._obs.out(parts), self._results.merge_infos(parts)

    # --- step --------------------------------------------------------------------------------

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action, as SyncVectorEnv does.

        Args:
            actions: a batch of ``num_envs`` actions of the action space.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``.

        Raises:
            ValueError, TypeError: the actions do not fit the action space (nothing is sent).
            EnvError: an env's step raised (its type kept, naming the env).
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Start stepping every env; :meth:`step_wait` returns the result.

        Args:
            actions: as :meth:`step`.

        Raises:
            AlreadyPendingCallError: another call is pending.
            ClosedEnvironmentError: the vector env is closed.
            ValueError, TypeError: the actions do not fit the action space, or (autoreset
                DISABLED) an ended env was not reset; nothing is sent.
        """
        self._begin_step()
        store = self._exchange.store_actions
        # Validates every leaf before writing any, so a rejected batch changes nothing.
        self._send_step(actions, BY_VALUE if store is None else store(actions))

    def _step_async_values(self, per_env: Sequence[Any]) -> None:
        """Start a step that hands env ``i`` the object ``per_env[i]`` as it is (pickled to its
        worker), whatever the block holds: the SB3 face's path for actions whose dtype or type
        the block would change (Stable-Baselines3's VecEnvs hand each env ``actions[i]``).

        Args:
            per_env: one action per env, in env order.

        Raises:
            AlreadyPendingCallError, ClosedEnvironmentError: as :meth:`step_async`.
            ValueError: ``per_env`` does not hold ``num_envs`` actions (nothing is sent), or
                (autoreset DISABLED) an ended env was not reset.
        """
        self._begin_step()
        self._send_step(None, BY_VALUE, list(per_env))

    def _begin_step(self, state: _State = _State.WAITING_STEP) -> None:
        self._begin(state)
        if self._refuses_ended and self._ended.flags.any():
            ended = self._ended.ids()
            raise ValueError(
                f"envs {ended} terminated or truncated and autoreset_mode is DISABLED: reset them "
                "with reset(options={'reset_mask': mask}) before stepping again"
            )

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step :meth:`step_async` started.

        Args:
            timeout: seconds to wait (None: the constructor's ``timeout``).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``.

        Raises:
            NoAsyncCallError: no step is pending.
            EnvError: an env's step raised (its type kept, naming the env).
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self._finish(_State.WAITING_STEP, "step_wait")
        return self._results.step(self._collect(_State.WAITING_STEP, timeout))

    # --- action chunks -----------------------------------------------------------------------

    def step_chunk(
        self, actions: Any, stop_on_done: bool = False, all_obs: bool = False
    ) -> ChunkResults:
        """Run K actions of each env inside the units: one command per unit, K sub-steps
        of each env, one reply.

        Sub-step k of env i is exactly the k-th ``step()`` that env would have had, under
        the vector env's ``autoreset_mode`` (NEXT_STEP: the sub-step after an episode end is
        the reset step; SAME_STEP: the env resets at the ending sub-step). ``step`` and
        ``step_chunk`` can be interleaved on one trajectory.

        Args:
            actions: the batch with a chunk axis after the env axis: ``(num_envs, K,
                *single_action_space.shape)``, the same leading ``(num_envs, K)`` on every
                leaf of a Dict/Tuple action; K >= 1 and may change between calls.
            stop_on_done: an env whose episode ends at sub-step j executes none of its
                later actions (their rewards 0, flags False); implied with
                ``autoreset_mode=DISABLED``.
            all_obs: return every sub-step's observation, ``(num_envs, K, *obs_shape)``
                (per leaf), rows after an early stop repeating the env's last one; else
                each env's observation after its last executed sub-step, as ``step()``.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``: rewards and flags
            ``(num_envs, K)``; ``infos["chunk_steps"]`` the sub-steps each env executed, and
            each info key with the chunk axis (``(num_envs, K, ...)``, masks ``(num_envs,
            K)``; docs/api.md).

        Raises:
            ValueError, TypeError: the batch is not chunks of the action space (the message
                names the expected and the given shape), ``all_obs`` with observations that
                are not fixed-size, recycling configured, or (DISABLED) an ended env was not
                reset; nothing is sent.
            AlreadyPendingCallError: another call is pending, or envs are stepping
                asynchronously (``drain()`` first).
            EnvError: an env raised (its type kept, naming the env and the sub-step).
            WorkerDiedError, WorkerTimeoutError: a unit died or did not answer in time.
        """
        if self._state is not _State.IDLE or self._recycler is not None:
            # raises, naming step_chunk (step() checks the rest again)
            self._begin_step(_State.WAITING_CHUNK)
            if self._recycler is not None:
                raise ValueError(
                    "step_chunk is not available with recycle_every or worker_max_rss "
                    "(recycling counts episodes one step at a time); use step()"
                )
        chunks = self._chunks
        batch, one = chunks.check(actions, all_obs)
        if batch is None:
            # One sub-step is one step(): the backends' quickest round trip, one command per
            # unit all the same.
            return chunks.one_step(self.step(one), all_obs)
        self._begin_step(_State.WAITING_CHUNK)
        chunk = batch.chunk
        views, per_unit, same = chunks.load(batch, stop_on_done, all_obs)
        self._exchange.prepare_step()
        try:
            parts = self._chunk_exchange(per_unit) if same else None
            if parts is None:
                self._exchange.send(Command.STEP_ENVS, per_unit=per_unit)
                self._enter(_State.WAITING_CHUNK)
                parts = self._collect(_State.WAITING_CHUNK, self.timeouts.chunk(chunk))
            return chunks.results(
                parts,
                views,
                chunk,
                all_obs,
                observations=self._obs.observations,
                observations_out=self._obs.out,
                restarted=self._exchange.restarted if self._exchange.any_restarted else None,
                ended=self._ended,
            )
        except BaseException:
            # Not kept in this frame: a traceback the caller keeps (an env's error) would hold
            # the chunk's arrays, and through them the chunk block, mapped after close().
            del views
            raise

    def _chunk_exchange(self, per_unit: PerUnit) -> list[Part] | None:
        """A backend's quick round trip for a chunk command that is the same for every unit
        (the process backend's: the pool's per-step exchange, with the command's bytes); its
        parts, or None where it does not apply (then the front's send and collect run)."""
        return None

    # --- asynchronous stepping: the public calls in ``_front.async_calls``, the engine in
    # ``_front.stepping``; the front's state follows the engine through these two hooks

    def _enter_async(self) -> None:
        """Envs go in flight: from idle, the units write the block's own observation batch
        (slot 0: the engine copies each env's result out of it)."""
        if self._state is _State.IDLE:
            self._obs.first_slot()
            self._state = _State.ASYNC

    def _leave_async(self) -> None:
        """Nothing is in flight or held any more: idle again."""
        if self._state is _State.ASYNC:
            self._state = _State.IDLE

    # --- the envs' generators ----------------------------------------------------------------

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The seeds of every env's ``np_random``."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Every env's random generator (copies: they live in the workers)."""
        return self.get_attr("np_random")

    # --- close -------------------------------------------------------------------------------

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Stop every unit and release every resource; bounded and safe from any state.

        Units finish their current command, close their envs and exit. After ``timeout``
        seconds (default 10) or at once with ``terminate=True`` the stragglers get SIGTERM,
        then SIGKILL (one more second). With a call still pending, it warns first, as
        AsyncVectorEnv does (``Calling `close` while waiting for a pending call to `step` to
        complete.``, a ``UserWarning`` through gymnasium's logger).

        Raises:
            EnvError: an env's own ``close()`` raised; re-raised after everything is released.
            UserWarning: the pending-call warning, where warnings are errors; raised after
                everything is released.
        """
        if "_exchange" not in self.__dict__:  # construction failed before any backend
            return
        try:
            if self._state in _ASYNC_NAME:
                # As AsyncVectorEnv warns (gymnasium's logger: UserWarning, its colours); the
                # pending call's replies are then waited for, or dropped by seq, below.
                logger.warn(
                    f"Calling `close` while waiting for a pending call to `{self._state.value}` "
                    "to complete."
                )
        except BaseException:
            # Warnings turned into errors (-W error): release everything all the same.
            self.closed = True
            self._close_backends(timeout, terminate)
            raise
        self._close_backends(timeout, terminate)

    def _close_backends(self, timeout: float | None, terminate: bool) -> None:
        if self._state is _State.INTERRUPTED and not terminate:
            # Workers still running an interrupted call could close their envs only once it
            # ends: after a short wait they are ended instead.
            terminate = not self._settle_interrupted(None)
        broken = self._state is _State.BROKEN
        error = self._exchange.close(timeout, broken, terminate, self._drop_views)
        self._drop_views()
        self._state = _State.IDLE
        self._released()
        if error is not None:
            self.closed = True
            raise error

    def _released(self) -> None:
        """Called once every backend is closed (the subclass drops what it still holds)."""

    def __enter__(self: _Front) -> _Front:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def remote(self) -> RemoteProxy:
        """Attribute-style calls: ``envs.remote.get_t(1)`` is ``envs.call("get_t", 1)``."""
        return RemoteProxy(self)

    def _drop_views(self) -> None:
        # The components' references to the batch arrays (each drops its own); without them
        # a shared block unmaps at once.
        for name in ("_chunks", "_async", "_obs", "_exchange", "_results"):
            component = self.__dict__.get(name)
            if component is not None:
                component.drop_views()
