"""What the front is built from: the options every backend shares, the spaces, and the
components it owns.

A mixin of :class:`subvec._front.front.VectorFront`: :meth:`FrontStart._configure` checks and
keeps the options before any backend starts; once the subclass has started its backends and
bound the batch arrays, :meth:`FrontStart._start` builds the components that act on the
front's state, each holding named references and none back to the front but weak hooks (a
cycle would keep a dropped vector env's workers until the cycle collector ran).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from gymnasium import Space

from subvec._backend import Backend, Failure, RestartRecord
from subvec._batch import BatchViews, ChunkStore, PlainChunkStore
from subvec._compat import AutoresetMode, vector_metadata
from subvec._front.chunk import ChunkStepper
from subvec._front.ended import EndedEnvs
from subvec._front.exchange import LockstepExchange
from subvec._front.merge import make_merger
from subvec._front.observations import ObservationBatch
from subvec._front.options import EnvResetOptions, ResetRequest
from subvec._front.recovery import FailurePolicy, Recovery
from subvec._front.recycle import RecyclePolicy, Recycler, RssReader
from subvec._front.setup import (
    EnvsHello,
    ObservationMode,
    TimeoutArg,
    batched_spaces,
    check_batch_size,
    check_freeze,
    check_info_format,
    check_observation_mode,
    check_timeouts,
)
from subvec._front.state import _State, weak_method
from subvec._front.step_results import StepResults
from subvec._front.stepping import AsyncEngine, FrontHooks
from subvec._front.units import Units
from subvec._late_binding import warn_of_late_binding

__all__ = ["FrontStart", "public_name"]


def public_name(cls: type) -> str:
    """The name an error shows for ``cls``: its first public class, so that a user's own
    subclass keeps its name and subvec's private helpers never show."""
    return next((c.__name__ for c in cls.__mro__ if not c.__name__.startswith("_")), cls.__name__)


class FrontStart:
    """The construction of :class:`subvec._front.front.VectorFront` (a mixin)."""

    if TYPE_CHECKING:
        # The front's, declared for the type checker.
        def _break(self, units: Iterable[int], reason: str) -> None: ...
        def _fail(self, failures: list[Failure], timeout: float | None) -> NoReturn: ...
        def _interrupted(self, state: _State) -> None: ...
        def _enter_async(self) -> None: ...
        def _leave_async(self) -> None: ...

    def _configure(
        self,
        env_fns: Iterable[Callable[[], Any]],
        autoreset_mode: str | AutoresetMode | None,
        info_format: str,
        *,
        copy: bool,
        timeout: TimeoutArg,
        on_worker_failure: str,
        max_restarts: int,
        batch_size: int | None = None,
        start_timeout: float | None = None,
        observation_mode: ObservationMode = "same",
        freeze: bool = False,
    ) -> None:
        """Keep the env factories and check and keep the options every backend shares
        (before any backend starts).

        Raises:
            ValueError: no env factory, or a bad option value.
            TypeError: a custom ``observation_mode`` that is not two spaces.
        """
        self.env_fns = list(env_fns)
        if not self.env_fns:
            raise ValueError("env_fns is empty: a vector env needs at least one env factory")
        warn_of_late_binding(self.env_fns)
        num_envs = len(self.env_fns)
        self._policy = FailurePolicy(on_worker_failure, max_restarts)
        #: bound on building envs: at construction, and for a replacement (else the call's)
        self.start_timeout = start_timeout
        self.num_envs = num_envs
        #: how many envs ``recv()`` returns by default
        self.batch_size = check_batch_size(batch_size, num_envs)
        if freeze and autoreset_mode is None:
            autoreset_mode = AutoresetMode.DISABLED  # what freezing ended envs means
        self.autoreset_mode = check_info_format(info_format, autoreset_mode, freeze=bool(freeze))
        #: ended envs are not stepped again until reset (``EnvSlab``'s freeze; DISABLED)
        self.freeze = check_freeze(freeze, self.autoreset_mode)
        #: whether stepping an ended env is refused (DISABLED without freeze)
        self._refuses_ended = self.autoreset_mode is AutoresetMode.DISABLED and not self.freeze
        self.info_format = info_format
        self.copy = bool(copy)
        #: each command's default bound (``timeout=``: one number, or one per command)
        self.timeouts = check_timeouts(timeout)
        #: the ``timeout`` as given (a number, None, or the mapping of one per command)
        self.default_timeout = timeout
        #: ``"same"``, ``"different"`` or ``(observation_space, single_observation_space)``
        self.observation_mode = check_observation_mode(observation_mode)
        self._backends: list[Backend] = []
        #: every unit, which runs which env, and the one replacement driver
        self._units = Units([], num_envs)
        #: the reset options each env stored, and the checks of every form of them
        self._reset_options = EnvResetOptions(num_envs)

    # --- what the subclass sets up ----------------------------------------------------------

    def _take_hellos(self, hellos: Sequence[EnvsHello]) -> None:
        """Metadata and render mode from the first unit's envs, and every env's spaces (see
        :meth:`_setup_spaces`); ``hellos`` cover the envs in env order."""
        first = hellos[0]
        self.metadata = vector_metadata(first.metadata, self.autoreset_mode)
        self.render_mode = first.render_mode
        self._setup_spaces(
            [space for hello in hellos for space in hello.observation_spaces],
            [space for hello in hellos for space in hello.action_spaces],
        )

    def _setup_spaces(
        self, obs_spaces: Sequence[Space[Any]], act_spaces: Sequence[Space[Any]]
    ) -> None:
        """The single and batched spaces (as ``observation_mode`` says), checked env by env
        against env 0's; ``obs_spaces`` and ``act_spaces`` hold every env's, in env order."""
        spaces = batched_spaces(
            obs_spaces, act_spaces, self.observation_mode, public_name(type(self))
        )
        self.single_observation_space = spaces.single_observation_space
        self.observation_space = spaces.observation_space
        self.single_action_space = spaces.single_action_space
        self.action_space = spaces.action_space

    def _start(self, backends: Sequence[Backend], batch: BatchViews, final_obs: bool) -> None:
        """Take the backends (in the order commands go out) and the batch arrays."""
        self._backends = list(backends)
        self._units = Units(self._backends, self.num_envs)
        n = self.num_envs
        #: the observation batch the units write, its slots, and the batch handed out
        self._obs = obs = ObservationBatch(batch, self.single_observation_space, n, self.copy)
        #: observations entirely in the block
        self._obs_shared = obs.shared
        #: restarts in lock-step calls, what they leave to report, and rebuilds
        self._recovery = Recovery(
            self._policy,
            self._units,
            self._reset_options,
            None if self._obs_shared else obs,
            # weakly: the component is the front's, and a cycle would delay freeing it
            build_timeout=weak_method(self._build_timeout),
            break_env=weak_method(self._break),
        )
        #: sending lock-step commands, collecting with the failure policy, closing backends;
        #: the restart flags' writer
        self._exchange = exchange = LockstepExchange(
            self._backends,
            self._units,
            batch,
            self._policy,
            self._recovery,
            obs,
            (self.single_action_space, self.action_space),
            self.timeouts,
            fail=weak_method(self._fail),
            interrupted=weak_method(self._interrupted),
        )
        #: the envs that ended and wait for a reset (DISABLED refuses to step them)
        self._ended = EndedEnvs(n, self.autoreset_mode is AutoresetMode.DISABLED)
        #: a step's results, as they are handed out
        self._results = StepResults(
            batch,
            final_obs,
            self._units,
            obs,
            make_merger(self.info_format, n),
            exchange,
            self._ended,
            self.timeouts,
        )
        #: the pending reset's seeds, mask and named options (a restart during it resets
        #: with them too)
        self._reset_request: ResetRequest | None = None
        #: the pending call's env ids (None: every env) and the units it went to
        self._call_ids: list[int] | None = None
        self._call_units: frozenset[int] | None = None
        #: ``step_chunk``'s work; the chunk's arrays are the front's own unless the backend
        #: keeps them (:meth:`_start_chunks`)
        self._chunks = ChunkStepper(
            n,
            self.single_observation_space,
            self.single_action_space,
            self.autoreset_mode,
            self.info_format,
            self.copy,
            PlainChunkStore(n),
        )
        # The engine's hooks reach the front weakly: a cycle would delay freeing it.
        front = weakref.proxy(self)
        #: asynchronous stepping; this front keeps the call state and the observation slot
        self._async = AsyncEngine(
            units=self._units,
            collect_order=exchange.collect_order,
            batch=batch,
            final_in_block=final_obs,
            obs=obs,
            ended=self._ended,
            reset_options=self._reset_options,
            policy=self._policy,
            spaces=(self.single_observation_space, self.single_action_space),
            autoreset_mode=self.autoreset_mode,
            refuses_ended=self._refuses_ended,
            info_format=self.info_format,
            batch_size=self.batch_size,
            hooks=FrontHooks(
                enter=lambda: front._enter_async(),
                leave=lambda: front._leave_async(),
                fail=weak_method(self._fail),
                broken=lambda units, reason: front._break(units, reason),
                build_timeout=lambda timeout: front._build_timeout(timeout),
            ),
            chunks=self._chunks,
        )
        #: recycling, where the backend offers it (:meth:`_start_recycling`)
        self._recycler: Recycler | None = None

    def _start_chunks(self, store: ChunkStore) -> None:
        """Keep action chunks' arrays where the backend's units read and write them (after
        :meth:`_start`)."""
        self._chunks.store = store

    def _start_recycling(self, policy: RecyclePolicy, rss_of: RssReader) -> None:
        """Recycle workers as ``policy`` says (after :meth:`_start`); ``rss_of`` reads a
        unit's resident memory."""
        self._recycler = Recycler(
            policy,
            self._units,
            self.num_envs,
            self.autoreset_mode,
            rss_of=rss_of,
            # weakly: the recycler is the front's, and a cycle would delay freeing it
            build_timeout=weak_method(self._build_timeout),
            stored_options=self._reset_options.stored,
            fail=weak_method(self._fail),
            break_env=weak_method(self._break),
        )
        self._exchange.recycler = self._results.recycler = self._recycler

    # --- failure policy ----------------------------------------------------------------------

    @property
    def on_worker_failure(self) -> str:
        """``"raise"`` or ``"restart"``: what a dead or hung worker leads to."""
        return self._policy.mode

    @property
    def max_restarts(self) -> int:
        """The most restarts over the env's life before failures raise again."""
        return self._policy.max_restarts

    @property
    def restarts(self) -> list[RestartRecord]:
        """Every worker replacement ``on_worker_failure="restart"`` made so far, oldest first,
        the ones that failed to start included (each counts against ``max_restarts``)."""
        return self._policy.restarts

    @property
    def recycles(self) -> list[RestartRecord]:
        """Every worker replacement that recycling (``recycle_every``, ``worker_max_rss``) made,
        oldest first; the reason says which and the pids, or ends with ``its replacement
        failed: ...`` (none counts against ``max_restarts``)."""
        return [] if self._recycler is None else self._recycler.records

    @property
    def rebuilds(self) -> list[RestartRecord]:
        """Every worker that ``reset()`` rebuilt after the vector env broke, oldest first (not
        restarts: they do not count against ``max_restarts``)."""
        return self._recovery.rebuilds

    def _build_timeout(self, timeout: float | None) -> float | None:
        """The bound on building a replacement's envs: ``start_timeout`` when given, else the
        bound of the call that met the failure."""
        return self.start_timeout if self.start_timeout is not None else timeout
