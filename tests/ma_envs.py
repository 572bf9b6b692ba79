"""PettingZoo ParallelEnvs for the multi-agent tests, and the serial oracle they run against.

``Comings``: 8 agents (by default) that leave at random (terminated), may come back, some
absent at reset, per-agent infos on some steps, truncation at ``max_steps``; everything drawn
from the reset seed, so two envs with one seed are identical and envs with different seeds
differ. ``SerialRows``: the agents-as-rows contract written as a plain loop over the
ParallelEnvs' dicts, independently of subvec's adapter (the oracle).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from pettingzoo import ParallelEnv


class Comings(ParallelEnv):  # type: ignore[misc]
    """Agents that leave and come back (module doc). The observation says who and when, and
    carries the agent's last action, so a row given another row's action shows it."""

    metadata = {"name": "comings_v0", "render_modes": []}
    render_mode = None

    def __init__(
        self,
        num_agents: int = 8,
        max_steps: int = 12,
        leave_p: float = 0.15,
        return_p: float = 0.3,
        late: int = 1,
        fail_at: int | None = None,
        gate: str | None = None,
    ) -> None:
        self.possible_agents = [f"a{j}" for j in range(num_agents)]
        self.max_steps = max_steps
        self.leave_p, self.return_p, self.late = leave_p, return_p, late
        self.fail_at = fail_at
        #: a path: each step waits until that file exists (a test opens the gate)
        self.gate = gate
        self.agents: list[str] = []
        self.gone: list[str] = []
        self.rng = np.random.default_rng()
        self.t = 0
        self.resets = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-np.inf, np.inf, (4,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def _obs(self, agent: str, action: Any) -> np.ndarray:
        j = self.possible_agents.index(agent)
        noise = self.rng.standard_normal()
        return np.array([self.t, j, action, noise], dtype=np.float32)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.resets += 1
        self.last_options = options
        self.t = 0
        # the last ``late`` agents are absent at reset and join after a few steps
        self.agents = self.possible_agents[: len(self.possible_agents) - self.late]
        self.gone = self.possible_agents[len(self.agents) :]
        obs = {a: self._obs(a, -1) for a in self.agents}
        infos = {
            a: {"start": float(self.rng.random())} if j % 3 == 0 else {}
            for j, a in enumerate(self.agents)
        }
        return obs, infos

    def step(self, actions: dict[str, Any]):
        if set(actions) != set(self.agents):
            raise KeyError(f"actions for {sorted(actions)}, agents are {sorted(self.agents)}")
        if self.gate is not None:
            waited = 0
            while not os.path.exists(self.gate):
                waited += 1
                assert waited < 30_000, f"gate {self.gate} never opened"
                time.sleep(0.001)
        self.t += 1
        if self.fail_at is not None and self.t == self.fail_at:
            raise RuntimeError(f"boom at t={self.t}")
        obs, rew, term, trunc, infos = {}, {}, {}, {}, {}
        for a in self.agents:
            act = int(actions[a])
            obs[a] = self._obs(a, act)
            rew[a] = float(act) * 0.5 + float(self.rng.standard_normal())
            term[a] = bool(self.rng.random() < self.leave_p)
            trunc[a] = self.t >= self.max_steps
            infos[a] = {"score": float(rew[a]), "t": self.t} if self.t % 3 == 0 else {}
        staying = [a for a in self.agents if not (term[a] or trunc[a])]
        back = []
        if self.t < self.max_steps:
            for a in list(self.gone):
                if self.rng.random() < self.return_p or (
                    self.t == 2 and a in self.possible_agents[-self.late :]
                ):
                    back.append(a)
        for a in back:
            self.gone.remove(a)
            obs[a] = self._obs(a, -2)
            rew[a], term[a], trunc[a] = 0.0, False, False
        self.gone += [a for a in self.agents if term[a] or trunc[a]]
        self.agents = [a for a in self.possible_agents if a in staying or a in back]
        return obs, rew, term, trunc, infos

    def ping(self, x: int) -> tuple[int, int]:
        return x, self.resets


class SerialRows:
    """The oracle: ParallelEnvs stepped one after the other, their dicts laid out as rows by
    hand (row ``i * A + j``), padding ``pad`` for absent agents, one env reset when its agents
    are all gone, in ``mode``. With ``black_death`` (SuperSuit's) no row ends before its env:
    on the step its last agent leaves, every row of it has the env's flags (truncated if any
    agent leaving then was), and no other step flags a row.

    ``step`` returns ``(obs, rewards, terms, truncs, active, finals)``, ``finals`` being
    ``{row: final observation}`` (SAME_STEP only).
    """

    def __init__(
        self, par_envs: list[Any], mode: AutoresetMode, pad: float = 0.0, black_death: bool = False
    ) -> None:
        self.envs = par_envs
        self.black_death = black_death
        self.mode = mode
        self.pad = pad
        self.agents = list(par_envs[0].possible_agents)
        self.A = len(self.agents)
        space = par_envs[0].observation_space(self.agents[0])
        self.shape, self.dtype = space.shape, space.dtype
        self.n = len(par_envs)
        self.obs = np.zeros((self.n * self.A, *self.shape), self.dtype)
        self.active = np.zeros(self.n * self.A, bool)
        self.needs_reset = [False] * self.n

    def _put(self, i: int, obs: dict[str, Any]) -> None:
        for j, a in enumerate(self.agents):
            r = i * self.A + j
            if a in obs:
                self.obs[r] = obs[a]
                self.active[r] = True
            else:
                self.obs[r] = self.pad
                self.active[r] = False

    def reset(self, seed: int | None = None, mask: np.ndarray | None = None):
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                continue
            obs, _ = env.reset(seed=None if seed is None else seed + i)
            self._put(i, obs)
            self.needs_reset[i] = False
        return self.obs.copy(), self.active.copy()

    def step(self, actions: np.ndarray):
        rew = np.zeros(self.n * self.A)
        term = np.zeros(self.n * self.A, bool)
        trunc = np.zeros(self.n * self.A, bool)
        finals: dict[int, np.ndarray] = {}
        for i, env in enumerate(self.envs):
            if self.needs_reset[i]:  # NEXT_STEP
                obs, _ = env.reset()
                self._put(i, obs)
                self.needs_reset[i] = False
                continue
            live = list(env.agents)
            if not live:  # DISABLED: an ended env the caller did not reset
                continue
            acts = {a: actions[i * self.A + self.agents.index(a)] for a in live}
            obs, r, te, tr, _ = env.step(acts)
            self._put(i, obs)
            for j, a in enumerate(self.agents):
                if a in obs:
                    k = i * self.A + j
                    rew[k], term[k], trunc[k] = r.get(a, 0.0), te.get(a, False), tr.get(a, False)
            if self.black_death:
                mine = slice(i * self.A, (i + 1) * self.A)
                cut = not env.agents and bool(trunc[mine].any())
                term[mine] = not env.agents and not cut
                trunc[mine] = cut
            if self.mode is AutoresetMode.SAME_STEP:
                for k in np.flatnonzero(
                    term[i * self.A : (i + 1) * self.A] | trunc[i * self.A : (i + 1) * self.A]
                ):
                    finals[i * self.A + int(k)] = self.obs[i * self.A + int(k)].copy()
            if not env.agents:
                if self.mode is AutoresetMode.NEXT_STEP:
                    self.needs_reset[i] = True
                elif self.mode is AutoresetMode.SAME_STEP:
                    obs, _ = env.reset()
                    self._put(i, obs)
        return self.obs.copy(), rew, term, trunc, self.active.copy(), finals


class Nested(ParallelEnv):  # type: ignore[misc]
    """Dict observations and Tuple actions per agent; agent ``b`` leaves at step 2, the env
    ends at step 4. Each observation echoes the agent's last action."""

    metadata = {"name": "nested_v0", "render_modes": []}
    render_mode = None
    possible_agents = ["a", "b", "c"]

    def observation_space(self, agent: str) -> spaces.Dict:
        return spaces.Dict(
            {"pos": spaces.Box(-10, 10, (2,), np.float32), "last": spaces.Discrete(4)}
        )

    def action_space(self, agent: str) -> spaces.Tuple:
        return spaces.Tuple((spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float32)))

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0
        self.base = 0 if seed is None else seed
        self.agents = list(self.possible_agents)
        return {a: self._obs(a, 0, np.zeros(2, np.float32)) for a in self.agents}, {}

    def _obs(self, agent: str, last: int, move: np.ndarray) -> dict[str, Any]:
        j = self.possible_agents.index(agent)
        pos = np.array([self.base + j, self.t], np.float32) + move
        return {"pos": pos, "last": last}

    def step(self, actions: dict[str, Any]):
        self.t += 1
        obs = {a: self._obs(a, int(act[0]), act[1]) for a, act in actions.items()}
        rew = {a: float(act[0]) for a, act in actions.items()}
        term = {a: a == "b" and self.t == 2 for a in actions}
        trunc = {a: self.t == 4 for a in actions}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in actions}
