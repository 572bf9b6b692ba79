"""EnvSlab: k consecutive envs of a vector env, stepped in-process.

This module knows nothing about processes, pipes or shared memory: it reads actions from and
writes observations, rewards and flags into whatever arrays it is given, and returns the infos
as a list of ``(local_env, info)`` events in the exact order SyncVectorEnv would merge them. A
worker process wraps it; tests drive it directly; another backend (Ray) could wrap it too.

The autoreset logic mirrors gymnasium 1.x SyncVectorEnv so that results are byte-identical:

- NEXT_STEP: an env that ended on the previous step is reset *instead of* stepped; that step
  reports reward 0 and both flags False, and the reset's info.
- SAME_STEP: an env that ends is reset at once; the step reports the reset observation and the
  events ``{"final_obs", "final_info"}`` then the reset info. Given ``store_final_obs``, the
  final observation goes to an array instead, and the final event is left implicit when the
  final info is empty (:class:`FinalObsInBlock`).
- DISABLED: the caller resets ended envs with ``reset(mask=...)``; stepping one is refused by the
  vector env before it gets here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import Env
from gymnasium.vector.vector_env import AutoresetMode

__all__ = ["EnvSlab", "FinalObsInBlock", "SlabArrays", "SlabResult", "final_obs_store"]

InfoEvent = tuple[int, dict[str, Any]]


@dataclass
class SlabArrays:
    """The slab's slices of the batch arrays (length k along the first axis).

    ``write_obs``/``read_action`` are None when observations/actions travel by value instead
    (spaces that cannot be shared): then observations are returned in ``SlabResult.obs`` and
    actions are passed to ``step``.
    """

    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    write_obs: Callable[[Any, int], None] | None = None
    read_action: Callable[[int], Any] | None = None
    #: SAME_STEP: ``store(final_obs, i) -> bool`` keeps an ended env's final observation in
    #: the block when it fits it exactly (type, dtype, shape); see :class:`FinalObsInBlock`
    store_final_obs: Callable[[Any, int], bool] | None = None


class FinalObsInBlock:
    """Stands for an ended env's final observation that ``store_final_obs`` kept in the block
    (SAME_STEP). An ended env whose final info is also empty reports no event at all: its
    ``{"final_obs": ..., "final_info": {}}`` is implied by its termination or truncation
    flag, and the reader rebuilds it, in the same place among the events."""


@dataclass
class SlabResult:
    infos: list[InfoEvent] = field(default_factory=list)
    obs: list[tuple[int, Any]] | None = None  # by-value observations (local env, obs)

    def is_empty(self) -> bool:
        return not self.infos and not self.obs


def final_obs_store(rows: np.ndarray) -> Callable[[Any, int], bool]:
    """``store(obs, i)``: copy ``obs`` into ``rows[i]`` if it is an ndarray of exactly the
    rows' dtype and shape, and say whether it did. Anything else travels in the final event
    by value, so the reader gets the very object SyncVectorEnv would report."""
    dtype, shape = rows.dtype, rows.shape[1:]

    def store(obs: Any, i: int) -> bool:
        if type(obs) is np.ndarray and obs.dtype == dtype and obs.shape == shape:
            rows[i] = obs
            return True
        return False

    return store


class EnvSlab:
    """Owns ``envs`` (global indices ``first_index ..``) and steps them in order."""

    def __init__(
        self, envs: Sequence[Env[Any, Any]], first_index: int, autoreset_mode: AutoresetMode
    ) -> None:
        self.envs = list(envs)
        self.first_index = first_index
        self.autoreset_mode = autoreset_mode
        self.needs_reset = [False] * len(self.envs)
        #: local index of the env being driven; tells error reports which env raised
        self.current = 0
        self.arrays: SlabArrays | None = None

    @property
    def current_env(self) -> int:
        """Global index of the env that is (or was last) being driven."""
        return self.first_index + self.current

    def bind(self, arrays: SlabArrays) -> None:
        self.arrays = arrays

    def _emit_obs(self, result: SlabResult, i: int, obs: Any) -> None:
        assert self.arrays is not None
        if self.arrays.write_obs is not None:
            self.arrays.write_obs(obs, i)
        else:
            if result.obs is None:
                result.obs = []
            result.obs.append((i, obs))

    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
        mask: Sequence[bool] | None = None,
    ) -> SlabResult:
        """Reset every env (or those where ``mask`` is True) with its own seed."""
        arrays = self.arrays
        assert arrays is not None, "bind() first"
        result = SlabResult()
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                continue
            self.current = i
            obs, info = env.reset(seed=seeds[i], options=options)
            self._emit_obs(result, i, obs)
            arrays.terminations[i] = False
            arrays.truncations[i] = False
            self.needs_reset[i] = False
            if info:
                result.infos.append((i, info))
        return result

    def step(self, actions: Sequence[Any] | None = None) -> SlabResult:
        """Step every env once with its action: ``actions[i]`` when given, else read from the
        bound array."""
        arrays = self.arrays
        assert arrays is not None, "bind() first"
        read = arrays.read_action
        write = arrays.write_obs
        rewards, terms, truncs = arrays.rewards, arrays.terminations, arrays.truncations
        next_step = self.autoreset_mode is AutoresetMode.NEXT_STEP
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        store_final = arrays.store_final_obs
        needs_reset = self.needs_reset
        result = SlabResult()
        infos = result.infos
        i = 0
        try:
            for i, env in enumerate(self.envs):
                if next_step and needs_reset[i]:
                    obs, info = env.reset()
                    rewards[i] = 0.0
                    terms[i] = False
                    truncs[i] = False
                    needs_reset[i] = False
                else:
                    # Actions given by value win over the block's (the SB3 face sends them
                    # when the block would change their dtype); the per-step path gives none.
                    action = read(i) if actions is None else actions[i]  # type: ignore[misc]
                    obs, reward, terminated, truncated, info = env.step(action)
                    rewards[i] = reward
                    terms[i] = terminated
                    truncs[i] = truncated
                    if terminated or truncated:
                        if same_step:
                            if store_final is None or not store_final(obs, i):
                                infos.append((i, {"final_obs": obs, "final_info": info}))
                            elif info:
                                kept = {"final_obs": FinalObsInBlock, "final_info": info}
                                infos.append((i, kept))
                            obs, info = env.reset()
                        else:
                            needs_reset[i] = True
                if write is not None:
                    write(obs, i)
                else:
                    self._emit_obs(result, i, obs)
                if info:
                    infos.append((i, info))
        finally:
            # Which env raised (error reports name it); set once, not per env.
            self.current = i
        return result

    def call(self, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        """``env.get_wrapper_attr(name)`` for each env, called with the arguments if callable."""
        results = []
        for i, env in enumerate(self.envs):
            self.current = i
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return results

    def set_attr(self, name: str, values: Sequence[Any]) -> None:
        for i, env in enumerate(self.envs):
            self.current = i
            env.set_wrapper_attr(name, values[i])

    def close(self) -> None:
        """Close every env; the first failure is re-raised after all were tried."""
        first: BaseException | None = None
        for i, env in enumerate(self.envs):
            self.current = i
            try:
                env.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first
