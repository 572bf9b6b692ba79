"""The Ray backend's actor side: :class:`EnvActor`, which runs in each Ray actor and holds a
local SubprocVectorEnv over the actor's envs, and the records it answers with.

It never raises for something an env or a worker did: an env's exception comes back as the
reply (its env index made global), a worker of its own that died or hung as an
:class:`InnerFailure`, so that a Ray-level error means one thing only: the actor itself is
gone. The driver's side is ``_ray`` (:class:`~subvec._ray.RayActors`), which wraps this class
with ``ray.remote``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import cloudpickle
import numpy as np
import ray
from gymnasium import Space
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from subvec import _spaces
from subvec._backend import PLAIN
from subvec._commands import (
    CallPayload,
    Command,
    ErrorRecord,
    ReconfigurePayload,
    ResetOptionsPayload,
    ResetPayload,
    RestorePayload,
    SetAttrPayload,
    Status,
    StepEnvsPayload,
    UnitReply,
)
from subvec._infos import InfoEvent
from subvec.errors import (
    BrokenVectorEnvError,
    EnvError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from subvec.vector import SubprocVectorEnv

__all__ = [
    "THREAD_CAPS",
    "ActorVectorEnv",
    "BatchActions",
    "EnvActor",
    "InnerFailure",
    "StepReply",
    "reap_blocks",
]

#: Set in every actor before its workers start (so they inherit them) unless the caller's
#: runtime_env sets them: an env that calls into numpy/torch must not start a thread per core in
#: every worker of a node. (Set by the actor, not through a runtime_env of ours, so that an actor
#: can start in one of Ray's pooled worker processes; Ray's own default for OMP_NUM_THREADS is
#: the actor's num_cpus.)
THREAD_CAPS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


class BatchActions(NamedTuple):
    """A lock-step step's actions (``StepEnvsPayload.actions``, every env of the actor) as
    one batch: rows ``lo..hi`` of the driver's, in the caller's dtypes. By-value actions
    travel as a list, one per env."""

    actions: Any


class InnerFailure(NamedTuple):
    """A worker of an actor's own SubprocVectorEnv died or hung (with on_worker_failure="raise";
    with "restart" the actor's vector env restarts it and reports ``worker_restarted``)."""

    kind: str  # "died" | "hung"
    message: str


class StepReply(NamedTuple):
    """An actor's answer to a step (and to RESET, with ``None`` rewards and flags)."""

    obs: Any  # the batch of its envs; by value: [(local env, observation)]
    rewards: np.ndarray | None
    terminations: np.ndarray | None
    truncations: np.ndarray | None
    events: list[InfoEvent]


#: (worker, global env indices, reason) of a restart inside an actor
NestedRestart = tuple[int, tuple[int, ...], str]


def _events(infos: Sequence[dict[str, Any]], same_step: bool) -> list[InfoEvent]:
    """The actor's infos (``info_format="list"``: one dict per env) as the events a worker
    sends: a same-step ended env's ``{"final_obs", "final_info"}`` first, then its reset info,
    as the legacy merge folds them."""
    events: list[InfoEvent] = []
    for i, info in enumerate(infos):
        if not info:
            continue
        if same_step and "final_obs" in info and "final_info" in info:
            rest = {k: v for k, v in info.items() if k not in ("final_obs", "final_info")}
            events.append((i, {"final_obs": info["final_obs"], "final_info": info["final_info"]}))
            if rest:
                events.append((i, rest))
        else:
            events.append((i, info))
    return events


class ActorVectorEnv(SubprocVectorEnv):
    """An actor's local vector env. Its envs' spaces are the driver's to check, over every env
    of the RayVectorEnv and with its env indices (as ``observation_mode`` says), so here they
    are only kept, one per env, and the actor's batch is laid out as its first env's space
    (the driver refuses envs whose spaces do not share that layout)."""

    def _setup_spaces(
        self, obs_spaces: Sequence[Space[Any]], act_spaces: Sequence[Space[Any]]
    ) -> None:
        #: every env's own observation and action space, in env order
        self.env_observation_spaces = tuple(obs_spaces)
        self.env_action_spaces = tuple(act_spaces)
        n = len(obs_spaces)
        super()._setup_spaces([obs_spaces[0]] * n, [act_spaces[0]] * n)


class EnvActor:
    """The envs ``lo..lo+len(blobs)-1`` in a local SubprocVectorEnv, inside a Ray actor.

    Every command arrives through :meth:`run` (one place for the payload records' fields)."""

    def __init__(
        self,
        blobs: list[bytes],
        lo: int,
        options: dict[str, Any],
        registry: bytes | None,
        caps: dict[str, str],
        replaces: int | None = None,
    ) -> None:
        os.environ.update(caps)
        if replaces is not None:
            # The actor this one replaces was killed with its resource tracker (Ray kills an
            # actor's child processes), so nothing unlinked its block; its bundle is this one,
            # on this node.
            reap_blocks([replaces])
        self.lo = lo
        self.hi = lo + len(blobs)
        self.env: Any = None
        self.error: BaseException | None = None
        self._seen_restarts = 0
        self._batch_spaces: dict[int, Space[Any]] = {}
        self._same_step = False
        self._obs_by_value = False
        #: a reconfigure's factories by local env, between its two steps
        self._staged: dict[int, bytes] = {}
        try:
            from subvec._process.bootstrap import adopt_registry

            if registry is not None:
                adopt_registry(registry)
            fns = [cloudpickle.loads(blob) for blob in blobs]
            # copy=False: the reply is serialised by Ray before the next command runs.
            self.env = ActorVectorEnv(fns, copy=False, info_format="list", **options)
            self._same_step = self.env.autoreset_mode.name == "SAME_STEP"
            self._obs_by_value = not _spaces.is_shareable(self.env.single_observation_space)
        except Exception as exc:
            self.error = self._global(exc)
        if "torch" in sys.modules:  # imported by a factory: one thread, as the caps say
            sys.modules["torch"].set_num_threads(1)

    def _global(self, exc: BaseException) -> BaseException:
        """An env's error with its env index over the whole vector env, not this actor's."""
        if isinstance(exc, EnvError) and isinstance(exc.env_index, int):
            exc.env_index += self.lo
        return exc

    def hello(self) -> tuple[Status, Any]:
        """What the driver needs: where this actor runs, and its envs' spaces and metadata."""
        if self.error is not None:
            return Status.ERROR, self.error
        env = self.env
        context = ray.get_runtime_context()
        return Status.OK_PAYLOAD, {
            "pid": os.getpid(),
            "node_id": context.get_node_id(),
            "worker_pids": tuple(env.worker_pids),
            "observation_spaces": env.env_observation_spaces,
            "action_spaces": env.env_action_spaces,
            "metadata": {k: v for k, v in env.metadata.items() if k != "autoreset_mode"},
            "render_mode": env.render_mode,
        }

    def run(self, command: int, payload: Any) -> tuple[Status, Any, list[NestedRestart] | None]:
        """Run one command of the protocol on this actor's envs and answer as a unit does.

        Returns:
            ``(status, value, restarts)``: the outcome, and the restarts of this actor's own
            workers since the last answer (None: none).
        """
        env = self.env
        outcome: tuple[Status, Any]
        try:
            if command == Command.STEP_ENVS and payload.envs is None:  # a lock-step step
                outcome = self._step_all(payload)
            elif command == Command.RESET:
                reset: ResetPayload = payload
                if reset.stored is not None:  # a replacement's: the options its envs keep
                    env.set_reset_options(list(reset.stored))
                options: Any = reset.options
                if options is None or isinstance(options, dict):
                    options = dict(options) if options is not None else None
                    if reset.mask is not None:
                        mask = np.array(reset.mask, dtype=bool)
                        options = {**(options or {}), "reset_mask": mask}
                else:  # one per env (the front takes a mask only with a dict)
                    options = list(options)
                obs, infos = env.reset(seed=list(reset.seeds), options=options)
                reply = StepReply(self._obs(obs), None, None, None, _events(infos, False))
                outcome = Status.OK_PAYLOAD, reply
            elif command == Command.STEP_ENVS and payload.is_chunk:  # an action chunk
                outcome = self._step_chunk(payload)
            elif command == Command.STEP_ENVS:
                outcome = self._step_envs(payload)
            elif command == Command.CALL:
                call: CallPayload = payload
                ids = None if call.envs is None else list(call.envs)
                if call.function is not None:  # the SB3 face's per-env operations
                    got = env._call_envs(call.function, call.args, ids, call.name)
                else:
                    got = env.call(call.name, *call.args, env_ids=ids, **call.kwargs)
                outcome = Status.OK_PAYLOAD, list(got)
            elif command == Command.SET_ATTR:
                values: SetAttrPayload = payload
                ids = None if values.envs is None else list(values.envs)
                env.set_attr(values.name, list(values.values), env_ids=ids)
                outcome = PLAIN
            elif command == Command.SNAPSHOT:
                outcome = Status.OK_PAYLOAD, env._snapshot_envs()
            elif command == Command.RESTORE:
                restore: RestorePayload = payload
                env._restore_envs(list(restore.snapshots))
                outcome = PLAIN
            elif command == Command.RECONFIGURE:
                change: ReconfigurePayload = payload
                if change.factories is not None:  # build and check, beside the old envs
                    self._staged = dict(zip(change.envs, change.factories))
                    env._stage_envs(self._staged)
                else:
                    staged, self._staged = self._staged, {}
                    env._swap_envs(staged, change.commit)
                outcome = PLAIN
            elif command == Command.SET_RESET_OPTIONS:
                stored: ResetOptionsPayload = payload
                env.set_reset_options(list(stored.options), env_ids=list(stored.envs))
                outcome = PLAIN
            else:
                raise ValueError(f"a Ray actor takes no {Command(command).name} command")
        except (WorkerDiedError, WorkerTimeoutError, BrokenVectorEnvError) as exc:
            kind = "hung" if isinstance(exc, WorkerTimeoutError) else "died"
            outcome = Status.ERROR, InnerFailure(kind, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            outcome = Status.ERROR, self._global(exc)
        return (*outcome, self._new_restarts())

    def _step_all(self, payload: StepEnvsPayload) -> tuple[Status, Any]:
        """A lock-step step of every env: the local vector env's own ``step()`` (its steady
        path) over the driver's rows (:class:`BatchActions`), or each env's action exactly as
        given (by value). The reply is :meth:`_step_envs`' with every env done (``None``) and
        no env errors: an env's error fails the whole step, as the local ``step()`` raises it
        (after its other envs stepped)."""
        env = self.env
        actions = payload.actions
        if isinstance(actions, BatchActions):
            obs, rewards, terminations, truncations, infos = env.step(actions.actions)
        else:
            assert actions is not None
            env._step_async_values(actions)
            obs, rewards, terminations, truncations, infos = env.step_wait()
        events = _events(infos, self._same_step)
        reply = StepReply(self._obs(obs), rewards, terminations, truncations, events)
        return Status.OK_PAYLOAD, (reply, None, None)

    def _step_envs(self, payload: StepEnvsPayload) -> tuple[Status, Any]:
        """Asynchronous stepping's command: step only ``payload.envs`` (local, ascending) with
        their actions, through the local vector env's own send/recv; answer with their rows
        (in that order), events and the errors of the envs whose step raised."""
        env = self.env
        envs = payload.envs
        assert envs is not None  # asynchronous stepping names its envs
        k = len(envs)
        space = env.single_action_space
        out: Any = create_empty_array(space, n=k, fn=np.zeros)
        # by value always: the driver's batch arrays are not the actor's to read
        assert payload.actions is not None
        batch = concatenate(space, payload.actions, out)
        env.send(batch, list(envs))
        rows: dict[int, tuple[Any, float, bool, bool, dict[str, Any]]] = {}
        errors: list[tuple[int, ErrorRecord]] = []
        while len(rows) + len(errors) < k:
            try:
                obs, rewards, terms, truncs, infos = env.recv(min_envs=1, max_envs=k)
            except EnvError as exc:  # that env's result; the others stay held
                local = int(exc.env_index or 0)
                errors.append((local, ErrorRecord.capture(exc, self.lo + local, "step")))
                continue
            items = list(iterate(self._batched(env.single_observation_space, len(infos)), obs))
            for r, info in enumerate(infos):
                local = int(info.pop("env_id"))
                rows[local] = (items[r], rewards[r], terms[r], truncs[r], info)
        done = [e for e in envs if e in rows]
        obs_rows = [rows[e][0] for e in done]
        reply = StepReply(
            self._obs_batch(obs_rows),
            np.array([rows[e][1] for e in done], dtype=np.float64),
            np.array([rows[e][2] for e in done], dtype=np.bool_),
            np.array([rows[e][3] for e in done], dtype=np.bool_),
            _events([rows[e][4] for e in done], self._same_step),
        )
        # events are numbered by position in ``done``: renumber them by local env
        events = [(done[i], info) for i, info in reply.events]
        return Status.OK_PAYLOAD, (reply._replace(events=events), done, errors)

    def _step_chunk(self, payload: StepEnvsPayload) -> tuple[Status, Any]:
        """One chunk on the local vector env (its workers run the sub-steps): every env's
        (``step_chunk``) or some envs' (``send_chunk``, then ``recv`` of exactly them). The
        reply holds the arrays (rows in ``payload.envs``' order), the events ``(local env,
        sub-step, info)`` and, for observations that travel by value, each env's last one."""
        env = self.env
        space = env.single_action_space
        assert payload.actions is not None  # by value: the driver's arrays are not ours
        envs = list(payload.envs or ())
        if len(envs) == env.num_envs:
            actions = _spaces.build_views(space, iter(payload.actions))
            obs, rewards, terms, truncs, infos = env.step_chunk(
                actions, stop_on_done=payload.stop_on_done, all_obs=payload.all_obs
            )
        else:  # the driver's asynchronous chunk on some of these envs
            actions = _spaces.build_views(space, iter([leaf[envs] for leaf in payload.actions]))
            env.send_chunk(
                actions, envs, stop_on_done=payload.stop_on_done, all_obs=payload.all_obs
            )
            try:
                obs, rewards, terms, truncs, infos = env.recv(env_ids=envs)
            except BaseException:
                _settle(env)  # idle again for the driver's next command
                raise
        events = [
            (envs[i], k, event)
            for i, info in enumerate(infos)  # info_format="list": per env, per sub-step
            for k, sub in enumerate(info["infos"])
            for _, event in _events([sub], self._same_step)
        ]
        steps = np.array([info["chunk_steps"] for info in infos], dtype=np.int64)
        by_value = None
        if self._obs_by_value:
            by_value = [(envs[i], o) for i, o in self._obs(obs)]
        arrays = (rewards, terms, truncs, steps, None if by_value is not None else obs)
        return Status.OK_PAYLOAD, UnitReply(events, by_value, None, None, arrays)

    def _obs_batch(self, obs_rows: list[Any]) -> Any:
        if self._obs_by_value:
            return obs_rows
        space = self.env.single_observation_space
        out: Any = create_empty_array(space, n=len(obs_rows), fn=np.zeros)
        return concatenate(space, obs_rows, out)

    def _batched(self, space: Space[Any], n: int) -> Space[Any]:
        found = self._batch_spaces.get(n)
        if found is None:
            found = self._batch_spaces[n] = batch_space(space, n)
        return found

    def _obs(self, obs: Any) -> Any:
        if self._obs_by_value:
            return list(enumerate(iterate(self.env.observation_space, obs)))
        return obs

    def _new_restarts(self) -> list[NestedRestart] | None:
        restarts = self.env.restarts if self.env is not None else ()
        if len(restarts) == self._seen_restarts:
            return None
        new = restarts[self._seen_restarts :]
        self._seen_restarts = len(restarts)
        return [(r.worker, tuple(self.lo + i for i in r.env_indices), r.reason) for r in new]

    def close(self) -> BaseException | None:
        """Close the envs and their workers; the first error an env's close() raised."""
        if self.env is None:
            return None
        try:
            self.env.close()
        except Exception as exc:
            return self._global(exc)
        return None


def _settle(env: Any) -> None:
    """Collect what ``env`` still holds after a ``recv`` raised, so that it is idle."""
    for _ in range(env.num_envs + 1):  # each failed drain hands out one env's error
        if not (env.in_flight_env_ids or env.ready_env_ids):
            return
        try:
            env.drain()
        except Exception:
            continue


def reap_blocks(pids: Sequence[int | None], wait: float = 0.0) -> None:
    """Remove the shared blocks that the dead processes ``pids`` of this node created (waiting
    up to ``wait`` seconds in all for them to be gone; a live one's are left)."""
    known = [pid for pid in pids if pid is not None]
    if not known:
        return
    from subvec._process.shm import _pid_alive, remove_stale_segments

    deadline = time.monotonic() + wait
    while any(_pid_alive(pid) for pid in known) and time.monotonic() < deadline:
        time.sleep(0.02)
    remove_stale_segments(pids=known)
