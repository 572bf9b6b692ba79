"""The oracle of action chunks: per env, a one-env SyncVectorEnv stepped with exactly the
``step()`` calls the chunk stands for (its executed sub-steps' actions, in order).

A chunk's result is compared env by env: sub-step k of env i is the k-th ``step()`` of that
env's reference, for its rewards, flags, observations and infos (the chunk's infos at ``[i, k]``
against the reference's at ``[0]``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from subvec._compat import AutoresetMode
from tests.helpers import assert_same
from tests.oracle import sync_vector_env


def sub_action(space: spaces.Space[Any], actions: Any, i: int, k: int) -> Any:
    """Env ``i``'s action for sub-step ``k`` of a batch of chunks, as a batch of one env."""
    if isinstance(space, spaces.Dict):
        return {key: sub_action(sub, actions[key], i, k) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(sub_action(sub, actions[j], i, k) for j, sub in enumerate(space.spaces))
    return np.asarray(actions)[i, k][None]


def sample_chunks(space: spaces.Space[Any], num_envs: int, chunk: int, seed: int) -> Any:
    """A batch of chunks of ``space``'s actions, ``(num_envs, chunk, ...)`` on every leaf."""
    batched = gym.vector.utils.batch_space(gym.vector.utils.batch_space(space, chunk), num_envs)
    batched.seed(seed)
    return batched.sample()


@dataclass
class Expected:
    """One env's chunk by the oracle."""

    rewards: list[float] = field(default_factory=list)
    terminations: list[bool] = field(default_factory=list)
    truncations: list[bool] = field(default_factory=list)
    obs: list[Any] = field(default_factory=list)  # the reference's batches of one env
    infos: list[dict[str, Any]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.rewards)


class Oracle:
    """One one-env SyncVectorEnv per env of a vector env, stepped as its chunks say."""

    def __init__(self, fns: Sequence[Callable[[], gym.Env[Any, Any]]], mode: AutoresetMode):
        self.mode = mode
        self.refs = [sync_vector_env([fn], autoreset_mode=mode) for fn in fns]
        self.space = self.refs[0].single_action_space

    def reset(self, seed: int) -> list[Any]:
        return [ref.reset(seed=seed + i)[0] for i, ref in enumerate(self.refs)]

    def reset_envs(self, mask: Sequence[bool]) -> None:
        for ref, reset in zip(self.refs, mask):
            if reset:
                ref.reset(options={"reset_mask": np.array([True])})

    def step(self, actions: Any) -> list[Any]:
        """One ``step()`` of every env (its action of a batch of ``step()``)."""
        out = []
        for i, ref in enumerate(self.refs):
            out.append(ref.step(_one(self.space, actions, i)))
        return out

    def chunk(self, actions: Any, chunk: int, stop_on_done: bool) -> list[Expected]:
        stop = stop_on_done or self.mode is AutoresetMode.DISABLED
        expected = []
        for i, ref in enumerate(self.refs):
            e = Expected()
            for k in range(chunk):
                obs, reward, term, trunc, info = ref.step(sub_action(self.space, actions, i, k))
                e.rewards.append(float(reward[0]))
                e.terminations.append(bool(term[0]))
                e.truncations.append(bool(trunc[0]))
                e.obs.append(obs)
                e.infos.append(info)
                if stop and (term[0] or trunc[0]):
                    break
            expected.append(e)
        return expected


def _one(space: spaces.Space[Any], actions: Any, i: int) -> Any:
    if isinstance(space, spaces.Dict):
        return {key: _one(sub, actions[key], i) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_one(sub, actions[j], i) for j, sub in enumerate(space.spaces))
    return np.asarray(actions)[i][None]


def row(batch: Any, i: int) -> Any:
    """Row ``i`` of a batch (a nest of arrays)."""
    if isinstance(batch, dict):
        return {key: row(value, i) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(row(value, i) for value in batch)
    return batch[i]


def info_at(infos: dict[str, Any], i: int, k: int) -> dict[str, Any]:
    """The infos of env ``i`` at sub-step ``k`` of a chunk's infos (keys gain the chunk axis,
    masks ``(num_envs, K)``), as a one-env vector env's infos: what the oracle gives."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or key == "chunk_steps":
            continue
        mask = infos[f"_{key}"]
        if not mask[i, k]:
            continue
        if isinstance(value, dict):
            out[key] = info_at(value, i, k)
        else:
            out[key] = value[i, k : k + 1]
        out[f"_{key}"] = np.ones(1, dtype=np.bool_)
    return out


def check_chunk(
    expected: list[Expected],
    chunk: int,
    obs: Any,
    rewards: np.ndarray,
    terminations: np.ndarray,
    truncations: np.ndarray,
    infos: dict[str, Any] | None,
    *,
    all_obs: bool = False,
    steps: np.ndarray | None = None,
    where: str = "",
) -> None:
    """Assert a chunk's results equal the oracle's, env by env (``infos`` None: not checked)."""
    n = len(expected)
    assert rewards.shape == (n, chunk) and rewards.dtype == np.float64, (where, rewards.shape)
    assert terminations.shape == truncations.shape == (n, chunk), where
    if steps is None and infos is not None:
        steps = infos["chunk_steps"]
    for i, e in enumerate(expected):
        s = e.steps
        at = f"{where} env {i}"
        if steps is not None:
            assert steps[i] == s, (at, steps[i], s)
        np.testing.assert_array_equal(rewards[i], e.rewards + [0.0] * (chunk - s), at)
        np.testing.assert_array_equal(terminations[i], e.terminations + [False] * (chunk - s), at)
        np.testing.assert_array_equal(truncations[i], e.truncations + [False] * (chunk - s), at)
        if all_obs:
            for k in range(chunk):
                want = row(e.obs[min(k, s - 1)], 0)
                assert_same(row_k(obs, i, k), want, f"{at} obs sub-step {k}")
        else:
            assert_same(row(obs, i), row(e.obs[-1], 0), f"{at} obs")
        if infos is not None:
            for k in range(s):
                got, want = info_at(infos, i, k), e.infos[k]
                assert_same(ordered(got), ordered(want), f"{at} infos sub-step {k}")


def ordered(infos: Any) -> Any:
    """``infos`` with every dict's keys sorted: a chunk's keys come in the order they first
    appear among all its envs and sub-steps, a one-env reference's in its own order."""
    if type(infos) is dict:
        return {key: ordered(infos[key]) for key in sorted(infos)}
    return infos


def row_k(batch: Any, i: int, k: int) -> Any:
    """Element ``[i, k]`` of a nest of ``(num_envs, K, ...)`` arrays."""
    if isinstance(batch, dict):
        return {key: row_k(value, i, k) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(row_k(value, i, k) for value in batch)
    return batch[i, k]


def rows_of(batch: Any, ids: Sequence[int]) -> Any:
    """Rows ``ids`` of a batch (a nest of arrays), in that order."""
    if isinstance(batch, dict):
        return {key: rows_of(value, ids) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(rows_of(value, ids) for value in batch)
    return np.asarray(batch)[list(ids)]


def without_env_id(infos: dict[str, Any]) -> dict[str, Any]:
    """An asynchronous batch's infos without ``env_id`` (the oracle has no such key)."""
    return {key: value for key, value in infos.items() if key != "env_id"}


def check_async_chunks(
    envs: Any,
    fns: Sequence[Callable[[], gym.Env[Any, Any]]],
    mode: AutoresetMode,
    sets: Sequence[Sequence[int]],
    rounds: int = 6,
    seed: int = 0,
) -> int:
    """``send_chunk`` to every set of ``sets`` (all in flight at once), collected by set
    (the last sent first) or first-ready, then single steps on ``sets[0]`` while
    ``sets[1]`` runs a chunk: every env's results against its own one-env oracle. Under
    DISABLED, ended envs are reset (masked) between rounds. Returns the episodes that ended
    inside a chunk."""
    oracles = [Oracle([fn], mode) for fn in fns]
    envs.async_reset(seed=seed)
    for env, oracle in enumerate(oracles):
        oracle.reset(seed + env)
    envs.drain()
    space = envs.single_action_space
    ended = 0
    for t in range(rounds):
        chunk, stop, all_obs = (2, 3, 5)[t % 3], t % 3 == 1, t % 2 == 1
        expected: dict[int, Expected] = {}
        for j, ids in enumerate(sets):
            actions = sample_chunks(space, len(ids), chunk, seed=100 * t + j)
            envs.send_chunk(actions, ids, stop_on_done=stop, all_obs=all_obs)
            for r, env in enumerate(ids):
                expected[env] = oracles[env].chunk(rows_of(actions, [r]), chunk, stop)[0]
        batches = []
        if t % 2:
            for ids in reversed(sets):
                batches.append(envs.recv(env_ids=ids))
        else:
            while envs.in_flight_env_ids or envs.ready_env_ids:
                batches.append(envs.recv(min_envs=1, max_envs=3))
        seen = []
        for obs, rewards, terms, truncs, infos in batches:
            ids = [int(e) for e in infos["env_id"]]
            seen += ids
            check_chunk(
                [expected[e] for e in ids],
                chunk,
                obs,
                rewards,
                terms,
                truncs,
                without_env_id(infos),
                all_obs=all_obs,
                where=f"round {t} (K={chunk}) envs {ids}",
            )
            ended += int(terms.any(axis=1).sum() + truncs.any(axis=1).sum())
        assert sorted(seen) == sorted(e for ids in sets for e in ids), (t, seen)
        if mode is AutoresetMode.DISABLED:
            _reset_ended(envs, oracles, expected)
    # steps on one set while a chunk runs on the other, then collected set by set
    first, other = list(sets[0]), list(sets[1])
    batch = gym.vector.utils.batch_space(envs.single_action_space, len(first))
    batch.seed(seed)
    steps = batch.sample()
    envs.send(steps, first)
    actions = sample_chunks(space, len(other), 4, seed=999)
    envs.send_chunk(actions, other)
    want_chunk = [oracles[e].chunk(rows_of(actions, [r]), 4, False)[0] for r, e in enumerate(other)]
    got = envs.recv(env_ids=other)
    check_chunk(want_chunk, 4, *got[:4], without_env_id(got[4]), where="chunk beside steps")
    obs, rewards, terms, truncs, _ = envs.recv(env_ids=first)
    for r, env in enumerate(first):
        w_obs, w_rew, w_term, w_trunc, _ = oracles[env].step(rows_of(steps, [r]))[0]
        assert_same(row(obs, r), row(w_obs, 0), f"step beside a chunk, env {env}")
        assert (rewards[r], terms[r], truncs[r]) == (w_rew[0], w_term[0], w_trunc[0]), env
    return ended


def _reset_ended(envs: Any, oracles: list[Oracle], expected: dict[int, Expected]) -> None:
    mask = np.zeros(envs.num_envs, dtype=np.bool_)
    for env, e in expected.items():
        mask[env] = e.terminations[-1] or e.truncations[-1]
    if mask.any():
        envs.reset(options={"reset_mask": mask})
        for env in np.flatnonzero(mask):
            oracles[env].reset_envs([True])
