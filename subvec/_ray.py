"""The Ray backend: each unit is a Ray actor that holds a local SubprocVectorEnv over its envs.

    driver (RayVectorEnv: the front)                   actor a (any node): envs lo..hi-1
    ────────────────────────────────                   ─────────────────────────────────
    validate the actions, store them (plain numpy)
    actor.run.remote(STEP, rows lo..hi)  ─────────────► SubprocVectorEnv.step(actions): its
                                                          own workers, block, NUMA placement
    ray.wait(every actor's reply, bound) ◄───────────── one object: (status, (obs, rewards,
    copy obs, rewards and flags into rows lo..hi          terminations, truncations, events),
    merge the events as any unit's infos                  new restarts of its workers)

One Ray call per actor per command, one object each way: the actions of the actor's envs as one
array (or nest), the results as columns. Replies from an actor on the driver's node come out of
Ray's object store read-only and zero-copy, and are copied once, into the front's batch.

:class:`~subvec._ray_actor.EnvActor` runs in the actor (``_ray_actor``; the driver wraps it
with ``ray.remote``) and never raises for something an env or a worker did, so that a Ray-level
error means one thing only: the actor itself is gone. :class:`RayActors`, here, is the
driver's side, the backend the front speaks to (``_backend``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from gymnasium import Space
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import remove_placement_group

from subvec import _spaces
from subvec._backend import PLAIN, Collected, Failure, Unit
from subvec._commands import (
    Command,
    Status,
    UnitReply,
    with_remote_cause,
)
from subvec._process.block import ActionRegions, _act, _action_itemsize
from subvec._ray_actor import (
    BatchActions,
    InnerFailure,
    StepReply,
    reap_blocks,
)
from subvec.errors import (
    WorkerDiedError,
    WorkerTimeoutError,
    first_line,
)

__all__ = [
    "RELEASE_GRACE",
    "ActorUnit",
    "RayActors",
    "RayResources",
    "action_store",
    "alive_nodes",
    "release",
]

#: How long a RayVectorEnv dropped without close() (collected, or left open at interpreter exit)
#: gives its actors to close their envs before they are killed.
RELEASE_GRACE = 1.0


# --- the driver's side ---------------------------------------------------------------------


@dataclass(eq=False)
class ActorUnit:
    """One actor and its envs ``lo..hi-1``, as the front schedules them."""

    index: int
    lo: int
    hi: int
    actor: Any
    bundle: int
    node_id: str = ""
    ip: str = ""
    actor_pid: int | None = None
    worker_pids: tuple[int | None, ...] = ()
    #: the actor's first answer: where it runs, its envs' spaces and metadata
    hello: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.actor_pid

    def describe(self) -> str:
        span = f"env {self.lo}" if self.hi - self.lo == 1 else f"envs {self.lo}..{self.hi - 1}"
        return (
            f"Ray actor {self.index} ({span}, pid {self.actor_pid}) on node "
            f"{self.node_id[:12] or '?'} ({self.ip or '?'})"
        )


def action_store(
    space: Space[Any], num_envs: int
) -> tuple[Callable[[Any], _spaces.Stored], ActionRegions]:
    """The driver's action batch (plain numpy, the layout the shared block would have), and
    ``store(actions)`` that validates and writes a batch there (``_spaces.batch_setter``)."""
    views = {}
    for k, leaf in enumerate(_spaces.leaf_specs(space)):
        count = num_envs * int(np.prod(leaf.shape, dtype=np.int64))
        views[_act(k)] = np.zeros(max(1, count * _action_itemsize(leaf)), dtype=np.uint8)
    regions = ActionRegions(views, space, num_envs)
    return _spaces.batch_setter(space, regions.view, num_envs), regions


def _assign_rows(batch: Any, rows: Any, where: slice | list[int]) -> None:
    """``batch[where] = rows`` through a Dict/Tuple nest."""
    if isinstance(batch, np.ndarray):
        batch[where] = rows
    elif isinstance(batch, dict):
        for key, value in batch.items():
            _assign_rows(value, rows[key], where)
    else:
        for value, part in zip(batch, rows):
            _assign_rows(value, part, where)


#: a unit sent nothing (a masked reset that leaves all its envs alone): it answers a plain OK
_NOT_SENT = None


@dataclass(eq=False)
class RayResources:
    """What a RayVectorEnv must release, held apart from it (and from its backend, whose
    ``spawn`` is the env's) so that the env's ``weakref.finalize`` reaches it without keeping
    the env alive."""

    #: the actors, in actor order (the backend's own list: replacements included)
    units: list[ActorUnit] = field(default_factory=list)
    #: the units whose actor closed its envs (their blocks went with them)
    closed: set[int] = field(default_factory=set)
    #: the placement group made for the env (a caller's is not here: it is left alone)
    group: Any = None
    #: whether Ray was started (or connected to) for the env: shut down when released
    owns_ray: bool = False
    #: the driver's node: the blocks of an actor there that did not close are removed here
    node_id: str = ""
    released: bool = False


def release(resources: RayResources, grace: float = RELEASE_GRACE) -> None:
    """Kill every actor (after asking each to close its envs within ``grace`` seconds), remove
    the blocks of those on the driver's node that did not close, the placement group made for
    the env, and shut down a Ray started for it. Idempotent and bounded. It must not reference
    the vector env: it is that env's finalizer (garbage collection, interpreter exit)."""
    if resources.released:
        return
    resources.released = True
    units = list(resources.units)
    if ray.is_initialized():
        if grace > 0:
            closed, _ = _ask_close(units, grace)
            resources.closed |= closed
        for unit in units:
            _kill(unit.actor)
        group, resources.group = resources.group, None
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception:  # Ray lost it already: nothing to remove
                pass
    # An actor killed before it closed its envs leaves its blocks behind (its resource tracker
    # is killed with it): on the driver's node they are removed here. Ray shut down first (at
    # interpreter exit, its own hook may run before this one) took the actors with it, and
    # their blocks are left all the same.
    closed, here = resources.closed, resources.node_id
    reap_blocks(
        [u.actor_pid for u in units if u.node_id == here and u.index not in closed], wait=3.0
    )
    if resources.owns_ray and ray.is_initialized():
        resources.owns_ray = False
        ray.shutdown()


def _ask_close(units: Sequence[ActorUnit], timeout: float) -> tuple[set[int], Any]:
    """Ask ``units``' actors to close their envs and wait ``timeout`` seconds at most.

    Returns:
        The indices of the units that closed, and the first error an env's close() raised
        (None: none).
    """
    closed: set[int] = set()
    error: BaseException | None = None
    if not units:
        return closed, error
    refs = {u.actor.close.remote(): u for u in units}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    for ref in ready:
        try:
            got = ray.get(ref, timeout=1.0)
        except (RayError, GetTimeoutError):
            continue
        closed.add(refs[ref].index)
        if error is None and got is not None:
            error = got
    return closed, error


@dataclass
class RayActors:
    """The backend of a RayVectorEnv: its actors as units (see the module docstring).

    ``spawn(index, bundle, lo, hi, replaces)`` creates an actor (in its placement-group
    bundle; ``replaces``: the pid of the dead actor it replaces); the public class supplies
    it, with the options, the factories and the placement group. The actors are kept in
    ``resources``, which ``release`` frees."""

    spawn: Callable[[int, int, int, int, int | None], Any]
    bounds: list[tuple[int, int]]
    resources: RayResources
    inline: bool = False
    #: the restarts of the actors' own workers (on_worker_failure="restart" inside them)
    nested_restarts: list[tuple[int, tuple[int, ...], str, float]] = field(default_factory=list)
    _inflight: dict[int, tuple[Any, Command] | None] = field(default_factory=dict)
    _dead: set[int] = field(default_factory=set)

    @property
    def units_(self) -> list[ActorUnit]:
        """The actors, in actor order."""
        return self.resources.units

    # --- construction -----------------------------------------------------------------------

    def start(self, timeout: float | None) -> None:
        """Create every actor and wait for each one's hello (its envs built) within ``timeout``.

        Raises:
            EnvError: a factory raised (its type kept, naming the env).
            WorkerDiedError, WorkerTimeoutError: an actor died or did not start in time.
        """
        for i, (lo, hi) in enumerate(self.bounds):  # each kept as soon as it exists
            self.units_.append(ActorUnit(i, lo, hi, self.spawn(i, i, lo, hi, None), bundle=i))
        self._handshake(self.units_, timeout)

    def _handshake(self, units: Sequence[ActorUnit], timeout: float | None) -> None:
        refs = {unit.actor.hello.remote(): unit for unit in units}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        if pending:
            late = [refs[r] for r in pending]
            raise WorkerTimeoutError(
                f"{late[0].describe()} did not build its envs within start_timeout={timeout}s "
                "(a bundle of the placement group may wait for resources, or a factory hangs)",
                env_indices=[i for u in late for i in range(u.lo, u.hi)],
                timeout=timeout or 0.0,
            )
        for ref in ready:
            unit = refs[ref]
            try:
                status, value = ray.get(ref)
            except RayError as exc:
                raise WorkerDiedError(
                    f"{unit.describe()} died while building its envs: {first_line(exc)}",
                    env_indices=range(unit.lo, unit.hi),
                ) from exc
            if status is Status.ERROR:
                raise with_remote_cause(value)
            unit.node_id = value["node_id"]
            unit.ip = _node_address(unit.node_id)
            unit.actor_pid, unit.worker_pids = value["pid"], value["worker_pids"]
            unit.hello = value

    def bind(
        self,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        observations: Any,
        regions: ActionRegions | None,
    ) -> None:
        """The front's batch arrays (rows are written here) and the stored actions."""
        self._rewards, self._terminations, self._truncations = rewards, terminations, truncations
        self._observations = observations  # None: observations travel by value
        self._regions = regions
        self._action_rows_cache: dict[tuple[tuple[str, ...] | None, int, int], Any] = {}

    # --- the backend ------------------------------------------------------------------------

    @property
    def units(self) -> Sequence[Unit]:
        return self.units_

    def send(
        self,
        command: Command,
        payload: Any = None,
        *,
        per_unit: Callable[[Any], Any] | None = None,
        units: Sequence[Any] | None = None,
    ) -> None:
        """One Ray call per unit: ``actor.run(command, payload)``."""
        for unit in self.units_ if units is None else units:
            sent = per_unit(unit) if per_unit is not None else payload
            if command is Command.STEP_ENVS and sent.envs is None and sent.actions is None:
                # a lock-step step with its actions in our batch: the unit's rows go
                sent = sent._replace(actions=self._action_rows(unit, sent.action_dtypes))
            elif command is Command.RESET and sent.mask is not None and not any(sent.mask):
                self._inflight[unit.index] = _NOT_SENT
                continue
            self._inflight[unit.index] = (unit.actor.run.remote(int(command), sent), command)

    def _action_rows(self, unit: ActorUnit, dtypes: tuple[str, ...] | None) -> BatchActions:
        """The unit's rows of the driver's action batch, in ``dtypes`` (None: the space's)."""
        key = (dtypes, unit.lo, unit.hi)
        rows = self._action_rows_cache.get(key)
        if rows is None:
            regions = self._regions
            assert regions is not None
            names = dtypes or tuple(leaf.dtype.str for leaf in regions.leaves)
            leaves = [regions.view(k, np.dtype(d)) for k, d in enumerate(names)]
            views = (leaf[unit.lo : unit.hi] for leaf in leaves if leaf is not None)
            rows = self._action_rows_cache[key] = _spaces.build_views(regions.space, views)
        return BatchActions(rows)  # Ray serialises the rows in .remote(): a copy

    def collect(
        self,
        timeout: float | None,
        what: str,
        *,
        units: Sequence[Any] | None = None,
        stop_at_death: bool = False,
    ) -> Collected | None:
        """Wait (within ``timeout``) for the replies of ``units`` (all by default), writing each
        one's rows into the batch; None when every one answered with nothing more to say."""
        wanted = self.units_ if units is None else units
        refs: dict[Any, tuple[ActorUnit, Command]] = {}
        for unit in wanted:
            entry = self._inflight.pop(unit.index, _NOT_SENT)
            if entry is not _NOT_SENT:
                refs[entry[0]] = (unit, entry[1])
        collected = Collected({}, [])
        pending = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            # All at once on the usual path; one by one when a death must stop the wait.
            want = 1 if stop_at_death else len(pending)
            ready, pending = ray.wait(pending, num_returns=want, timeout=remaining)
            for ref in ready:
                unit, command = refs[ref]
                self._take(unit, command, ref, collected)
            if not ready:  # the bound passed
                break
            if stop_at_death and collected.failures:
                pending = []  # the others' answers are dropped: the vector env breaks
        for ref in pending:
            unit, _ = refs[ref]
            collected.failures.append(
                Failure(unit, "hung", f"{unit.describe()} did not answer within {timeout}s {what}")
            )
        if not collected.outcomes and not collected.failures:
            return None
        return collected

    def collect_ready(
        self, units: Sequence[Any], enough: int, timeout: float | None, what: str
    ) -> Collected:
        """Wait until at least ``enough`` of ``units`` answered (or ``timeout`` passed), then
        take every other answer already there; the rest stay in flight."""
        refs: dict[Any, tuple[ActorUnit, Command]] = {}
        collected = Collected({}, [])
        for unit in units:
            entry = self._inflight.get(unit.index, _NOT_SENT)
            if entry is _NOT_SENT:
                if unit.index in self._inflight:
                    del self._inflight[unit.index]
                    collected.outcomes[unit.index] = PLAIN
                continue
            refs[entry[0]] = (unit, entry[1])
        if refs:
            need = max(0, min(enough - len(collected.outcomes), len(refs)))
            # need 0: take only what is there, without waiting
            wait = 0.0 if need == 0 else timeout
            ready, pending = ray.wait(list(refs), num_returns=max(need, 1), timeout=wait)
            if pending:
                more, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
                ready = ready + more
            for ref in ready:
                unit, command = refs[ref]
                del self._inflight[unit.index]
                failed = len(collected.failures)
                self._take(unit, command, ref, collected)
                if len(collected.failures) == failed:  # a lost actor has no outcome
                    collected.outcomes.setdefault(unit.index, PLAIN)
        return collected

    def _take(self, unit: ActorUnit, command: Command, ref: Any, into: Collected) -> None:
        """One actor's reply: rows into the batch, and its outcome or failure into ``into``."""
        try:
            status, value, restarts = ray.get(ref)
        except RayActorError as exc:
            self._dead.add(unit.index)
            into.failures.append(
                Failure(unit, "died", f"{unit.describe()} died ({first_line(exc)})")
            )
            return
        except RayTaskError as exc:  # run() itself failed: not an env's doing
            into.outcomes[unit.index] = (Status.ERROR, exc.as_instanceof_cause())
            return
        except RayError as exc:  # the reply was lost with its node
            self._dead.add(unit.index)
            into.failures.append(
                Failure(unit, "died", f"{unit.describe()} was lost ({first_line(exc)})")
            )
            return
        if restarts:
            now = time.monotonic()
            for worker, envs, reason in restarts:
                why = f"a worker of {unit.describe()}: {reason}"
                self.nested_restarts.append((worker, envs, why, now))
        if status is Status.ERROR:
            if isinstance(value, InnerFailure):
                self._dead.add(unit.index)  # its vector env is broken: rebuild the actor
                message = f"{unit.describe()} lost a worker: {value.message}"
                into.failures.append(Failure(unit, value.kind, message))
            else:
                into.outcomes[unit.index] = (status, with_remote_cause(value))
            return
        if command is Command.STEP_ENVS and isinstance(value, UnitReply):  # an action chunk
            into.outcomes[unit.index] = (Status.OK_PAYLOAD, value)
            return
        if command is Command.RESET or (command is Command.STEP_ENVS and value[1] is None):
            # a reset, or a lock-step step (every env of the unit: ``done`` is None)
            reply: StepReply = value if command is Command.RESET else value[0]
            self._write(reply, slice(unit.lo, unit.hi))
            by_value = reply.obs if self._observations is None else None
            if reply.events or by_value is not None:
                into.outcomes[unit.index] = (Status.OK_PAYLOAD, UnitReply(reply.events, by_value))
            return
        if command is Command.STEP_ENVS:  # asynchronous stepping's: some envs
            reply, done, errors = value
            self._write(reply, [unit.lo + e for e in done])
            by_value = None
            if self._observations is None:
                by_value = list(zip(done, reply.obs))
            into.outcomes[unit.index] = (
                Status.OK_PAYLOAD,
                UnitReply(reply.events, by_value, errors),
            )
            return
        if status is not Status.OK:
            into.outcomes[unit.index] = (status, value)

    def _write(self, reply: StepReply, where: slice | list[int]) -> None:
        """An actor's rows into the front's batch arrays (the one copy)."""
        if reply.rewards is not None:
            self._rewards[where] = reply.rewards
            self._terminations[where] = reply.terminations
            self._truncations[where] = reply.truncations
        if self._observations is not None:
            _assign_rows(self._observations, reply.obs, where)

    def set_factories(self, blobs: Mapping[int, bytes]) -> None:
        """A replacement actor builds env ``i`` from ``blobs[i]`` from now on."""
        self.spawn.set_factories(blobs)  # type: ignore[attr-defined]

    def restart(self, unit: Any, timeout: float | None) -> Unit:
        """Kill ``unit``'s actor and create a fresh one in the same bundle, its envs built (not
        reset).

        Raises:
            EnvError, WorkerDiedError, WorkerTimeoutError: the new actor failed to start.
        """
        self._inflight.pop(unit.index, None)
        _kill(unit.actor)
        new = ActorUnit(
            unit.index,
            unit.lo,
            unit.hi,
            self.spawn(unit.index, unit.bundle, unit.lo, unit.hi, unit.actor_pid),
            bundle=unit.bundle,
        )
        self.units_[unit.index] = new
        self._dead.discard(unit.index)
        try:
            self._handshake([new], timeout)
        except BaseException:
            self._dead.add(unit.index)
            raise
        return new

    def suspend(self, timeout: float) -> None:
        """Have every actor close its envs (within ``timeout``), then end the actors (their
        worker processes with them); the placement group and its bundles stay."""
        self._inflight.clear()
        live = [u for u in self.units_ if u.index not in self._dead]
        if live and ray.is_initialized():
            _ask_close(live, timeout)
        for unit in self.units_:
            _kill(unit.actor)
            self._dead.add(unit.index)

    def resume(self, timeout: float | None) -> None:
        """A fresh actor for every unit, in its bundle, all created at once and their envs
        built (not reset).

        Raises:
            EnvError, WorkerDiedError, WorkerTimeoutError: an actor failed to start (every
                actor is ended again: the backend stays suspended).
        """
        units = self.units_
        for i, unit in enumerate(units):
            actor = self.spawn(unit.index, unit.bundle, unit.lo, unit.hi, unit.actor_pid)
            units[i] = ActorUnit(unit.index, unit.lo, unit.hi, actor, bundle=unit.bundle)
        try:
            self._handshake(list(units), timeout)
        except BaseException:
            self.suspend(0.0)
            raise
        self._dead.clear()

    def dead(self) -> list[Any]:
        """The units whose actor died (or whose own vector env lost a worker)."""
        return [u for u in self.units_ if u.index in self._dead]

    def owing(self) -> list[Any]:
        """None known: an interrupted wait drops its object refs, and an actor runs the next
        call after the interrupted one, so that call waits for it (docs/ray.md)."""
        return []

    def close(self, timeout: float, terminate: bool) -> BaseException | None:
        """Ask every live actor to close its envs (within ``timeout``), then release them all
        (``release``). Returns the first error an env's close() raised."""
        self._inflight.clear()
        error: BaseException | None = None
        try:
            live = [u for u in self.units_ if u.index not in self._dead]
            if live and not terminate and ray.is_initialized():
                closed, error = _ask_close(live, timeout)
                self.resources.closed |= closed
        finally:
            release(self.resources, grace=0.0)
        return error


def alive_nodes() -> list[dict[str, Any]]:
    """Ray's record of every alive node of the cluster."""
    nodes: list[dict[str, Any]] = ray.nodes()
    return [n for n in nodes if n.get("Alive")]


def _node_address(node_id: str) -> str:
    """The address Ray knows the node by (inside an actor, ``get_node_ip_address`` may name
    another interface of the machine)."""
    for node in alive_nodes():
        if node["NodeID"] == node_id:
            return str(node.get("NodeManagerAddress", ""))
    return ""


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone, or Ray shut down under us: nothing left to stop
        pass
