"""EnvSlab: k consecutive envs of a vector env, stepped in-process.

This module knows nothing about processes, pipes or shared memory: it reads actions from and
writes observations, rewards and flags into whatever arrays it is given, and returns the infos
as a list of ``(local_env, info)`` events in the exact order SyncVectorEnv would merge them. A
worker process wraps it, and so does the parent for its own envs (``_process.local``); tests drive
it directly.

The autoreset logic mirrors gymnasium 1.x SyncVectorEnv so that results are byte-identical:

- NEXT_STEP: an env that ended on the previous step is reset *instead of* stepped; that step
  reports reward 0 and both flags False, and the reset's info.
- SAME_STEP: an env that ends is reset at once; the step reports the reset observation and the
  events ``{"final_obs", "final_info"}`` then the reset info. Given ``store_final_obs``, the
  final observation goes to an array instead, and the final event is left implicit when the
  final info is empty (:class:`FinalObsInBlock`).
- DISABLED: the caller resets ended envs with ``reset(mask=...)``; stepping one is refused by the
  vector env before it gets here, unless the slab *freezes* ended envs (``freeze``): then an
  ended env is not stepped again until it is reset; each step (or chunk) it is given reports its
  final observation again, reward 0, both flags False (the end was reported once, on the step
  it happened) and the info ``{"frozen": True}``.

Action chunks (:meth:`EnvSlab.step_chunk`): K sub-steps of each env in one call, each exactly
the ``step()`` that env would have had, under the same autoreset mode (the env's needs-reset
state carries over between chunks and steps). The envs run one after the other, each its K
sub-steps in a row (env-major). The results go to ``(k, K)`` reward and flag arrays and the
executed counts to ``steps``; the info events are ``(local env, sub-step, info)`` in that same
env-major order, an episode end's ``{"final_obs", "final_info"}`` (SAME_STEP; always by value
in a chunk) before the reset's info of the same sub-step, as in ``step()``. With
``stop_on_done`` (implied by DISABLED) an env stops after the sub-step its episode ended in;
its later sub-steps report reward 0 and both flags False, and with ``all_obs`` their
observations repeat its last one.

Each env has stored reset options (:meth:`EnvSlab.set_reset_options`, None by default): every
reset that names no options for the env (None or an empty dict) gets them, its autoresets in
every mode included.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import Env

from subvec._commands import EnvSnapshot, PerEnv
from subvec._compat import AutoresetMode, get_env_attr, set_env_attr
from subvec._slab_records import (
    ChunkArrays,
    ChunkResult,
    FinalObsInBlock,
    InfoEvent,
    SlabArrays,
    SlabResult,
)
from subvec.errors import add_note

__all__ = [
    "EnvSlab",
    "close_quietly",
    "env_metadata",
    "snapshot",
]


def env_metadata(env: Env[Any, Any]) -> dict[str, Any]:
    """``env.metadata`` as a new dict: a mapping copied, anything else (robosuite's
    ``GymWrapper`` sets ``metadata = None``) read as no metadata at all, ``{}``. Every hello
    (a worker's, an actor's, the parent's own envs') reads an env's metadata through this."""
    metadata = getattr(env, "metadata", None)
    if isinstance(metadata, Mapping):
        return dict(metadata)
    return {}


def snapshot(value: Any) -> Any:
    """A copy of an observation or info as it is now: arrays copied, dicts, tuples and lists
    rebuilt (an ``OrderedDict`` too: gymnasium 0.29's Dict observations), anything else (their
    subclasses too) as it is: what SyncVectorEnv copies when it batches an info."""
    if type(value) is np.ndarray:
        return value.copy()
    if type(value) is dict:
        return {key: snapshot(item) for key, item in value.items()}
    if type(value) is OrderedDict:
        return OrderedDict((key, snapshot(item)) for key, item in value.items())
    if type(value) is tuple or type(value) is list:
        return type(value)(snapshot(item) for item in value)
    return value


def _cells(array: np.ndarray) -> memoryview:
    """A chunk array's cells as one flat memoryview (env ``i``'s sub-step ``k`` at
    ``i * K + k``).

    Raises:
        ValueError: the array is not C-contiguous (a chunk's arrays are).
    """
    if not array.flags.c_contiguous:
        raise ValueError(f"a chunk's arrays must be C-contiguous; got strides {array.strides}")
    return array.reshape(-1).data


def _store_sub_step(
    out: ChunkArrays, i: int, k: int, reward: Any, terminated: Any, truncated: Any
) -> None:
    """Store one sub-step's reward and flags as numpy does (its conversions; a value it
    cannot store raises :func:`_unbatchable`'s error)."""
    try:
        out.rewards[i, k] = reward
        out.terminations[i, k] = terminated
        out.truncations[i, k] = truncated
    except (TypeError, ValueError) as exc:
        raise _unbatchable(exc, reward, terminated, truncated) from None


def _unbatchable(
    exc: TypeError | ValueError, reward: Any, terminated: Any, truncated: Any
) -> TypeError | ValueError:
    """The error numpy raised storing a step's reward or flags, saying which value it was.
    Same type as numpy's (SyncVectorEnv stores them the same way and raises that error)."""
    values = {"reward": reward, "terminated": terminated, "truncated": truncated}
    arrays = [(k, v) for k, v in values.items() if isinstance(v, np.ndarray) and v.ndim]
    if arrays:
        name, array = arrays[0]
        what = f"an array of shape {array.shape} ({array.dtype})"
    else:
        name, what = "reward/terminated/truncated", repr((reward, terminated, truncated))
    return type(exc)(
        f"step returned {name} as {what}, which numpy cannot store as one env's scalar "
        f"({exc}); return a scalar, e.g. float(reward[0])"
    )


class EnvSlab:
    """Owns ``envs`` (global indices ``first_index ..``) and steps them in order."""

    def __init__(
        self,
        envs: Sequence[Env[Any, Any]],
        first_index: int,
        autoreset_mode: AutoresetMode,
        freeze: bool = False,
    ) -> None:
        if freeze and autoreset_mode is not AutoresetMode.DISABLED:
            raise ValueError(f"freeze needs autoreset_mode DISABLED, not {autoreset_mode}")
        self.envs = list(envs)
        self.first_index = first_index
        self.autoreset_mode = autoreset_mode
        #: ended envs are frozen until reset (DISABLED only): see the module's docstring
        self.freeze = freeze
        #: whether an ended env is held back from ``env.step`` until it is reset (NEXT_STEP,
        #: freeze)
        self.holds_ended = autoreset_mode is AutoresetMode.NEXT_STEP or freeze
        #: with ``freeze``: each ended env's final observation, shown while it is frozen
        self.final_obs: list[Any] = [None] * len(self.envs)
        #: ``(local env, new env)`` built by a reconfigure, waiting for :meth:`commit`
        self.staged: list[tuple[int, Env[Any, Any]]] = []
        self.needs_reset = [False] * len(self.envs)
        #: local index of the env being driven; tells error reports which env raised
        self.current = 0
        self.arrays: SlabArrays | None = None
        #: per env: the options of its resets that name none (its autoresets); None: none
        self.reset_options: list[dict[str, Any] | None] = [None] * len(self.envs)

    @property
    def current_env(self) -> int:
        """Global index of the env that is (or was last) being driven."""
        return self.first_index + self.current

    def bind(self, arrays: SlabArrays) -> None:
        self.arrays = arrays

    def _emit_obs(self, result: SlabResult | ChunkResult, i: int, obs: Any) -> None:
        arrays = self.arrays
        assert arrays is not None
        if arrays.write_obs is not None:
            arrays.write_obs(obs, i)
            return
        if arrays.split_obs is not None:
            obs = arrays.split_obs(obs, i)
        if result.obs is None:
            result.obs = []
        result.obs.append((i, obs))

    def set_reset_options(
        self, envs: Sequence[int], options: Sequence[dict[str, Any] | None]
    ) -> None:
        """Store ``options[j]`` as the reset options of local env ``envs[j]`` (None clears)."""
        for i, opts in zip(envs, options):
            self.reset_options[i] = opts

    def _autoreset(self, i: int) -> tuple[Any, dict[str, Any]]:
        """Reset env ``i`` on its own behalf: with its stored options, if any."""
        options = self.reset_options[i]
        if options is None:
            return self.envs[i].reset()
        return self.envs[i].reset(options=options)

    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None,
        mask: Sequence[bool] | None = None,
        stored: Sequence[dict[str, Any] | None] | None = None,
    ) -> SlabResult:
        """Reset every env (or those where ``mask`` is True) with its own seed.

        Args:
            seeds: one seed (or None) per env.
            options: one dict for every env, or one dict (or None) per env; an env given
                None or an empty dict resets with its stored options, if it has any.
            mask: which envs reset (None: all).
            stored: first replace every env's stored options with these (a replacement's).
        """
        arrays = self.arrays
        assert arrays is not None, "bind() first"
        if stored is not None:
            self.reset_options = list(stored)
        result = SlabResult()
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                continue
            self.current = i
            opts = options if options is None or isinstance(options, dict) else options[i]
            if not opts and self.reset_options[i] is not None:  # none named: the stored ones
                opts = self.reset_options[i]
            obs, info = env.reset(seed=seeds[i], options=opts)
            self._emit_obs(result, i, obs)
            arrays.terminations[i] = False
            arrays.truncations[i] = False
            self.needs_reset[i] = False
            self.final_obs[i] = None
            if info:
                result.infos.append((i, info))
        return result

    def step(
        self,
        envs: Sequence[int] | None = None,
        actions: Sequence[Any] | None = None,
        action_dtypes: tuple[str, ...] | None = None,
    ) -> SlabResult:
        """Step the envs at local ``envs`` (ascending; None: every env) once each: what
        ``step()`` does to an env, and what the front's step command with one sub-step asks
        of a unit, lock-step and asynchronous alike.

        Args:
            envs: the local envs to step, ascending (None: every env).
            actions: one action per env of ``envs``, by value (None: each env's action in the
                bound arrays).
            action_dtypes: the dtypes the parent stored the actions in the bound arrays with
                (``np.dtype.str`` per action leaf; None: the action space's).

        Returns:
            The infos, the by-value observations and the envs that raised. An env that
            raises is reported as ``(local env, exception)`` and the others still step: each
            env's error belongs to that env's own result.
        """
        arrays = self.arrays
        assert arrays is not None, "bind() first"
        indices: Sequence[int] = range(len(self.envs)) if envs is None else envs
        read: Callable[[int], Any]
        if actions is not None:
            read = actions.__getitem__ if envs is None else dict(zip(envs, actions)).__getitem__
        elif action_dtypes is not None:
            assert arrays.action_reader is not None
            read = arrays.action_reader(action_dtypes)
        else:
            assert arrays.read_action is not None, "no actions in the arrays: give them by value"
            read = arrays.read_action
        write = arrays.write_obs
        rewards, terms, truncs = arrays.rewards, arrays.terminations, arrays.truncations
        # An ended env is held back from env.step: reset (NEXT_STEP) or frozen (freeze). One
        # local for both, as many loads as NEXT_STEP's own test took: the per-step loop below
        # is the one it was without freeze.
        held = self.holds_ended
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        store_final = arrays.store_final_obs
        needs_reset = self.needs_reset
        result = SlabResult()
        infos = result.infos
        errors: list[tuple[int, Exception]] | None = None
        i = 0
        try:
            for i in indices:
                try:
                    if held and needs_reset[i]:
                        if self.freeze:
                            obs, info = self._frozen_obs(i), {"frozen": True}
                        else:
                            obs, info = self._autoreset(i)
                            needs_reset[i] = False
                        rewards[i] = 0.0
                        terms[i] = False
                        truncs[i] = False
                    else:
                        obs, reward, terminated, truncated, info = self.envs[i].step(read(i))
                        try:
                            rewards[i] = reward
                            terms[i] = terminated
                            truncs[i] = truncated
                        except (TypeError, ValueError) as exc:
                            raise _unbatchable(exc, reward, terminated, truncated) from None
                        if (terminated or truncated) and same_step:
                            obs, info = self._reset_at_end(i, obs, info, infos, store_final)
                        elif terminated or truncated:
                            needs_reset[i] = True
                            if self.freeze:
                                self.final_obs[i] = snapshot(obs)
                    if write is not None:
                        write(obs, i)
                    else:
                        self._emit_obs(result, i, obs)
                except Exception as exc:
                    if errors is None:
                        errors = result.errors = []
                    errors.append((i, exc))
                    continue
                if info:
                    infos.append((i, info))
        finally:
            # Which env ran last (a reply that cannot be sent names it); set once, not per env.
            self.current = i
        return result

    def _reset_at_end(
        self,
        i: int,
        obs: Any,
        info: dict[str, Any],
        infos: list[InfoEvent],
        store_final: Callable[[Any, int], bool] | None,
    ) -> tuple[Any, dict[str, Any]]:
        """SAME_STEP: env ``i``'s episode ended with ``obs`` and ``info``: its final event
        (the final observation in the block where ``store_final`` keeps it), then its reset."""
        # Taken before reset(): an env that mutates and returns one buffer (or info dict)
        # would otherwise show the reset's contents there.
        if store_final is None or not store_final(obs, i):
            infos.append((i, {"final_obs": snapshot(obs), "final_info": snapshot(info)}))
        elif info:
            infos.append((i, {"final_obs": FinalObsInBlock, "final_info": snapshot(info)}))
        return self._autoreset(i)

    def step_chunk(
        self,
        out: ChunkArrays,
        read: Callable[[int, int], Any],
        chunk: int,
        *,
        stop_on_done: bool = False,
        all_obs: bool = False,
        envs: Sequence[int] | None = None,
        env_actions: Callable[[int], Sequence[Any]] | None = None,
    ) -> ChunkResult:
        """Run an action chunk: ``chunk`` sub-steps of each env (of ``envs``, local indices
        in ascending order; None: every env), each the ``step()`` that env would have had.

        Per env, in order: a NEXT_STEP env that ended on its previous (sub-)step has its reset
        step (action not read, reward 0, flags False); any other sub-step calls ``env.step``
        with ``read(i, k)`` and, when the episode ends, resets at once (SAME_STEP, the final
        observation and info in an event) or marks the env for the next sub-step's reset
        (NEXT_STEP). With ``stop_on_done`` (always under DISABLED) an env that ended executes
        none of its later sub-steps. ``out`` gets every sub-step's reward and flags (0 and
        False past an early stop) and the executed counts; the bound arrays get each env's
        last observation (without ``all_obs``), as a step's. (Their rewards and flags are
        left alone: the chunk's are in ``out``.)

        Args:
            out: the chunk's arrays (rows: this slab's local envs).
            read: ``read(i, k)``: local env ``i``'s action for sub-step ``k``, in the form
                ``step()`` would hand it.
            chunk: K, the sub-steps (at least 1).
            stop_on_done: stop an env after the sub-step its episode ended in.
            all_obs: report the observation after every sub-step (``out.write_sub_obs``, or
                by value), instead of the last one.
            envs: the local envs to run (None: all).
            env_actions: ``env_actions(i)[k]`` is ``read(i, k)``, one call per env instead of
                one per sub-step (e.g. a row of numpy scalars); None: ``read``.

        Returns:
            The info events and by-value observations, and in ``errors`` the envs that
            raised (each exception with a note naming the sub-step): such an env stops at
            that sub-step, its ``steps`` count says how many it completed, and the other envs
            run their chunk.
        """
        arrays = self.arrays
        assert arrays is not None, "bind() first"
        next_step = self.autoreset_mode is AutoresetMode.NEXT_STEP
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        # An ended env must not be stepped until the caller resets it
        stop = stop_on_done or self.autoreset_mode is AutoresetMode.DISABLED
        freeze = self.freeze
        rewards, terms, truncs = out.rewards, out.terminations, out.truncations
        write_sub = out.write_sub_obs
        steps = out.steps
        needs_reset = self.needs_reset
        slab_envs = self.envs
        result = ChunkResult()
        events = result.infos
        every = range(len(slab_envs)) if envs is None else envs
        # The flags are False but where an episode ends: set False up front, stored below
        # only when a step returns something else than the False singleton (what storing it
        # would have left there).
        if envs is None:
            terms[:] = False
            truncs[:] = False
        else:
            for i in envs:
                terms[i] = False
                truncs[i] = False
        # Stores through flat memoryviews (~20 ns against numpy's ~35: decision 0032; flat,
        # not 2-D indexed by a tuple, and no row views per env: decision 0035); numpy's own
        # store is the fallback, for its conversions and its errors.
        cell_rewards, cell_terms, cell_truncs = _cells(rewards), _cells(terms), _cells(truncs)
        cell_steps = steps.data
        # the last observation's write, looked up once (the per-env costs are a chunk's
        # fixed cost: 8 envs at K = 8 pay them once per 8 sub-steps)
        write_obs = None if all_obs else arrays.write_obs
        sub_steps = range(chunk)
        executed = 0
        for i in every:
            self.current = i
            if freeze and needs_reset[i]:
                self._frozen_chunk(out, result, i, chunk, all_obs)
                continue
            env = slab_envs[i]
            step = env.step
            # its K actions at once: one call per env, an index per sub-step
            row = env_actions(i) if env_actions is not None else None
            reward: Any = 0.0
            ended: Any = False
            terminated: Any = False
            truncated: Any = False
            seen: list[Any] = []  # by-value observations, with all_obs
            obs: Any = None
            at = i * chunk  # env i's sub-step 0 in the flat cells
            # NEXT_STEP: its next sub-step is the reset step (needs_reset[i], kept here too)
            pending = next_step and needs_reset[i]
            k = 0
            try:
                for k in sub_steps:
                    if pending:
                        obs, info = self._autoreset(i)
                        reward, terminated, truncated, ended = 0.0, False, False, False
                        needs_reset[i] = pending = False
                    else:
                        action = row[k] if row is not None else read(i, k)
                        obs, reward, terminated, truncated, info = step(action)
                        ended = terminated or truncated
                        if ended:
                            if same_step:
                                final = {"final_obs": snapshot(obs), "final_info": snapshot(info)}
                                events.append((i, k, final))
                                obs, info = self._autoreset(i)
                            else:
                                needs_reset[i] = True
                                pending = next_step
                                if freeze:
                                    self.final_obs[i] = snapshot(obs)
                    try:
                        cell_rewards[at + k] = reward
                        if terminated is not False:
                            cell_terms[at + k] = terminated
                        if truncated is not False:
                            cell_truncs[at + k] = truncated
                    except Exception:
                        _store_sub_step(out, i, k, reward, terminated, truncated)
                    if all_obs:
                        if write_sub is not None:
                            write_sub(obs, i, k)
                        else:
                            seen.append(snapshot(obs))
                    if info:
                        events.append((i, k, info))
                    # after every sub-step: a death mid-chunk then says where the env was lost
                    cell_steps[i] = k + 1
                    if stop and ended:
                        break
                done = k + 1
                if done < chunk:
                    rewards[i, done:] = 0.0
                    if all_obs and write_sub is not None:
                        for rest in range(done, chunk):
                            write_sub(obs, i, rest)
                if write_obs is not None:
                    write_obs(obs, i)
                elif not all_obs:
                    self._emit_obs(result, i, obs)
                elif write_sub is None:
                    if result.sub_obs is None:
                        result.sub_obs = []
                    result.sub_obs.append((i, seen))
            except Exception as exc:
                # This env stops at the sub-step that raised (its rows from there read 0 and
                # False); the unit's other envs run their chunk, as they step in step().
                add_note(exc, f"raised at sub-step {k} of an action chunk of {chunk}")
                if result.errors is None:
                    result.errors = []
                result.errors.append((i, exc))
                done = int(steps[i])
                rewards[i, done:], terms[i, done:], truncs[i, done:] = 0.0, False, False
            executed += done
        result.executed = executed
        return result

    def _frozen_obs(self, i: int) -> Any:
        """The observation a frozen env ``i`` shows: its final one.

        Raises:
            RuntimeError: env ``i`` was replaced by ``reconfigure`` and not reset since (it
                has no episode to show).
        """
        obs = self.final_obs[i]
        if obs is None:
            raise RuntimeError(
                f"env {self.first_index + i} was replaced by reconfigure() and has not been "
                "reset since: reset it (options={'reset_mask': mask}) before stepping it"
            )
        return obs

    def _frozen_chunk(
        self, out: ChunkArrays, result: ChunkResult, i: int, chunk: int, all_obs: bool
    ) -> None:
        """A frozen env's chunk: no sub-step executed (``steps`` 0), rewards 0 and flags
        False, its final observation as the chunk's (every sub-step's, with ``all_obs``),
        and the event ``{"frozen": True}`` at sub-step 0."""
        obs = self._frozen_obs(i)
        out.rewards[i] = 0.0
        out.steps[i] = 0
        result.infos.append((i, 0, {"frozen": True}))
        arrays = self.arrays
        assert arrays is not None
        if not all_obs:
            if arrays.write_obs is not None:
                arrays.write_obs(obs, i)
            else:
                self._emit_obs(result, i, obs)
        elif out.write_sub_obs is not None:
            for k in range(chunk):
                out.write_sub_obs(obs, i, k)
        else:
            if result.sub_obs is None:
                result.sub_obs = []
            result.sub_obs.append((i, [obs]))

    def call(
        self,
        name: str,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        envs: Sequence[int] | None = None,
        function: Callable[..., Any] | None = None,
    ) -> list[Any]:
        """``env.get_wrapper_attr(name)`` (``_compat.get_env_attr``) for each env, called with
        the arguments if callable;
        or ``function(env, *args, **kwargs)``.

        Args:
            name: the attribute (with ``function``: only named in error reports).
            args, kwargs: the call's arguments.
            envs: the local envs to call, in that order (repeats are called again); None: all.
            function: run this on each env instead of its attribute ``name``.

        A :class:`subvec._commands.PerEnv` argument gives the ``j``-th env called its
        ``values[j]``.

        Returns:
            One result per env called, in that order.
        """
        call_args, call_kwargs = args, kwargs
        results = []
        per_env = PerEnv.in_call(args, kwargs)
        for j, i in enumerate(range(len(self.envs)) if envs is None else envs):
            self.current = i
            env = self.envs[i]
            if per_env:
                args, kwargs = PerEnv.of_env(call_args, call_kwargs, j)
            if function is not None:
                results.append(function(env, *args, **kwargs))
                continue
            attr = get_env_attr(env, name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return results

    def set_attr(self, name: str, values: Sequence[Any], envs: Sequence[int] | None = None) -> None:
        """``env.set_wrapper_attr(name, values[j])`` (``_compat.set_env_attr``) for the
        ``j``-th env of ``envs`` (local
        indices; None: every env)."""
        for j, i in enumerate(range(len(self.envs)) if envs is None else envs):
            self.current = i
            set_env_attr(self.envs[i], name, values[j])

    def snapshot(self) -> list[EnvSnapshot]:
        """Each env as it is now: ``env.get_state()`` where the env (or a wrapper) has it,
        and this slab's own record of the env."""
        snapshots = []
        for i, env in enumerate(self.envs):
            self.current = i
            try:
                get_state = get_env_attr(env, "get_state")
            except AttributeError:
                get_state = None
            state = get_state() if get_state is not None else None
            snapshots.append(
                EnvSnapshot(get_state is not None, state, self.needs_reset[i], self.final_obs[i])
            )
        return snapshots

    def restore(self, snapshots: Sequence[EnvSnapshot]) -> None:
        """Put each env with a state back to its snapshot (``env.set_state(state)``, then
        this slab's record of it); the others are left as they are (just reset)."""
        for i, snap in enumerate(snapshots):
            if not snap.has_state:
                continue
            self.current = i
            get_env_attr(self.envs[i], "set_state")(snap.state)
            self.needs_reset[i] = snap.needs_reset
            self.final_obs[i] = snap.final_obs

    def stage(self, envs: Sequence[int], new: Sequence[Env[Any, Any]]) -> None:
        """Keep ``new[j]`` to replace local env ``envs[j]`` at :meth:`commit`, once its spaces
        are checked against the old env's (earlier staged envs are dropped first).

        Raises:
            ValueError: a new env's observation or action space differs from the old one's
                (``current`` names the env; every new env is closed, the old ones stay).
        """
        self.abort()
        for local, env in zip(envs, new):
            old = self.envs[local]
            for what in ("observation_space", "action_space"):
                if getattr(env, what) != getattr(old, what):
                    self.current = local
                    close_quietly(new)
                    raise ValueError(
                        f"reconfigure: the new env has {what} {getattr(env, what)}, "
                        f"the vector env's is "
                        f"{getattr(old, what)}; the old envs are kept"
                    )
        self.staged = list(zip(envs, new))

    def commit(self) -> None:
        """Swap the staged envs in and close the old ones (their close errors are dropped:
        they are gone either way). A new env starts with no episode: it waits for a reset
        (``needs_reset``: NEXT_STEP resets it on its next step, freeze refuses to step it),
        except under SAME_STEP, which keeps every env in an episode: it is reset here (its
        observation is not reported). Its stored reset options are kept.

        Raises:
            Exception: (SAME_STEP) a new env's reset raised; the other envs are swapped in.
        """
        staged, self.staged = self.staged, []
        old = []
        for local, env in staged:
            old.append(self.envs[local])
            self.envs[local] = env
            self.needs_reset[local] = True
            self.final_obs[local] = None
        close_quietly(old)
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            for local, _ in staged:
                self.current = local
                self._autoreset(local)
                self.needs_reset[local] = False

    def abort(self) -> None:
        """Close and drop the staged envs, if any."""
        staged, self.staged = self.staged, []
        close_quietly([env for _, env in staged])

    def close(self) -> None:
        """Close every env; the first failure is re-raised after all were tried, with
        ``current`` naming the env that raised it (not the last one closed)."""
        self.abort()
        first: BaseException | None = None
        failed = 0
        for i, env in enumerate(self.envs):
            try:
                env.close()
            except Exception as exc:
                if first is None:
                    first, failed = exc, i
        if first is not None:
            self.current = failed
            raise first


def close_quietly(envs: Sequence[Env[Any, Any]]) -> None:
    """Close ``envs``, dropping their close errors (envs being discarded either way)."""
    for env in envs:
        try:
            env.close()
        except Exception:
            pass  # nothing to report to: the env is dropped
