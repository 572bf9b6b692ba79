"""PettingZoo parallel envs as rows of one gymnasium vector env (and SuperSuit's signature).

``MultiAgentVectorEnv(par_env_fns)`` runs ``n`` ParallelEnvs of ``A`` possible agents each as
a gymnasium 1.x ``VectorEnv`` of ``n * A`` rows, env-major: row ``i * A + j`` is env ``i``'s
agent ``possible_agents[j]`` (SuperSuit's order)::

    envs = MultiAgentVectorEnv([lambda: pistonball_v6.parallel_env() for _ in range(4)])
    obs, infos = envs.reset(seed=0)          # obs: (4 * 20, 457, 120, 3); env i seeded 0 + i
    obs, rewards, terms, truncs, infos = envs.step(actions)   # actions: one row per agent
    infos["active"]                          # rows that carry their agent's real data

How: each worker holds ``AgentRows`` adapters (``subvec._agents``), each a ParallelEnv as one
fixed-shape gymnasium env whose observation is a Dict of the agents' stacked observations,
rewards, terminations, truncations and active mask, all in the shared block of a
:class:`subvec.SubprocVectorEnv` (or a ``RayVectorEnv``, ``backend="ray"``). The dict-to-rows
conversion runs in the workers; this layer only reshapes the block's arrays into rows and
lays the agents' infos out per row. Seeds, autoreset, errors, restarts and placement are the
core's, per ParallelEnv.

Agents that leave: a row reports its agent's real observation, reward and own termination or
truncation on the step the agent leaves; from the next step until its env resets, it is
padding (observation ``pad_value``, reward 0, flags False, ``infos["active"]`` False) and its
action is not passed to the env. An env resets when all of its agents have left, under the
autoreset mode (NEXT_STEP: the step after; SAME_STEP: in that step, each row that ended with
``final_obs``/``final_info``; DISABLED: when ``reset(options={"reset_mask": rows})`` selects
a row of it). With ``black_death=True`` (SuperSuit's ``black_death_v3``) no row ends before
its env: an agent's own end is not reported, and every row of an env carries the env's flags
on the step its last agent leaves.

SuperSuit's ``concat_vec_envs_v1`` signature over it is :func:`subvec.concat.concat_vec_envs`.
This module imports neither PettingZoo nor SuperSuit; ``import subvec`` does not import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from subvec._agent_infos import RowInfos
from subvec._agents import AgentRowsFactory
from subvec._compat import AutoresetMode
from subvec._front.async_stats import AsyncStats
from subvec._front.front import VectorFront
from subvec._front.merge import merge_chunk_infos
from subvec._front.setup import check_info_format
from subvec._seeding import SeedArg
from subvec._spaces import build_views, leaves_of, map_leaves, path_text
from subvec.factory import VECTOR_KWARGS, backend_kwargs, check_kwargs

__all__ = ["MULTIAGENT_KWARGS", "MultiAgentVectorEnv"]

# Options this layer sets on the vector env underneath, and what to do instead.
_FIXED = {
    "info_format": "pass info_format= to MultiAgentVectorEnv itself (the rows' infos)",
    "observation_mode": "every ParallelEnv must share its possible agents' spaces",
    "worker": "subvec's workers run the ParallelEnvs themselves",
}
#: The :class:`subvec.SubprocVectorEnv` options :class:`MultiAgentVectorEnv` passes on.
MULTIAGENT_KWARGS: tuple[str, ...] = tuple(
    k for k in VECTOR_KWARGS if k not in _FIXED and k not in ("autoreset_mode", "copy")
)


class MultiAgentVectorEnv(VectorEnv):
    """A gymnasium ``VectorEnv`` whose rows are the agents of PettingZoo ParallelEnvs.

    ``num_envs`` is the number of rows, ``num_parallel_envs * agents_per_env``;
    ``single_observation_space`` and ``single_action_space`` are one agent's (every possible
    agent of every env must share them). See the module doc for the row order and for agents
    that leave.

    Args:
        par_env_fns: callables that each build one PettingZoo ``ParallelEnv`` (in a worker).
        pad_value: what a padded row's observation holds (every leaf; zeros by default, which
            may lie outside the space).
        black_death: SuperSuit's ``black_death_v3`` for scripts that rely on it: no row ends
            before its env. A row whose agent leaves is padding from the next step on, as by
            default, but its agent's own termination or truncation is not reported; on the
            step the env's last agent leaves, every row of the env is terminated (truncated if
            any agent leaving on that step was). SuperSuit's wrapper tests ``(terms &
            truncs).all()``, so a time-limited env runs a step too long there; this tests
            whether any agent is left.
        info_format: the rows' infos: ``"gymnasium"`` (1.x ``_key`` masks over the rows, as
            the vector wrappers read them), ``"legacy"`` (gymnasium 0.29's
            ``final_observation``/``final_info`` object arrays; implies SAME_STEP), or
            ``"list"`` (one dict per row). Every format carries ``"active"`` per row.
        autoreset_mode: as :class:`subvec.SubprocVectorEnv`'s, applied per ParallelEnv.
        copy: return fresh arrays (``False``: views of the block, valid until the next call).
        backend: ``"process"`` (a :class:`subvec.SubprocVectorEnv` underneath) or ``"ray"``
            (a :class:`subvec.ray.RayVectorEnv`).
        **subvec_kwargs: the options of the vector env underneath (``num_workers``,
            ``envs_per_worker``, ``timeout``, ``on_worker_failure``, ``numa``, ``gpus``, ...),
            which count ParallelEnvs, not rows.

    Raises:
        ValueError: the ParallelEnvs' possible agents or spaces differ (naming the env and
            agent), or a bad option.
        TypeError: an unknown option, or a space agents as rows cannot hold.
    """

    def __init__(
        self,
        par_env_fns: Iterable[Callable[[], Any]],
        *,
        pad_value: float = 0.0,
        black_death: bool = False,
        info_format: str = "gymnasium",
        autoreset_mode: str | AutoresetMode | None = None,
        copy: bool = True,
        backend: str = "process",
        **subvec_kwargs: Any,
    ) -> None:
        allowed = (
            MULTIAGENT_KWARGS
            if backend == "process"
            else tuple(
                k
                for k in backend_kwargs(backend)
                if k not in _FIXED and k not in ("autoreset_mode", "copy")
            )
        )
        check_kwargs(subvec_kwargs, allowed, "MultiAgentVectorEnv()", hints=_FIXED)
        mode = check_info_format(info_format, autoreset_mode)
        if not isinstance(black_death, bool):
            raise TypeError(f"black_death must be a bool, got {black_death!r}")
        factories = [AgentRowsFactory(fn, float(pad_value), black_death) for fn in par_env_fns]
        if not factories:
            raise ValueError("par_env_fns is empty: pass at least one ParallelEnv factory")
        self.info_format = info_format
        self.autoreset_mode = mode
        self._views = not copy
        #: The vector env underneath, one env per ParallelEnv (a SubprocVectorEnv or a
        #: RayVectorEnv): its calls, ``stats()`` and placement are per ParallelEnv.
        self.env_vector: VectorFront
        if backend == "ray":
            from subvec.ray import RayVectorEnv

            self.env_vector = RayVectorEnv(
                factories, copy=copy, autoreset_mode=mode, info_format="list", **subvec_kwargs
            )
        else:
            from subvec.vector import SubprocVectorEnv

            self.env_vector = SubprocVectorEnv(
                factories, copy=copy, autoreset_mode=mode, info_format="list", **subvec_kwargs
            )
        try:
            self._take_spaces()
        except BaseException:
            self.env_vector.close(terminate=True)
            raise
        self.metadata = dict(self.env_vector.metadata)
        self.metadata["autoreset_mode"] = mode
        self.render_mode = self.env_vector.render_mode
        #: The ParallelEnvs whose agents had all left at the last step (with SAME_STEP they
        #: reset in that step; with DISABLED they wait for a reset); cleared by a reset.
        self.ended_envs = np.zeros(self.num_parallel_envs, dtype=np.bool_)
        self._last_recv: list[int] = []
        #: the ParallelEnvs running a ``send_chunk`` no ``recv`` returned yet, and the
        #: ``all_obs`` those chunks return with
        self._chunks_out: set[int] = set()
        self._chunk_all_obs = False

    def _take_spaces(self) -> None:
        """Agents and spaces from every env, checked to agree."""
        agents = self.env_vector.get_attr("possible_agents")
        obs_spaces = self.env_vector.get_attr("agent_observation_space")
        act_spaces = self.env_vector.get_attr("agent_action_space")
        for i in range(1, len(agents)):
            for what, mine, first in (
                ("possible_agents", agents[i], agents[0]),
                ("agent observation space", obs_spaces[i], obs_spaces[0]),
                ("agent action space", act_spaces[i], act_spaces[0]),
            ):
                if mine != first:
                    raise ValueError(
                        f"env {i} has the {what} {mine!r}, env 0 has {first!r}: every "
                        "ParallelEnv must have the same possible agents and spaces"
                    )
        #: The possible agents of every env; row ``i * agents_per_env + j`` is agent ``j``.
        self.possible_agents: list[str] = list(agents[0])
        #: Possible agents per env (``A``).
        self.agents_per_env = len(self.possible_agents)
        #: ParallelEnvs (``n``); ``num_envs`` is ``n * A`` rows.
        self.num_parallel_envs = len(agents)
        self.num_envs = self.num_parallel_envs * self.agents_per_env
        self.single_observation_space = obs_spaces[0]
        self.single_action_space = act_spaces[0]
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._infos = RowInfos(self.possible_agents, self.info_format, self.num_envs)

    # ---- rows ---------------------------------------------------------------------------

    def _flat(self, nest: Any, rows: int | None = None) -> Any:
        """``(n, A, ...)`` leaves as ``(n * A, ...)`` rows (views)."""
        rows = self.num_envs if rows is None else rows
        return map_leaves(lambda a: a.reshape(rows, *a.shape[2:]), nest)

    def env_and_agent(self, row: int) -> tuple[int, str]:
        """The ParallelEnv index and agent of ``row``."""
        i, j = divmod(int(row), self.agents_per_env)
        return i, self.possible_agents[j]

    def _env_actions(self, actions: Any, envs: int | None = None) -> Any:
        """Row actions ``(n * A, ...)`` as the env batch ``(n, A, ...)`` (views), checked
        (``n``: every env, or ``envs`` of them)."""
        n, a = self.num_parallel_envs if envs is None else envs, self.agents_per_env
        rows = n * a
        out: list[Any] = []  # the leaves, in the walk order build_views takes
        for path, _, leaf in leaves_of(self.single_action_space, actions):
            where = path_text(path)
            shape = getattr(leaf, "shape", None)
            if shape is None:
                leaf = np.asarray(leaf)
                shape = leaf.shape
            if len(shape) == 0 or shape[0] != rows:
                got = "a scalar" if len(shape) == 0 else f"{shape[0]} rows (shape {tuple(shape)})"
                raise ValueError(
                    f"actions{where}: expected one row per agent, {rows} rows "
                    f"({n} envs x {a} agents), got {got}"
                )
            out.append(leaf.reshape(n, a, *shape[1:]))
        return build_views(self.single_action_space, iter(out))

    def _env_chunks(self, actions: Any, envs: int | None = None) -> Any:
        """Row chunks ``(n * A, K, ...)`` as the envs' ``(n, K, A, ...)`` (copies), checked
        (``n``: every env, or ``envs`` of them)."""
        n, a = self.num_parallel_envs if envs is None else envs, self.agents_per_env
        rows = n * a
        out: list[Any] = []  # the leaves, in the walk order build_views takes
        chunk: int | None = None
        for path, _, leaf in leaves_of(self.single_action_space, actions):
            where = path_text(path)
            leaf = np.asarray(leaf)
            if leaf.ndim < 2 or leaf.shape[0] != rows:
                raise ValueError(
                    f"actions{where}: expected one chunk per agent, ({rows}, K, ...) "
                    f"({n} envs x {a} agents, K actions each), got shape {leaf.shape}"
                )
            if chunk is not None and leaf.shape[1] != chunk:
                raise ValueError(
                    f"actions{where}: chunks of {leaf.shape[1]} actions, another leaf has {chunk}"
                )
            chunk = int(leaf.shape[1])
            per_env = leaf.reshape(n, a, chunk, *leaf.shape[2:])
            out.append(np.ascontiguousarray(per_env.swapaxes(1, 2)))
        return build_views(self.single_action_space, iter(out))

    def _env_mask(self, mask: Any) -> np.ndarray:
        """A rows' reset mask as the envs': an env resets when one of its rows is selected;
        a selected row's agent must have left (DISABLED mode resets only ended envs)."""
        rows = np.asarray(mask)
        if rows.dtype != np.bool_ or rows.shape != (self.num_envs,):
            raise ValueError(
                f"reset_mask must be a bool array of {self.num_envs} rows (one per agent), "
                f"got {rows.dtype} of shape {rows.shape}"
            )
        per_env = rows.reshape(self.num_parallel_envs, self.agents_per_env)
        env_mask = np.asarray(per_env.any(axis=1))
        if self.autoreset_mode is AutoresetMode.DISABLED:
            running = env_mask & ~self.ended_envs
            if running.any():
                i = int(np.flatnonzero(running)[0])
                j = int(np.flatnonzero(per_env[i])[0])
                raise ValueError(
                    f"reset_mask selects row {i * self.agents_per_env + j} (env {i}, agent "
                    f"{self.possible_agents[j]!r}) but env {i} is still running; an env "
                    "resets once all of its agents have left (its rows all ended)"
                )
        return env_mask

    # ---- gymnasium's VectorEnv ----------------------------------------------------------

    def reset(
        self, *, seed: SeedArg = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, Any]:
        """Reset every ParallelEnv (or those with a row in ``options["reset_mask"]``).

        Args:
            seed: an int (env ``i`` gets ``seed + i``, so no two envs share a seed) or one
                seed per ParallelEnv (``num_parallel_envs`` of them, not rows).
            options: passed to each ParallelEnv's ``reset``; ``"reset_mask"``, if given, is a
                bool array over the rows (DISABLED mode: every selected row's env must have
                ended).

        Returns:
            The rows' observations and infos.

        Raises:
            ValueError: a bad mask or seed list (nothing is sent).
        """
        opts = dict(options) if options else {}
        mask = opts.pop("reset_mask", None)
        env_mask = None if mask is None else self._env_mask(mask)
        if env_mask is not None:
            opts["reset_mask"] = env_mask
        obs, listed = self.env_vector.reset(seed=seed, options=opts or None)
        env_infos: list[dict[str, Any]] = listed  # type: ignore[assignment]  # "list" format
        if env_mask is None:
            self.ended_envs = np.zeros(self.num_parallel_envs, dtype=np.bool_)
        else:
            self.ended_envs = self.ended_envs & ~env_mask
        active = self._flat(obs["active"])
        events = self._infos.events(env_infos, env_mask)
        return self._flat(obs["obs"]), self._infos.merge(events, active)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Step every ParallelEnv with its rows of ``actions`` (padded rows' are ignored).

        Args:
            actions: one row per agent, ``(num_envs, *single_action_space.shape)`` (a dict or
                tuple of such batches for nested spaces).

        Returns:
            ``(obs, rewards, terminations, truncations, infos)`` over the rows.

        Raises:
            ValueError: not one action row per agent.
            EnvError: a ParallelEnv raised (naming the env; the adapter's own errors name
                the agent too).
        """
        obs, _, env_terms, env_truncs, listed = self.env_vector.step(self._env_actions(actions))
        env_infos: list[dict[str, Any]] = listed  # type: ignore[assignment]  # "list" format
        self.ended_envs = env_terms | env_truncs
        return self._results(obs, env_infos)

    def _results(
        self, obs: dict[str, Any], env_infos: list[dict[str, Any]], env_ids: Any = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """A step's rows out of the adapters' batch (every env, or those of ``env_ids``)."""
        row_obs, rewards, terms, truncs, active, events = self._row_step(obs, env_infos)
        infos = self._infos.merge(events, active, len(active))
        if env_ids is not None:
            self._name_envs(infos, env_ids)
        return row_obs, rewards, terms, truncs, infos

    def _name_envs(self, infos: Any, env_ids: Sequence[int]) -> None:
        """Each row's ParallelEnv as ``infos["env_id"]`` (a recv's rows, env-major)."""
        ids = np.repeat(np.asarray(env_ids, dtype=np.int64), self.agents_per_env)
        if self.info_format == "list":
            for info, i in zip(infos, ids.tolist()):
                info["env_id"] = i
        else:
            infos["env_id"] = ids

    def _row_step(
        self, obs: dict[str, Any], env_infos: Sequence[dict[str, Any]]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[tuple[int, Any]]]:
        """One step's rows out of the adapters' batch ``obs`` and the envs' infos:
        ``(obs, rewards, terminations, truncations, active, events)``, ``events`` the rows'
        infos as ``(row, info)`` in row order."""
        rows = len(env_infos) * self.agents_per_env
        # with copy=False these leaves are the block's: rewards and flags are handed out fresh
        # all the same (as every subvec vector env does), only the observations are views
        fresh = np.array if self._views else np.asarray
        rewards = fresh(obs["reward"].reshape(rows))
        terms = fresh(obs["terminated"].reshape(rows))
        truncs = fresh(obs["truncated"].reshape(rows))
        active = obs["active"].reshape(rows)
        row_obs = self._flat(obs["obs"], rows)
        events = self._infos.events(env_infos, None)
        a = self.agents_per_env
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            finals = [i for i, info in enumerate(env_infos) if "final_obs" in info]
            if finals or terms.any() or truncs.any():
                rewards, terms, truncs = rewards.copy(), terms.copy(), truncs.copy()
                events = self._infos.same_step_finals(
                    finals, env_infos, row_obs, rewards, terms, truncs, events
                )
        restarted = [i for i, info in enumerate(env_infos) if info.get("worker_restarted")]
        if restarted:
            truncs = truncs.copy()
            for i in restarted:
                truncs[i * a : (i + 1) * a] = True
                events += [(i * a + j, {"worker_restarted": True}) for j in range(a)]
            events.sort(key=lambda e: e[0])
        return row_obs, rewards, terms, truncs, active, events

    def step_chunk(
        self, actions: Any, stop_on_done: bool = False, all_obs: bool = False
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """K actions of every agent in one command per worker: sub-step k of each row is
        exactly the k-th :meth:`step` it would have had (``SubprocVectorEnv.step_chunk``,
        per ParallelEnv).

        Args:
            actions: one chunk per row, ``(num_envs, K, *single_action_space.shape)`` (every
                leaf of a nested space with the same leading ``(num_envs, K)``).
            stop_on_done: a ParallelEnv whose agents have all left at sub-step j runs none
                of its later actions (its rows' rewards 0, flags False there).
            all_obs: every sub-step's observations, ``(num_envs, K, ...)``; else each row's
                after its env's last executed sub-step.

        Returns:
            ``(obs, rewards, terminations, truncations, infos)``: rewards and flags
            ``(num_envs, K)``; infos with the chunk axis as ``step_chunk``'s, each row's
            ``"active"`` per sub-step, and ``"chunk_steps"`` per row.

        Raises:
            ValueError: not one chunk per agent (nothing is sent); as
                ``SubprocVectorEnv.step_chunk`` otherwise.
        """
        # every sub-step's adapter observation: the rows' rewards and flags are in it
        batch = self.env_vector.step_chunk(
            self._env_chunks(actions), stop_on_done=stop_on_done, all_obs=True
        )
        return self._chunk_rows(batch, None, all_obs)

    def _chunk_rows(
        self, batch: Any, env_ids: list[int] | None, all_obs: bool
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """A chunk's rows out of the adapters' chunk batch (run with ``all_obs`` underneath)
        of every env, or of ``env_ids``: each sub-step laid out as that :meth:`step` would
        have, merged with the chunk axis."""
        obs, _, env_terms, env_truncs, listed = batch  # info_format="list" underneath
        steps = np.array([int(info["chunk_steps"]) for info in listed], dtype=np.int64)
        a = self.agents_per_env
        rows = len(listed) * a
        chunk = int(env_terms.shape[1])
        rewards = np.zeros((rows, chunk), dtype=np.float64)
        terms = np.zeros((rows, chunk), dtype=np.bool_)
        truncs = np.zeros((rows, chunk), dtype=np.bool_)
        events: list[tuple[int, int, dict[str, Any]]] = []
        row_steps = np.repeat(steps, a)
        for k in range(chunk):
            ran = row_steps > k
            sub_infos = [info["infos"][k] if steps[i] > k else {} for i, info in enumerate(listed)]
            sub_obs = map_leaves(lambda leaf: leaf[:, k], obs)  # noqa: B023 (used at once)
            _, r, te, tr, active, sub_events = self._row_step(sub_obs, sub_infos)
            rewards[:, k] = np.where(ran, r, 0.0)
            terms[:, k] = te & ran
            truncs[:, k] = tr & ran
            said = dict(sub_events)
            events += [
                (row, k, {"active": bool(active[row]), **said.get(row, {})})
                for row in np.flatnonzero(ran).tolist()
            ]
        events.sort(key=lambda e: e[0])  # env-major, sub-steps in order
        infos = merge_chunk_infos(self.info_format, events, rows, chunk, row_steps)
        ids = np.arange(len(listed)) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
        ended_envs = self.ended_envs.copy()
        last = np.maximum(steps - 1, 0)
        ended = (env_terms | env_truncs)[np.arange(len(steps)), last]
        ended_envs[ids] = np.where(steps > 0, ended, ended_envs[ids])
        self.ended_envs = ended_envs
        if env_ids is not None:
            self._name_envs(infos, env_ids)
        # the agents' observations, (n, K, A, ...) per leaf, as rows (n * A, K, ...)
        row_obs = map_leaves(
            lambda leaf: leaf.swapaxes(1, 2).reshape(rows, chunk, *leaf.shape[3:]), obs["obs"]
        )
        if not all_obs:  # a stopped env's rows repeat its last executed sub-step's
            row_obs = map_leaves(lambda leaf: leaf[:, -1].copy(), row_obs)
        return row_obs, rewards, terms, truncs, infos

    # ---- asynchronous stepping, by ParallelEnv ------------------------------------------

    def async_reset(self, seed: SeedArg = None, options: dict[str, Any] | None = None) -> None:
        """Start resetting every ParallelEnv (or those with a row in
        ``options["reset_mask"]``); their rows come back through :meth:`recv`.

        Args:
            seed, options: as :meth:`reset`.
        """
        opts = dict(options) if options else {}
        mask = opts.pop("reset_mask", None)
        if mask is not None:
            opts["reset_mask"] = self._env_mask(mask)
        self.env_vector.async_reset(seed=seed, options=opts or None)

    def send(self, actions: Any, env_ids: Sequence[int] | None = None) -> None:
        """Start stepping the ParallelEnvs ``env_ids`` with their agents' rows of ``actions``.

        Args:
            actions: ``len(env_ids) * agents_per_env`` rows, env-major in the order of
                ``env_ids``.
            env_ids: ParallelEnv indices (default: those the last :meth:`recv` returned).

        Raises:
            ValueError: not one action row per agent of those envs, or a bad env id (as
                :meth:`subvec.SubprocVectorEnv.send`); nothing is sent.
        """
        ids = self._last_recv if env_ids is None else [int(i) for i in env_ids]
        self.env_vector.send(self._env_actions(actions, len(ids)), ids)

    def send_chunk(
        self,
        actions: Any,
        env_ids: Sequence[int] | None = None,
        *,
        stop_on_done: bool = False,
        all_obs: bool = False,
    ) -> None:
        """Start a chunk of K actions on the ParallelEnvs ``env_ids``, while others may be
        in flight: per row exactly :meth:`step_chunk`'s; a :meth:`recv` that returns them
        gives rewards and flags ``(rows, K)`` and infos with the chunk axis.

        Args:
            actions: ``len(env_ids) * agents_per_env`` row chunks, ``(rows, K, ...)``,
                env-major in the order of ``env_ids``.
            env_ids: ParallelEnv indices (default: those the last :meth:`recv` returned).
            stop_on_done, all_obs: as :meth:`step_chunk`; chunks in flight at once share
                ``all_obs`` (and K, as ``SubprocVectorEnv.send_chunk``'s).

        Raises:
            ValueError: not one chunk per agent of those envs, another ``all_obs`` than the
                chunks in flight, or as ``SubprocVectorEnv.send_chunk``; nothing is sent.
        """
        ids = self._last_recv if env_ids is None else [int(i) for i in env_ids]
        if self._chunks_out and all_obs != self._chunk_all_obs:
            raise ValueError(
                f"send_chunk: all_obs={all_obs}, but the chunks in flight (envs "
                f"{sorted(self._chunks_out)}) have all_obs={self._chunk_all_obs}: recv() them "
                "first"
            )
        self.env_vector.send_chunk(
            self._env_chunks(actions, len(ids)), ids, stop_on_done=stop_on_done, all_obs=True
        )
        self._chunk_all_obs = all_obs
        self._chunks_out.update(ids)

    def recv(
        self,
        min_envs: int | None = None,
        max_envs: int | None = None,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        env_ids: Sequence[int] | None = None,
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """The rows of the first ready ParallelEnvs, or of exactly ``env_ids``; counts and
        ids are of ParallelEnvs, not rows.

        Args:
            min_envs, max_envs, timeout, deadline: as :meth:`subvec.SubprocVectorEnv.recv`
                (``min_envs=0``: the batch may hold no env).
            env_ids: wait until every one of these ParallelEnvs is ready and return exactly
                their rows, env-major in this order (one group of :meth:`env_groups`).

        Returns:
            ``(obs, rewards, terminations, truncations, infos)``, ``agents_per_env`` rows per
            env returned; ``infos["env_id"]`` (in the list format, each row's ``"env_id"``)
            names each row's ParallelEnv.

        Raises:
            as :meth:`subvec.SubprocVectorEnv.recv`.
        """
        return self._async_rows(
            self.env_vector.recv(min_envs, max_envs, timeout, deadline=deadline, env_ids=env_ids)
        )

    def poll(
        self, max_envs: int | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """The rows of the ParallelEnvs ready now, without waiting (``recv(min_envs=0)``).

        Args:
            max_envs: return at most this many ParallelEnvs (default ``batch_size``).

        Returns:
            As :meth:`recv`; it may hold zero rows (arrays of length 0, shaped and typed as
            the rows').

        Raises:
            as :meth:`subvec.SubprocVectorEnv.poll`.
        """
        return self._async_rows(self.env_vector.poll(max_envs))

    def env_groups(self, num_groups: int) -> list[list[int]]:
        """Split the ParallelEnvs into ``num_groups`` stages of whole workers, for a staged
        loop (``recv(env_ids=group)``, then ``send(actions, group)``, group by group).

        Args:
            num_groups: how many groups.

        Returns:
            ``num_groups`` lists of ParallelEnv indices; no worker holds envs of two.

        Raises:
            ValueError: as :meth:`subvec.SubprocVectorEnv.env_groups`.
        """
        return self.env_vector.env_groups(num_groups)

    def async_stats(self, reset: bool = False) -> AsyncStats:
        """Who waits on whom in the asynchronous loop, counted in ParallelEnvs
        (:meth:`subvec.SubprocVectorEnv.async_stats`).

        Args:
            reset: start a new window after reading this one.

        Returns:
            The window's :class:`AsyncStats` (batch sizes in ParallelEnvs).
        """
        return self.env_vector.async_stats(reset=reset)

    def drain(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        """Wait for every ParallelEnv in flight and return all held results as one
        recv-shaped batch of rows; the vector env is idle again."""
        return self._async_rows(self.env_vector.drain())

    def _async_rows(self, batch: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, Any]:
        obs, _, env_terms, env_truncs, env_infos = batch  # info_format="list" underneath
        ids = [int(info["env_id"]) for info in env_infos]
        self._last_recv = ids
        if env_infos and "chunk_steps" in env_infos[0]:  # chunks (a batch holds one shape)
            self._chunks_out.difference_update(ids)
            return self._chunk_rows(batch, ids, self._chunk_all_obs)
        ended = self.ended_envs.copy()
        ended[ids] = env_terms | env_truncs
        self.ended_envs = ended
        return self._results(obs, env_infos, ids)

    def render(self) -> tuple[Any, ...] | None:
        """Each ParallelEnv's ``render()`` (one per env, not per row)."""
        return self.env_vector.render()

    def call(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call ``name`` on the ParallelEnvs (or read it, if not callable): one result per
        env of ``env_ids`` (ParallelEnv indices, default all), not per row."""
        return self.env_vector.call(name, *args, env_ids=env_ids, **kwargs)

    def get_attr(self, name: str, env_ids: Sequence[int] | None = None) -> tuple[Any, ...]:
        """The ParallelEnvs' attribute ``name``, one per env of ``env_ids`` (default all)."""
        return self.env_vector.get_attr(name, env_ids=env_ids)

    def set_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        """Set ``name`` on the ParallelEnvs: ``values`` one per env of ``env_ids``, or one
        value for all."""
        self.env_vector.set_attr(name, values, env_ids=env_ids)

    def close_extras(self, **kwargs: Any) -> None:
        """Close the vector env underneath (its workers and block)."""
        self.env_vector.close(**kwargs)

    def __repr__(self) -> str:
        return (
            f"MultiAgentVectorEnv({self.num_parallel_envs} envs x {self.agents_per_env} agents"
            f" = {self.num_envs} rows, {self.env_vector!r})"
        )
