"""SuperSuit's ``concat_vec_envs_v1`` signature over subvec's agents as rows.

``ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 8, num_cpus=2,
base_class="stable_baselines3")`` becomes ``concat_vec_envs(env, 8, num_cpus=2,
base_class="stable_baselines3")``: a :class:`subvec.multiagent.MultiAgentVectorEnv`
(gymnasium) or a :class:`subvec.multiagent_sb3.MultiAgentVecEnv` (Stable-Baselines3; imported
only then). Imports neither PettingZoo nor SuperSuit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cloudpickle

from subvec.multiagent import MultiAgentVectorEnv

__all__ = ["concat_vec_envs"]


class _CopiedEnv:
    """A factory that builds a fresh copy of one ParallelEnv (as SuperSuit copies an env
    instance per vector entry): the instance is pickled once, here, and unpickled per env."""

    def __init__(self, par_env: Any) -> None:
        self.data = cloudpickle.dumps(par_env)

    def __call__(self) -> Any:
        return cloudpickle.loads(self.data)


def concat_vec_envs(
    par_env_or_fns: Any,
    num_vec_envs: int,
    num_cpus: int = 0,
    base_class: str = "gymnasium",
    **subvec_kwargs: Any,
) -> Any:
    """SuperSuit's ``concat_vec_envs_v1`` signature over :class:`MultiAgentVectorEnv`.

    ``ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 8, num_cpus=2,
    base_class="stable_baselines3")`` becomes ``concat_vec_envs(env, 8, num_cpus=2,
    base_class="stable_baselines3")``; SuperSuit's own ``pettingzoo_env_to_vec_env_v1(env)``
    result is accepted in place of ``env``, and SuperSuit's per-env wrappers in front of the
    env keep working.

    Args:
        par_env_or_fns: a ParallelEnv instance (copied per env, as SuperSuit does), a
            factory building one (called ``num_vec_envs`` times), a list of
            ``num_vec_envs`` factories, or SuperSuit's ``MarkovVectorEnv`` over a ParallelEnv.
        num_vec_envs: ParallelEnvs (rows: ``num_vec_envs * len(possible_agents)``).
        num_cpus: worker processes (0: subvec's default layout, one worker per usable CPU).
        base_class: ``"gymnasium"`` (a :class:`MultiAgentVectorEnv`) or
            ``"stable_baselines3"`` (a :class:`subvec.multiagent_sb3.MultiAgentVecEnv`).
        **subvec_kwargs: :class:`MultiAgentVectorEnv`'s options.

    Returns:
        The vector env.

    Raises:
        ValueError: a bad ``base_class``, ``num_vec_envs`` or ``num_cpus``, or a factory list
            of another length.
    """
    if base_class not in ("gymnasium", "stable_baselines3"):
        raise ValueError(
            f"base_class must be 'gymnasium' or 'stable_baselines3', got {base_class!r}"
        )
    if not isinstance(num_vec_envs, int) or num_vec_envs < 1:
        raise ValueError(f"num_vec_envs must be a positive int, got {num_vec_envs!r}")
    if not isinstance(num_cpus, int) or num_cpus < 0:
        raise ValueError(f"num_cpus must be an int >= 0, got {num_cpus!r}")
    fns = _factories(par_env_or_fns, num_vec_envs)
    if num_cpus:
        subvec_kwargs.setdefault("num_workers", min(num_cpus, num_vec_envs))
    if base_class == "stable_baselines3":
        from subvec.multiagent_sb3 import MultiAgentVecEnv

        return MultiAgentVecEnv(fns, **subvec_kwargs)
    return MultiAgentVectorEnv(fns, **subvec_kwargs)


def _factories(par_env_or_fns: Any, n: int) -> list[Callable[[], Any]]:
    """``n`` ParallelEnv factories from what :func:`concat_vec_envs` accepts."""
    if isinstance(par_env_or_fns, list | tuple):
        if len(par_env_or_fns) != n:
            raise ValueError(
                f"got {len(par_env_or_fns)} env factories for num_vec_envs={n}: pass one per "
                "env, or a single env or factory"
            )
        return list(par_env_or_fns)
    par_env = getattr(par_env_or_fns, "par_env", None)
    if par_env is not None and not hasattr(par_env_or_fns, "possible_agents"):
        par_env_or_fns = par_env  # SuperSuit's MarkovVectorEnv: vectorise what it wraps
    if hasattr(par_env_or_fns, "possible_agents"):
        return [_CopiedEnv(par_env_or_fns)] * n
    if callable(par_env_or_fns):
        return [par_env_or_fns] * n
    raise TypeError(
        "concat_vec_envs takes a PettingZoo ParallelEnv, a factory of one, or a list of "
        f"factories; got {type(par_env_or_fns)!r}"
    )
