"""The Stable-Baselines3 face: :class:`SubprocVecEnv`, a drop-in for SB3's own.

``from subvec.sb3 import SubprocVecEnv`` and everything else stays as it was::

    vec_env = make_vec_env("CartPole-v1", n_envs=8, vec_env_cls=SubprocVecEnv)
    model = PPO("MlpPolicy", vec_env).learn(100_000)

It is a thin layer over :class:`subvec.SubprocVectorEnv` run with same-step autoreset and one
info dict per env (``info_format="list"``), translated to SB3's contract:

- ``reset()`` returns the observations only and applies what ``seed()`` and ``set_options()``
  stored; the reset infos land in ``reset_infos``.
- ``step_async(actions)`` hands env ``i`` what SB3's VecEnvs hand it, ``actions[i]``: an array
  of the action space's dtype goes through the shared block; per-env dicts and tuples are
  stacked into the batched form the core takes; anything the block would change (another
  dtype, a Python number) travels by value, so the env gets the very object DummyVecEnv hands it.
- ``step_wait()`` returns fresh float32 rewards (PPO adds to them in place), bool dones and a
  list of fresh dicts; an env that ended reports its final step's info plus
  ``terminal_observation`` and ``TimeLimit.truncated`` and is already reset.
- ``get_attr``, ``set_attr``, ``env_method`` and ``env_is_wrapped`` take ``indices`` and touch
  only those envs, through the core's env-addressed calls (only the workers holding them get
  a command; see ``subvec._sb3_ops``); ``set_attr`` sets the outermost wrapper, as SB3.

This module imports Stable-Baselines3 (and so torch); ``import subvec`` never imports it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env as _sb3_make_vec_env
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from subvec._commands import PerEnv
from subvec._compat import AutoresetMode
from subvec._front.front import VectorFront
from subvec._sb3_ops import Op, SB3EnvFactory, class_path, run_op
from subvec._spaces import (
    LeafSpec,
    build_views,
    is_shareable,
    leaf_specs,
    leaves_of,
    path_text,
)
from subvec.factory import VECTOR_KWARGS, backend_kwargs, check_kwargs
from subvec.vector import SubprocVectorEnv

__all__ = ["SUBVEC_KWARGS", "SubprocVecEnv", "make_vec_env"]

# Options the adapter fixes because SB3's contract depends on them.
_FIXED = {
    "autoreset_mode": "SB3 resets envs in the same step; the adapter always uses SAME_STEP",
    "info_format": "SB3 takes a list of dicts; the adapter always asks the core for 'list'",
    "context": "pass start_method=... (SB3's name for it)",
}
#: The :class:`subvec.SubprocVectorEnv` options :class:`SubprocVecEnv` passes on.
SUBVEC_KWARGS: tuple[str, ...] = tuple(k for k in VECTOR_KWARGS if k not in _FIXED)


def _allowed(backend: str) -> tuple[str, ...]:
    """The options the adapter passes on to ``backend``'s vector env (``"ray"`` imports ray)."""
    if backend == "process":
        return SUBVEC_KWARGS
    return tuple(k for k in backend_kwargs(backend) if k not in _FIXED)


class SubprocVecEnv(VecEnv):
    """Stable-Baselines3's ``VecEnv`` on subvec's workers and shared memory.

    Args:
        env_fns: callables that each build one env (as for SB3's ``SubprocVecEnv``).
        start_method: multiprocessing start method; default forkserver on Linux (thread-safe
            with torch already running in the parent), spawn elsewhere. With
            ``backend="ray"``, that of the worker processes inside each actor.
        **subvec_kwargs: options of :class:`subvec.SubprocVectorEnv`: ``num_workers``,
            ``envs_per_worker``, ``shared_memory``, ``daemon``, ``numa``, ``pin``, ``gpus``,
            ``worker_env``, ``max_concurrent_starts``, ``build_retries``,
            ``observation_mode``, ``timeout``, ``start_timeout``; ``copy`` must stay True (SB3
            keeps the previous observations while it steps). With ``backend="ray"``, those
            of :class:`subvec.ray.RayVectorEnv` (``num_actors``, ``address``, ...).
        backend: ``"process"`` (a :class:`subvec.SubprocVectorEnv` underneath) or ``"ray"``
            (a :class:`subvec.ray.RayVectorEnv`: Ray actors, each holding worker processes).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        start_method: str | None = None,
        *,
        backend: str = "process",
        **subvec_kwargs: Any,
    ) -> None:
        allowed = _allowed(backend)
        check_kwargs(subvec_kwargs, allowed, "subvec.sb3.SubprocVecEnv()", hints=_FIXED)
        if not subvec_kwargs.get("copy", True):
            raise ValueError(
                "copy=False is not supported by the SB3 adapter: SB3 keeps the previous "
                "observations (self._last_obs) while the next step writes the shared block; "
                "drop copy=False"
            )
        subvec_kwargs["copy"] = True
        factories = [SB3EnvFactory(fn) for fn in env_fns]
        #: The vector env underneath (gymnasium API, placement, ...): a
        #: :class:`subvec.SubprocVectorEnv`, or a ``RayVectorEnv`` with backend="ray".
        self.vector_env: VectorFront
        if backend == "ray":
            from subvec.ray import RayVectorEnv

            self.vector_env = RayVectorEnv(
                factories,
                autoreset_mode=AutoresetMode.SAME_STEP,
                info_format="list",
                context=start_method,  # the start method of the workers inside each actor
                **subvec_kwargs,
            )
        else:
            self.vector_env = SubprocVectorEnv(
                factories,
                autoreset_mode=AutoresetMode.SAME_STEP,
                info_format="list",
                context=start_method,
                **subvec_kwargs,
            )
        try:
            # VecEnv.__init__ calls get_attr("render_mode"): the workers must already run.
            super().__init__(
                self.vector_env.num_envs,
                self.vector_env.single_observation_space,
                self.vector_env.single_action_space,
            )
        except BaseException:
            self.vector_env.close(terminate=True)
            raise
        # As DummyVecEnv: the first env's metadata (render_fps reaches VecVideoRecorder).
        self.metadata = dict(self.vector_env.metadata)
        space = self.vector_env.single_action_space
        #: the block's action leaves (none when actions cannot live in shared memory)
        self._act_leaves: list[LeafSpec] = leaf_specs(space) if is_shareable(space) else []
        #: the dtype an array of actions needs to go into the block as it is (one plain leaf)
        self._act_dtype: np.dtype[Any] | None = None
        if len(self._act_leaves) == 1 and not self._act_leaves[0].path:
            self._act_dtype = self._act_leaves[0].dtype

    # --- stepping ---------------------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        """Reset every env with the pending ``seed()``/``set_options()``; return the obs."""
        venv = self.vector_env
        seeds = None if all(s is None for s in self._seeds) else list(self._seeds)
        # SB3 passes an env its options only when they are non-empty.
        options = [opts or None for opts in self._options]
        obs: Any
        infos: Any  # info_format="list": one dict per env
        obs, infos = venv.reset(
            seed=seeds, options=None if all(o is None for o in options) else options
        )
        self.reset_infos = list(infos)
        self._reset_seeds()
        self._reset_options()
        return obs  # type: ignore[no-any-return]

    def step_async(self, actions: np.ndarray) -> None:
        """Start stepping: env ``i`` gets ``actions[i]``, as from SB3's own VecEnvs.

        An array of the action space's dtype (what SB3's algorithms pass for Box, Discrete and
        MultiDiscrete spaces) goes through the shared block. A list of per-env actions whose
        leaves are arrays (or numpy scalars) of the space's dtypes, e.g. per-env dicts for a
        Dict space or per-env tuples for a Tuple space, is stacked into the batched form the
        core takes. Anything else the block would change, such as PPO's float32 actions for a
        MultiBinary space, float or int actions for a uint8 Box, or Python numbers, travels by
        value: each env gets exactly what DummyVecEnv would hand it.

        Args:
            actions: one action per env, indexed by env (an array, or a list or tuple).

        Raises:
            TypeError, ValueError: ``actions`` is not one action per env of the action space
                (the message names the env); nothing is sent.
        """
        dtype = self._act_dtype  # compared only when set: numpy takes None for float64
        if dtype is not None and type(actions) is np.ndarray and actions.dtype == dtype:
            self.vector_env.step_async(actions)  # the usual step: into the block as it is
            return
        space = self.vector_env.single_action_space
        if isinstance(actions, Mapping) and isinstance(space, spaces.Dict):
            # The core's batched form (a dict of batches): it has no per-env reading to follow.
            self.vector_env.step_async(dict(actions))
            return
        per_env = self._per_env(actions, space)
        batch = self._stacked(per_env, space)
        if batch is None:
            self.vector_env._step_async_values(per_env)
        else:
            self.vector_env.step_async(batch)

    def _per_env(self, actions: Any, space: spaces.Space[Any]) -> list[Any]:
        """``[actions[i] for each env]``, each checked against the single action space."""
        n = self.num_envs
        if isinstance(actions, (str, bytes, Mapping)) or not hasattr(actions, "__len__"):
            raise TypeError(
                f"actions: expected one action per env ({n} of {space}), "
                f"got {type(actions).__name__}"
            )
        if isinstance(actions, np.ndarray) and actions.ndim == 0:
            raise ValueError(f"actions: expected {n} actions, one per env, got a 0-d array")
        if len(actions) != n:
            raise ValueError(f"actions: expected {n} actions, one per env, got {len(actions)}")
        per_env = [actions[i] for i in range(n)]
        for i, action in enumerate(per_env):
            _check_action(space, action, f"actions[{i}]")
        return per_env

    def _stacked(self, per_env: list[Any], space: spaces.Space[Any]) -> Any:
        """The batched form of ``per_env`` when each env would read back from the block the same
        types, dtypes and bytes: dicts with the space's keys in its order, tuples, and leaves
        that are arrays (numpy scalars for scalar leaves) of the block's dtypes. None otherwise
        (the actions then travel by value)."""
        leaves = self._act_leaves
        if not leaves:
            return None
        columns: list[list[Any]] = [[] for _ in leaves]
        for action in per_env:
            if not _plain_nest(space, action):
                return None
            for column, spec, (_, _, value) in zip(columns, leaves, leaves_of(space, action)):
                if spec.shape:
                    exact = type(value) is np.ndarray and value.dtype == spec.dtype
                else:
                    exact = isinstance(value, np.generic) and value.dtype == spec.dtype
                if not exact:
                    return None
                column.append(value)
        return build_views(space, iter([np.stack(column) for column in columns]))

    def step_wait(self) -> VecEnvStepReturn:
        obs, rewards, terminations, truncations, infos = self.vector_env.step_wait()
        dones = terminations | truncations
        out: list[dict[str, Any]] = infos  # type: ignore[assignment]  # info_format="list"
        if not np.count_nonzero(dones):  # the usual step: one pass, no per-env flag
            for info in out:
                info["TimeLimit.truncated"] = False
            return obs, rewards.astype(np.float32), dones, out
        for i, done in enumerate(dones.tolist()):
            if not done:
                out[i]["TimeLimit.truncated"] = False
                continue
            # The core's same-step dict: the reset's info plus the episode's final obs and
            # info. SB3 wants the final info (with terminal_observation) in infos and the
            # reset's info in reset_infos.
            merged = out[i]
            if "final_obs" not in merged:
                # on_worker_failure="restart" replaced this env's worker: the episode was cut
                # short and there is no final observation to bootstrap from.
                merged.pop("worker_restarted", None)
                self.reset_infos[i] = merged
                out[i] = {"TimeLimit.truncated": True, "worker_restarted": True}
                continue
            final_obs = merged.pop("final_obs")
            final_info = merged.pop("final_info")
            self.reset_infos[i] = merged
            final_info["TimeLimit.truncated"] = bool(truncations[i] and not terminations[i])
            final_info["terminal_observation"] = final_obs
            out[i] = final_info
        return obs, rewards.astype(np.float32), dones, out

    def close(self) -> None:
        self.vector_env.close()

    @property
    def closed(self) -> bool:
        return bool(self.vector_env.closed)

    # --- per-env access ---------------------------------------------------------------------

    def _indices(self, indices: VecEnvIndices) -> list[int]:
        n = self.num_envs
        if indices is None:
            return list(range(n))
        raw = [indices] if isinstance(indices, (int, np.integer)) else list(indices)
        out = []
        for i in raw:
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
                raise TypeError(f"env indices must be ints, got {i!r}")
            if not -n <= i < n:
                raise IndexError(f"env index {i} out of range for {n} envs")
            out.append(int(i) % n)
        return out

    def _run(self, op: Op, indices: VecEnvIndices, *args: Any) -> list[Any]:
        """Run ``op`` on the envs in ``indices`` (in that order, repeats included): only the
        workers holding them get the command."""
        targets = self._indices(indices)
        if not targets:
            return []
        ids = None if indices is None else targets
        blob: bytes | PerEnv
        if op is Op.ENV_METHOD and PerEnv.in_call(args[1], args[2]):
            # one pickle per env called, each with its own values of the PerEnv arguments
            name, method_args, method_kwargs = args
            PerEnv.check(method_args, method_kwargs, len(targets), name)
            blob = PerEnv(
                [
                    cloudpickle.dumps((name, *PerEnv.of_env(method_args, method_kwargs, j)))
                    for j in range(len(targets))
                ]
            )
        else:
            blob = cloudpickle.dumps(args)
        payload = (op, blob)
        name = f"{op.value} {args[0]!r}"
        return list(self.vector_env._call_envs(run_op, payload, ids, name))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The attribute of each env in ``indices`` (through wrappers)."""
        return self._run(Op.GET_ATTR, indices, attr_name)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name = value`` on each env in ``indices`` (on the outermost wrapper, as
        SB3 does; each env gets its own copy of ``value``)."""
        self._run(Op.SET_ATTR, indices, attr_name, value)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name`` of each env in ``indices``; one result per index.

        A :class:`subvec.PerEnv` argument gives the ``j``-th env of ``indices`` (every env:
        env ``j``) its ``j``-th value (``env_method("set_init_state", PerEnv(states),
        indices=ids)``).

        Raises:
            ValueError: a PerEnv argument without one value per index.
        """
        return self._run(Op.ENV_METHOD, indices, method_name, method_args, method_kwargs)

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has ``attr_name`` (nothing is pickled but the answer)."""
        return all(self._run(Op.HAS_ATTR, None, attr_name))

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Whether each env in ``indices`` has a ``wrapper_class`` layer (subclasses count)."""
        return self._run(Op.IS_WRAPPED, indices, class_path(wrapper_class))

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` frame (needs ``render_mode="rgb_array"``)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is "
                "`rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return list(self.vector_env.call("render"))

    def __repr__(self) -> str:
        return f"subvec.sb3.SubprocVecEnv({self.vector_env!r})"


def _check_action(space: spaces.Space[Any], action: Any, where: str) -> None:
    """Refuse one env's action whose structure or shape does not fit ``space``: the block's
    checks do not see actions that travel by value, and DummyVecEnv would hand them on."""
    for path, sub, leaf in leaves_of(space, action, where):
        if not is_shareable(sub):
            continue
        try:
            shape = np.shape(leaf)
        except ValueError:  # ragged nested lists
            shape = None
        if shape != sub.shape:
            raise ValueError(
                f"{where}{path_text(path)}: expected shape {sub.shape} for {sub}, got {shape}"
            )


def _plain_nest(space: spaces.Space[Any], action: Any) -> bool:
    """Whether ``action`` nests as the block rebuilds it: a dict of exactly the space's keys in
    its order for a Dict, a tuple for a Tuple."""
    if isinstance(space, spaces.Dict):
        return (
            type(action) is dict
            and list(action) == list(space.spaces)
            and all(_plain_nest(sub, action[key]) for key, sub in space.spaces.items())
        )
    if isinstance(space, spaces.Tuple):
        return type(action) is tuple and all(
            _plain_nest(sub, item) for sub, item in zip(space.spaces, action)
        )
    return True


def make_vec_env(
    env_id: str | Callable[..., gym.Env[Any, Any]],
    n_envs: int = 1,
    seed: int | None = None,
    start_index: int = 0,
    monitor_dir: str | None = None,
    wrapper_class: Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    vec_env_kwargs: dict[str, Any] | None = None,
    monitor_kwargs: dict[str, Any] | None = None,
    wrapper_kwargs: dict[str, Any] | None = None,
    *,
    start_method: str | None = None,
    **subvec_kwargs: Any,
) -> VecEnv:
    """SB3's ``make_vec_env`` (Monitor, seeding, wrapper) with :class:`SubprocVecEnv`.

    The same as ``stable_baselines3.common.env_util.make_vec_env(...,
    vec_env_cls=SubprocVecEnv)``; subvec's options may be given directly as keyword
    arguments or in ``vec_env_kwargs``.
    """
    kwargs = dict(vec_env_kwargs or {})
    both = sorted(set(kwargs) & set(subvec_kwargs))
    if both:
        raise TypeError(f"{both} given both in vec_env_kwargs and as keyword arguments")
    kwargs.update(subvec_kwargs)
    if start_method is not None:
        kwargs["start_method"] = start_method
    check_kwargs(
        kwargs,
        ("start_method", "backend", *_allowed(kwargs.get("backend", "process"))),
        "subvec.sb3.make_vec_env()",
        hints=_FIXED,
    )
    vec_env: VecEnv = _sb3_make_vec_env(
        env_id,
        n_envs=n_envs,
        seed=seed,
        start_index=start_index,
        monitor_dir=monitor_dir,
        wrapper_class=wrapper_class,
        env_kwargs=env_kwargs,
        vec_env_cls=SubprocVecEnv,  # type: ignore[arg-type]  # SB3 annotates its two classes
        vec_env_kwargs=kwargs,
        monitor_kwargs=monitor_kwargs,
        wrapper_kwargs=wrapper_kwargs,
    )
    return vec_env
