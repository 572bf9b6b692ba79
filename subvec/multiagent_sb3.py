"""The Stable-Baselines3 face of agents as rows: :class:`MultiAgentVecEnv`.

An SB3 ``VecEnv`` whose envs are the rows of :class:`subvec.multiagent.MultiAgentVectorEnv`
(row ``i * A + j``: ParallelEnv ``i``'s agent ``possible_agents[j]``), run with same-step
autoreset and one info dict per row, translated to SB3's contract:

- ``reset()`` returns the rows' observations and applies what ``seed()`` stored: ParallelEnv
  ``i`` gets ``seed + i`` (no two share a seed); the reset infos land in ``reset_infos``.
- ``step_wait()`` returns fresh float32 rewards, bool dones and one dict per row. A row that
  ended (its agent left, or its env ended) has its last step's info plus
  ``terminal_observation`` and ``TimeLimit.truncated`` (its agent's own truncation, not
  termination); when its env reset in that step, its observation is the new episode's first.
  Every info has ``"active"``: False on a padded row (an agent that has left a running env:
  observation ``pad_value``, reward 0, not done, action ignored).
- ``get_attr``, ``set_attr``, ``env_method`` and ``env_is_wrapped`` take row ``indices`` and
  act on the ParallelEnv of each row, once per env (a row's result is its env's).

This module imports Stable-Baselines3 (and so torch); ``import subvec`` never imports it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from subvec._compat import AutoresetMode
from subvec.multiagent import MultiAgentVectorEnv

__all__ = ["MultiAgentVecEnv"]

_FIXED = ("autoreset_mode", "info_format")


class MultiAgentVecEnv(VecEnv):
    """Stable-Baselines3's ``VecEnv`` over the agents of PettingZoo ParallelEnvs (module doc).

    Args:
        par_env_fns: callables that each build one PettingZoo ``ParallelEnv`` (in a worker).
        **subvec_kwargs: :class:`subvec.multiagent.MultiAgentVectorEnv`'s options
            (``pad_value``, ``num_workers``, ``envs_per_worker``, ``backend``, ...), except
            ``autoreset_mode`` and ``info_format``, which SB3's contract fixes; ``copy`` must
            stay True.

    Raises:
        TypeError: ``autoreset_mode`` or ``info_format`` given, or an unknown option.
        ValueError: ``copy=False`` (SB3 keeps the previous observations while it steps).
    """

    def __init__(self, par_env_fns: Iterable[Callable[[], Any]], **subvec_kwargs: Any) -> None:
        fixed = [k for k in _FIXED if k in subvec_kwargs]
        if fixed:
            raise TypeError(
                f"MultiAgentVecEnv() sets {', '.join(fixed)} itself (SB3 resets envs in the "
                "same step and takes one info dict per env); drop it"
            )
        if not subvec_kwargs.get("copy", True):
            raise ValueError(
                "copy=False is not supported by the SB3 face: SB3 keeps the previous "
                "observations while the next step writes the shared block; drop copy=False"
            )
        #: The gymnasium vector env of rows underneath.
        self.vector_env = MultiAgentVectorEnv(
            par_env_fns,
            autoreset_mode=AutoresetMode.SAME_STEP,
            info_format="list",
            **subvec_kwargs,
        )
        venv = self.vector_env
        self._env_seed: int | None = None
        self._env_options: dict[str, Any] | None = None
        try:
            super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        except BaseException:
            venv.close(terminate=True)
            raise
        self.metadata = dict(venv.metadata)
        self._actions: Any = None

    # --- stepping ---------------------------------------------------------------------------

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seed the next ``reset()``: ParallelEnv ``i`` gets ``seed + i`` (None: a random
        seed, as SB3's ``VecEnv.seed``).

        Returns:
            The seed of each row's env.
        """
        if seed is None:
            seed = int(np.random.randint(0, np.iinfo(np.uint32).max, dtype=np.uint32))
        self._env_seed = int(seed)
        a = self.vector_env.agents_per_env
        return [self._env_seed + r // a for r in range(self.num_envs)]

    def set_options(self, options: dict[str, Any] | list[dict[str, Any]] | None = None) -> None:
        """Options for every ParallelEnv's next ``reset()`` (one dict: a ParallelEnv resets
        all of its agents, so there are no per-row options).

        Raises:
            TypeError: a list of per-row options.
        """
        if isinstance(options, list):
            raise TypeError(
                "set_options takes one dict for every ParallelEnv (an env resets all of its "
                "agents at once; rows have no options of their own), got a list"
            )
        self._env_options = dict(options) if options else None

    def reset(self) -> VecEnvObs:
        """Reset every ParallelEnv with the pending ``seed()`` and ``set_options()``; return
        the rows' observations."""
        obs, infos = self.vector_env.reset(seed=self._env_seed, options=self._env_options)
        self._env_seed = self._env_options = None
        self.reset_infos = list(infos)
        self._reset_seeds()
        self._reset_options()
        return obs  # type: ignore[no-any-return]

    def step_async(self, actions: np.ndarray) -> None:
        """Keep ``actions`` (one row per agent) for :meth:`step_wait`."""
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Step every ParallelEnv with its rows' actions.

        Raises:
            ValueError: not one action row per agent.
        """
        actions, self._actions = self._actions, None
        obs, rewards, terms, truncs, infos = self.vector_env.step(actions)
        dones = terms | truncs
        out: list[dict[str, Any]] = infos
        a = self.vector_env.agents_per_env
        # An env that ended reset in this step: each of its rows' infos is its agent's reset
        # info (for reset_infos, as DummyVecEnv keeps them), plus the last step's for a row
        # that ended.
        for i in np.flatnonzero(self.vector_env.ended_envs).tolist():
            for r in range(i * a, (i + 1) * a):
                merged = out[r]
                final = {"final_obs": merged.pop("final_obs")} if "final_obs" in merged else {}
                if "final_info" in merged:
                    final["final_info"] = merged.pop("final_info")
                merged.pop("worker_restarted", None)
                self.reset_infos[r] = {k: v for k, v in merged.items() if k != "active"}
                out[r] = {"active": merged["active"], **final}
        for r in np.flatnonzero(dones).tolist():
            merged = out[r]
            if "final_obs" not in merged:
                # on_worker_failure="restart" replaced this env's worker: the episode was
                # cut short and there is no final observation to bootstrap from.
                out[r] = {
                    "TimeLimit.truncated": True,
                    "worker_restarted": True,
                    "active": merged["active"],
                }
                continue
            final_info = dict(merged.pop("final_info"))
            final_info["active"] = merged["active"]
            final_info["terminal_observation"] = merged.pop("final_obs")
            final_info["TimeLimit.truncated"] = bool(truncs[r] and not terms[r])
            out[r] = final_info
        for info in out:
            info.setdefault("TimeLimit.truncated", False)
        return obs, rewards.astype(np.float32), dones, out

    def close(self) -> None:
        """Close the vector env (its workers and block)."""
        self.vector_env.close()

    @property
    def closed(self) -> bool:
        return bool(self.vector_env.closed)

    # --- per-env access ---------------------------------------------------------------------

    def _envs_of(self, indices: VecEnvIndices) -> tuple[list[int], list[int]]:
        """The env of each row in ``indices``, and those envs once each in first order."""
        n = self.num_envs
        if indices is None:
            rows = list(range(n))
        else:
            raw = [indices] if isinstance(indices, int | np.integer) else list(indices)
            rows = []
            for r in raw:
                if not isinstance(r, int | np.integer) or isinstance(r, bool):
                    raise TypeError(f"row indices must be ints, got {r!r}")
                if not -n <= r < n:
                    raise IndexError(f"row index {r} out of range for {n} rows")
                rows.append(int(r) % n)
        a = self.vector_env.agents_per_env
        envs = [r // a for r in rows]
        return envs, list(dict.fromkeys(envs))

    def _per_row(self, envs: list[int], unique: list[int], results: Sequence[Any]) -> list[Any]:
        by_env = dict(zip(unique, results))
        return [by_env[i] for i in envs]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The ParallelEnv attribute of each row in ``indices`` (its env's)."""
        envs, unique = self._envs_of(indices)
        if not unique:
            return []
        return self._per_row(envs, unique, self.vector_env.get_attr(attr_name, env_ids=unique))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name = value`` on the ParallelEnv of each row in ``indices`` (once per
        env)."""
        _, unique = self._envs_of(indices)
        if unique:
            self.vector_env.set_attr(attr_name, [value] * len(unique), env_ids=unique)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name`` on the ParallelEnv of each row in ``indices``, once per env;
        each row gets its env's result."""
        envs, unique = self._envs_of(indices)
        if not unique:
            return []
        results = self.vector_env.call(method_name, *method_args, env_ids=unique, **method_kwargs)
        return self._per_row(envs, unique, results)

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: VecEnvIndices = None
    ) -> list[bool]:
        """False for every row: a ParallelEnv is not a gymnasium env, so no gymnasium wrapper
        (such as SB3's ``Monitor``) can be around it; use ``VecMonitor``."""
        envs, _ = self._envs_of(indices)
        return [False] * len(envs)

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each row's env ``render()`` frame (needs ``render_mode="rgb_array"``)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is "
                "`rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        frames = self.vector_env.render() or ()
        a = self.vector_env.agents_per_env
        return [frames[r // a] for r in range(self.num_envs)]

    def __repr__(self) -> str:
        return f"subvec.multiagent_sb3.MultiAgentVecEnv({self.vector_env!r})"
