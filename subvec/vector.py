"""SubprocVectorEnv: a gymnasium VectorEnv whose envs run in worker processes.

Data flow of one step (see docs/design.md for the full picture)::

    parent                                              worker w (envs lo..hi-1)
    store actions in the block (validated first)
    write STEP frame (9 bytes) on every command pipe ──► EnvSlab.step: read act[i], env.step,
                                                        autoreset, write obs/rew/flags rows
    poll(all reply pipes + all worker sentinels) ◄───── OK frame (9 bytes), or OK_PAYLOAD with
    merge infos with gymnasium's _key masks              pickled infos, or ERROR with a record
    copy observations out of the block

Who owns what: the parent's pool (``_process.pool``) owns the workers, their pipes and the shared
block; the front (``_front.front``) owns the state machine; each worker owns its envs.

This module is the process backend's public class: it plans the layout (``_process.plan``), starts
the pool (``_process.pool``) and the parent's own envs (``_process.local``), plans and attaches the
block (``_process.block``), and hands them to the front (``_front.front``), which holds the
gymnasium contract. Only the steady lock-step ``step`` is its own: the per-step round trip without
the general path.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable
from multiprocessing import resource_tracker
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np
from gymnasium import Env

from subvec._commands import Command, StepEnvsPayload
from subvec._compat import DEFAULT_INFO_FORMAT, AutoresetMode
from subvec._front.front import VectorFront
from subvec._front.merge import Part
from subvec._front.recovery import DEFAULT_MAX_RESTARTS
from subvec._front.recycle import RecyclePolicy
from subvec._front.setup import EnvsHello, Hello, ObservationMode, TimeoutArg
from subvec._front.state import _WAITING, _State
from subvec._front.suspend import SUSPEND_CLOSE_TIMEOUT
from subvec._pickling import pickle_factories
from subvec._process import wire as proto
from subvec._process.block import BlockPlan, bind_batch, plan_block
from subvec._process.bootstrap import registry_snapshot
from subvec._process.busy import busy_cpus
from subvec._process.chunks import SharedChunkStore
from subvec._process.environ import WorkerEnvSpec, check_worker_env
from subvec._process.gpus import GpuSpec, resolve_gpus
from subvec._process.local import LocalShare
from subvec._process.plan import (
    Layout,
    check_max_concurrency,
    check_platform,
    plan_layout,
    resolve_context,
)
from subvec._process.pool import WorkerPool
from subvec._process.pool_workers import PoolResources, release
from subvec._process.shm import BlockLayout, SharedBlock
from subvec._process.slice import DEFAULT_SLICE_US, ParentSlice, check_slice
from subvec._process.starts import BuildFailure, check_build_retries, check_max_concurrent_starts
from subvec._process.stats import WorkerStats, process_rss, worker_stats
from subvec._process.threads import check_threads
from subvec._process.topology import PlacementReport, plan_placement, usable_cpus
from subvec._process.wake import FUTEX

__all__ = ["SubprocVectorEnv"]

#: The info formats whose fixed-schema scalar infos stay in the block (_infos.InfoBlockWriter).
_BLOCK_INFO_FORMATS = ("gymnasium", "list", "legacy")


def _new_chunk_block(
    resources: PoolResources, layout: BlockLayout
) -> tuple[str | None, dict[str, np.ndarray]]:
    """A shared-memory chunk block in place of the last one, which is closed (units map the
    new one when the next chunk command names it; ``resources`` own it, as the main block)."""
    old, resources.chunk_block = resources.chunk_block, None
    if old is not None:
        old.close()
    block = resources.chunk_block = SharedBlock.create(layout)
    return block.name, block.views


class SubprocVectorEnv(VectorFront):
    """Run ``len(env_fns)`` envs in worker processes, batched through shared memory.

    A drop-in for ``gymnasium.vector.AsyncVectorEnv``: same methods, same results (byte for byte
    against ``SyncVectorEnv`` for the same seeds), with several envs per worker, one shared block
    for every fixed-size array, and errors that name the env and keep the worker's traceback.

    The first five parameters are gymnasium 1.4's ``AsyncVectorEnv(env_fns, shared_memory,
    copy, context, daemon)``, positional or keyword; every other option is keyword-only.

    Args:
        env_fns: callables that build the envs (lambdas and closures work: cloudpickle).
        shared_memory: observations in shared memory (else pickled through the reply pipes).
        copy: return fresh observation arrays; ``False`` returns views valid until the next call.
        context: multiprocessing start method; default forkserver on Linux, spawn elsewhere.
        daemon: start workers as daemons (killed with the parent's interpreter).
        worker: gymnasium's custom worker function; only None is accepted (see Raises).
        observation_mode: ``"same"``, ``"different"`` or ``(observation_space, single_space)``.
        autoreset_mode: an ``AutoresetMode`` or its value/name ("NextStep", "same_step", ...).
            None (the default): NEXT_STEP, gymnasium's default, or SAME_STEP with
            ``info_format="legacy"``, the only mode that format has (an explicit other mode is
            refused). On gymnasium 0.29, SAME_STEP is the only mode, as in 0.29's own vector
            envs; any other is refused.
        max_concurrency: the most envs in ``step`` or ``reset`` at once, as gymnasium's (None:
            no limit; calls and attributes are not limited). A worker steps its envs one
            after the other, so by default there are at most that many workers; with more
            workers (``num_workers``/``envs_per_worker``), a step or reset is sent to that
            many and then to the next worker each time one answers.
        num_workers: worker processes; default ``min(num_envs, usable CPUs, max_concurrency)``.
        envs_per_worker: alternatively, envs per worker (the last workers may get one fewer).
        numa: placement of workers on NUMA nodes (``"auto"``, ``None``, ``True``, a
            ``{node: [cpus]}`` dict or a topology); see docs/numa.md.
        pin: ``"node"`` (a worker may use its node's CPUs) or ``"core"`` (one CPU per worker).
        info_format: ``"gymnasium"`` (1.x ``_key`` masks; the default on gymnasium 1.x) or
            ``"legacy"`` (gymnasium 0.29's ``final_observation``/``final_info`` object arrays
            that CleanRL reads; implies same-step autoreset; the default on gymnasium 0.29,
            where ``"gymnasium"`` is refused), or ``"list"`` (one dict per env: the step's
            info; for an env that ended with same-step autoreset, the reset's info plus
            ``final_obs`` and ``final_info``; used by the Stable-Baselines3 adapter).
        timeout: default timeout in seconds for every ``*_wait`` (``None``: wait forever, still
            watching for dead workers), or one per command: a mapping of ``"reset"``,
            ``"step"`` and ``"call"`` to seconds (``{"reset": 120, "step": 30}``; a command
            not named is not bounded; an action chunk of K sub-steps gets K times the step's).
            What times out follows ``on_worker_failure``.
        start_timeout: bound on building the envs at construction (``None``: no bound).
        start: ``"now"`` (default): the workers build their envs at construction. ``"lazy"``:
            construction builds the first worker's envs only, to read the spaces, and ends
            it; the first call that needs the envs (a ``reset``, usually) starts every worker,
            as ``resume()`` does, and checks that every env has the first env's spaces
            (envs whose spaces differ, ``observation_mode="different"``, cannot start
            lazily). Until then no
            worker process exists (``started`` is False): many vector envs can be built
            ahead and only the one in use holds processes and memory. Not with
            ``parent_envs`` (built in the parent at construction) or recycling.
        on_worker_failure: ``"raise"`` (default: a dead or hung worker breaks the vector env,
            like AsyncVectorEnv) or ``"restart"``: the worker is replaced, its envs rebuilt and
            reset, and the step reports them truncated with ``infos["worker_restarted"]``. Hangs
            are only detected with a ``timeout``.
        max_restarts: the most restarts over the env's life before failures raise again.
        parent_envs: how many envs (the last ones) the parent steps itself, in-process, while
            the workers step theirs. Uses the parent's CPU instead of leaving it idle: fastest
            for cheap envs (CartPole x 16: ~2.5x), but those envs lose process isolation (a
            segfault or hang in one of them takes the parent with it). Default 0.
        spin_us: busy-poll window before blocking, for the next command (workers) and for
            replies (parent); 0 disables. Default: 300 us for each process that has a CPU of
            its own; when the workers fill every CPU, worker 0 shares the parent's and neither
            of those two spins (see ``subvec._process.plan``).
        batch_size: how many envs ``recv()`` returns by default with asynchronous stepping
            (``async_reset``/``send``/``recv``/``drain``; docs/async.md). None: num_envs.
            ``reset()`` and ``step()`` stay lock-step over every env.
        worker_threads: threads per BLAS, OpenMP and torch pool in each worker (default 1, so
            that W workers do not run W x CPUs threads); None leaves the pools as the
            libraries size them. Set in the worker only: the parent's environment and torch
            settings are not touched (see ``subvec._process.threads``).
        recycle_every: replace a worker (a new process, its envs rebuilt from their factories)
            once its env has ended this many episodes, between two episodes (see
            ``recycles``). None: never. Needs one env per worker.
        worker_max_rss: replace a worker, in the same way, at the end of an episode of its env
            when its resident memory exceeds this many bytes (read with psutil). None: never.
        gpus: the GPUs the workers render or compute on: None (none: nothing set), ``"auto"``
            (every GPU this process may use), a list of CUDA indices, or ``{gpu: numa_node}``
            (where the topology cannot be read). Worker ``w`` gets GPU ``w % len(gpus)``, runs
            on its GPU's NUMA node (with ``numa`` placing; ``pin`` applies within the node),
            and has ``CUDA_VISIBLE_DEVICES``, ``MUJOCO_EGL_DEVICE_ID`` and ``EGL_DEVICE_ID``
            set for it before its factories are unpickled (docs/numa.md, "GPUs").
        worker_env: environment variables for the workers: a dict (a None value unsets the
            variable), or a callable taking the worker's ``Placement`` (``worker``, ``node``,
            ``cpus``, ``gpu``) and returning one. Applied in each worker (a replacement too)
            before its factories are unpickled, over the GPU's variables; never in the parent.
        max_concurrent_starts: the most workers building their envs at once (unpickling the
            factories, constructing the envs, and serving their first reset), at start, when
            ``reset()`` rebuilds and when a worker is replaced. None: no limit. The parent's
            own envs (``parent_envs``) are not counted.
        build_retries: call an env factory that raises up to this many more times, in the
            same worker, after a short pause (0.1 s, doubling, at most 2 s); each failed
            attempt is in ``build_failures``. When every attempt fails, the last error is
            raised (its type kept, naming the env).
        freeze: fixed-horizon rollouts (needs ``autoreset_mode`` DISABLED, which it implies
            when none is given): an env whose episode ended is not stepped again until it is
            reset. ``step``, ``step_chunk`` and ``send`` give it its final observation again,
            reward 0, both flags False (its end is reported once, on the step it happened, so
            gymnasium's RecordEpisodeStatistics counts each episode once) and the info
            ``frozen`` True (a chunk: at sub-step 0, with ``chunk_steps`` 0); a masked
            ``reset(options={"reset_mask": mask})`` starts its next episode.
        parent_slice_us: the scheduler slice, in microseconds, the thread that builds the
            vector env asks the kernel for (Linux 6.12 and later; 100 to 100,000; None: leave
            it). Default 100: woken while the workers hold every CPU, the parent runs at once
            instead of after a worker's slice; its CPU share is unchanged. The workers keep
            the kernel's default. ``close()`` gives the thread the default back (decision
            0062; ``parent_slice`` says what the kernel took).

    Raises:
        NotImplementedError: the platform cannot run the workers (Windows; see
            ``subvec._process.plan.check_platform``).
        ValueError: ``worker`` is not None (subvec's workers each run several envs from
            cloudpickled factories and speak their own protocol, so gymnasium's per-env
            worker function cannot run in them), or a bad option value.
    """

    def __init__(
        self,
        env_fns: Iterable[Callable[[], Env[Any, Any]]],
        shared_memory: bool = True,
        copy: bool = True,
        context: str | BaseContext | None = None,
        daemon: bool = True,
        *,
        worker: Callable[..., Any] | None = None,
        observation_mode: ObservationMode = "same",
        autoreset_mode: str | AutoresetMode | None = None,
        max_concurrency: int | None = None,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        numa: Any = "auto",
        pin: str = "node",
        info_format: str = DEFAULT_INFO_FORMAT,
        timeout: TimeoutArg = None,
        start_timeout: float | None = None,
        on_worker_failure: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        parent_envs: int = 0,
        spin_us: float | None = None,
        batch_size: int | None = None,
        worker_threads: int | None = 1,
        recycle_every: int | None = None,
        worker_max_rss: int | None = None,
        gpus: GpuSpec = None,
        worker_env: WorkerEnvSpec = None,
        max_concurrent_starts: int | None = None,
        build_retries: int = 0,
        freeze: bool = False,
        start: str = "now",
        parent_slice_us: int | None = DEFAULT_SLICE_US,
    ) -> None:
        super().__init__()
        check_platform()
        parent_slice_us = check_slice(parent_slice_us)
        if worker is not None:
            raise ValueError(
                f"worker={worker!r} is not supported: a subvec worker process runs several "
                "envs, built from cloudpickled env_fns, and exchanges actions and results with "
                "the parent through the shared block, so gymnasium's custom worker function "
                "(one env, gymnasium's pipe protocol) has nowhere to run. To change what a "
                "step or reset does, wrap the env in its factory (a gymnasium.Wrapper); for a "
                "custom worker, use gymnasium.vector.AsyncVectorEnv."
            )
        self._configure(
            env_fns,
            autoreset_mode,
            info_format,
            copy=copy,
            timeout=timeout,
            on_worker_failure=on_worker_failure,
            max_restarts=max_restarts,
            batch_size=batch_size,
            start_timeout=start_timeout,
            observation_mode=observation_mode,
            freeze=freeze,
        )
        #: threads per pool in each worker (None: the libraries' own default)
        self.worker_threads = check_threads(worker_threads)
        recycling = RecyclePolicy.create(recycle_every, worker_max_rss)
        if recycling is not None:
            num_workers, envs_per_worker = recycling.layout(
                self.num_envs, num_workers, envs_per_worker, parent_envs
            )
        self.shared_memory = bool(shared_memory)
        self.daemon = bool(daemon)
        cpus = usable_cpus()
        #: where the envs run and how each process waits (see ``subvec._process.plan``); on a
        #: busy machine, planned for the CPUs left free (``layout.planned_cpus``, decision 0057)
        self.layout: Layout = plan_layout(
            self.num_envs,
            cpus=cpus,
            parent_envs=parent_envs,
            num_workers=num_workers,
            envs_per_worker=envs_per_worker,
            spin_us=spin_us,
            max_concurrency=max_concurrency,
            first_ready=self.batch_size < self.num_envs,
            busy=busy_cpus(cpus),
        )
        #: the most envs in ``step`` or ``reset`` at once (None: no limit)
        self.max_concurrency = check_max_concurrency(max_concurrency)
        self.parent_envs = self.layout.parent_envs
        self.num_workers = self.layout.num_workers
        #: the busy-poll window of the workers that spin (0: none does)
        self.spin_us = max(self.layout.worker_spin_us)
        blobs = pickle_factories(self.env_fns, self.num_envs - self.parent_envs, "a worker process")
        ctx = resolve_context(context)
        self.context = ctx.get_start_method()
        check_worker_env(worker_env)
        max_concurrent_starts = check_max_concurrent_starts(max_concurrent_starts)
        build_retries = check_build_retries(build_retries)
        placements = plan_placement(numa, self.num_workers, pin, gpus=resolve_gpus(gpus))

        self._pool = WorkerPool(
            ctx,
            blobs,
            self.layout.bounds,
            self.autoreset_mode.value,
            placements,
            self.daemon,
            # A forked worker inherits the registry; the others do not run the script that
            # may have registered the ids their factories make (see _bootstrap).
            registry=None if self.context == "fork" else registry_snapshot(),
            spin_s=self.layout.parent_spin_us * 1e-6,
            partner=self.layout.partner,
            late_spin_s=self.layout.late_spin_us * 1e-6,
            max_active=self.layout.max_active,
            threads=self.worker_threads,
            worker_env=worker_env,
            max_concurrent_starts=max_concurrent_starts,
            build_retries=build_retries,
            wake=self.layout.wake,
            freeze=self.freeze,
        )
        self._finalizer = weakref.finalize(self, release, self._pool.resources)
        # The tracker must run before any worker exists so that all share it (see _shm).
        resource_tracker.ensure_running()
        self._local: LocalShare | None = None
        #: the last chunk command and its bytes (a usual chunk's is the same object again)
        self._chunk_sent: tuple[StepEnvsPayload, bytes] | None = None
        lazy = check_start(start, self.parent_envs, recycling is not None)
        try:
            if lazy:  # the first call starts the workers (see _start_units)
                self._take_hellos([self._probe(start_timeout)])
            else:
                self._pool.spawn_all()
                if self.parent_envs:  # built here while the workers build theirs
                    first = self.num_envs - self.parent_envs
                    self._local = LocalShare(
                        self.env_fns[first:],
                        first,
                        self.num_workers,
                        self.autoreset_mode,
                        self.freeze,
                        build_retries,
                    )
                self._pool.handshake(self._pool.workers, start_timeout)
                hellos: list[EnvsHello] = [w.hello for w in self._pool.workers if w.hello]
                if self._local is not None:
                    hellos.append(Hello.of_envs(self._local.envs))
                self._take_hellos(hellos)
            self._setup_block()
            if lazy:
                self._enter_unstarted()
        except BaseException:
            # Nothing may outlive a failed construction: the caller holds only the exception.
            if self._local is not None:
                self._local.close(0.0, True)
            self._finalizer()
            raise
        #: whether ``step`` may take its short path: every env in a worker, the
        #: observations in the block as one array, gymnasium's infos and an autoreset
        #: (fixed from here on)
        self._steady = (
            self._local is None
            and self._obs_shared
            and type(self._obs.observations) is np.ndarray
            and recycling is None  # whose episode counts are kept on the general path
            and self.info_format == "gymnasium"
            and self.autoreset_mode is not AutoresetMode.DISABLED
        )
        if recycling is not None:
            self._start_recycling(recycling, rss_of=lambda unit: process_rss(unit.pid))
        # After the workers and the fork server started: they keep the kernel's default.
        self._slice = ParentSlice(parent_slice_us)
        weakref.finalize(self, self._slice.release)  # also when never closed
        #: the slice (us) the kernel gave the building thread, None where none was taken
        self.parent_slice = self._slice.us

    # --- construction ------------------------------------------------------------------------

    def _probe(self, timeout: float | None) -> Hello:
        """``start="lazy"``: build the first worker's envs, read what they say, end it again;
        every env is taken to be the first one's (checked when the workers start)."""
        pool = self._pool
        pool.workers.append(pool.spawn(0))
        try:
            pool.handshake(pool.workers, timeout)
            first = pool.workers[0].hello
            assert first is not None
        finally:
            pool.suspend(SUSPEND_CLOSE_TIMEOUT)
        n = self.num_envs
        return Hello(
            [first.observation_spaces[0]] * n,
            [first.action_spaces[0]] * n,
            first.metadata,
            first.render_mode,
        )

    def _check_started(self) -> None:
        """``start="lazy"``: every worker's envs against the spaces the probe read.

        Raises:
            ValueError: an env has other spaces.
        """
        obs_space, act_space = self.single_observation_space, self.single_action_space
        for worker in self._pool.workers:
            assert worker.hello is not None
            spaces = zip(worker.hello.observation_spaces, worker.hello.action_spaces)
            for env, (obs, act) in enumerate(spaces, start=worker.lo):
                if obs != obs_space or act != act_space:
                    raise ValueError(
                        f"env {env} has observation space {obs} and action space {act}; env "
                        f"0 had {obs_space} and {act_space} when start='lazy' read them: every "
                        "env must have the same spaces (the workers are ended again)"
                    )

    def _setup_block(self) -> None:
        n = self.num_envs
        obs_space, act_space = self.single_observation_space, self.single_action_space
        plan = plan_block(
            n,
            self.num_workers,
            obs_space,
            act_space,
            shared_memory=self.shared_memory,
            same_step=self.autoreset_mode is AutoresetMode.SAME_STEP,
            slots=self.copy and self._local is None,
            info_block=self.info_format in _BLOCK_INFO_FORMATS,
            wake=self.layout.wake == FUTEX,
        )
        block = SharedBlock.create(plan.layout)
        spec = plan.attach_spec(
            block.name,
            n,
            obs_space,
            act_space,
            spin_us=self.layout.worker_spin_us,
            info_columns=self.info_format == "gymnasium",
        )
        self._pool.attach(block, spec, self.start_timeout)
        #: what the shared block holds (see ``subvec._process.block``)
        self.block_plan: BlockPlan = plan
        views = block.views
        backends: list[Any] = [self._pool]
        if self._local is not None:
            self._local.bind(views, spec)
            backends.append(self._local)
        self._start(backends, bind_batch(views, plan, spec), plan.final_obs)
        # Action chunks' arrays: a second segment the pool's resources own, as the main block
        self._start_chunks(
            SharedChunkStore(
                n,
                obs_space if self._obs_shared else None,
                act_space,
                functools.partial(_new_chunk_block, self._pool.resources),
            )
        )

    # --- the steady step ---------------------------------------------------------------------

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
        exchange = self._exchange
        if (
            self._steady
            and self._state is _State.IDLE
            and not exchange.any_restarted
            and not self.closed
            and (store := exchange.store_actions) is not None  # None once closed
        ):
            # step_async + step_wait without the checks and branches that cannot apply here:
            # on a cheap env the parent's Python is on the critical path (its CPU is the
            # partner's too).
            stored = store(actions)  # validates every leaf before writing any
            # Not kept in this frame: if the gather raises, a traceback the caller keeps would
            # hold the action views, and through them the shared block, open after close().
            del store
            if stored is not None:  # another dtype than the space's, or by value
                self._send_step(actions, stored)
                return self.step_wait()
            obs = self._obs
            if obs.slots is not None:
                obs.pick_slot()
            state = _State.WAITING_STEP
            self._enter(state)
            timeout = self.timeouts.step
            restart = self._policy.can_restart
            try:
                collected = self._pool.exchange(
                    Command.STEP, timeout, _WAITING[state], stop_at_death=not restart
                )
            except KeyboardInterrupt:
                self._interrupted(state)  # as in the exchange's collect
                raise
            results = self._results
            if collected is not None:
                return results.step(self._answered(state, collected, timeout, restart))
            self._settle(state)
            infos: dict[str, Any] | None = {}
            info_block = exchange.info_block
            if info_block is not None and info_block.flagged():
                # Every env's infos in the block under one schema, or None (merged below)
                infos = info_block.merged(self._pool.workers)
            if infos is None or (results.final_in_block and results.any_ended()):
                # final events implied by the flags, or infos to merge
                return results.step(exchange.block_parts(self._units.all))
            return results.from_block(infos)
        self.step_async(actions)
        return self.step_wait()

    # --- action chunks -----------------------------------------------------------------------

    def _chunk_exchange(self, per_unit: Callable[[Any], StepEnvsPayload]) -> list[Part] | None:
        """Every env in a worker, workers of one size, no restarted worker answering with its
        reset: one encoded command for all, sent and collected as the steady step's are, the
        failures and outcomes through the front's ``_answered``."""
        workers = self._pool.workers
        if self._local is not None or self._exchange.answered or not self._chunk_even:
            return None
        command = per_unit(workers[0])
        sent = self._chunk_sent
        if sent is None or sent[0] is not command:  # the usual chunk sends the same again
            sent = self._chunk_sent = (command, proto.encode_step_envs(command))
        payload = sent[1]
        state = _State.WAITING_CHUNK
        self._enter(state)
        timeout = self.timeouts.chunk(command.substeps)
        restart = self._policy.can_restart
        try:
            collected = self._pool.exchange_frame(
                Command.STEP_ENVS, payload, timeout, _WAITING[state], stop_at_death=not restart
            )
        except KeyboardInterrupt:
            self._interrupted(state)  # as in the exchange's collect
            raise
        if collected is None:
            self._settle(state)
            return []
        return self._answered(state, collected, timeout, restart)

    @functools.cached_property
    def _chunk_even(self) -> bool:
        """Whether every worker holds as many envs (one chunk command fits them all)."""
        return len({hi - lo for lo, hi in self.layout.bounds}) == 1

    # --- close and introspection -------------------------------------------------------------

    def _released(self) -> None:
        self._local = None
        self._finalizer()
        if "_slice" in self.__dict__:
            self._slice.release()

    @property
    def placement(self) -> tuple[PlacementReport, ...]:
        """Where each worker runs, from its ready handshake: pid, NUMA node, CPU set, GPU,
        ``CUDA_VISIBLE_DEVICES`` and EGL device (and how that was chosen)."""
        return tuple(w.hello.placement for w in self._pool.workers if w.hello is not None)

    @property
    def build_failures(self) -> list[BuildFailure]:
        """Every failed attempt of an env factory that was then tried again
        (``build_retries``), at start, on rebuilds and in replacements, in order; each names
        its worker, env, attempt and error."""
        return self._pool.build_failures

    def stats(self, timeout: float | None = None) -> list[WorkerStats]:
        """What each worker has done since it started: one :class:`WorkerStats` per worker.

        Asks every worker for its counters (one round trip) and reads its resident memory
        (psutil, when installed). Counting costs the workers two clock reads per command.

        Args:
            timeout: seconds to wait for the counters (None: the constructor's ``timeout``).

        Returns:
            One entry per worker, in worker order (the parent's own envs are not counted).

        Raises:
            AlreadyPendingCallError: a call is pending (stats need the workers idle).
            ClosedEnvironmentError: the vector env is closed.
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self._begin(_State.WAITING_CALL)  # only checks: the workers must be idle
        counters = self._pool.counters(self.timeouts.call if timeout is None else timeout)
        return worker_stats(
            self._pool.workers, counters, self.restarts, self.recycles, self.build_failures
        )

    @property
    def worker_pids(self) -> tuple[int | None, ...]:
        """The pid of each worker process, in worker order."""
        return tuple(w.pid for w in self._pool.workers)

    @property
    def worker_envs(self) -> tuple[range, ...]:
        """The env indices of each worker, in worker order (the parent's own envs apart)."""
        return tuple(range(lo, hi) for lo, hi in self.layout.bounds)

    def __repr__(self) -> str:
        spec = f"{self.spec.id}, " if self.spec is not None else ""
        state = "closed" if self.closed else self._state.value
        nodes = [] if self.closed else [r.node for r in self.placement]
        if any(node is not None for node in nodes):
            state += f", nodes={nodes}"
        return (
            f"SubprocVectorEnv({spec}num_envs={self.num_envs}, num_workers={self.num_workers}, "
            f"autoreset_mode={self.autoreset_mode.value}, context={self.context}, {state})"
        )


def check_start(start: object, parent_envs: int, recycling: bool) -> bool:
    """Whether ``start`` asks for a lazy start (``"lazy"``; ``"now"``: not).

    Raises:
        ValueError: another value, or ``"lazy"`` with ``parent_envs`` or recycling.
    """
    if start not in ("now", "lazy"):
        raise ValueError(f"start must be 'now' or 'lazy', got {start!r}")
    if start == "lazy" and parent_envs:
        raise ValueError(
            "start='lazy' builds no env until the first call, and parent_envs builds its envs "
            "in the parent at construction: use one or the other"
        )
    if start == "lazy" and recycling:
        raise ValueError(
            "start='lazy' is not available with recycle_every or worker_max_rss (recycling "
            "watches the workers from construction on)"
        )
    return start == "lazy"
