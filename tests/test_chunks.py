"""``step_chunk`` on SubprocVectorEnv: every layout, every autoreset mode, against per-env
one-env SyncVectorEnv references (tests/chunks.py); errors, failures, the state machine.

The in-process engine's own tests are tests/test_chunk_slab.py; Ray's are in tests/test_ray.py.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError

from subvec import EnvError, SubprocVectorEnv, WorkerDiedError
from subvec._compat import GYM_029, AutoresetMode
from subvec._process import wake as _wake
from subvec._process.shm import list_segments
from tests.chunks import Oracle, check_chunk, sample_chunks
from tests.envs import CrashEnv, ZooEnv
from tests.oracle import DEFAULT_MODE, offered_modes, require_offered
from tests.vectorisers import check_built_as_asked, make_vector_env

pytestmark = pytest.mark.timeout(60)

MODES = offered_modes()
LAYOUTS = ["workers", "single_worker", "parent_envs", "pipes", "in_process"]
OBS = spaces.Box(0, 9, shape=(2, 3), dtype=np.float32)
BOX_ACT = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)


def _cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def _zoo() -> gym.Env[Any, Any]:
    return ZooEnv(OBS, BOX_ACT, max_steps=6, terminate_prob=0.1)


def run_against_oracle(
    envs: Any, fns: list[Any], mode: AutoresetMode, chunks: list[int], seed: int = 0
) -> int:
    """Step ``envs`` with chunks of the sizes ``chunks`` (alternating stop_on_done and
    all_obs) and check each against the oracle; returns the episodes that ended inside one."""
    n = len(fns)
    oracle = Oracle(fns, mode)
    envs.reset(seed=seed)
    oracle.reset(seed)
    inside = 0
    for t, chunk in enumerate(chunks):
        actions = sample_chunks(envs.single_action_space, n, chunk, seed=t)
        stop, all_obs = t % 3 == 1, t % 2 == 1
        got = envs.step_chunk(actions, stop_on_done=stop, all_obs=all_obs)
        expected = oracle.chunk(actions, chunk, stop)
        check_chunk(expected, chunk, *got, all_obs=all_obs, where=f"chunk {t} (K={chunk})")
        inside += sum(
            1
            for e in expected
            for k in range(min(e.steps, chunk - 1))
            if e.terminations[k] or e.truncations[k]
        )
        if mode is AutoresetMode.DISABLED:
            last = got[4]["chunk_steps"] - 1
            ended = got[2][np.arange(n), last] | got[3][np.arange(n), last]
            if ended.any():
                envs.reset(options={"reset_mask": ended})
                oracle.reset_envs(ended)
    return inside


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("vectoriser", LAYOUTS)
def test_chunks_match_sync_per_env(vectoriser: str, mode: AutoresetMode) -> None:
    fns = [_cartpole] * 5
    with make_vector_env(vectoriser, fns, autoreset_mode=mode) as envs:
        check_built_as_asked(vectoriser, envs)
        inside = run_against_oracle(envs, fns, mode, [1, 3, 8, 8, 3, 8, 1, 8, 8, 8])
    assert inside >= 1, "no CartPole episode ended inside a chunk"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_box_actions_and_infos_match_sync_per_env(mode: AutoresetMode) -> None:
    """Box actions, infos of every shape (final_obs / final_info under SAME_STEP)."""
    fns = [_zoo] * 4
    with SubprocVectorEnv(fns, num_workers=2, autoreset_mode=mode) as envs:
        run_against_oracle(envs, fns, mode, [4, 1, 8, 5, 8, 2])


def test_steps_and_chunks_interleave_on_one_trajectory() -> None:
    fns = [_cartpole] * 4
    mode = DEFAULT_MODE
    oracle = Oracle(fns, mode)
    rng = np.random.default_rng(0)
    with SubprocVectorEnv(fns, num_workers=2, autoreset_mode=mode) as envs:
        envs.reset(seed=1)
        oracle.reset(1)
        for t in range(24):
            if t % 3 == 0:
                actions = rng.integers(0, 2, size=4)
                obs, rewards, terms, truncs, _ = envs.step(actions)
                for i, (o, r, te, tr, _) in enumerate(oracle.step(actions)):
                    np.testing.assert_array_equal(obs[i], o[0])
                    assert (rewards[i], terms[i], truncs[i]) == (r[0], te[0], tr[0])
            else:
                actions = rng.integers(0, 2, size=(4, 5))
                got = envs.step_chunk(actions)
                check_chunk(oracle.chunk(actions, 5, False), 5, *got, where=f"chunk {t}")


@pytest.mark.parametrize("vectoriser", ["workers", "parent_envs", "in_process"])
def test_chunks_of_one_kind_in_a_row_each_run_their_own_actions(vectoriser: str) -> None:
    """The usual chunk's arrays and command are kept for the next chunk of the same kind:
    every call's actions still land, and a change of kind in between (the actions' dtype,
    stop_on_done, K, all_obs) is taken up and then left again."""
    fns = [_cartpole] * 4
    mode = DEFAULT_MODE
    oracle = Oracle(fns, mode)
    kinds = [(8, np.int64, False, False)] * 3 + [
        (8, np.int32, False, False),  # not the space's dtype: the actions in the command
        (8, np.int64, False, False),
        (8, np.int64, True, False),
        (8, np.int64, False, True),
        (1, np.int64, False, False),
        (4, np.int64, False, False),
        (8, np.int64, False, False),
        (8, np.int64, False, False),
    ]
    with make_vector_env(vectoriser, fns, autoreset_mode=mode) as envs:
        envs.reset(seed=3)
        oracle.reset(3)
        for t, (chunk, dtype, stop, all_obs) in enumerate(kinds):
            actions = sample_chunks(envs.single_action_space, 4, chunk, seed=t).astype(dtype)
            got = envs.step_chunk(actions, stop_on_done=stop, all_obs=all_obs)
            expected = oracle.chunk(actions, chunk, stop)
            check_chunk(expected, chunk, *got, all_obs=all_obs, where=f"chunk {t} (K={chunk})")


def test_infos_gain_the_chunk_axis() -> None:
    """RecordEpisodeStatistics' ``episode`` stays reachable: (num_envs, K) with its mask."""

    def make() -> gym.Env[Any, Any]:
        return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))

    with SubprocVectorEnv([make] * 2, num_workers=1) as envs:
        envs.reset(seed=0)
        ended = 0
        for _ in range(10):
            _, _, terms, truncs, infos = envs.step_chunk(np.ones((2, 8), dtype=np.int64))
            assert infos["chunk_steps"].tolist() == [8, 8]
            if GYM_029 and "final_info" in infos:  # the same step's reset: in final_info
                mask = infos["_final_info"]
                assert mask.shape == (2, 8)
                np.testing.assert_array_equal(mask, terms | truncs)
                assert all(
                    infos["final_info"][i, k]["episode"]["l"] > 0 for i, k in zip(*mask.nonzero())
                )
                ended += int(mask.sum())
            elif "episode" in infos:
                mask = infos["_episode"]
                assert mask.shape == (2, 8)
                np.testing.assert_array_equal(mask, terms | truncs)
                assert infos["episode"]["r"].shape == (2, 8)
                assert (infos["episode"]["l"][mask] > 0).all()
                ended += int(mask.sum())
        assert ended >= 2


def test_chunk_k_grows_and_the_block_is_replaced() -> None:
    def ours() -> set[str]:  # this process's segments (other test runs may share /dev/shm)
        return {s for s in list_segments() if s.startswith(f"subvec_{os.getpid()}_")}

    before = ours()
    with SubprocVectorEnv([_cartpole] * 3, num_workers=2) as envs:
        envs.reset(seed=0)
        for chunk in (2, 8, 9, 33, 4):
            *_, infos = envs.step_chunk(np.zeros((3, chunk), dtype=np.int64), all_obs=chunk > 8)
            assert infos["chunk_steps"].shape == (3,)
        spec = envs._chunks.store.views.spec  # type: ignore[attr-defined]
        assert spec.capacity == 64 and spec.obs_rows
        # the main block and one chunk block: a replaced one is unlinked at once
        assert len(ours() - before) == 2
    assert not ours() - before


def test_stats_count_sub_steps_as_steps() -> None:
    with SubprocVectorEnv([_cartpole] * 4, num_workers=2) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        *_, infos = envs.step_chunk(np.zeros((4, 6), dtype=np.int64), stop_on_done=True)
        steps = sum(s.steps for s in envs.stats())
        assert steps == 4 + int(infos["chunk_steps"].sum())


@pytest.mark.parametrize("mode", offered_modes([AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]))
def test_chunks_through_the_futex_protocol(
    monkeypatch: pytest.MonkeyPatch, mode: AutoresetMode
) -> None:
    """Chunks go as frames behind the futex wake-up (its fast path is for plain steps)."""
    if not _wake.available():
        pytest.skip("no shared futex here")
    monkeypatch.setenv("SUBVEC_WAKE", "futex")
    fns = [_cartpole] * 4
    with SubprocVectorEnv(fns, num_workers=3, autoreset_mode=mode) as envs:
        assert envs.layout.wake == "futex"
        run_against_oracle(envs, fns, mode, [3, 8, 1, 8, 5])


def test_chunks_take_turns_under_max_concurrency() -> None:
    """Four one-env workers, two at a time: a chunk runs envs as a step does."""
    fns = [_cartpole] * 4
    with SubprocVectorEnv(fns, num_workers=4, max_concurrency=2) as envs:
        assert envs.layout.max_active == 2
        run_against_oracle(envs, fns, AutoresetMode.NEXT_STEP, [4, 8, 2])


# --- refused before anything is sent ------------------------------------------------------


@pytest.mark.parametrize(
    ("actions", "error", "message"),
    [
        (np.zeros((3, 4), np.int64), ValueError, r"shape \(4, K\), got shape \(3, 4\)"),
        (np.zeros(4, np.int64), ValueError, r"one action per env.*\[:, None\]"),
        (np.zeros((4, 0), np.int64), ValueError, "K >= 1, got K = 0"),
        (np.zeros((4, 3), np.float32), TypeError, "float32 cannot be cast"),
    ],
    ids=["env_count", "no_chunk_axis", "empty_chunk", "dtype_kind"],
)
def test_bad_chunks_are_refused_and_the_env_stays_usable(
    actions: np.ndarray, error: type[Exception], message: str
) -> None:
    with SubprocVectorEnv([_cartpole] * 4, num_workers=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(error, match=message):
            envs.step_chunk(actions)
        _, rewards, *_ = envs.step_chunk(np.ones((4, 2), dtype=np.int64))
        assert rewards.shape == (4, 2)


def test_step_chunk_while_envs_are_in_flight_asks_to_drain() -> None:
    with SubprocVectorEnv([_cartpole] * 2, num_workers=2) as envs:
        envs.async_reset(seed=0)
        with pytest.raises(AlreadyPendingCallError, match=r"step_chunk.*drain\(\)"):
            envs.step_chunk(np.zeros((2, 3), dtype=np.int64))
        envs.drain()
        envs.reset(seed=0)
        assert envs.step_chunk(np.zeros((2, 3), dtype=np.int64))[1].shape == (2, 3)


def test_disabled_refuses_an_ended_env_until_reset() -> None:
    require_offered(AutoresetMode.DISABLED)
    fns = [lambda: ZooEnv(OBS, BOX_ACT, max_steps=2, terminate_prob=0.0)] * 2
    with SubprocVectorEnv(fns, num_workers=1, autoreset_mode="Disabled") as envs:
        envs.reset(seed=0)
        *_, truncs, infos = envs.step_chunk(np.zeros((2, 4, 2), np.float32))
        assert infos["chunk_steps"].tolist() == [2, 2] and truncs[:, 1].all()
        with pytest.raises(ValueError, match=r"envs \[0, 1\] terminated or truncated"):
            envs.step_chunk(np.zeros((2, 4, 2), np.float32))
        envs.reset(options={"reset_mask": np.array([True, True])})
        assert envs.step_chunk(np.zeros((2, 1, 2), np.float32))[4]["chunk_steps"].tolist() == [1, 1]


def test_all_obs_needs_fixed_size_observations() -> None:
    fns = [lambda: ZooEnv(spaces.Text(4), BOX_ACT)] * 2
    with SubprocVectorEnv(fns, num_workers=1) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="all_obs needs a fixed-size observation space"):
            envs.step_chunk(np.zeros((2, 3, 2), np.float32), all_obs=True)
        obs, rewards, *_ = envs.step_chunk(np.zeros((2, 3, 2), np.float32))
        assert len(obs) == 2 and rewards.shape == (2, 3)


def test_recycling_refuses_chunks() -> None:
    with SubprocVectorEnv([_cartpole] * 2, recycle_every=10) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="recycle_every"):
            envs.step_chunk(np.zeros((2, 3), dtype=np.int64))


# --- errors and failures ------------------------------------------------------------------


@pytest.mark.parametrize("vectoriser", ["workers", "parent_envs"])
def test_an_env_error_mid_chunk_names_the_env_and_the_sub_step(vectoriser: str) -> None:
    crash = 3 if vectoriser == "workers" else 4  # a worker's env, or one of the parent's
    fns = [lambda: ZooEnv(OBS, BOX_ACT, max_steps=50, terminate_prob=0.0)] * 5
    fns[crash] = lambda: CrashEnv(
        "raise", at_step=4, obs_space=OBS, act_space=BOX_ACT, max_steps=50, terminate_prob=0.0
    )
    with make_vector_env(vectoriser, fns) as envs:
        envs.reset(seed=0)
        with pytest.raises(KeyError) as info:
            envs.step_chunk(np.zeros((5, 6, 2), np.float32))
        assert isinstance(info.value, EnvError) and info.value.env_index == crash
        notes = "".join(getattr(info.value, "__notes__", []))
        assert "raised at sub-step 3 of an action chunk of 6" in notes + str(info.value)
        # usable: the next chunk runs (the env misbehaves once)
        assert envs.step_chunk(np.zeros((5, 2, 2), np.float32))[1].shape == (5, 2)


def test_a_worker_death_mid_chunk_raises_with_raise_policy() -> None:
    fns = [lambda: ZooEnv(OBS, BOX_ACT, max_steps=50, terminate_prob=0.0)] * 4
    fns[1] = lambda: CrashEnv("exit", at_step=3, obs_space=OBS, act_space=BOX_ACT, max_steps=50)
    with SubprocVectorEnv(fns, num_workers=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(WorkerDiedError):
            envs.step_chunk(np.zeros((4, 5, 2), np.float32))


def test_a_worker_death_mid_chunk_restarts_at_the_sub_step_it_was_lost() -> None:
    """Worker 0 holds envs 0 and 1; env 1 kills it at its 3rd sub-step (env 0 had run its 5).
    Both come back truncated with worker_restarted where they were lost: env 0 at its last
    sub-step (4), env 1 at sub-step 2; the other worker's envs are untouched."""
    quiet = dict(obs_space=OBS, act_space=BOX_ACT, max_steps=50, terminate_prob=0.0, quiet=True)
    fns = [lambda: ZooEnv(**quiet)] * 4  # type: ignore[arg-type]
    fns[1] = lambda: CrashEnv("exit", at_step=3, **quiet)  # type: ignore[arg-type]
    with SubprocVectorEnv(fns, num_workers=2, on_worker_failure="restart") as envs:
        envs.reset(seed=0)
        _, rewards, terms, truncs, infos = envs.step_chunk(np.zeros((4, 5, 2), np.float32))
        assert infos["chunk_steps"].tolist() == [5, 3, 5, 5]
        assert truncs[0].tolist() == [False] * 4 + [True]
        assert truncs[1].tolist() == [False, False, True, False, False]
        assert not truncs[2:].any() and not terms.any()
        assert rewards[1, 2:].tolist() == [0.0] * 3 and (rewards[1, :2] != 0).all()
        restarted = infos["_worker_restarted"]
        assert np.flatnonzero(restarted[0]).tolist() == [4]
        assert np.flatnonzero(restarted[1]).tolist() == [2]
        assert not restarted[2:].any()
        assert len(envs.restarts) == 1
        # the replacement steps on: a whole chunk for everyone
        *_, infos = envs.step_chunk(np.zeros((4, 2, 2), np.float32))
        assert infos["chunk_steps"].tolist() == [2, 2, 2, 2]


def _three_step_quiet_zoo() -> ZooEnv:
    return ZooEnv(OBS, BOX_ACT, max_steps=3, terminate_prob=0.0, quiet=True)


def test_the_legacy_info_format_gains_the_chunk_axis() -> None:
    fns = [_three_step_quiet_zoo] * 2
    actions = np.zeros((2, 5, 2), np.float32)
    with SubprocVectorEnv(fns, num_workers=1, info_format="legacy") as envs:
        envs.reset(seed=0)
        _, _, _, truncs, infos = envs.step_chunk(actions)
        # episodes of 3 steps end at sub-step 2; SAME_STEP (legacy's mode) resets there
        assert truncs.tolist() == [[False, False, True, False, False]] * 2
        mask = infos["_final_observation"]
        assert mask.shape == (2, 5) and np.array_equal(mask, truncs)
        assert infos["final_observation"][0, 2].shape == (2, 3)
        assert infos["chunk_steps"].tolist() == [5, 5]


def test_the_list_info_format_gives_each_env_its_sub_steps() -> None:
    require_offered(AutoresetMode.NEXT_STEP)
    fns = [_three_step_quiet_zoo] * 2
    actions = np.zeros((2, 5, 2), np.float32)
    with SubprocVectorEnv(
        fns, num_workers=1, info_format="list", autoreset_mode="NextStep"
    ) as envs:
        envs.reset(seed=0)
        *_, infos = envs.step_chunk(actions, stop_on_done=True)
        assert [info["chunk_steps"] for info in infos] == [3, 3]
        assert [info["infos"] for info in infos] == [[{}, {}, {}]] * 2  # a quiet env
        # NEXT_STEP: the next chunk begins with the reset step, and its reset info
        *_, infos = envs.step_chunk(actions[:, :2])
        assert [sorted(info["infos"][0]) for info in infos] == [["reset_count"]] * 2


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_a_hung_worker_mid_chunk_is_replaced_at_the_sub_step_it_was_lost() -> None:
    """A timeout inside a chunk follows the policy as in step(): with "restart" the hung
    worker is killed and replaced, its envs truncated where they were lost."""
    quiet = dict(obs_space=OBS, act_space=BOX_ACT, max_steps=50, terminate_prob=0.0, quiet=True)
    fns = [lambda: ZooEnv(**quiet)] * 2  # type: ignore[arg-type]
    fns[1] = lambda: CrashEnv("hang", at_step=2, seconds=30, **quiet)  # type: ignore[arg-type]
    with SubprocVectorEnv(fns, num_workers=2, timeout=1.0, on_worker_failure="restart") as envs:
        envs.reset(seed=0)
        _, _, _, truncs, infos = envs.step_chunk(np.zeros((2, 4, 2), np.float32))
        assert infos["chunk_steps"].tolist() == [4, 2]
        assert truncs[1].tolist() == [False, True, False, False] and not truncs[0].any()
        assert infos["_worker_restarted"].tolist() == [[False] * 4, [False, True, False, False]]
        assert "waiting for step_chunk" in envs.restarts[0].reason
