"""RayVectorEnv: the same gymnasium VectorEnv, its envs spread over the actors of a Ray cluster.

Each actor holds a local :class:`~subvec.SubprocVectorEnv` over a consecutive range of envs
(its own worker processes, shared block, NUMA placement and restarts); the driver sends one
Ray call per actor per step and copies each reply once into its batch (``subvec._ray``). The
actors live in one placement group (one bundle per actor), created and awaited within
``start_timeout`` so that a request the cluster cannot meet fails with what was asked and what
the cluster has, instead of hanging. Install with ``pip install "subvec[ray]"``; ``import
subvec`` never imports ray, this module does. See docs/ray.md.
"""

from __future__ import annotations

import math
import multiprocessing
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from subvec._requires import missing_extra

try:
    import ray
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "ray") from exc
from gymnasium import Env
from gymnasium.vector.utils import create_empty_array
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from subvec import _spaces
from subvec._backend import RestartRecord
from subvec._batch import BatchViews
from subvec._compat import DEFAULT_INFO_FORMAT, AutoresetMode
from subvec._front.front import VectorFront
from subvec._front.recovery import DEFAULT_MAX_RESTARTS
from subvec._front.setup import Hello, ObservationMode, TimeoutArg
from subvec._pickling import pickle_factories
from subvec._process.bootstrap import registry_snapshot
from subvec._process.environ import WorkerEnvSpec, check_worker_env
from subvec._process.plan import check_max_concurrency, split
from subvec._process.starts import check_build_retries
from subvec._ray import (
    RELEASE_GRACE,
    RayActors,
    RayResources,
    action_store,
    alive_nodes,
    release,
)
from subvec._ray_actor import THREAD_CAPS, EnvActor
from subvec.errors import PlacementError

__all__ = ["ActorPlacement", "RayVectorEnv"]

#: ``placement=`` names and Ray's placement-group strategies
STRATEGIES = {
    "pack": "PACK",
    "spread": "SPREAD",
    "strict_pack": "STRICT_PACK",
    "strict_spread": "STRICT_SPREAD",
}


@dataclass(frozen=True)
class ActorPlacement:
    """Where one actor runs: its Ray node, its envs, its process and its workers' pids."""

    actor: int
    node_id: str
    ip: str
    env_indices: tuple[int, ...]
    pid: int | None
    worker_pids: tuple[int | None, ...]


def _cpu_nodes() -> list[dict[str, Any]]:
    return [n for n in alive_nodes() if n.get("Resources", {}).get("CPU", 0) > 0]


def _cluster_summary(nodes: list[dict[str, Any]]) -> str:
    parts = [
        f"node {n['NodeID'][:12]} ({n.get('NodeManagerAddress', '?')}): "
        f"{n['Resources'].get('CPU', 0):g} CPUs"
        + (f", {n['Resources']['GPU']:g} GPUs" if n["Resources"].get("GPU") else "")
        for n in nodes
    ]
    return f"{len(nodes)} alive node(s) with CPUs: " + ("; ".join(parts) or "none")


@dataclass(frozen=True)
class _Spawner:
    """``RayActors``' ``spawn``: creates actor ``index`` (envs ``lo..hi-1``) in its bundle.
    It holds what an actor is made from and not the vector env, which keeps the backend: the
    env stays out of any reference cycle, and is freed (its actors with it) once dropped."""

    actor_class: Any
    options: dict[str, Any]
    group: PlacementGroup
    blobs: list[bytes]
    #: the options of each actor's vector env, besides its workers and share of concurrency
    inner: dict[str, Any]
    local_workers: int
    shares: list[int | None]
    registry: bytes | None
    caps: dict[str, str]

    def __call__(self, index: int, bundle: int, lo: int, hi: int, replaces: int | None) -> Any:
        strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=bundle)
        inner = {
            **self.inner,
            "num_workers": min(self.local_workers, hi - lo),
            "max_concurrency": self.shares[index],
        }
        actor = self.actor_class.options(scheduling_strategy=strategy, **self.options)
        return actor.remote(self.blobs[lo:hi], lo, inner, self.registry, self.caps, replaces)

    def set_factories(self, blobs: Mapping[int, bytes]) -> None:
        """Build env ``i`` from ``blobs[i]`` from now on (a reconfigure's)."""
        for env, blob in blobs.items():
            self.blobs[env] = blob


class RayVectorEnv(VectorFront):
    """Run ``len(env_fns)`` envs on Ray actors, each holding a local SubprocVectorEnv.

    The same surface as :class:`~subvec.SubprocVectorEnv` (reset/step, ``*_async``/``*_wait``,
    call/get_attr/set_attr, render, close) and the same results, byte for byte against
    ``SyncVectorEnv`` for the same seeds.

    Args:
        env_fns: callables that build the envs (cloudpickled from the driver: no env is
            built here).
        num_actors: how many actors; default one per alive node with CPUs (at most one per
            env), or ``ceil(num_envs / envs_per_actor)``.
        envs_per_actor: alternatively, envs per actor (the first actors get one more when
            they do not divide).
        local_workers: worker processes of each actor's SubprocVectorEnv; default the
            actor's ``num_cpus`` (at most its envs).
        context: the start method of the worker processes inside each actor (``"forkserver"``,
            ``"spawn"`` or ``"fork"``; None: SubprocVectorEnv's default, forkserver), checked
            here before anything starts. SB3's ``start_method`` with ``backend="ray"``.
        actor_options: Ray actor options: ``num_cpus`` (default ``local_workers`` or 1; never
            0), ``num_gpus``, ``resources``, ``runtime_env``, and any other option of
            ``.options()``. Each actor sets ``OMP/MKL/OPENBLAS_NUM_THREADS=1`` for its workers
            (those its ``runtime_env`` ``env_vars`` set are left as given) and one torch
            thread.
        placement: ``"pack"``, ``"spread"``, ``"strict_pack"``, ``"strict_spread"`` (a
            placement group made here, one bundle per actor, removed at close) or a
            ``PlacementGroup`` of yours (bundle ``i`` holds actor ``i``; not removed).
        address: the Ray cluster to connect to when Ray is not initialised yet (``"auto"``:
            the one ``ray start`` started on this machine; None: start a local one). Ray
            started here is shut down at close; Ray already initialised is used and left up.
        observation_mode: ``"same"``, ``"different"`` or ``(observation_space,
            single_space)``, as SubprocVectorEnv's (and gymnasium's AsyncVectorEnv's); every
            env's space is checked here, over the whole vector env.
        autoreset_mode: as SubprocVectorEnv's (None: NEXT_STEP, or SAME_STEP with
            ``info_format="legacy"``).
        max_concurrency: the most envs in ``step`` or ``reset`` at once, as SubprocVectorEnv's
            (None: no limit): split over the actors (each gets its share for its own vector
            env, the first ones one more when it does not divide), so it must be at least the
            number of actors. Without ``num_actors`` or ``envs_per_actor``, there are at most
            that many actors.
        info_format: ``"gymnasium"``, ``"list"`` or ``"legacy"``, as SubprocVectorEnv's.
        copy: return fresh observation arrays; ``False`` returns the driver's batch, valid
            until the next call.
        batch_size: how many envs ``recv()`` returns by default (asynchronous stepping).
        timeout: default timeout in seconds of every ``*_wait`` (None: wait forever, still
            noticing a dead actor at once), or one per command (``{"reset": 120, "step":
            30, "call": 60}``), as SubprocVectorEnv's.
        start_timeout: bound on the placement group becoming ready and on the actors building
            their envs, at construction and for a replacement.
        on_worker_failure: ``"raise"`` (an actor's death, or a worker dying inside one, raises
            ``WorkerDiedError`` naming its envs and node and breaks the vector env) or
            ``"restart"`` (a dead actor is replaced in its bundle and its envs reset; a dead
            worker inside an actor is restarted by that actor; either way the step reports
            those envs truncated with ``infos["worker_restarted"]``).
        max_restarts: the most actor replacements over the env's life (each actor's own
            vector env gets the same bound for its workers).
        worker_env: environment variables for the worker processes inside each actor, as
            SubprocVectorEnv's (a dict, or a callable taking the worker's ``Placement``; its
            ``worker`` is the index within the actor). Not set in the actor itself: for that,
            ``actor_options={"runtime_env": {"env_vars": ...}}``.
        build_retries: as SubprocVectorEnv's, in each actor's workers (the failed attempts
            are recorded in the actor's vector env, not here).
        freeze: as SubprocVectorEnv's.

    Raises:
        PlacementError: the placement group asks for more than the cluster has, or is not
            ready within ``start_timeout``.
        ValueError, TypeError: a bad option value, or a factory that cannot be pickled.
        EnvError: a factory raised in its actor (its type kept, naming the env).
    """

    def __init__(
        self,
        env_fns: Iterable[Callable[[], Env[Any, Any]]],
        *,
        num_actors: int | None = None,
        envs_per_actor: int | None = None,
        local_workers: int | None = None,
        context: str | None = None,
        actor_options: Mapping[str, Any] | None = None,
        placement: str | PlacementGroup = "spread",
        address: str | None = None,
        observation_mode: ObservationMode = "same",
        autoreset_mode: str | AutoresetMode | None = None,
        max_concurrency: int | None = None,
        info_format: str = DEFAULT_INFO_FORMAT,
        copy: bool = True,
        batch_size: int | None = None,
        timeout: TimeoutArg = None,
        start_timeout: float | None = 120,
        on_worker_failure: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        worker_env: WorkerEnvSpec = None,
        build_retries: int = 0,
        freeze: bool = False,
    ) -> None:
        super().__init__()
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
        if context is not None:
            multiprocessing.get_context(context)  # ValueError: cannot find context for '...'
        #: the most envs in ``step`` or ``reset`` at once (None: no limit)
        self.max_concurrency = check_max_concurrency(max_concurrency)
        if not isinstance(placement, PlacementGroup) and placement not in STRATEGIES:
            raise ValueError(
                f"placement must be one of {list(STRATEGIES)} or a ray PlacementGroup, "
                f"got {placement!r}"
            )
        blobs = pickle_factories(self.env_fns, self.num_envs, "a Ray actor")
        check_worker_env(worker_env)
        build_retries = check_build_retries(build_retries)
        options = dict(actor_options or {})
        num_cpus = options.pop("num_cpus", None)
        if num_cpus is None:
            num_cpus = local_workers if local_workers else 1
        if not isinstance(num_cpus, (int, float)) or num_cpus <= 0:
            raise ValueError(
                f"actor_options['num_cpus'] must be a number > 0, got {num_cpus!r}: an actor "
                "with no CPU reserved is placed on a node without regard to the cores its "
                "workers step on"
            )
        if local_workers is not None and (not isinstance(local_workers, int) or local_workers < 1):
            raise ValueError(
                "local_workers must be an int >= 1 (worker processes per actor: each actor's "
                f"SubprocVectorEnv steps its envs in at least one), got {local_workers!r}"
            )
        self._backend: RayActors | None = None
        # What must be released, apart from the env: dropped without close() (collected, or
        # still open at interpreter exit), the env releases it all the same, within a bound.
        resources = self._resources = RayResources()
        self._finalizer = weakref.finalize(self, release, resources, RELEASE_GRACE)
        deadline = None if start_timeout is None else time.monotonic() + start_timeout
        try:
            if not ray.is_initialized():
                # Started here, so shut down at close (never one the caller started).
                init: dict[str, Any] = {"address": address}
                if address is None:
                    init["include_dashboard"] = False
                ray.init(**init)
                resources.owns_ray = True
            resources.node_id = ray.get_runtime_context().get_node_id()
            self.num_actors = self._count_actors(num_actors, envs_per_actor)
            shares = self._concurrency_shares()
            bounds = split(self.num_envs, self.num_actors)
            #: worker processes of each actor's SubprocVectorEnv
            self.local_workers = local_workers or max(1, int(num_cpus))
            bundle = {"CPU": float(num_cpus)}
            if options.get("num_gpus"):
                bundle["GPU"] = float(options["num_gpus"])
            bundle.update(options.get("resources") or {})
            group = self._place(placement, bundle, deadline)
            spawner = _Spawner(
                actor_class=ray.remote(EnvActor),
                options=self._options(options, float(num_cpus)),
                group=group,
                blobs=blobs,
                inner={
                    "autoreset_mode": self.autoreset_mode,
                    "freeze": self.freeze,
                    "on_worker_failure": self.on_worker_failure,
                    "max_restarts": self.max_restarts,
                    "start_timeout": self.start_timeout,
                    "context": context,
                    # what each actor's SubprocVectorEnv gives its workers
                    "worker_env": worker_env,
                    "build_retries": build_retries,
                },
                local_workers=self.local_workers,
                shares=shares,
                registry=registry_snapshot(),
                caps=self._caps,
            )
            backend = RayActors(spawner, bounds, resources)
            self._backend = backend
            backend.start(self._remaining(deadline))
            self._setup(backend)
        except BaseException:
            self._teardown()
            raise

    # --- construction ------------------------------------------------------------------------

    def _count_actors(self, num_actors: int | None, envs_per_actor: int | None) -> int:
        n = self.num_envs
        if num_actors is not None and envs_per_actor is not None:
            raise ValueError("give num_actors or envs_per_actor, not both")
        if envs_per_actor is not None:
            if not isinstance(envs_per_actor, int) or envs_per_actor < 1:
                raise ValueError(f"envs_per_actor must be an int >= 1, got {envs_per_actor!r}")
            return math.ceil(n / envs_per_actor)
        if num_actors is not None:
            if not isinstance(num_actors, int) or not 1 <= num_actors <= n:
                raise ValueError(
                    f"num_actors must be an int in [1, num_envs] = [1, {n}], got {num_actors!r}"
                )
            return num_actors
        limit = n if self.max_concurrency is None else min(n, self.max_concurrency)
        return max(1, min(limit, len(_cpu_nodes())))

    def _concurrency_shares(self) -> list[int | None]:
        """Each actor's ``max_concurrency``: the env's split over them (None: no limit)."""
        k = self.max_concurrency
        if k is None:
            return [None] * self.num_actors
        if k < self.num_actors:
            raise ValueError(
                f"max_concurrency={k} is fewer than the {self.num_actors} actors: each actor "
                "steps at least one env at a time. Ask for at most max_concurrency actors "
                f"(num_actors={k}) or a larger max_concurrency"
            )
        return [hi - lo for lo, hi in split(k, self.num_actors)]

    @staticmethod
    def _remaining(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _place(
        self, placement: str | PlacementGroup, bundle: dict[str, float], deadline: float | None
    ) -> PlacementGroup:
        """The placement group: the caller's, or one bundle per actor made here and awaited."""
        if isinstance(placement, PlacementGroup):
            if len(placement.bundle_specs) < self.num_actors:
                raise ValueError(
                    f"the placement group has {len(placement.bundle_specs)} bundles for "
                    f"{self.num_actors} actors (bundle i holds actor i)"
                )
            return placement
        strategy = STRATEGIES[placement]
        asked = f"{self.num_actors} bundles of {bundle} with strategy {strategy}"
        nodes = _cpu_nodes()
        self._check_feasible(strategy, bundle, nodes, asked)
        group: PlacementGroup = placement_group(
            [dict(bundle) for _ in range(self.num_actors)], strategy=strategy
        )
        self._resources.group = group  # removed when released
        timeout = self._remaining(deadline)
        ready, _ = ray.wait([group.ready()], timeout=timeout)
        if not ready:
            available = ray.available_resources()
            raise PlacementError(
                f"the placement group ({asked}) was not ready within start_timeout="
                f"{self.start_timeout}s; the cluster has {_cluster_summary(_cpu_nodes())} "
                f"(available now: {available})"
            )
        return group

    def _check_feasible(
        self, strategy: str, bundle: dict[str, float], nodes: list[dict[str, Any]], asked: str
    ) -> None:
        """Refuse at once what no placement can meet (Ray would wait for it forever)."""

        def fits(node: dict[str, Any]) -> int:
            have = node["Resources"]
            return min(
                int(have.get(k, 0) // v) if v else self.num_actors for k, v in bundle.items()
            )

        per_node = [fits(n) for n in nodes]
        if strategy == "STRICT_SPREAD":
            ok = sum(1 for f in per_node if f >= 1) >= self.num_actors
        elif strategy == "STRICT_PACK":
            ok = any(f >= self.num_actors for f in per_node)
        else:
            ok = sum(per_node) >= self.num_actors
        if not ok:
            raise PlacementError(
                f"the placement group ({asked}) cannot be placed: the cluster has "
                f"{_cluster_summary(nodes)}. Ask for fewer actors, fewer CPUs per actor "
                "(actor_options={'num_cpus': ...}) or another placement, or add nodes."
            )

    def _options(self, options: dict[str, Any], num_cpus: float) -> dict[str, Any]:
        runtime_env = options.get("runtime_env") or {}
        given = runtime_env.get("env_vars") or {}
        self._caps = {k: v for k, v in THREAD_CAPS.items() if k not in given}
        return {
            **options,
            "num_cpus": num_cpus,
            # subvec's failure policy replaces a dead actor (and resets its envs); Ray must not
            # restart it behind the front's back, nor run a step twice.
            "max_restarts": 0,
            "max_task_retries": 0,
        }

    def _setup(self, backend: RayActors) -> None:
        self._take_hellos([Hello.of_mapping(u.hello) for u in backend.units_])
        n = self.num_envs
        store, regions = None, None
        if _spaces.is_shareable(self.single_action_space):
            store, regions = action_store(self.single_action_space, n)
        observations = None
        if _spaces.is_shareable(self.single_observation_space):
            observations = create_empty_array(self.single_observation_space, n=n, fn=np.zeros)
        batch = BatchViews(
            rewards=np.zeros(n, dtype=np.float64),
            terminations=np.zeros(n, dtype=np.bool_),
            truncations=np.zeros(n, dtype=np.bool_),
            store_actions=store,
            # Asynchronous sends travel by value: an actor is sent its envs' actions.
            store_action_rows=None,
            read_action=None,
            observations=observations,
            final_obs_rows=None,
            info_block=None,
            obs_slots=None,
        )
        backend.bind(batch.rewards, batch.terminations, batch.truncations, observations, regions)
        self._start([backend], batch, final_obs=False)

    # --- close and introspection -------------------------------------------------------------

    def _teardown(self) -> None:
        """Release what construction made (actors, placement group, Ray if started here)."""
        if self._backend is not None:
            self._backend.close(0.0, True)
        self._released()

    def _released(self) -> None:
        self._finalizer()

    @property
    def actors(self) -> tuple[Any, ...]:
        """The actor handles, in actor order."""
        assert self._backend is not None
        return tuple(u.actor for u in self._backend.units_)

    @property
    def placement(self) -> tuple[ActorPlacement, ...]:
        """Where each actor runs: node id and address, env indices, pid, its workers' pids."""
        assert self._backend is not None
        return tuple(
            ActorPlacement(
                u.index, u.node_id, u.ip, tuple(range(u.lo, u.hi)), u.actor_pid, u.worker_pids
            )
            for u in self._backend.units_
        )

    @property
    def restarts(self) -> list[RestartRecord]:
        """Every actor replacement (``on_worker_failure="restart"``), then every restart of a
        worker inside an actor, oldest first within each; each actor replacement counts
        against ``max_restarts``."""
        nested = [] if self._backend is None else self._backend.nested_restarts
        return self._policy.restarts + [RestartRecord(w, e, r, t) for w, e, r, t in nested]

    def __repr__(self) -> str:
        state = "closed" if self.closed else self._state.value
        return (
            f"RayVectorEnv(num_envs={self.num_envs}, num_actors={self.num_actors}, "
            f"autoreset_mode={self.autoreset_mode.value}, {state})"
        )
