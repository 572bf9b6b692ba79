"""SubprocVectorEnv: a gymnasium VectorEnv whose envs run in worker processes.

Data flow of one step (see docs/design.md for the full picture)::

    parent                                              worker w (envs lo..hi-1)
    store actions in the block (validated first)
    write STEP frame (9 bytes) on every command pipe ──► EnvSlab.step: read act[i], env.step,
                                                        autoreset, write obs/rew/flags rows
    poll(all reply pipes + all worker sentinels) ◄───── OK frame (9 bytes), or OK_PAYLOAD with
    merge infos with gymnasium's _key masks              pickled infos, or ERROR with a record
    copy observations out of the block

Actors: the parent owns the shared block (creates and unlinks it), one command and one reply
pipe per worker, and the state machine (idle / waiting for reset, step or call / broken /
closed). Each worker owns its envs. Every wait watches the workers' sentinels as well as their
reply pipes, so a dead worker is noticed at once even while others are still busy, and every
wait can be bounded by a timeout. Each command carries a sequence number echoed by its reply,
so a reply to a command the parent stopped waiting for is dropped, never mistaken for the next.
"""

from __future__ import annotations

import enum
import multiprocessing
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from copy import deepcopy
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.context import BaseContext
from sys import getrefcount
from typing import Any

import cloudpickle
import numpy as np
from gymnasium import Env, Space
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector.utils import (
    batch_differing_spaces,
    batch_space,
    concatenate,
    create_empty_array,
    iterate,
)
from gymnasium.vector.vector_env import AutoresetMode, VectorEnv

from subvec import _protocol as proto
from subvec import _spaces
from subvec._core import EnvSlab, FinalObsInBlock, SlabArrays, SlabResult, final_obs_store
from subvec._infos import (
    InfoBlockReader,
    InfoColumns,
    as_events,
    info_block_regions,
    merge_columns,
    merge_scalar_events,
)
from subvec._pool import (
    PLAIN_OK,
    Failure,
    Gathered,
    Reply,
    Worker,
    WorkerPool,
    raise_env_errors,
    release,
)
from subvec._protocol import Command, ErrorRecord, Status
from subvec._seeding import SeedArg, per_env_seeds
from subvec._shm import BlockLayout, SharedBlock, has_free_space
from subvec._topology import PlacementReport, plan_placement, usable_cpus
from subvec._worker import AttachSpec
from subvec.errors import BrokenVectorEnvError, add_note
from subvec.proxy import RemoteProxy

__all__ = ["SubprocVectorEnv"]

#: How long close() waits for workers to finish their envs' close() before escalating.
DEFAULT_CLOSE_TIMEOUT = 10.0
#: The same bound once a worker has died (the others may be stuck mid-step).
BROKEN_CLOSE_TIMEOUT = 2.0
#: Restarts allowed over the life of a vector env with on_worker_failure="restart".
DEFAULT_MAX_RESTARTS = 100
#: Busy-poll window (microseconds) before blocking, used by processes that own a CPU. On the
#: 2-vCPU VM a blocking wake-up costs tens of microseconds, more than a cheap env's step; the
#: window must outlast the other side's turn (the parent's own envs with parent_envs), and
#: 50 us measured too short there while 100-1000 us all helped (docs/benchmarks.md).
DEFAULT_SPIN_US = 300.0
#: Observation batches of at least this many bytes are handed to the caller in slots of the
#: block instead of copied out (see ``_pick_obs_slot``); smaller ones cost less to copy.
OBS_SLOT_MIN_BYTES = 16 * 1024
#: How many batches the caller may hold at once before the next one is copied out again...
OBS_SLOTS = 3
#: ...within this many bytes of block for them (/dev/shm is often small in containers).
OBS_SLOT_MAX_BYTES = 64 * 2**20


class _State(enum.Enum):
    IDLE = "idle"
    WAITING_RESET = "reset"
    WAITING_STEP = "step"
    WAITING_CALL = "call"
    BROKEN = "broken"


#: The info formats whose steady scalar infos stay in the block (see _infos.InfoBlockWriter).
_BLOCK_INFO_FORMATS = ("gymnasium", "list", "legacy")
#: (name, dtype, shape) of an array in the shared block
_Region = tuple[str, np.dtype[Any], tuple[int, ...]]
_WAITING = {state: f"waiting for {state.value}" for state in _State}


@dataclass(frozen=True)
class RestartRecord:
    """One worker replacement: which worker, which envs, why, and when (monotonic)."""

    worker: int
    env_indices: tuple[int, ...]
    reason: str
    time: float


def _default_context() -> str:
    # forkserver: safe when the parent already runs threads (torch, BLAS); fork would copy
    # their locks mid-flight. macOS has no forkserver-friendly default, spawn is its default.
    if sys.platform == "linux":
        return "forkserver"
    return "spawn"


def _split(num_envs: int, num_workers: int, extra_last: bool = False) -> list[tuple[int, int]]:
    """Consecutive env ranges, as even as possible; the remainder goes to the first workers,
    or with ``extra_last`` to the last ones (worker 0 as the parent's partner also carries the
    parent's own work on its CPU)."""
    base, extra = divmod(num_envs, num_workers)
    bounds, lo = [], 0
    for w in range(num_workers):
        gets_extra = w >= num_workers - extra if extra_last else w < extra
        hi = lo + base + (1 if gets_extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _parse_autoreset(mode: str | AutoresetMode) -> AutoresetMode:
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


def _copy_nest(obs: Any) -> Any:
    if isinstance(obs, np.ndarray):
        return obs.copy()
    if isinstance(obs, dict):
        return {k: _copy_nest(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_copy_nest(v) for v in obs)
    return deepcopy(obs)


class SubprocVectorEnv(VectorEnv[Any, Any, np.ndarray]):
    """Run ``len(env_fns)`` envs in worker processes, batched through shared memory.

    A drop-in for ``gymnasium.vector.AsyncVectorEnv``: same methods, same results (byte for byte
    against ``SyncVectorEnv`` for the same seeds), with several envs per worker, one shared block
    for every fixed-size array, and errors that name the env and keep the worker's traceback.

    Args:
        env_fns: callables that build the envs (lambdas and closures work: cloudpickle).
        num_workers: worker processes; default ``min(num_envs, usable CPUs)``.
        envs_per_worker: alternatively, envs per worker (the last workers may get one fewer).
        autoreset_mode: an ``AutoresetMode`` or its value/name ("NextStep", "same_step", ...).
        shared_memory: observations in shared memory (else pickled through the reply pipes).
        copy: return fresh observation arrays; ``False`` returns views valid until the next call.
        context: multiprocessing start method; default forkserver on Linux, spawn elsewhere.
        daemon: start workers as daemons (killed with the parent's interpreter).
        numa: placement of workers on NUMA nodes (``"auto"``, ``None``, ``True``, a
            ``{node: [cpus]}`` dict or a topology); see docs/numa.md.
        pin: ``"node"`` (a worker may use its node's CPUs) or ``"core"`` (one CPU per worker).
        observation_mode: ``"same"``, ``"different"`` or ``(observation_space, single_space)``.
        info_format: ``"gymnasium"`` (1.x ``_key`` masks) or ``"legacy"`` (gymnasium 0.29's
            ``final_observation``/``final_info`` object arrays that CleanRL reads; implies
            same-step autoreset), or ``"list"`` (one dict per env: the step's info; for an env
            that ended with same-step autoreset, the reset's info plus ``final_obs`` and
            ``final_info``; used by the Stable-Baselines3 adapter).
        timeout: default timeout in seconds for every ``*_wait`` (``None``: wait forever, still
            watching for dead workers).
        start_timeout: bound on building the envs at construction (``None``: no bound).
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
            of those two spins (see ``_resolve_spin``).
    """

    def __init__(
        self,
        env_fns: Iterable[Callable[[], Env[Any, Any]]],
        *,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        autoreset_mode: str | AutoresetMode | None = None,
        shared_memory: bool = True,
        copy: bool = True,
        context: str | BaseContext | None = None,
        daemon: bool = True,
        numa: Any = "auto",
        pin: str = "node",
        observation_mode: str | tuple[Space[Any], Space[Any]] = "same",
        info_format: str = "gymnasium",
        timeout: float | None = None,
        start_timeout: float | None = None,
        on_worker_failure: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        parent_envs: int = 0,
        spin_us: float | None = None,
    ) -> None:
        super().__init__()
        self._state = _State.IDLE
        self._broken_reason = ""
        if on_worker_failure not in ("raise", "restart"):
            raise ValueError(
                f"on_worker_failure must be 'raise' or 'restart', got {on_worker_failure!r}"
            )
        self.on_worker_failure = on_worker_failure
        self.max_restarts = int(max_restarts)
        self.restarts: list[RestartRecord] = []
        self.start_timeout = start_timeout

        self.env_fns = list(env_fns)
        self.num_envs = len(self.env_fns)
        if self.num_envs == 0:
            raise ValueError("env_fns is empty: a vector env needs at least one env factory")
        if info_format not in ("gymnasium", "legacy", "list"):
            raise ValueError(
                f"info_format must be 'gymnasium', 'legacy' or 'list', got {info_format!r}"
            )
        self.info_format = info_format
        if autoreset_mode is None:
            autoreset_mode = (
                AutoresetMode.SAME_STEP if info_format == "legacy" else AutoresetMode.NEXT_STEP
            )
        self.autoreset_mode = _parse_autoreset(autoreset_mode)
        if info_format == "legacy" and self.autoreset_mode is not AutoresetMode.SAME_STEP:
            raise ValueError(
                "info_format='legacy' reproduces gymnasium 0.29, which reset envs in the same "
                f"step; drop autoreset_mode={self.autoreset_mode.value!r} or pass SAME_STEP"
            )
        self.shared_memory = bool(shared_memory)
        self.copy = bool(copy)
        self.daemon = bool(daemon)
        self.observation_mode = observation_mode
        self.default_timeout = timeout
        if not isinstance(parent_envs, (int, np.integer)) or not 0 <= parent_envs < self.num_envs:
            raise ValueError(
                f"parent_envs must be an int in [0, num_envs - 1] = [0, {self.num_envs - 1}] "
                f"(at least one env runs in a worker), got {parent_envs!r}"
            )
        self.parent_envs = int(parent_envs)
        self._local: EnvSlab | None = None
        self._local_pending: Callable[[], Any] | None = None

        self.num_workers = self._resolve_workers(num_workers, envs_per_worker)
        self._worker_spin_us, self._parent_spin_us, self._partner = self._resolve_spin(spin_us)
        #: the busy-poll window of the workers that spin (0: none does)
        self.spin_us = max(self._worker_spin_us)
        blobs = self._pickle_factories()
        ctx = self._resolve_context(context)
        self.context = ctx.get_start_method()
        placements = plan_placement(numa, self.num_workers, pin)

        self._pool = WorkerPool(
            ctx,
            blobs,
            _split(
                self.num_envs - self.parent_envs,
                self.num_workers,
                extra_last=self._partner is not None,
            ),
            self.autoreset_mode.value,
            placements,
            self.daemon,
        )
        self._finalizer = weakref.finalize(self, release, self._pool.resources)
        # The tracker must run before any worker exists so that all share it (see _shm).
        resource_tracker.ensure_running()
        self._pool.spin_s = self._parent_spin_us * 1e-6
        self._pool.wait_first = self._partner
        try:
            self._pool.spawn_all()
            self._build_local_envs()  # while the workers build theirs
            self._pool.handshake(self._pool.workers, start_timeout)
        except BaseException:
            self._close_local()
            self._finalizer()
            raise
        workers = self._pool.workers
        first = workers[0].hello
        assert first is not None
        self.metadata = dict(first.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first.render_mode
        obs_spaces = [sp for w in workers if w.hello for sp in w.hello.observation_spaces]
        act_spaces = [sp for w in workers if w.hello for sp in w.hello.action_spaces]
        if self._local is not None:
            obs_spaces += [env.observation_space for env in self._local.envs]
            act_spaces += [env.action_space for env in self._local.envs]
        try:
            self._setup_spaces(obs_spaces, act_spaces)
            self._setup_block()
        except BaseException:
            self._close_local()
            raise
        self._needs_reset = np.zeros(self.num_envs, dtype=np.bool_)
        self._restarted = np.zeros(self.num_envs, dtype=np.bool_)
        self._any_restarted = False
        self._reset_request: tuple[list[int | None], np.ndarray | None] | None = None
        self._env_obs: list[Any] = [None] * self.num_envs
        #: whether ``step`` may take its short path: every env in a worker and the
        #: observations in the block as one array (fixed from here on)
        self._steady = (
            self._local is None and self._obs_shared and type(self._observations) is np.ndarray
        )

    # --- construction -----------------------------------------------------------------------

    def _resolve_workers(self, num_workers: int | None, envs_per_worker: int | None) -> int:
        n = self.num_envs - self.parent_envs
        if num_workers is not None and envs_per_worker is not None:
            raise ValueError(
                "give num_workers or envs_per_worker, not both "
                f"(got num_workers={num_workers}, envs_per_worker={envs_per_worker})"
            )
        if num_workers is not None:
            if not isinstance(num_workers, (int, np.integer)) or num_workers < 1:
                raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
            if num_workers > n:
                raise ValueError(
                    f"num_workers={num_workers} exceeds num_envs={n}: each worker needs an env"
                )
            return int(num_workers)
        if envs_per_worker is not None:
            if not isinstance(envs_per_worker, (int, np.integer)) or envs_per_worker < 1:
                raise ValueError(f"envs_per_worker must be a positive int, got {envs_per_worker!r}")
            return -(-n // int(envs_per_worker))
        # The parent stepping envs itself is a process at work too: leave it a CPU.
        return max(1, min(n, usable_cpus() - (1 if self.parent_envs else 0)))

    def _resolve_spin(self, spin_us: float | None) -> tuple[tuple[float, ...], float, int | None]:
        """Per-worker spin and parent spin in microseconds, and the partner worker (if any).

        A spinner that owns its CPU spares a sleep and a wake-up, which on a VM costs more than
        a cheap env's step; one that shares its CPU steals time from a process at work. So:

        - every worker and the parent have a CPU each (``num_workers + 1 <= CPUs``): all spin;
        - only the workers do (``num_workers == CPUs``): the parent shares a CPU with one of
          them. Worker 0 becomes its *partner*: it never spins, so the moment it has replied
          it sleeps and the parent has the CPU, and the parent sleeps until the partner
          replies, so the partner has the CPU meanwhile: two context switches on one CPU per
          step, no cross-CPU wake-up. The scheduler keeps the two together because every
          other CPU is busy with a spinning worker. The other workers spin; the parent
          doesn't (with ``parent_envs`` there is no partner: the parent is busy stepping its
          own envs, so the workers spin);
        - more workers than CPUs: nobody spins.
        """
        n = self.num_workers
        if spin_us is not None:
            if spin_us < 0:
                raise ValueError(f"spin_us must be >= 0 (0 disables spinning), got {spin_us!r}")
            return (float(spin_us),) * n, float(spin_us), None
        cpus = usable_cpus()
        if n + 1 <= cpus:
            return (DEFAULT_SPIN_US,) * n, DEFAULT_SPIN_US, None
        if n > cpus:
            return (0.0,) * n, 0.0, None
        if self.parent_envs:  # the parent is busy with its own envs meanwhile: no partner
            return (DEFAULT_SPIN_US,) * n, 0.0, None
        return (0.0,) + (DEFAULT_SPIN_US,) * (n - 1), 0.0, 0

    def _build_local_envs(self) -> None:
        if not self.parent_envs:
            return
        first = self.num_envs - self.parent_envs
        envs: list[Env[Any, Any]] = []
        try:
            for fn in self.env_fns[first:]:
                envs.append(fn())
        except Exception as exc:
            for env in envs:
                env.close()
            record = ErrorRecord.capture(exc, first + len(envs), "make")
            raise proto.rebuild_remote_error(record, os.getpid()) from None
        self._local = EnvSlab(envs, first, self.autoreset_mode)

    def _close_local(self) -> BaseException | None:
        slab, self._local = self._local, None
        if slab is None:
            return None
        # Unbind its rows of the block: a traceback may keep the slab alive after close.
        slab.arrays = None
        try:
            slab.close()
        except Exception as exc:
            record = ErrorRecord.capture(exc, slab.current_env, "close")
            return proto.rebuild_remote_error(record, os.getpid())
        return None

    def _pickle_factories(self) -> list[bytes]:
        blobs = []
        for i, fn in enumerate(self.env_fns):
            if not callable(fn):
                raise TypeError(f"env_fns[{i}] must be a callable returning an env, got {fn!r}")
            if i >= self.num_envs - self.parent_envs:
                continue  # built here in the parent: never pickled
            try:
                blobs.append(cloudpickle.dumps(fn))
            except Exception as exc:
                raise TypeError(
                    f"env_fns[{i}] ({fn!r}) cannot be pickled to send it to a worker process: "
                    f"{exc}. Capture only picklable values in the factory (build the env "
                    f"inside it, not outside)."
                ) from exc
        return blobs

    def _resolve_context(self, context: str | BaseContext | None) -> BaseContext:
        if isinstance(context, BaseContext):
            ctx = context
        else:
            ctx = multiprocessing.get_context(context or _default_context())
        if ctx.get_start_method() == "forkserver":
            # Preloading makes each new worker a cheap fork of a server that already imported
            # numpy and gymnasium (0.37 s instead of 2.7 s for 8 CartPole workers). It only takes
            # effect if the server is not running yet.
            ctx.set_forkserver_preload(["numpy", "gymnasium", "subvec._worker"])
        return ctx

    def _setup_spaces(self, obs_spaces: list[Space[Any]], act_spaces: list[Space[Any]]) -> None:
        self.single_action_space = act_spaces[0]
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        mode = self.observation_mode
        if isinstance(mode, tuple) and len(mode) == 2:
            if not isinstance(mode[0], Space) or not isinstance(mode[1], Space):
                raise TypeError(
                    "Expected both elements of observation_mode to be Spaces, "
                    f"got {type(mode[0])} and {type(mode[1])}"
                )
            self.observation_space, self.single_observation_space = mode
        elif mode == "same":
            self.single_observation_space = obs_spaces[0]
            self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        elif mode == "different":
            self.single_observation_space = obs_spaces[0]
            self.observation_space = batch_differing_spaces(obs_spaces)
        else:
            raise ValueError(
                "observation_mode must be 'same', 'different' or a tuple "
                f"(observation_space, single_observation_space), got {mode!r}"
            )
        for i, (obs_space, act_space) in enumerate(zip(obs_spaces, act_spaces)):
            if mode == "same":
                if obs_space != self.single_observation_space:
                    raise RuntimeError(
                        f"env {i} has observation space {obs_space} but env 0 has "
                        f"{self.single_observation_space}; with observation_mode='same' they must "
                        "be equal (use observation_mode='different' if this is intended)"
                    )
            elif not is_space_dtype_shape_equiv(obs_space, self.single_observation_space):
                raise RuntimeError(
                    f"env {i} has observation space {obs_space} whose shape/dtype differs from "
                    f"{self.single_observation_space}"
                )
            if act_space != self.single_action_space:
                raise RuntimeError(
                    f"env {i} has action space {act_space} but env 0 has "
                    f"{self.single_action_space}; all action spaces must be equal"
                )

    def _setup_block(self) -> None:
        n = self.num_envs
        obs_space, act_space = self.single_observation_space, self.single_action_space
        self._obs_shared = self.shared_memory and _spaces.is_shareable(obs_space)
        self._act_shared = _spaces.is_shareable(act_space)
        arrays: list[_Region] = [
            ("rewards", np.dtype(np.float64), (n,)),
            ("terminations", np.dtype(np.bool_), (n,)),
            ("truncations", np.dtype(np.bool_), (n,)),
        ]
        if self._act_shared:
            for k, leaf in enumerate(_spaces.leaf_specs(act_space)):
                arrays.append((f"act{k}", leaf.dtype, (n, *leaf.shape)))
        if self._obs_shared:
            for k, leaf in enumerate(_spaces.leaf_specs(obs_space)):
                arrays.append((f"obs{k}", leaf.dtype, (n, *leaf.shape)))
        leaves = _spaces.leaf_specs(obs_space) if self._obs_shared else []
        #: SAME_STEP, one array of observations: ended envs leave their final observation in
        #: the block, and those whose final info is empty send nothing (see _core.FinalObsInBlock)
        self._final_in_block = (
            self.autoreset_mode is AutoresetMode.SAME_STEP
            and len(leaves) == 1
            and not leaves[0].path
        )
        if self._final_in_block:
            arrays.append(("final_obs", leaves[0].dtype, (n, *leaves[0].shape)))
        slots = self._obs_slot_regions(leaves)
        arrays += slots
        # Steady scalar infos stay in the block (read back as columns, or as events for the
        # list and legacy formats).
        info_block = self.info_format in _BLOCK_INFO_FORMATS and bool(self._pool.workers)
        if info_block:
            arrays += info_block_regions(n, len(self._pool.workers))
        layout = BlockLayout.plan(arrays)
        if slots and not has_free_space(layout.size):  # the slots are only a speed-up
            layout = BlockLayout.plan([a for a in arrays if a not in slots])
            slots = []
        try:
            block = SharedBlock.create(layout)
            self._pool.resources.block = block
            spec = AttachSpec(
                block_name=block.name,
                layout=layout,
                num_envs=n,
                observation_space=obs_space if self._obs_shared else None,
                action_space=act_space if self._act_shared else None,
                spin_us=self._worker_spin_us,
                info_columns=self.info_format == "gymnasium",
                final_obs=self._final_in_block,
                info_block=info_block,
                obs_slots=len(slots) - 1 if slots else 0,
            )
            self._attach_payload = cloudpickle.dumps(spec)
            workers = self._pool.workers
            for worker in workers:
                self._pool.send(worker, Command.ATTACH, self._attach_payload)
            replies, failures = self._pool.gather(workers, self.start_timeout, "attaching")
            if failures:
                raise failures[0].to_error()
            raise_env_errors(workers, [replies[w.index] for w in workers])
        except BaseException:
            self._finalizer()
            raise
        views = block.views
        self._final_obs_rows = views["final_obs"] if self._final_in_block else None
        self._info_block = InfoBlockReader(views, n) if info_block else None
        self._rewards = views["rewards"]
        self._terminations = views["terminations"]
        self._truncations = views["truncations"]
        self._store_actions: Callable[[Any], None] | None = None
        if self._act_shared:
            act_leaves = [views[f"act{k}"] for k in range(len(_spaces.leaf_specs(act_space)))]
            act_batch = _spaces.build_views(act_space, iter(act_leaves))
            self._store_actions = _spaces.batch_setter(act_space, act_batch, n)
        #: the observation slots (slot 0: the one copied out) and the arrays their views hang
        #: from: the refcount of those tells whether the caller still holds a batch
        self._obs_slots: list[np.ndarray] | None = None
        self._obs_slot = 0
        if slots:
            self._obs_slots = [views["obs0"]] + [views[name] for name, *_ in slots[:-1]]
            self._obs_roots = [view.base for view in self._obs_slots]
            self._obs_slot_cell = memoryview(views["obs_slot"])  # type: ignore[arg-type]
            self._obs_slot_free = getrefcount(self._obs_roots[1])  # held by nobody but us
        if self._obs_shared:
            obs_leaves = [views[f"obs{k}"] for k in range(len(_spaces.leaf_specs(obs_space)))]
            self._observations = _spaces.build_views(obs_space, iter(obs_leaves))
        else:
            self._observations = create_empty_array(obs_space, n=n, fn=np.zeros)
        if self._local is not None:
            self._bind_local(views)

    def _obs_slot_regions(self, leaves: list[Any]) -> list[_Region]:
        """The block regions of the observation slots (the extra batches and the cell that
        tells the workers which batch to write), or none where copying out is as cheap or the
        caller asked for the block's own views (``copy=False``)."""
        if not (self.copy and self._local is None and len(leaves) == 1 and not leaves[0].path):
            return []
        leaf = leaves[0]
        shape = (self.num_envs, *leaf.shape)
        nbytes = leaf.dtype.itemsize * int(np.prod(shape))
        if nbytes < OBS_SLOT_MIN_BYTES or nbytes * OBS_SLOTS > OBS_SLOT_MAX_BYTES:
            return []
        regions = [(f"obs0_slot{s}", leaf.dtype, shape) for s in range(1, OBS_SLOTS + 1)]
        return [*regions, ("obs_slot", np.dtype(np.int32), (1,))]

    def _pick_obs_slot(self) -> None:
        """Point the workers at a batch of observations the caller holds nothing of.

        ``step`` hands the caller a view of slot 1..OBS_SLOTS instead of a copy of the block
        (a Pong batch of 8 envs: ~20 us of copying, on the CPU the partner steps on). Every
        view of a slot, and whatever keeps one alive (a torch tensor from ``from_numpy``, a
        slice), holds a reference to the slot's root array, so the root's refcount says
        whether the caller still holds anything of it. Only a slot back at its free count is
        written again. If the caller holds them all, the workers write slot 0 and the batch
        is copied out, as without slots."""
        roots, free = self._obs_roots, self._obs_slot_free
        for slot in range(1, len(roots)):
            if getrefcount(roots[slot]) == free:
                break
        else:
            slot = 0
        self._obs_slot = self._obs_slot_cell[0] = slot
        self._observations = self._obs_slots[slot]  # type: ignore[index]

    def _bind_local(self, views: dict[str, np.ndarray]) -> None:
        """Give the parent's own envs their rows of the block, as a worker's are given."""
        slab = self._local
        assert slab is not None
        lo = slab.first_index
        obs_space, act_space = self.single_observation_space, self.single_action_space
        write_obs = read_action = None
        if self._obs_shared:
            leaves = [views[f"obs{k}"][lo:] for k in range(len(_spaces.leaf_specs(obs_space)))]
            rows = _spaces.build_views(obs_space, iter(leaves))
            write_obs = _spaces.row_writer(obs_space, rows, env_offset=lo)
        if self._act_shared:
            leaves = [views[f"act{k}"][lo:] for k in range(len(_spaces.leaf_specs(act_space)))]
            read_action = _spaces.row_reader(
                act_space, _spaces.build_views(act_space, iter(leaves))
            )
        slab.bind(
            SlabArrays(
                rewards=views["rewards"][lo:],
                terminations=views["terminations"][lo:],
                truncations=views["truncations"][lo:],
                write_obs=write_obs,
                read_action=read_action,
                store_final_obs=final_obs_store(views["final_obs"][lo:])
                if self._final_in_block
                else None,
            )
        )

    # --- state checks -----------------------------------------------------------------------

    def _assert_is_running(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`."
            )
        if self._state is _State.BROKEN:
            raise BrokenVectorEnvError(
                f"the vector env is broken ({self._broken_reason}); only close() is allowed"
            )

    def _begin(self, state: _State) -> None:
        self._assert_is_running()
        if self._state is not _State.IDLE:
            raise AlreadyPendingCallError(
                f"Calling `{state.value}` while waiting for a pending call to "
                f"`{self._state.value}` to complete",
                str(self._state.value),
            )

    def _finish(self, state: _State, method: str) -> None:
        self._assert_is_running()
        if self._state is not state:
            raise NoAsyncCallError(
                f"Calling `{method}` without any prior call to `{state.value}_async`.",
                state.value,
            )

    def _broadcast(self, command: Command, payloads: Callable[[Worker], bytes] | bytes) -> None:
        for worker in self._pool.workers:
            payload = payloads if isinstance(payloads, bytes) else payloads(worker)
            self._pool.send(worker, command, payload)

    def _collect(self, state: _State, timeout: float | None) -> list[tuple[int, Any]]:
        """Run the parent's own share of the pending call (if any), gather the workers'
        replies, and return ``(first env index, decoded payload or None)`` in env order.

        Failures: with on_worker_failure="raise", a death breaks the env and a timeout returns
        it to idle (late replies are dropped by seq); both raise. With "restart", each failed
        worker is replaced and, for a step or reset, its envs reset (see _recover).
        """
        if timeout is None:
            timeout = self.default_timeout
        restart = self.on_worker_failure == "restart" and len(self.restarts) < self.max_restarts
        local, self._local_pending = self._local_pending, None
        try:
            # The parent's envs run while the workers run theirs; then we wait for them.
            local_part = self._run_local(local, state) if local is not None else None
            gathered = self._pool.gather_all(timeout, _WAITING[state], stop_at_death=not restart)
        except KeyboardInterrupt:
            # Back to idle: the interrupted call's late replies carry an old seq and are dropped.
            self._state = _State.IDLE
            raise
        if gathered is None and local_part is None:  # every worker said a plain OK
            self._state = _State.IDLE
            return self._block_parts(self._pool.workers) if state is _State.WAITING_STEP else []
        return self._parts(state, gathered, local_part, timeout, restart)

    def _parts(
        self,
        state: _State,
        gathered: Gathered | None,
        local_part: tuple[int, Any] | None,
        timeout: float | None,
        restart: bool,
    ) -> list[tuple[int, Any]]:
        """The second half of ``_collect``: failures, then the replies that say something."""
        workers = self._pool.workers  # replace() swaps a worker in place, in this same list
        replies, failures = gathered or ({w.index: PLAIN_OK for w in workers}, [])
        recovered: dict[int, Reply] = {}
        if failures:
            if restart:
                recovered = self._recover(state, failures, timeout)
                replies.update(recovered)
            else:
                self._fail(failures, timeout)
        self._state = _State.IDLE
        # Only replies with something to say become parts; a plain OK adds nothing but the
        # infos a step left in the block, as all its other results are there already.
        parts: list[tuple[int, Any]] = []
        failed = False
        step = state is _State.WAITING_STEP and self._info_block is not None
        for w in workers:
            status, payload = replies[w.index]
            if status is Status.OK_PAYLOAD:
                parts.append((w.lo, proto.loads(payload)))
            elif status is not Status.OK:
                failed = True
            elif step and w.index not in recovered:  # a restarted worker's reply is a reset's
                parts += self._block_parts((w,))
        local_error = local_part[1] if local_part is not None else None
        if failed:
            try:
                raise_env_errors(workers, [replies[w.index] for w in workers])
            except BaseException as worker_error:
                if isinstance(local_error, BaseException):
                    index = getattr(local_error, "env_index", "?")
                    add_note(worker_error, f"env {index} also failed: {local_error!r}")
                raise
        if isinstance(local_error, BaseException):
            raise local_error
        if local_part is not None:
            parts.append(local_part)
        return parts

    def _run_local(self, command: Callable[[], Any], state: _State) -> tuple[int, Any]:
        """Run the parent's share; an env's exception becomes the same EnvError a worker's
        would (type kept, env index, this pid, traceback as cause), raised after the gather."""
        slab = self._local
        assert slab is not None
        try:
            result = command()
        except Exception as exc:
            record = ErrorRecord.capture(exc, slab.current_env, state.value)
            return slab.first_index, proto.rebuild_remote_error(record, os.getpid())
        if isinstance(result, SlabResult):
            return slab.first_index, None if result.is_empty() else (result.infos, result.obs)
        return slab.first_index, result

    def _fail(self, failures: list[Failure], timeout: float | None) -> None:
        first = failures[0]
        error = first.to_error(timeout or 0.0)
        if self.on_worker_failure == "restart":
            add_note(error, f"max_restarts={self.max_restarts} restarts are used up")
        if first.kind == "died" or self.on_worker_failure == "restart":
            self._state = _State.BROKEN
            self._broken_reason = first.message
            error.args = (first.message + "; the vector env cannot continue: close() it",)
        else:
            self._state = _State.IDLE  # the late replies of the stuck workers will be dropped
            error.args = (
                first.message + ". Their envs are in an undefined state: reset them, or "
                "close(terminate=True).",
            )
        for other in failures[1:]:
            add_note(error, other.message)
        raise error

    def _recover(
        self, state: _State, failures: list[Failure], timeout: float | None
    ) -> dict[int, Reply]:
        """Replace each failed worker; for a step or reset, reset its envs and return that
        reset's reply as the worker's answer. The step then reports those envs truncated with
        reward 0 and ``worker_restarted`` in their infos: nothing about the lost transition is
        made up. A failed call cannot be replayed (it may not be idempotent) and raises."""
        replies: dict[int, Reply] = {}
        for failure in failures:
            worker = self._pool.replace(failure.worker, self._attach_payload, self.start_timeout)
            self.restarts.append(
                RestartRecord(worker.index, tuple(worker.envs), failure.message, time.monotonic())
            )
            if state is _State.WAITING_CALL:
                continue
            seeds: list[int | None] = [None] * len(worker.envs)
            if state is _State.WAITING_RESET and self._reset_request is not None:
                all_seeds, _ = self._reset_request
                seeds = all_seeds[worker.lo : worker.hi]
            self._pool.send(worker, Command.RESET, proto.dumps((seeds, None, None)))
            got, again = self._pool.gather([worker], timeout, "resetting a restarted worker")
            if again:
                self._fail(again, timeout)
            replies[worker.index] = got[worker.index]
            self._restarted[worker.lo : worker.hi] = True
            self._any_restarted = True
        if state is _State.WAITING_CALL:
            self._state = _State.IDLE
            error = failures[0].to_error(timeout or 0.0)
            add_note(error, "the worker was restarted and the vector env remains usable")
            raise error
        return replies

    # --- reset ------------------------------------------------------------------------------

    def reset(
        self, *, seed: SeedArg = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``) and return the batch."""
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: SeedArg = None, options: dict[str, Any] | None = None) -> None:
        self._begin(_State.WAITING_RESET)
        seeds = per_env_seeds(seed, self.num_envs)
        mask = None
        env_options = options
        if options is not None and "reset_mask" in options:
            mask = self._check_reset_mask(options["reset_mask"])
            # Never mutate the caller's dict; the envs see the options without the mask.
            env_options = {k: v for k, v in options.items() if k != "reset_mask"}
        self._reset_request = (seeds, mask)

        def payload(worker: Worker) -> bytes:
            sub_mask = None if mask is None else [bool(m) for m in mask[worker.lo : worker.hi]]
            return proto.dumps((seeds[worker.lo : worker.hi], env_options, sub_mask))

        if self._any_restarted:
            self._restarted[:] = False
            self._any_restarted = False
        if self._obs_slots is not None:
            previous = self._observations
            self._pick_obs_slot()
            if mask is not None and self._observations is not previous:
                np.copyto(self._observations, previous)  # the envs not reset keep theirs
        self._broadcast(Command.RESET, payload)
        slab = self._local
        if slab is not None:
            lo = slab.first_index
            local_mask = None if mask is None else [bool(m) for m in mask[lo:]]
            if local_mask is None or any(local_mask):
                self._local_pending = lambda: slab.reset(seeds[lo:], env_options, local_mask)
        self._state = _State.WAITING_RESET

    def _check_reset_mask(self, reset_mask: Any) -> np.ndarray:
        if not isinstance(reset_mask, np.ndarray):
            raise TypeError(
                f"`options['reset_mask']` must be a numpy array, got {type(reset_mask)}"
            )
        if reset_mask.shape != (self.num_envs,):
            raise ValueError(
                f"`options['reset_mask']` must have shape `({self.num_envs},)`, "
                f"got {reset_mask.shape}"
            )
        if reset_mask.dtype != np.bool_:
            raise TypeError(
                f"`options['reset_mask']` must have `dtype=np.bool_`, got {reset_mask.dtype}"
            )
        if not np.any(reset_mask):
            raise ValueError(
                "`options['reset_mask']` must contain a boolean array with at least one True "
                f"value, got reset_mask={reset_mask}"
            )
        return np.array(reset_mask, dtype=np.bool_)

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        self._finish(_State.WAITING_RESET, "reset_wait")
        parts = self._collect(_State.WAITING_RESET, timeout)
        assert self._reset_request is not None
        _, mask = self._reset_request
        self._reset_request = None
        if mask is None:
            self._needs_reset[:] = False
        else:
            self._needs_reset[mask] = False
        return self._observations_out(parts), self._merge_infos(parts)

    # --- step -------------------------------------------------------------------------------

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action; returns (obs, rewards, terminations, truncations,
        infos) as SyncVectorEnv does."""
        if (
            self._state is _State.IDLE
            and not self._any_restarted
            and not self.closed
            and self._steady
            and self.info_format == "gymnasium"
            and self.autoreset_mode is not AutoresetMode.DISABLED
            and (store := self._store_actions) is not None  # last: bound only on this path
        ):
            # step_async + step_wait without the checks and branches that cannot apply here:
            # on a cheap env the parent's Python is on the critical path (its CPU is the
            # partner's too).
            store(actions)  # validates every leaf before writing any
            # Not kept in this frame: if the gather raises, a traceback the caller keeps would
            # hold the action views, and through them the shared block, open after close().
            del store
            if self._obs_slots is not None:
                self._pick_obs_slot()
            self._state = state = _State.WAITING_STEP
            # send_all + _collect without a parent share to run, in one call.
            timeout = self.default_timeout
            restart = self.on_worker_failure == "restart" and len(self.restarts) < self.max_restarts
            try:
                gathered = self._pool.exchange(
                    Command.STEP, timeout, _WAITING[state], stop_at_death=not restart
                )
            except KeyboardInterrupt:
                self._state = _State.IDLE  # as in _collect
                raise
            if gathered is not None:
                return self._step_results(self._parts(state, gathered, None, timeout, restart))
            self._state = _State.IDLE
            # Nothing but the shared block to read: the usual step, returned without the
            # general merge (this Python shares its CPU with the partner's envs).
            infos: dict[str, Any] | None = {}
            info_block = self._info_block
            if info_block is not None and info_block.flagged():
                # Every env's infos in the block under one schema, or None (merged below)
                infos = info_block.merged(self._pool.workers)
            if infos is None or (
                self._final_in_block and self._any_ended()
            ):  # final events implied by the flags, or infos to merge
                return self._step_results(self._block_parts(self._pool.workers))
            obs = self._observations
            return (
                obs.view() if self._obs_slot else obs.copy() if self.copy else obs,
                self._rewards.copy(),
                self._terminations.copy(),
                self._truncations.copy(),
                infos,
            )
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        self._begin(_State.WAITING_STEP)
        if self.autoreset_mode is AutoresetMode.DISABLED and self._needs_reset.any():
            ended = np.flatnonzero(self._needs_reset).tolist()
            raise ValueError(
                f"envs {ended} terminated or truncated and autoreset_mode is DISABLED: reset them "
                "with reset(options={'reset_mask': mask}) before stepping again"
            )
        if self._any_restarted:
            self._restarted[:] = False
            self._any_restarted = False
        if self._store_actions is not None:
            # Validates every leaf before writing any, so a rejected batch changes nothing.
            self._store_actions(actions)
            if self._obs_slots is not None:
                self._pick_obs_slot()
            self._pool.send_all(Command.STEP)
            if self._local is not None:
                self._local_pending = self._local.step
        else:
            per_env = list(iterate(self.action_space, actions))
            if len(per_env) != self.num_envs:
                raise ValueError(
                    f"expected {self.num_envs} actions, one per env, got {len(per_env)}"
                )
            self._broadcast(Command.STEP, lambda w: proto.dumps(per_env[w.lo : w.hi]))
            slab = self._local
            if slab is not None:
                self._local_pending = lambda: slab.step(per_env[slab.first_index :])
        self._state = _State.WAITING_STEP

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._finish(_State.WAITING_STEP, "step_wait")
        return self._step_results(self._collect(_State.WAITING_STEP, timeout))

    def _step_results(
        self, parts: Sequence[tuple[int, Any]]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._any_restarted:
            # Their episodes were cut short by the restart: truncated, with no reward.
            self._rewards[self._restarted] = 0.0
            self._terminations[self._restarted] = False
            self._truncations[self._restarted] = True
        if self._final_in_block:
            parts = self._with_final_obs(parts)
        obs = self._observations_out(parts)
        infos = self._merge_infos(parts)
        if self.autoreset_mode is AutoresetMode.DISABLED:  # only that mode refuses ended envs
            np.logical_or(self._terminations, self._truncations, out=self._needs_reset)
        return (
            obs,
            self._rewards.copy(),
            self._terminations.copy(),
            self._truncations.copy(),
            infos,
        )

    # --- results ----------------------------------------------------------------------------

    def _any_ended(self) -> bool:
        """Whether any env terminated or truncated in the last step. ``count_nonzero`` is a
        plain C call; ``ndarray.any()`` goes through the ufunc machinery (~0.25 against
        ~1.4 us for 16 envs, twice a SAME_STEP step, on the partner's CPU)."""
        return bool(np.count_nonzero(self._terminations) or np.count_nonzero(self._truncations))

    def _with_final_obs(self, parts: Sequence[tuple[int, Any]]) -> Sequence[tuple[int, Any]]:
        """SAME_STEP with final observations kept in the block: each ended env's final event,
        with its observation copied out of the block, in the place SyncVectorEnv gives it
        (after the events of the envs before it, before its own reset info). Workers leave
        the event out when the final info is empty, and send a stand-in for the observation
        otherwise; an env ended by a worker restart has no final observation."""
        if not self._any_ended():
            return parts  # no final event, so no stand-in either
        ended_mask = self._terminations | self._truncations
        if self._any_restarted:
            ended_mask &= ~self._restarted
        ended = np.flatnonzero(ended_mask).tolist()
        if not ended:
            return parts
        rows = self._final_obs_rows
        assert rows is not None
        sent = dict(parts)
        out: list[tuple[int, Any]] = []
        for lo, hi in self._slab_bounds():
            data = sent.get(lo)
            mine = [i - lo for i in ended if lo <= i < hi]
            if not mine:
                if data is not None:
                    out.append((lo, data))
                continue
            events = list(as_events(data[0])) if data is not None else []
            kept = {e for e, info in events if info.get("final_obs") is FinalObsInBlock}
            merged: list[tuple[int, dict[str, Any]]] = []
            k = 0
            for local in mine:
                while k < len(events) and events[k][0] < local:
                    merged.append(events[k])
                    k += 1
                if local not in kept:
                    merged.append((local, {"final_obs": FinalObsInBlock, "final_info": {}}))
            merged += events[k:]
            for local, info in merged:
                if info.get("final_obs") is FinalObsInBlock:
                    # [i, ...]: a 0-d leaf stays an array
                    info["final_obs"] = rows[lo + local, ...].copy()
            out.append((lo, (merged, data[1] if data is not None else None)))
        return out

    def _block_parts(self, workers: Iterable[Worker]) -> list[tuple[int, Any]]:
        """The parts of those ``workers`` that answered a step with a plain OK and left their
        infos in the block (as the columns they would have sent)."""
        info_block = self._info_block
        if info_block is None:
            return []
        parts = []
        for w in workers:
            columns = info_block.columns(w)
            if columns is not None:
                parts.append((w.lo, (columns, None)))
        return parts

    def _slab_bounds(self) -> list[tuple[int, int]]:
        """``(first, one past the last)`` env index of each worker and of the parent's envs."""
        bounds = [(w.lo, w.hi) for w in self._pool.workers]
        if self._local is not None:
            bounds.append((self._local.first_index, self.num_envs))
        return bounds

    def _observations_out(self, parts: Sequence[tuple[int, Any]]) -> Any:
        if not self._obs_shared:
            for lo, data in parts:
                if data is not None:
                    for local, value in data[1] or ():
                        self._env_obs[lo + local] = value
            self._observations = concatenate(
                self.single_observation_space, self._env_obs, self._observations
            )
            return deepcopy(self._observations) if self.copy else self._observations
        if self._obs_slot:  # the caller's own batch (see _pick_obs_slot)
            return self._observations.view()
        return _copy_nest(self._observations) if self.copy else self._observations

    def _merge_infos(self, parts: Sequence[tuple[int, Any]]) -> Any:
        """Merge the info events in env order, as SyncVectorEnv would."""
        if not parts and not self._any_restarted and self.info_format != "list":
            return {}  # the usual cheap-env step: no env said anything
        restarted = np.flatnonzero(self._restarted).tolist() if self._any_restarted else []
        if self.info_format == "list":
            per_env: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            for lo, data in parts:
                for local, info in as_events(data[0]) if data is not None else ():
                    per_env[lo + local].update(info)
            for i in restarted:
                per_env[i]["worker_restarted"] = True
            return per_env
        if self.info_format == "legacy":
            infos: dict[str, Any] = {}
            for lo, data in parts:
                if data is not None:
                    for env_index, info in _legacy_events(as_events(data[0]), lo):
                        infos = _add_info_legacy(infos, info, env_index, self.num_envs)
            for i in restarted:
                infos = _add_info_legacy(infos, {"worker_restarted": True}, i, self.num_envs)
            return infos
        sent = [(lo, data[0]) for lo, data in parts if data is not None]
        if not restarted and all(type(infos) is InfoColumns for _, infos in sent):
            merged = merge_columns(sent, self.num_envs)  # the workers' scalar infos
            if merged is not None:
                return merged
        events = [(lo + local, info) for lo, infos in sent for local, info in as_events(infos)]
        events += [(i, {"worker_restarted": True}) for i in restarted]
        merged = merge_scalar_events(events, self.num_envs)
        if merged is not None:
            return merged
        infos = {}
        for env_index, info in events:
            infos = self._add_info(infos, info, env_index)
        return infos

    # --- call / attributes ------------------------------------------------------------------

    def call_async(self, name: str, /, *args: Any, **kwargs: Any) -> None:
        self._begin(_State.WAITING_CALL)
        self._broadcast(Command.CALL, cloudpickle.dumps((name, args, kwargs)))
        slab = self._local
        if slab is not None:
            self._local_pending = lambda: slab.call(name, args, kwargs)
        self._state = _State.WAITING_CALL

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        self._finish(_State.WAITING_CALL, "call_wait")
        results: list[Any] = []
        for _, data in self._collect(_State.WAITING_CALL, timeout):
            results.extend(data)
        return tuple(results)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (or read the attribute if not callable)."""
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env (through wrappers)."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set ``name`` on every env: a list/tuple gives one value per env, else one for all."""
        self._begin(_State.WAITING_CALL)
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        per_env = list(values)
        self._broadcast(Command.SET_ATTR, lambda w: cloudpickle.dumps((name, per_env[w.lo : w.hi])))
        slab = self._local
        if slab is not None:
            self._local_pending = lambda: slab.set_attr(name, per_env[slab.first_index :])
        self._state = _State.WAITING_CALL
        self._collect(_State.WAITING_CALL, None)

    def render(self) -> tuple[Any, ...] | None:
        """The frames of every env, as ``call("render")``."""
        return self.call("render")

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The seeds of every env's ``np_random``."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Every env's random generator (copies: they live in the workers)."""
        return self.get_attr("np_random")

    # --- close ------------------------------------------------------------------------------

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Stop the workers and release every resource; bounded and safe from any state.

        Workers finish their current command, close their envs and exit. After ``timeout``
        seconds (default 10) or at once with ``terminate=True`` the stragglers get SIGTERM,
        then SIGKILL (one more second). Errors raised by the envs' own ``close()`` are re-raised
        after everything is released.
        """
        pool = getattr(self, "_pool", None)
        if pool is None:  # construction failed before the pool existed
            return
        bound = DEFAULT_CLOSE_TIMEOUT if timeout is None else timeout
        if timeout is None and self._state is _State.BROKEN:
            # A worker already died; the rest may be stuck mid-step. Give them a short grace
            # to close their envs, not the full default: the user is waiting on a crash.
            bound = BROKEN_CLOSE_TIMEOUT
        local_error = self._close_local()
        self._drop_views()
        error = pool.close(bound, terminate) or local_error
        self._state = _State.IDLE
        self._finalizer()
        if error is not None:
            self.closed = True
            raise error

    @property
    def remote(self) -> RemoteProxy:
        """Attribute-style calls: ``envs.remote.get_t(1)`` is ``envs.call("get_t", 1)``."""
        return RemoteProxy(self)

    def __enter__(self) -> SubprocVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def placement(self) -> tuple[PlacementReport, ...]:
        """Where each worker runs: pid, NUMA node and CPU set, from its ready handshake."""
        return tuple(w.hello.placement for w in self._pool.workers if w.hello is not None)

    @property
    def worker_pids(self) -> tuple[int | None, ...]:
        """The pid of each worker process, in worker order."""
        return tuple(w.pid for w in self._pool.workers)

    def _drop_views(self) -> None:
        # Our own references to the block; without them the block unmaps at once.
        views = (
            "_rewards",
            "_terminations",
            "_truncations",
            "_store_actions",
            "_final_obs_rows",
            "_info_block",
            "_obs_slots",
            "_obs_roots",
            "_obs_slot_cell",
        )
        for name in views:
            self.__dict__.pop(name, None)
        if getattr(self, "_obs_shared", False):
            self.__dict__.pop("_observations", None)

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


def _legacy_events(
    events: Sequence[tuple[int, dict[str, Any]]], lo: int
) -> list[tuple[int, dict[str, Any]]]:
    """Fold same-step events of one env into the gymnasium 0.29 shape: the reset info plus
    ``final_observation`` and ``final_info`` of the episode that just ended."""
    folded: dict[int, dict[str, Any]] = {}
    for local, info in events:
        entry = folded.setdefault(local, {})
        if "final_obs" in info and "final_info" in info and "_final" not in entry:
            entry["_final"] = (info["final_obs"], info["final_info"])
        else:
            entry.update(info)
    out = []
    for local, entry in folded.items():
        final = entry.pop("_final", None)
        if final is not None:
            entry["final_observation"], entry["final_info"] = final
        out.append((lo + local, entry))
    return out


def _add_info_legacy(
    infos: dict[str, Any], info: dict[str, Any], env_index: int, num_envs: int
) -> dict[str, Any]:
    """gymnasium 0.29's info layout: numbers in typed arrays, anything else (dicts, arrays,
    observations) in object arrays, each key with a boolean ``_key`` mask; no recursion."""
    for key, value in info.items():
        if key not in infos:
            if type(value) in (int, float, bool) or isinstance(value, np.number):
                infos[key] = np.zeros(num_envs, dtype=type(value))
            else:
                infos[key] = np.full(num_envs, None, dtype=object)
            infos[f"_{key}"] = np.zeros(num_envs, dtype=np.bool_)
        infos[key][env_index] = value
        infos[f"_{key}"][env_index] = True
    return infos
