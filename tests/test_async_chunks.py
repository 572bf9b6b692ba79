"""``send_chunk``: action chunks on some envs while others are in flight, results through
``recv``; per env against one-env references (tests/chunks.py) in every layout and
autoreset mode, interleaved with single steps; errors, worker deaths, the state machine.

Ray's runs are in tests/test_ray.py (the same check, on its module's local Ray).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError

from subvec import EnvError, SubprocVectorEnv, WorkerDiedError
from subvec._compat import AutoresetMode
from tests.chunks import check_async_chunks, sample_chunks
from tests.envs import CrashEnv, ZooEnv
from tests.oracle import DEFAULT_MODE, offered_modes, require_offered
from tests.vectorisers import make_vector_env

pytestmark = pytest.mark.timeout(60)

MODES = offered_modes()
LAYOUTS = ["workers", "one_per_worker", "parent_envs", "pipes", "in_process"]
OBS = spaces.Dict(
    {"pos": spaces.Box(0, 9, shape=(2, 3), dtype=np.float32), "id": spaces.Discrete(5)}
)
BOX_ACT = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)


def _zoo() -> gym.Env[Any, Any]:
    return ZooEnv(OBS, BOX_ACT, max_steps=6, terminate_prob=0.15)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_async_chunks_match_one_env_references(layout: str, mode: AutoresetMode) -> None:
    fns = [_zoo] * 6
    envs = make_vector_env(layout, fns, autoreset_mode=mode)
    try:
        # sets that cut across the workers: a worker runs one set's chunk, then the other's
        ended = check_async_chunks(envs, fns, mode, [[0, 3, 4], [1, 2, 5]])
        assert ended > 0  # episodes ended inside chunks (autoreset inside a chunk checked)
    finally:
        envs.close()


def test_async_chunks_on_worker_groups_in_a_staged_loop() -> None:
    fns = [lambda: gym.make("CartPole-v1")] * 8
    envs = SubprocVectorEnv(fns, envs_per_worker=2)
    try:
        groups = envs.env_groups(2)
        check_async_chunks(envs, fns, envs.autoreset_mode, groups, rounds=4)
    finally:
        envs.close()


def _chunk(n: int, k: int) -> np.ndarray:
    return np.zeros((n, k), dtype=np.int64)


def test_the_state_machine_around_chunks_in_flight() -> None:
    fns = [lambda: ZooEnv(max_steps=10**6, terminate_prob=0.0)] * 4
    envs = SubprocVectorEnv(fns, envs_per_worker=1)
    try:
        envs.async_reset(seed=0)
        envs.drain()
        envs.send_chunk(_chunk(2, 3), [0, 1])
        with pytest.raises(AlreadyPendingCallError, match="drain"):
            envs.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(AlreadyPendingCallError):
            envs.step_chunk(_chunk(4, 3))
        with pytest.raises(ValueError, match=r"K=3 .* in flight and this one is K=2"):
            envs.send_chunk(_chunk(2, 2), [2, 3])
        with pytest.raises(ValueError, match="in flight or hold a result"):
            envs.send_chunk(_chunk(1, 3), [1])
        with pytest.raises(ValueError, match=r"expected .*\(2, K\)|shape"):
            envs.send_chunk(np.zeros((3, 3), dtype=np.int64), [2, 3])
        # the refused sends sent nothing
        assert sorted(envs.in_flight_env_ids + envs.ready_env_ids) == [0, 1]
        envs.send(np.zeros(2, dtype=np.int64), [2, 3])  # steps beside the chunk
        # held results of two shapes (drain waits for all): a batch holds one
        with pytest.raises(ValueError, match="different shapes"):
            envs.drain()
        assert sorted(envs.ready_env_ids) == [0, 1, 2, 3]  # nothing lost
        with pytest.raises(ValueError, match="different shapes"):
            envs.recv(env_ids=[1, 2])
        _, rewards, _, _, infos = envs.recv(max_envs=4)  # the oldest's shape: the chunk
        assert rewards.shape == (2, 3) and infos["env_id"].tolist() == [0, 1]
        assert infos["chunk_steps"].tolist() == [3, 3]
        _, rewards, _, _, infos = envs.recv(max_envs=4)
        assert rewards.shape == (2,) and infos["env_id"].tolist() == [2, 3]
        # idle again: lock-step calls work; the envs stepped 3 and 1 times
        assert envs.call("get_t") == (3, 3, 1, 1)
        # a chunk of one sub-step is still a chunk: (n, 1)
        envs.send_chunk(_chunk(4, 1), [0, 1, 2, 3])
        _, rewards, _, _, infos = envs.recv(env_ids=[3, 2, 1, 0])
        assert rewards.shape == (4, 1) and infos["chunk_steps"].tolist() == [1, 1, 1, 1]
    finally:
        envs.close()


def test_an_env_error_in_a_chunk_surfaces_from_its_recv_and_the_others_are_kept() -> None:
    fns = [lambda: ZooEnv(max_steps=10**6, terminate_prob=0.0)] * 3
    fns[1] = lambda: CrashEnv("raise", at_step=2, max_steps=10**6, terminate_prob=0.0)
    envs = SubprocVectorEnv(fns, num_workers=1)  # one worker runs all three
    try:
        envs.async_reset(seed=0)
        envs.drain()
        envs.send_chunk(_chunk(3, 4), [0, 1, 2])
        with pytest.raises(EnvError) as info:
            envs.recv(env_ids=[0, 1, 2])
        assert isinstance(info.value, KeyError) and info.value.env_index == 1
        assert info.value.command == "send_chunk" and "during send_chunk" in str(info.value)
        notes = "".join(getattr(info.value, "__notes__", ()))
        assert "raised at sub-step 1 of an action chunk of 4" in notes
        infos = envs.recv(env_ids=[0, 2])[4]
        assert infos["chunk_steps"].tolist() == [4, 4]
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("policy", "all_obs"), [("raise", False), ("restart", False), ("restart", True)]
)
def test_a_worker_lost_mid_chunk(policy: str, all_obs: bool) -> None:
    fns = [lambda: ZooEnv(max_steps=10**6, terminate_prob=0.0)] * 4
    fns[1] = lambda: CrashEnv("kill", at_step=3, max_steps=10**6, terminate_prob=0.0)
    envs = SubprocVectorEnv(fns, envs_per_worker=2, on_worker_failure=policy)
    try:
        groups = envs.env_groups(2)
        envs.async_reset(seed=0)
        envs.drain()
        envs.send_chunk(_chunk(2, 5), groups[0], all_obs=all_obs)
        envs.send_chunk(_chunk(2, 5), groups[1], all_obs=all_obs)
        if policy == "raise":
            with pytest.raises(WorkerDiedError, match=r"envs 0\.\.1\) died"):
                envs.recv(env_ids=groups[0])
            return
        obs, _, terms, truncs, infos = envs.recv(env_ids=groups[0])
        if all_obs:  # the sub-steps before the loss as run, then the reset's observation
            assert obs.shape[:2] == (2, 5)
            np.testing.assert_array_equal(obs[1, 2], obs[1, 4])
            assert not np.array_equal(obs[1, 1], obs[1, 2])
        # env 1 was lost at its third sub-step (it died inside it): two kept, then truncated
        assert infos["chunk_steps"].tolist()[1] == 3
        assert truncs[1].tolist() == [False, False, True, False, False]
        assert infos["worker_restarted"][1, 2] and infos["_worker_restarted"].sum() >= 1
        # its worker's other env was lost too, at the sub-step its progress count says
        assert truncs[0].any() and infos["_worker_restarted"][0].any()
        assert not terms.any()
        _, _, _, truncs, infos = envs.recv(env_ids=groups[1])  # the other group ran its chunk
        assert not truncs.any() and infos["chunk_steps"].tolist() == [5, 5]
        envs.send_chunk(_chunk(4, 2), [0, 1, 2, 3])  # the rebuilt worker runs on
        assert envs.recv(env_ids=[0, 1, 2, 3])[4]["chunk_steps"].tolist() == [2, 2, 2, 2]
    finally:
        envs.close()


def test_chunks_of_other_dtypes_travel_by_value_and_match() -> None:
    fns = [_zoo] * 4
    envs = SubprocVectorEnv(fns, envs_per_worker=2, autoreset_mode=DEFAULT_MODE)
    ref = SubprocVectorEnv(fns, envs_per_worker=2, autoreset_mode=DEFAULT_MODE)
    try:
        actions = sample_chunks(envs.single_action_space, 4, 3, seed=1).astype(np.float64)
        ref.reset(seed=3)
        want = ref.step_chunk(actions)
        envs.async_reset(seed=3)
        envs.drain()
        envs.send_chunk(actions[[2, 3]], [2, 3])
        envs.send_chunk(actions[[0, 1]], [0, 1])
        got = envs.recv(env_ids=[0, 1, 2, 3])
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0]["pos"], want[0]["pos"])
    finally:
        envs.close()
        ref.close()


def test_frozen_envs_in_async_chunks_match_step_chunk() -> None:
    require_offered(AutoresetMode.DISABLED)  # freeze is DISABLED's (gymnasium >= 1.0)
    fns = [lambda: ZooEnv(max_steps=3, terminate_prob=0.0)] * 4
    kw = {"envs_per_worker": 2, "freeze": True}
    envs, twin = SubprocVectorEnv(fns, **kw), SubprocVectorEnv(fns, **kw)
    try:
        twin.reset(seed=0)
        envs.async_reset(seed=0)
        envs.drain()
        for t in range(3):  # episodes of 3 steps: ended, then frozen, in chunks of 2
            actions = np.full((4, 2), t, dtype=np.int64)
            want = twin.step_chunk(actions)
            envs.send_chunk(actions[2:], [2, 3])
            envs.send_chunk(actions[:2], [0, 1])
            got = [envs.recv(env_ids=[0, 1]), envs.recv(env_ids=[2, 3])]
            for i, key in enumerate(("obs", "rewards", "terminations", "truncations")):
                np.testing.assert_array_equal(np.concatenate([g[i] for g in got]), want[i], key)
            for key in ("chunk_steps", "frozen", "_frozen"):
                if key in want[4]:
                    joined = np.concatenate([g[4][key] for g in got])
                    np.testing.assert_array_equal(joined, want[4][key], f"{t} {key}")
            assert ("frozen" in want[4]) == ("frozen" in got[0][4]), t
    finally:
        envs.close()
        twin.close()


def _quiet_zoo() -> gym.Env[Any, Any]:
    # no step infos: plain answers, whose results recv gathers from the chunk arrays (an end
    # still sends its events: such a unit's results are copied out, and batches mix both)
    return ZooEnv(OBS, BOX_ACT, max_steps=6, terminate_prob=0.15, quiet=True)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("layout", ["workers", "in_process"])
def test_plain_async_chunks_match_one_env_references(layout: str, mode: AutoresetMode) -> None:
    fns = [_quiet_zoo] * 6
    envs = make_vector_env(layout, fns, autoreset_mode=mode)
    try:
        assert check_async_chunks(envs, fns, mode, [[0, 3, 4], [1, 2, 5]]) > 0
    finally:
        envs.close()


def test_a_held_chunk_result_survives_the_restart_of_its_worker() -> None:
    fns = [lambda: ZooEnv(max_steps=10**6, terminate_prob=0.0, quiet=True)] * 2
    fns[1] = lambda: CrashEnv("kill", at_step=1, max_steps=10**6, terminate_prob=0.0, quiet=True)
    envs = SubprocVectorEnv(fns, num_workers=1, on_worker_failure="restart")
    twin = SubprocVectorEnv(fns[:1], num_workers=1)
    try:
        twin.reset(seed=0)
        want = twin.step_chunk(np.ones((1, 3), dtype=np.int64))
        envs.async_reset(seed=0)
        envs.drain()
        envs.send_chunk(np.ones((1, 3), dtype=np.int64), [0])
        # queued behind the chunk on the same worker: sent once the chunk's answer is held
        # (in the chunk arrays and the block's rows), and it kills that worker
        envs.send(np.zeros(1, dtype=np.int64), [1])
        _, _, _, truncs, infos = envs.recv(env_ids=[1])
        assert truncs.all() and infos["worker_restarted"].all()
        obs, rewards, terms, truncs, infos = envs.recv(env_ids=[0])
        np.testing.assert_array_equal(obs, want[0])
        np.testing.assert_array_equal(rewards, want[1])
        assert infos["chunk_steps"].tolist() == [3] and not (terms.any() or truncs.any())
    finally:
        envs.close()
        twin.close()


@pytest.mark.parametrize("next_k", [5, 16], ids=["same_arrays", "larger_arrays"])
def test_a_held_chunk_result_outlives_a_chunk_of_another_k(next_k: int) -> None:
    # Env 1's K=3 result is held in its rows when env 0 is sent a chunk of another K: the
    # arrays are reshaped (K=5: env 0's rows then cover env 1's) or replaced (K=16).
    fns = [lambda: ZooEnv(max_steps=10**6, terminate_prob=0.0, quiet=True)] * 2
    envs = SubprocVectorEnv(fns, num_workers=1)  # one command, one answer for both
    twin = SubprocVectorEnv(fns, num_workers=1)
    try:
        twin.reset(seed=0)
        want = twin.step_chunk(np.ones((2, 3), dtype=np.int64))
        envs.reset(seed=0)
        envs.send_chunk(np.ones((2, 3), dtype=np.int64), [0, 1])
        envs.recv(env_ids=[0])
        assert envs.ready_env_ids == [1]  # answered with env 0, held
        envs.send_chunk(np.ones((1, next_k), dtype=np.int64), [0])
        _, rewards, _, _, infos = envs.recv(env_ids=[0])
        assert rewards.shape == (1, next_k) and infos["chunk_steps"].tolist() == [next_k]
        obs, rewards, terms, truncs, infos = envs.recv(env_ids=[1])
        np.testing.assert_array_equal(obs, want[0][1:])
        np.testing.assert_array_equal(rewards, want[1][1:])
        np.testing.assert_array_equal(terms, want[2][1:])
        np.testing.assert_array_equal(truncs, want[3][1:])
        assert infos["chunk_steps"].tolist() == [3]
    finally:
        envs.close()
        twin.close()
