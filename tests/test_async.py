"""Asynchronous stepping: async_reset / send / recv / drain, checked env by env against
one-env vector envs stepped with the same seeds and actions (SyncVectorEnv for the gymnasium
format; for the list and legacy formats a one-env lock-step SubprocVectorEnv, itself checked
against SyncVectorEnv by the conformance suite)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import SyncVectorEnv

from subvec import EnvError, RecvTimeoutError, SubprocVectorEnv, WorkerDiedError
from subvec._compat import AutoresetMode
from subvec._front.async_stats import AsyncStats
from subvec._inproc import InProcessVectorEnv
from tests.envs import CrashEnv, ZooEnv, make_zoo
from tests.helpers import assert_same
from tests.oracle import require_offered, sync_vector_env

SEED = 11


def row_info(infos: Any, row: int) -> Any:
    """One row of a vector env's infos, as a plain dict (``_key`` masks applied), its keys
    sorted: a batch's key order depends on which rows it merged, not on the env."""
    if isinstance(infos, list):
        return {k: v for k, v in sorted(infos[row].items()) if k != "env_id"}
    out = {}
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id":
            continue
        mask = infos.get(f"_{key}")
        if isinstance(value, dict):
            if mask is None or mask[row]:
                out[key] = row_info(value, row)
        elif mask is None or mask[row]:
            out[key] = value[row]
    return dict(sorted(out.items()))


def _row(batch: Any, row: int, space: spaces.Space[Any]) -> Any:
    """Row ``row`` of a batch of the single ``space``: an array's row, or the item of a leaf
    gymnasium batches as a tuple (Text, Sequence, ...)."""
    if isinstance(space, spaces.Dict):
        return {k: _row(batch[k], row, sub) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_row(batch[i], row, sub) for i, sub in enumerate(space.spaces))
    return batch[row, ...] if isinstance(batch, np.ndarray) else batch[row]


def _oracle(fn: Any, mode: AutoresetMode, info_format: str) -> Any:
    if info_format == "gymnasium":
        return sync_vector_env([fn], autoreset_mode=mode)
    return SubprocVectorEnv([fn], num_workers=1, autoreset_mode=mode, info_format=info_format)


def _expected(fns: list[Any], actions: list[list[Any]], mode: AutoresetMode, fmt: str) -> list:
    """Per env: the reset, then one record per action, from a one-env vector env."""
    out = []
    for e, fn in enumerate(fns):
        oracle = _oracle(fn, mode, fmt)
        try:
            obs, infos = oracle.reset(seed=SEED + e)
            space = oracle.single_observation_space
            records = [(_row(obs, 0, space), 0.0, False, False, row_info(infos, 0))]
            for action in actions[e]:
                obs, rew, term, trunc, infos = oracle.step(np.array([action]))
                row = _row(obs, 0, space)
                records.append((row, rew[0], term[0], trunc[0], row_info(infos, 0)))
        finally:
            oracle.close()
        out.append(records)
    return out


def _record(got: dict[int, list], batch: tuple, space: spaces.Space[Any]) -> list[int]:
    obs, rew, term, trunc, infos = batch
    ids = [infos[r]["env_id"] for r in range(len(infos))] if isinstance(infos, list) else None
    ids = ids if ids is not None else infos["env_id"].tolist()
    for r, env in enumerate(ids):
        got.setdefault(env, []).append(
            (_row(obs, r, space), rew[r], term[r], trunc[r], row_info(infos, r))
        )
    return ids


def _compare(got: dict[int, list], want: list[list]) -> None:
    for env, records in enumerate(want):
        assert len(got[env]) == len(records), (env, len(got[env]), len(records))
        for t, (mine, theirs) in enumerate(zip(got[env], records)):
            assert_same(mine[0], theirs[0], f"env {env} record {t} obs")
            assert float(mine[1]) == float(theirs[1]), (env, t, mine[1], theirs[1])
            assert bool(mine[2]) == bool(theirs[2]) and bool(mine[3]) == bool(theirs[3])
            assert_same(mine[4], theirs[4], f"env {env} record {t} infos")


CASES = [
    # (layout, mode, info_format, batch_size)
    ({"num_workers": 2}, AutoresetMode.NEXT_STEP, "gymnasium", 2),
    ({"envs_per_worker": 1}, AutoresetMode.SAME_STEP, "gymnasium", 3),
    ({"num_workers": 1, "parent_envs": 2}, AutoresetMode.NEXT_STEP, "list", 1),
    ({"num_workers": 2}, AutoresetMode.SAME_STEP, "list", 5),
    ({"num_workers": 2, "shared_memory": False}, AutoresetMode.SAME_STEP, "legacy", 2),
    ({"envs_per_worker": 2}, AutoresetMode.NEXT_STEP, "gymnasium", 4),
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("layout", "mode", "info_format", "batch_size"),
    CASES,
    ids=[f"{'-'.join(map(str, c[0].values()))}-{c[1].value}-{c[2]}-b{c[3]}" for c in CASES],
)
@pytest.mark.parametrize("space", ["dict_nest", "box_f32", "cameras_text"])
def test_each_envs_trajectory_matches_sync(
    layout: dict[str, Any], mode: AutoresetMode, info_format: str, batch_size: int, space: str
) -> None:
    require_offered(mode, info_format)
    num_envs, steps = 5, 12
    fns = [make_zoo(space) for _ in range(num_envs)]
    rng = np.random.default_rng(3)
    actions = [rng.integers(0, 3, size=steps).tolist() for _ in range(num_envs)]
    want = _expected(fns, actions, mode, info_format)
    envs = SubprocVectorEnv(
        fns, autoreset_mode=mode, info_format=info_format, batch_size=batch_size, **layout
    )
    try:
        check_trajectories(envs, actions, want, batch_size)
    finally:
        envs.close()


def check_trajectories(envs: Any, actions: list[list[Any]], want: list, batch_size: int) -> None:
    """Run ``envs`` asynchronously (each recv's envs sent their next action) until every env
    has taken all its ``actions``; each env's records must equal ``want``'s. Then the vector
    env is idle again: the lock-step contract works and continues each env's episode."""
    got: dict[int, list] = {}
    sent = [0] * len(actions)
    envs.async_reset(seed=SEED)
    while envs.in_flight_env_ids or envs.ready_env_ids:
        ids = _record(got, envs.recv(), envs.single_observation_space)
        assert len(ids) <= batch_size
        todo = [e for e in ids if sent[e] < len(actions[e])]
        if todo:
            envs.send(np.array([actions[e][sent[e]] for e in todo]), todo)
            for e in todo:
                sent[e] += 1
    _compare(got, want)
    assert envs.drain()[0] is not None
    envs.step(envs.action_space.sample())


HOWS = ["deadline", "poll", "groups"]


def _recv_by(envs: Any, how: str, batch_size: int, turn: int) -> tuple:
    """One batch the way ``how`` takes it: a deadline batch, a poll (a blocking recv when it
    came back empty), or the next group of ``batch_size`` envs in env order."""
    if how == "deadline":
        return envs.recv(min_envs=1, max_envs=batch_size, deadline=0.005)
    if how == "poll":
        batch = envs.poll()
        return batch if len(batch[1]) else envs.recv(min_envs=1)
    groups = [
        list(range(g, min(g + batch_size, envs.num_envs)))
        for g in range(0, envs.num_envs, batch_size)
    ]
    busy = set(envs.in_flight_env_ids) | set(envs.ready_env_ids)
    group = next(
        group
        for group in groups[turn % len(groups) :] + groups[: turn % len(groups)]
        if set(group) <= busy
    )
    return envs.recv(env_ids=group)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize(
    "layout", [{"envs_per_worker": 1}, {"envs_per_worker": 2}], ids=["epw1", "epw2"]
)
@pytest.mark.parametrize("space", ["box_f32", "cameras_text"])
def test_deadline_poll_and_group_batches_keep_each_envs_trajectory(
    how: str, mode: AutoresetMode, layout: dict[str, Any], space: str
) -> None:
    num_envs, steps, batch_size = 4, 10, 2
    fns = [make_zoo(space) for _ in range(num_envs)]
    rng = np.random.default_rng(5)
    actions = [rng.integers(0, 3, size=steps).tolist() for _ in range(num_envs)]
    want = _expected(fns, actions, mode, "gymnasium")
    envs = SubprocVectorEnv(fns, autoreset_mode=mode, batch_size=batch_size, **layout)
    try:
        check_batches_by(envs, how, actions, want, batch_size)
    finally:
        envs.close()


@pytest.mark.parametrize("how", HOWS)
def test_deadline_poll_and_group_batches_in_process_keep_each_envs_trajectory(how: str) -> None:
    fns = [make_zoo("box_f32") for _ in range(4)]
    rng = np.random.default_rng(6)
    actions = [rng.integers(0, 3, size=8).tolist() for _ in range(4)]
    want = _expected(fns, actions, AutoresetMode.NEXT_STEP, "gymnasium")
    envs = InProcessVectorEnv(fns, batch_size=2)
    try:
        check_batches_by(envs, how, actions, want, 2)
    finally:
        envs.close()


def check_batches_by(
    envs: Any, how: str, actions: list[list[Any]], want: list, batch_size: int
) -> None:
    """:func:`check_trajectories` with the batches taken ``how`` (:func:`_recv_by`)."""
    got: dict[int, list] = {}
    sent = [0] * len(actions)
    envs.async_reset(seed=SEED)
    turn = 0
    while envs.in_flight_env_ids or envs.ready_env_ids:
        batch = _recv_by(envs, how, batch_size, turn)
        turn += 1
        ids = _record(got, batch, envs.single_observation_space)
        assert len(ids) <= batch_size
        if how == "groups":
            assert ids in [list(range(g, g + batch_size)) for g in range(0, len(sent), batch_size)]
        todo = [e for e in ids if sent[e] < len(actions[e])]
        if todo:
            envs.send(np.array([actions[e][sent[e]] for e in todo]), todo)
            for e in todo:
                sent[e] += 1
    _compare(got, want)


@pytest.mark.timeout(60)
def test_poll_returns_an_empty_batch_of_the_right_shape_and_loses_nothing() -> None:
    envs = SubprocVectorEnv([_slow(1.0)] * 2, envs_per_worker=1, batch_size=2)
    try:
        envs.async_reset(seed=0)
        assert sorted(envs.recv(min_envs=2)[4]["env_id"].tolist()) == [0, 1]
        envs.send(np.zeros(2, dtype=np.int64), [0, 1])
        obs, rew, term, trunc, infos = envs.poll()  # both still stepping (1 s each)
        assert obs.shape == (0, 3) and obs.dtype == envs.single_observation_space.dtype
        assert rew.shape == term.shape == trunc.shape == (0,)
        assert rew.dtype == np.float64 and term.dtype == trunc.dtype == np.bool_
        assert infos["env_id"].shape == (0,) and envs.in_flight_env_ids == [0, 1]
        obs, *_ = envs.recv(min_envs=0, max_envs=1)  # the same, through recv
        assert len(obs) == 0
        assert sorted(envs.recv(min_envs=2)[4]["env_id"].tolist()) == [0, 1]  # nothing lost
        with pytest.raises(NoAsyncCallError):
            envs.poll()
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_recv_of_env_ids_waits_for_exactly_those_and_refuses_what_cannot_come() -> None:
    envs = SubprocVectorEnv([_slow(0.0), _slow(0.0), _slow(0.4), _slow(0.0)], envs_per_worker=1)
    try:
        envs.async_reset(seed=0)
        assert envs.recv(env_ids=[3, 0])[4]["env_id"].tolist() == [3, 0]  # in the order asked
        assert sorted(envs.in_flight_env_ids + envs.ready_env_ids) == [1, 2]
        envs.send(np.zeros(2, dtype=np.int64), [3, 0])
        assert envs.recv(env_ids=[1, 2])[4]["env_id"].tolist() == [1, 2]
        with pytest.raises(ValueError, match=r"envs \[1\] are neither in flight nor holding"):
            envs.recv(env_ids=[0, 1])
        with pytest.raises(ValueError, match="min_envs, max_envs and deadline do not apply"):
            envs.recv(env_ids=[0], min_envs=1)
        envs.send(np.zeros(1, dtype=np.int64), [2])  # 0.4 s
        with pytest.raises(RecvTimeoutError, match=r"envs \[2\] of \[0, 2\] not ready"):
            envs.recv(env_ids=[0, 2], timeout=0.05)
        assert envs.recv(env_ids=[2, 0, 3])[4]["env_id"].tolist() == [2, 0, 3]  # nothing lost
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_a_deadline_batch_fills_up_to_max_envs_or_stops_at_the_deadline() -> None:
    envs = SubprocVectorEnv([_slow(0.0), _slow(2.0), _slow(0.2)], envs_per_worker=1)
    try:
        envs.async_reset(seed=0)
        envs.recv(min_envs=3)
        envs.send(np.zeros(3, dtype=np.int64), [0, 1, 2])
        # Env 0 is ready at once; within a 30 s deadline the batch fills to max_envs=2 with
        # env 2 (0.2 s), not waiting for env 1 (2 s).
        assert sorted(envs.recv(min_envs=1, max_envs=2, deadline=30.0)[4]["env_id"].tolist()) == [
            0,
            2,
        ]
        envs.send(np.zeros(2, dtype=np.int64), [0, 2])
        # Env 0 again at once, env 2 after 0.2 s, env 1 later still: a 0.05 s deadline stops
        # with env 0 (and whatever else came meanwhile: not env 1).
        ids = envs.recv(min_envs=1, max_envs=3, deadline=0.05)[4]["env_id"].tolist()
        assert 0 in ids and 1 not in ids
        envs.drain()
    finally:
        envs.close()


def _slow(seconds: float) -> Any:
    def factory() -> ZooEnv:
        return ZooEnv(step_seconds=seconds, max_steps=10**6, terminate_prob=0.0)

    return factory


@pytest.mark.timeout(60)
def test_surplus_envs_are_held_and_returned_first() -> None:
    # Resets are instant and steps take 0.5 s: a result held since the reset is returned
    # before a step sent since, whatever the machine's load.
    envs = SubprocVectorEnv([_slow(0.5)] * 4, envs_per_worker=1, batch_size=2)
    try:
        envs.async_reset(seed=0)
        first = envs.recv()[4]["env_id"].tolist()
        envs.send(np.zeros(2, dtype=np.int64), first)
        # The other two resets, not the steps sent since: the oldest results go first.
        second = envs.recv()[4]["env_id"].tolist()
        assert sorted(first + second) == [0, 1, 2, 3]
        envs.send(np.zeros(2, dtype=np.int64), second)
        returned = envs.recv()[4]["env_id"].tolist() + envs.recv()[4]["env_id"].tolist()
        assert sorted(returned) == [0, 1, 2, 3]  # every step comes back, none twice
        with pytest.raises(NoAsyncCallError):
            envs.recv()
    finally:
        envs.close()


def test_results_ready_together_go_in_the_order_their_envs_were_sent() -> None:
    # In-process, a unit answers when it is collected: the order is the rule's alone. Env 3
    # is stepped first; envs 2 then 0 are queued behind it and answer together, in one
    # command; env 2 was sent first, so it is returned first (not env 0, the lower index).
    envs = InProcessVectorEnv([make_zoo("box_f32")] * 4, batch_size=2)
    try:
        envs.async_reset(seed=SEED)
        assert envs.recv(min_envs=4)[4]["env_id"].tolist() == [0, 1, 2, 3]
        for env in (3, 2, 0):
            envs.send(np.zeros(1, dtype=np.int64), [env])
        assert envs.recv(min_envs=1, max_envs=1)[4]["env_id"].tolist() == [3]
        assert envs.in_flight_env_ids == [0, 2]
        assert envs.recv(min_envs=2, max_envs=2)[4]["env_id"].tolist() == [2, 0]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_an_env_sent_its_work_first_goes_before_one_ready_earlier() -> None:
    # Env 0's step takes 0.3 s and is sent first; envs 1 and 2 answer at once. Whichever of
    # those the first recv returns, the other is ready long before env 0, yet env 0 goes
    # first: recv serves the oldest requests among what is ready, not the first ready.
    envs = SubprocVectorEnv([_slow(0.3), _slow(0.0), _slow(0.0)], envs_per_worker=1, batch_size=1)
    try:
        envs.async_reset(seed=0)
        assert sorted(envs.recv(min_envs=3)[4]["env_id"].tolist()) == [0, 1, 2]
        for env in (0, 1, 2):
            envs.send(np.zeros(1, dtype=np.int64), [env])
        first = envs.recv()[4]["env_id"].tolist()
        assert first in ([1], [2])
        other = 3 - first[0]
        assert envs.recv(min_envs=2, max_envs=2)[4]["env_id"].tolist() == [0, other]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_recv_timeout_names_the_envs_in_flight_and_loses_nothing() -> None:
    fns = [_slow(0.0), _slow(0.0), _slow(1.0)]
    envs = SubprocVectorEnv(fns, envs_per_worker=1, batch_size=3)
    try:
        envs.async_reset(seed=0)
        envs.recv()
        envs.send(np.zeros(3, dtype=np.int64), [0, 1, 2])
        with pytest.raises(RecvTimeoutError) as info:
            envs.recv(timeout=0.3)
        assert info.value.env_indices == (2,) and "still in flight" in str(info.value)
        assert isinstance(info.value, TimeoutError)
        assert envs.in_flight_env_ids == [2] and sorted(envs.ready_env_ids) == [0, 1]
        ids = envs.recv(timeout=5.0)[4]["env_id"].tolist()
        assert sorted(ids) == [0, 1, 2]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_recv_bounds_and_nothing_in_flight() -> None:
    envs = SubprocVectorEnv([_slow(0.0)] * 4, num_workers=2, batch_size=4)
    try:
        with pytest.raises(NoAsyncCallError):
            envs.recv()
        envs.async_reset(seed=1)
        obs, rew, term, trunc, infos = envs.recv(min_envs=1, max_envs=2)
        ids = infos["env_id"].tolist()
        assert 1 <= len(ids) <= 2 and len(set(ids)) == len(ids)  # within the bounds, distinct
        assert obs.shape[0] == len(rew) == len(term) == len(ids)
        assert not term.any() and not trunc.any() and not rew.any()  # reset results
        with pytest.raises(ValueError, match=r"min_envs must be an int in \[0, 4\]"):
            envs.recv(min_envs=-1)
        with pytest.raises(ValueError, match=r"max_envs must be an int in \[1, 4\]"):
            envs.recv(max_envs=0)
        rest = envs.drain()
        assert sorted(infos["env_id"].tolist() + rest[4]["env_id"].tolist()) == [0, 1, 2, 3]
        assert len(envs.drain()[1]) == 0  # nothing left: an empty batch
        with pytest.raises(ValueError, match="batch_size must be an int in"):
            SubprocVectorEnv([_slow(0.0)] * 2, batch_size=3)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_an_env_error_surfaces_from_its_recv_and_the_others_stay_queued() -> None:
    fns = [_slow(0.0), lambda: CrashEnv("raise", at_step=1), _slow(0.0)]
    envs = SubprocVectorEnv(fns, num_workers=1, batch_size=3)  # one unit steps all three
    try:
        envs.async_reset(seed=0)
        envs.recv()
        envs.send(np.zeros(3, dtype=np.int64), [0, 1, 2])
        with pytest.raises(EnvError) as info:
            envs.recv(min_envs=3)
        assert isinstance(info.value, KeyError) and info.value.env_index == 1
        assert sorted(envs.ready_env_ids) == [0, 2]  # the others' results are kept
        ids = envs.recv(min_envs=2)[4]["env_id"].tolist()
        assert ids == [0, 2]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_lock_step_calls_while_in_flight_say_drain_and_send_refuses_bad_ids() -> None:
    envs = SubprocVectorEnv([_slow(0.05)] * 3, num_workers=1, batch_size=1)
    try:
        envs.async_reset(seed=0)
        for call in (lambda: envs.step(envs.action_space.sample()), envs.reset):
            with pytest.raises(AlreadyPendingCallError, match="drain"):
                call()
        with pytest.raises(AlreadyPendingCallError, match="drain"):
            envs.call("get_t")
        ids = envs.recv()[4]["env_id"].tolist()
        for bad, message in [
            ([7], "out of range"),
            ([ids[0], ids[0]], "repeat env"),
            ([e for e in range(3) if e not in ids][:1], "in flight or hold a result"),
            ([], "empty"),
        ]:
            with pytest.raises(ValueError, match=message):
                envs.send(np.zeros(max(len(bad), 1), dtype=np.int64), bad)
        with pytest.raises(ValueError, match="expected 1 actions"):
            envs.send(np.zeros(2, dtype=np.int64))
        envs.send(np.zeros(1, dtype=np.int64))  # the last recv's envs by default
        envs.drain()
        t = envs.call("get_t")
        assert t[ids[0]] == 1 and sum(t) == 1
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_disabled_mode_refuses_ended_envs_until_reset() -> None:
    require_offered(AutoresetMode.DISABLED)
    fns = [lambda: ZooEnv(max_steps=1)] * 2
    envs = SubprocVectorEnv(fns, num_workers=1, autoreset_mode="disabled")
    try:
        envs.async_reset(seed=0)
        envs.recv()
        envs.send(np.zeros(2, dtype=np.int64), [0, 1])
        assert envs.recv()[3].all()  # truncated after one step
        with pytest.raises(ValueError, match="DISABLED"):
            envs.send(np.zeros(1, dtype=np.int64), [0])
        envs.async_reset(options={"reset_mask": np.array([True, False])})
        assert envs.recv(max_envs=1)[4]["env_id"].tolist() == [0]
        envs.send(np.zeros(1, dtype=np.int64), [0])
        assert envs.recv()[4]["env_id"].tolist() == [0]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_a_dead_worker_raises_or_comes_back_truncated() -> None:
    fns = [_slow(0.0), lambda: CrashEnv("kill", at_step=1), _slow(0.0)]
    envs = SubprocVectorEnv(fns, envs_per_worker=1, batch_size=3)
    try:
        envs.async_reset(seed=0)
        envs.recv()
        envs.send(np.zeros(3, dtype=np.int64), [0, 1, 2])
        with pytest.raises(WorkerDiedError, match="env 1"):
            envs.recv()
    finally:
        envs.close()
    envs = SubprocVectorEnv(fns, envs_per_worker=1, batch_size=3, on_worker_failure="restart")
    try:
        envs.async_reset(seed=0)
        envs.recv()
        envs.send(np.zeros(3, dtype=np.int64), [0, 1, 2])
        _, rew, term, trunc, infos = envs.recv()
        row = infos["env_id"].tolist().index(1)
        assert trunc[row] and not term[row] and rew[row] == 0.0
        assert infos["worker_restarted"][row] and infos["_worker_restarted"].sum() == 1
        assert len(envs.restarts) == 1
        envs.send(np.zeros(3, dtype=np.int64))  # the rebuilt env steps on
        assert sorted(envs.recv()[4]["env_id"].tolist()) == [0, 1, 2]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_image_observations_and_slots_after_async() -> None:
    image = spaces.Box(0, 255, (48, 48, 3), np.uint8)  # large enough for observation slots

    def fn() -> ZooEnv:
        return ZooEnv(image, max_steps=10**6, terminate_prob=0.2)

    # the installed gymnasium's default mode (0.29: the same step's), the oracle's too
    envs = SubprocVectorEnv([fn] * 4, num_workers=2, batch_size=2)
    oracle = sync_vector_env([fn] * 4, autoreset_mode=envs.autoreset_mode)
    try:
        assert envs.block_plan.obs_slots > 0
        assert_same(envs.reset(seed=5), oracle.reset(seed=5), "lock-step reset")
        envs.send(np.zeros(4, dtype=np.int64), [0, 1, 2, 3])  # async from an idle env
        obs, *_, infos = envs.drain()
        want = oracle.step(np.zeros(4, dtype=np.int64))
        assert_same(obs[np.argsort(infos["env_id"])], want[0], "async step")
        assert_same(envs.step(np.ones(4, dtype=np.int64)), oracle.step(np.ones(4, dtype=np.int64)))
    finally:
        envs.close()
        oracle.close()


def _quiet(max_steps: int = 4) -> Any:
    def factory() -> ZooEnv:  # no infos: every answer is a plain OK, the results in the block
        return ZooEnv(quiet=True, max_steps=max_steps, terminate_prob=0.2)

    return factory


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_results_left_in_the_block_and_sends_of_both_kinds_match_sync(mode: AutoresetMode) -> None:
    num_envs, steps = 6, 10
    fns = [_quiet() for _ in range(num_envs)]
    rng = np.random.default_rng(5)
    actions = [rng.integers(0, 3, size=steps).tolist() for _ in range(num_envs)]
    want = _expected(fns, actions, mode, "gymnasium")
    # One env per recv: a worker's other envs are then sent while it is busy, and queue up,
    # some stored in the block (an array) and some by value (a list) for the same command.
    envs = SubprocVectorEnv(fns, envs_per_worker=3, batch_size=1, autoreset_mode=mode)
    got: dict[int, list] = {}
    sent = [0] * num_envs
    turn = 0
    try:
        envs.async_reset(seed=SEED)
        while envs.in_flight_env_ids or envs.ready_env_ids:
            for e in _record(got, envs.recv(), envs.single_observation_space):
                if sent[e] < steps:
                    action = actions[e][sent[e]]
                    envs.send(np.array([action]) if turn % 2 else [action], [e])
                    sent[e] += 1
                    turn += 1
        _compare(got, want)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_a_held_result_survives_the_restart_of_its_worker() -> None:
    fns = [_quiet(10**6), lambda: CrashEnv("kill", at_step=1, quiet=True)]
    oracle = SyncVectorEnv([fns[0]])
    envs = SubprocVectorEnv(fns, envs_per_worker=2, batch_size=1, on_worker_failure="restart")
    try:
        want_reset, _ = oracle.reset(seed=SEED)
        want_step = oracle.step(np.array([2]))[0]
        envs.async_reset(seed=SEED)
        obs, *_, infos = envs.recv()  # env 0's reset; env 1's is held
        assert infos["env_id"].tolist() == [0]
        assert_same(obs[0], want_reset[0], "env 0 reset")
        envs.send(np.array([2]), [0])
        assert envs.recv()[4]["env_id"].tolist() == [1]
        envs.send(np.array([0]), [1])  # queued behind env 0's step; kills the worker
        # Both: env 0's step (held while its worker died and was rebuilt), env 1 truncated.
        obs, _, _, trunc, infos = envs.recv(min_envs=2)
        rows = {e: r for r, e in enumerate(infos["env_id"].tolist())}
        assert sorted(rows) == [0, 1] and len(envs.restarts) == 1
        assert_same(obs[rows[0]], want_step[0], "env 0's step, not the rebuilt env's reset")
        assert trunc[rows[1]] and infos["worker_restarted"][rows[1]]
        assert not trunc[rows[0]] and not infos["worker_restarted"][rows[0]]
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_async_stats_count_what_the_loop_did() -> None:
    envs = SubprocVectorEnv([_slow(0.0)] * 4, envs_per_worker=1, batch_size=2)
    try:
        assert envs.async_stats().verdict == "no data"
        envs.async_reset(seed=0)
        sizes, asked = [], []
        for turn in range(20):
            max_envs = 2 if turn % 2 else 4
            ids = envs.recv(min_envs=1, max_envs=max_envs)[4]["env_id"].tolist()
            sizes.append(len(ids))
            asked.append(max_envs)
            live = envs.async_stats()  # readable while envs are in flight
            assert live.recv_calls == turn + 1
            envs.send(np.zeros(len(ids), dtype=np.int64), ids)
        stats = envs.async_stats(reset=True)
        assert stats.recv_calls == stats.batches == 20
        assert stats.envs_returned == sum(sizes)
        assert stats.mean_batch == pytest.approx(sum(sizes) / 20)
        assert stats.fill_ratio == pytest.approx(sum(sizes) / sum(asked))
        partial = sum(k < m for k, m in zip(sizes, asked))
        assert stats.partial_share == pytest.approx(partial / 20)
        assert stats.queue_p50_s is not None and stats.queue_p95_s >= stats.queue_p50_s >= 0
        assert stats.policy_p50_s is not None and stats.policy_p95_s >= stats.policy_p50_s >= 0
        assert 0 <= stats.consumer_waiting <= 1 and 0 <= stats.envs_waiting <= 1
        assert str(stats).startswith(stats.verdict + ":")
        fresh = envs.async_stats()
        assert fresh.recv_calls == 0 and fresh.queue_p50_s is None
        envs.drain()
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("step_s", "policy_s", "verdict"), [(0.05, 0.0, "env-bound"), (0.0, 0.05, "policy-bound")]
)
def test_async_stats_say_which_side_the_loop_waits_on(
    step_s: float, policy_s: float, verdict: str
) -> None:
    # Envs of 50 ms against a policy of none, and the other way round: a 50:1 imbalance
    # whichever way, which no machine load turns over.
    envs = SubprocVectorEnv([_slow(step_s)] * 2, envs_per_worker=1, batch_size=2)
    try:
        envs.async_reset(seed=0)
        envs.recv(min_envs=2)
        envs.async_stats(reset=True)
        for _ in range(8):
            envs.send(np.zeros(2, dtype=np.int64), [0, 1])
            ids = envs.recv(min_envs=2)[4]["env_id"].tolist()
            assert sorted(ids) == [0, 1]
            if policy_s:
                time.sleep(policy_s)  # the policy's forward pass, releasing the CPU
        stats = envs.async_stats()
        assert stats.verdict == verdict, str(stats)
        # full batches: nothing to suggest but the side that bounds the loop
        assert stats.advice.startswith(verdict), stats.advice
        if verdict == "policy-bound":
            assert stats.policy_p50_s >= policy_s
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_async_stats_suggest_stages_when_envs_and_policy_take_turns() -> None:
    # 40 ms steps and a 40 ms policy, one after the other: each side waits about half the
    # time, 40 ms a recv, whatever the machine's load
    envs = SubprocVectorEnv([_slow(0.04)] * 2, envs_per_worker=1, batch_size=2)
    try:
        assert envs.async_stats().advice == ""
        envs.async_reset(seed=0)
        envs.recv(min_envs=2)
        envs.async_stats(reset=True)
        for _ in range(6):
            envs.send(np.zeros(2, dtype=np.int64), [0, 1])
            envs.recv(min_envs=2)
            time.sleep(0.04)
        stats = envs.async_stats()
        assert stats.advice.startswith("the envs and the policy take turns"), str(stats)
        assert "env_groups(2)" in stats.advice
        assert 1.5 <= stats.overlap_bound <= 2.0
    finally:
        envs.close()


def test_async_stats_advice_for_small_batches_of_a_policy_bound_loop() -> None:
    window = AsyncStats(
        wall_s=1.0,
        recv_calls=100,
        batches=100,
        envs_returned=200,
        mean_batch=2.0,
        fill_ratio=0.25,
        partial_share=1.0,
        queue_p50_s=None,
        queue_p95_s=None,
        policy_p50_s=None,
        policy_p95_s=None,
        consumer_waiting=0.05,
        envs_waiting=0.9,
    )
    assert window.verdict == "policy-bound"
    assert window.advice.startswith("policy-bound with batches 25% full: a larger min_envs")
    # both wait a fifth of the time, but 2 ms a recv of which 0.4 ms waiting: no stages
    quick = dataclasses.replace(window, recv_calls=500, consumer_waiting=0.2, envs_waiting=0.7)
    assert not quick.advice.startswith("the envs and the policy")
    slow = dataclasses.replace(quick, recv_calls=50)  # 20 ms a recv, 4 ms of it waiting
    assert slow.advice.startswith("the envs and the policy take turns")
    assert slow.overlap_bound == pytest.approx(1 / 0.7)


@pytest.mark.timeout(60)
def test_env_groups_are_whole_workers_and_a_staged_loop_waits_on_one_group() -> None:
    envs = SubprocVectorEnv([_slow(0.0), _slow(0.0), _slow(0.3), _slow(0.3)], envs_per_worker=1)
    try:
        assert envs.env_groups(2) == [[0, 1], [2, 3]]
        assert envs.env_groups(1) == [[0, 1, 2, 3]]
        with pytest.raises(ValueError, match="cannot be split into 3 groups of whole units"):
            envs.env_groups(3)
        fast, slow = envs.env_groups(2)
        envs.async_reset(seed=0)
        envs.recv(env_ids=fast + slow)
        envs.send(np.zeros(4, dtype=np.int64), fast + slow)
        # The fast group comes back while the slow one is still stepping (0.3 s)
        assert envs.recv(env_ids=fast)[4]["env_id"].tolist() == fast
        assert envs.in_flight_env_ids == slow
        with pytest.raises(AlreadyPendingCallError, match="drain"):
            envs.step(np.zeros(4, dtype=np.int64))  # a lock-step call while a group flies
        envs.send(np.zeros(2, dtype=np.int64), fast)
        assert envs.recv(env_ids=slow)[4]["env_id"].tolist() == slow
        assert envs.recv(env_ids=fast)[4]["env_id"].tolist() == fast
        envs.reset(seed=1)  # idle again: lock-step works
    finally:
        envs.close()
    two_per_worker = SubprocVectorEnv([_slow(0.0)] * 4, envs_per_worker=2)
    try:
        assert two_per_worker.env_groups(2) == [[0, 1], [2, 3]]
        with pytest.raises(ValueError, match="num_workers a multiple of 4"):
            two_per_worker.env_groups(4)
    finally:
        two_per_worker.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_a_worker_death_in_one_group_leaves_the_other_group_stepping(policy: str) -> None:
    fns = [_slow(0.0), _slow(0.0), lambda: CrashEnv("kill", at_step=1), _slow(0.0)]
    envs = SubprocVectorEnv(fns, envs_per_worker=1, on_worker_failure=policy)
    try:
        first, second = envs.env_groups(2)
        envs.async_reset(seed=0)
        envs.recv(env_ids=first + second)
        envs.send(np.zeros(4, dtype=np.int64), first + second)
        if policy == "raise":
            # As in lock-step, the first recv to see the death raises it: the vector env is
            # broken, whichever group that recv waits for.
            with pytest.raises(WorkerDiedError, match="env 2"):
                envs.recv(env_ids=first)
                envs.recv(env_ids=second)
            return
        assert envs.recv(env_ids=first)[4]["env_id"].tolist() == first  # untouched
        _, rew, term, trunc, infos = envs.recv(env_ids=second)
        assert not term.any()
        assert trunc.tolist() == [True, False] and rew[0] == 0.0
        assert infos["worker_restarted"][0] and not infos["_worker_restarted"][1]
        envs.send(np.zeros(2, dtype=np.int64), second)  # the rebuilt env steps on
        assert envs.recv(env_ids=second)[4]["env_id"].tolist() == second
    finally:
        envs.close()
