"""A PettingZoo ``ParallelEnv`` as one fixed-shape gymnasium env: its agents as stacked rows.

This is the worker's side of the multi-agent vector env (``subvec.multiagent``). A worker
builds ``AgentRows(factory)`` like any other env, so the core steps it with everything it
has (the block, autoreset modes, seeds, errors, restarts, Ray) and nothing on its path
changes. Its observation is a Dict whose leaves all live in the shared block::

    "obs"         (A, *agent_obs)   each possible agent's observation, in possible_agents order
    "reward"      (A,) float64      each agent's reward of the step
    "terminated"  (A,) bool         each agent's own termination
    "truncated"   (A,) bool         each agent's own truncation
    "active"      (A,) bool         the row carries this agent's real data this step

An agent present at the step's start reports its real observation, reward and flags, even on
the step it leaves; from the next step until the env resets its row is padding: the
observation ``pad_value``, reward 0, flags False, ``active`` False, and its action is not
passed to the env. An agent that comes back is active again. The env as a whole is
terminated (or truncated, if any agent leaving on that step was) when no agent is left,
which is when the core's autoreset resets it.

With ``black_death`` (SuperSuit's ``black_death_v3``, as its users rely on it) no row ends
before its env: an agent's own termination or truncation is not reported, and on the step the
env's last agent leaves every row of it carries the env's flags (terminated, or truncated if
any agent leaving on that step was), padded rows included.

PettingZoo is duck-typed here (``possible_agents``, ``observation_space(agent)``,
``action_space(agent)``, ``reset``, ``step``, ``agents``): nothing imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, iterate

from subvec._spaces import filled, walk

__all__ = ["AgentRows", "AgentRowsFactory", "agent_spaces"]

#: A per-agent space the rows can hold: arrays of one fixed shape, in the shared block.
_ROW_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def _check_row_space(space: spaces.Space[Any], what: str) -> None:
    for _, leaf in walk(space):
        if not isinstance(leaf, _ROW_SPACES):
            raise TypeError(
                f"{what} is {space!r}; agents as rows need fixed-shape spaces (Box, Discrete, "
                "MultiDiscrete, MultiBinary, or Dict/Tuple nests of them)"
            )


def agent_spaces(par_env: Any) -> tuple[list[str], spaces.Space[Any], spaces.Space[Any]]:
    """The possible agents and the one observation and action space they all share.

    Raises:
        TypeError: the env has no ``possible_agents``, or an agent's space is not fixed-shape.
        ValueError: no possible agents, or an agent's space differs from the first agent's
            (the message names the agent and both spaces).
    """
    try:
        agents = list(par_env.possible_agents)
    except AttributeError:
        raise TypeError(
            f"expected a PettingZoo ParallelEnv (with possible_agents), got {type(par_env)!r}"
        ) from None
    if not agents:
        raise ValueError("the ParallelEnv has no possible_agents")
    first = agents[0]
    obs_space, act_space = par_env.observation_space(first), par_env.action_space(first)
    for agent in agents[1:]:
        for kind, mine, theirs in (
            ("observation", par_env.observation_space(agent), obs_space),
            ("action", par_env.action_space(agent), act_space),
        ):
            if mine != theirs:
                raise ValueError(
                    f"agent {agent!r} has the {kind} space {mine!r}, agent {first!r} has "
                    f"{theirs!r}: agents as rows need every agent to share one {kind} space "
                    "(pad them to one, e.g. SuperSuit's pad_observations_v0 / "
                    "pad_action_space_v0, before vectorising)"
                )
    _check_row_space(obs_space, f"agent {first!r}'s observation space")
    _check_row_space(act_space, f"agent {first!r}'s action space")
    return agents, obs_space, act_space


def _write_row(dst: Any, j: int, value: Any) -> None:
    """``dst[j] = value`` over a nest of arrays (Dict/Tuple of stacked leaves)."""
    if isinstance(dst, dict):
        for k, sub in dst.items():
            _write_row(sub, j, value[k])
    elif isinstance(dst, tuple):
        for sub, v in zip(dst, value):
            _write_row(sub, j, v)
    else:
        dst[j] = value


class AgentRows(gym.Env[dict[str, Any], Any]):
    """A ParallelEnv whose agents are the rows of one fixed-shape observation (module doc).

    Attributes and methods the env does not have itself are the ParallelEnv's:
    ``get_wrapper_attr`` and ``set_wrapper_attr`` (what the core's ``get_attr``, ``call`` and
    ``set_attr`` use) reach it.

    Args:
        par_env: the ParallelEnv, built in the worker.
        pad_value: what a padded row's observation holds (every leaf).
        black_death: rows end with their env only (module doc).
    """

    def __init__(self, par_env: Any, pad_value: float = 0.0, black_death: bool = False) -> None:
        self.par_env = par_env
        self.black_death = black_death
        self.possible_agents, self.agent_observation_space, self.agent_action_space = agent_spaces(
            par_env
        )
        self.index = {agent: j for j, agent in enumerate(self.possible_agents)}
        n = len(self.possible_agents)
        flags = spaces.Box(0, 1, (n,), dtype=np.bool_)  # type: ignore[arg-type]
        self.observation_space = spaces.Dict(
            {
                "obs": batch_space(self.agent_observation_space, n),
                "reward": spaces.Box(-np.inf, np.inf, (n,), dtype=np.float64),
                "terminated": flags,
                "truncated": flags,
                "active": flags,
            }
        )
        self.action_space = batch_space(self.agent_action_space, n)
        self.metadata = dict(getattr(par_env, "metadata", {}) or {})
        self.render_mode = getattr(par_env, "render_mode", None)
        self._pad = filled(self.agent_observation_space, (), pad_value)
        nested = (spaces.Dict, spaces.Tuple)
        self._plain_obs = not isinstance(self.agent_observation_space, nested)
        self._plain_act = not isinstance(self.agent_action_space, nested)
        self._obs_shape = (n, *(self.agent_observation_space.shape or ()))
        self._obs_dtype = self.agent_observation_space.dtype

    def _rows(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """A fresh Dict observation: every agent of ``obs`` in its row, the others padded."""
        n = len(self.possible_agents)
        index = self.index
        active = np.zeros(n, dtype=np.bool_)
        if self._plain_obs:  # one array per agent: rows written directly (the usual case)
            stacked: Any = np.empty(self._obs_shape, dtype=self._obs_dtype)
            stacked[:] = self._pad
            row_shape = self._obs_shape[1:]
            for agent, value in obs.items():
                j = index.get(agent)
                if j is None:
                    raise self._unknown(agent)
                if np.shape(value) != row_shape:  # numpy would broadcast it silently
                    raise ValueError(
                        f"agent {agent!r}'s observation has shape {np.shape(value)}, its "
                        f"observation space {self.agent_observation_space} has {row_shape}"
                    )
                stacked[j] = value
                active[j] = True
        else:
            stacked = filled(self.agent_observation_space, (n,), 0)
            for agent, value in obs.items():
                j = index.get(agent)
                if j is None:
                    raise self._unknown(agent)
                _write_row(stacked, j, value)
                active[j] = True
            for j in np.flatnonzero(~active).tolist():
                _write_row(stacked, j, self._pad)
        return {
            "obs": stacked,
            "reward": np.zeros(n, dtype=np.float64),
            "terminated": np.zeros(n, dtype=np.bool_),
            "truncated": np.zeros(n, dtype=np.bool_),
            "active": active,
        }

    def _unknown(self, agent: str) -> ValueError:
        return ValueError(
            f"the ParallelEnv returned an observation for agent {agent!r}, which is not "
            f"among its possible_agents {self.possible_agents}"
        )

    @staticmethod
    def _infos(infos: Mapping[str, Any]) -> dict[str, Any]:
        """The agents' non-empty infos (so that a step without any says nothing)."""
        return {agent: dict(info) for agent, info in infos.items() if info}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset the ParallelEnv; the rows of agents not present at the start are padded."""
        obs, infos = self.par_env.reset(seed=seed, options=options)
        return self._rows(obs), self._infos(infos)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Step the agents present with their rows of ``action``; the env is done once none
        is left (module doc)."""
        live = self.par_env.agents
        if not live:
            raise RuntimeError("step() on a ParallelEnv whose agents have all left: reset it first")
        index = self.index
        # a plain action array's rows are its agents' actions; a nest's, gymnasium's iterate
        per_agent = action if self._plain_act else list(iterate(self.action_space, action))
        actions = {agent: per_agent[index[agent]] for agent in live}
        obs, rewards, terms, truncs, infos = self.par_env.step(actions)
        rows = self._rows(obs)
        reward, terminated, truncated = rows["reward"], rows["terminated"], rows["truncated"]
        for agent in obs:
            j = index[agent]
            reward[j] = rewards.get(agent, 0.0)
            terminated[j] = terms.get(agent, False)
            truncated[j] = truncs.get(agent, False)
        done = not self.par_env.agents
        cut = done and bool(truncated.any())
        if self.black_death:  # every row ends with the env, none before
            terminated[:] = done and not cut
            truncated[:] = cut
        return rows, float(reward.sum()), done and not cut, cut, self._infos(infos)

    def render(self) -> Any:
        """The ParallelEnv's ``render()``."""
        return self.par_env.render()

    def close(self) -> None:
        """Close the ParallelEnv."""
        self.par_env.close()

    def get_wrapper_attr(self, name: str) -> Any:
        """This adapter's attribute ``name`` if it has one, else the ParallelEnv's."""
        if name in self.__dict__ or hasattr(type(self), name):
            return getattr(self, name)
        return getattr(self.par_env, name)

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        """Set ``name`` on the ParallelEnv (the adapter's own state is not settable).

        Returns:
            True (it was set), as gymnasium's ``Env.set_wrapper_attr``.
        """
        setattr(self.par_env, name, value)
        return True


class AgentRowsFactory:
    """A picklable factory: ``AgentRows(make_par_env(), pad_value, black_death)`` (built in
    the worker)."""

    def __init__(
        self, make_par_env: Callable[[], Any], pad_value: float = 0.0, black_death: bool = False
    ) -> None:
        self.make_par_env = make_par_env
        self.pad_value = pad_value
        self.black_death = black_death

    def __call__(self) -> AgentRows:
        return AgentRows(self.make_par_env(), self.pad_value, self.black_death)
