"""Env-addressed calls (``env_ids=``) and per-env reset options (lists, ``set_reset_options``).

Layout used throughout: 5 envs, workers of 2 envs (envs 0-1 and 2-3) and the parent's own env 4,
so that every call reaches both kinds of unit. Which units got a command is read from each
worker's command counter (``seq``), which counts every frame the parent sent it.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest

from subvec import EnvError, SubprocVectorEnv, WorkerDiedError
from subvec._compat import GYM_VERSION, AutoresetMode
from tests.envs import CrashEnv, OptionsEnv, ZooEnv
from tests.oracle import FINAL_OBS, offered_modes

#: what a reset mask that is no numpy array raises: gymnasium 1.4's TypeError, an assert before
RESET_MASK_TYPE_ERROR = TypeError if GYM_VERSION >= (1, 4, 0) else AssertionError

LAYOUT: dict[str, Any] = {"envs_per_worker": 2, "parent_envs": 1}


def _zoo() -> ZooEnv:
    return ZooEnv(render_mode="rgb_array", max_steps=10**6, terminate_prob=0.0)


def _options_env() -> OptionsEnv:
    return OptionsEnv(length=2)


def _seqs(envs: SubprocVectorEnv) -> list[int]:
    return [envs._pool.seq(w) for w in envs._pool.workers]


def _levels(obs: np.ndarray) -> list[int]:
    return [int(v) for v in obs[:, 0]]


# --- env-addressed calls ---------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_calls_reach_only_the_given_envs_in_their_order() -> None:
    envs = SubprocVectorEnv([_zoo] * 5, **LAYOUT)
    try:
        assert envs.worker_envs == (range(0, 2), range(2, 4)) and envs.parent_envs == 1
        envs.reset(seed=0)
        envs.step(np.zeros(5, dtype=np.int64))
        envs.set_attr("marker", ["a", "b"], env_ids=[4, 1])
        assert envs.get_attr("marker") == ("default", "b", "default", "default", "a")
        envs.set_attr("marker", "z", env_ids=np.array([0, 4]))  # one value for each env
        assert envs.get_attr("marker") == ("z", "b", "default", "default", "z")
        assert envs.get_attr("marker", env_ids=(3, 0)) == ("default", "z")
        assert envs.call("get_t", 10, env_ids=[4, 0, 3]) == (11, 11, 11)
        assert envs.call("get_t", plus=2, env_ids=range(2, 4)) == (3, 3)
        frames = envs.render(env_ids=[2])
        assert frames is not None and len(frames) == 1 and frames[0].shape == (4, 4, 3)
        envs.call_async("get_t", env_ids=[1])
        assert envs.call_wait(timeout=10) == (1,)
        assert envs.remote.get_t(5, env_ids=[2, 4]) == (6, 6)  # the proxy passes it on

        # Only the workers holding the envs get a command; the others stay idle.
        before = _seqs(envs)
        assert envs.call("get_t", env_ids=[1, 0]) == (1, 1)
        assert _seqs(envs) == [before[0] + 1, before[1]]
        envs.set_attr("marker", "w", env_ids=[3])
        assert _seqs(envs) == [before[0] + 1, before[1] + 1]
        before = _seqs(envs)
        assert envs.get_attr("marker", env_ids=[4]) == ("z",)  # the parent's own env
        assert envs.call("get_t", env_ids=[]) == ()  # nothing to call: nothing sent
        envs.set_attr("marker", [], env_ids=[])
        assert _seqs(envs) == before
        assert envs.get_attr("marker") == ("z", "b", "default", "w", "z")
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("env_ids", "error", "message"),
    [
        ([5], ValueError, r"env_ids \[5\] out of range: expected env indices in \[0, 5\)"),
        ([0, -1], ValueError, r"env_ids \[-1\] out of range.*negative indices are refused"),
        ([1, 3, 1], ValueError, r"env_ids \[1, 3, 1\] repeat env\(s\) \[1\]: expected each env"),
        (2, TypeError, r"got the int 2; pass \[2\]"),
        ([1.0], TypeError, r"got 1.0 \(float\)"),
        ([True], TypeError, r"got True \(bool\)"),
        ("01", TypeError, "env_ids must be a list, tuple or 1-d array"),
        (np.array([[0, 1]]), TypeError, r"array of shape \(1, 2\)"),
        (np.array([0.0]), TypeError, "dtype float64"),
    ],
)
def test_bad_env_ids_are_refused_and_the_env_stays_usable(
    env_ids: Any, error: type[Exception], message: str
) -> None:
    envs = SubprocVectorEnv([_zoo] * 5, **LAYOUT)
    try:
        envs.reset(seed=0)
        before = _seqs(envs)
        with pytest.raises(error, match=f"call: .*{message}"):
            envs.call("get_t", env_ids=env_ids)
        with pytest.raises(error, match=f"call: .*{message}"):
            envs.get_attr("t", env_ids=env_ids)
        with pytest.raises(error, match=f"call: .*{message}"):
            envs.render(env_ids=env_ids)
        with pytest.raises(error, match=f"set_attr: .*{message}"):
            envs.set_attr("marker", "x", env_ids=env_ids)
        with pytest.raises(error, match=f"set_reset_options: .*{message}"):
            envs.set_reset_options({"level": 1}, env_ids=env_ids)
        with pytest.raises(error, match=f"send: .*{message}"):  # the same check, the same error
            envs.send(np.zeros(np.size(env_ids), dtype=np.int64), env_ids=env_ids)
        assert _seqs(envs) == before  # nothing was sent
        assert envs.get_attr("marker") == ("default",) * 5
        assert envs.reset_options == (None,) * 5
        envs.step(np.zeros(5, dtype=np.int64))
        assert envs.call("get_t", env_ids=[0, 4]) == (1, 1)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_set_attr_with_a_wrong_number_of_values_names_both() -> None:
    envs = SubprocVectorEnv([_zoo] * 5, **LAYOUT)
    try:
        with pytest.raises(
            ValueError, match=r"one value per env of env_ids \(2: \[0, 4\]\), got 3"
        ):
            envs.set_attr("marker", ["a", "b", "c"], env_ids=[0, 4])
        with pytest.raises(ValueError, match="Got `2` values for 5 environments"):
            envs.set_attr("marker", ["a", "b"])
        assert envs.get_attr("marker") == ("default",) * 5
        envs.set_attr("marker", ("a", "b"), env_ids=[0, 4])
        assert envs.get_attr("marker") == ("a", "default", "default", "default", "b")
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env", [1, 2, 4], ids=["worker0", "worker1", "parent"])
def test_an_error_in_an_addressed_call_names_its_env(env: int) -> None:
    fns = [lambda: CrashEnv(max_steps=10**6, terminate_prob=0.0)] * 5
    envs = SubprocVectorEnv(fns, **LAYOUT)
    try:
        envs.reset(seed=0)
        with pytest.raises(RuntimeError, match=f"boom {env}") as info:
            envs.call("explode", f"boom {env}", env_ids=[env])
        assert isinstance(info.value, EnvError) and info.value.env_index == env
        assert envs.call("get_t", env_ids=[env, 0]) == (0, 0)  # idle and usable again
    finally:
        envs.close()


# --- per-env reset options -------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shared_memory", [True, False], ids=["block", "pipes"])
def test_a_list_of_options_gives_each_env_its_own(shared_memory: bool) -> None:
    envs = SubprocVectorEnv([_options_env] * 5, shared_memory=shared_memory, **LAYOUT)
    try:
        options = [{"level": 10}, None, {"level": 12}, {}, {"level": 14}]
        obs, infos = envs.reset(seed=0, options=options)
        assert _levels(obs) == [10, -1, 12, -1, 14]
        assert list(infos["level"]) == [10, -1, 12, -1, 14]
        assert envs.get_attr("last_options") == (
            {"level": 10},
            None,
            {"level": 12},
            {},
            {"level": 14},
        )
        obs, _ = envs.reset(options=tuple({"level": i} for i in range(5)))
        assert _levels(obs) == [0, 1, 2, 3, 4]
        obs, _ = envs.reset(options={"level": 7})  # a dict: every env, as gymnasium
        assert _levels(obs) == [7] * 5
        options[0]["level"] = 99  # the caller's dicts are not the envs'
        assert envs.get_attr("last_options")[0] == {"level": 7}
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", offered_modes(), ids=lambda m: m.value)
def test_stored_options_drive_every_autoreset_mode(mode: AutoresetMode) -> None:
    envs = SubprocVectorEnv([_options_env] * 5, autoreset_mode=mode, **LAYOUT)
    try:
        envs.reset(seed=0)
        envs.set_reset_options({"level": 7}, env_ids=[1, 4])
        envs.set_reset_options([{"level": 3}], env_ids=[2])
        assert envs.reset_options == (None, {"level": 7}, {"level": 3}, None, {"level": 7})
        actions = np.zeros(5, dtype=np.int64)
        obs, _, _, trunc, infos = envs.step(actions)
        assert _levels(obs) == [-1] * 5  # nothing reset yet
        obs, _, _, trunc, infos = envs.step(actions)  # every episode ends here (length 2)
        assert trunc.all()
        want = [-1, 7, 3, -1, 7]
        if mode is AutoresetMode.SAME_STEP:
            assert _levels(obs) == want  # reset in this step
            assert list(infos["level"]) == want
            assert [int(o[0]) for o in infos[FINAL_OBS]] == [-1] * 5
        elif mode is AutoresetMode.NEXT_STEP:
            assert _levels(obs) == [-1] * 5
            obs, rew, _, trunc, infos = envs.step(actions)  # reset instead of stepped
            assert _levels(obs) == want and list(infos["level"]) == want
            assert not rew.any() and not trunc.any()
        else:
            # DISABLED: the caller's masked reset is the autoreset; envs given no options
            # take their stored ones, the others get gymnasium's options without the mask.
            obs, infos = envs.reset(options={"reset_mask": trunc})
            assert _levels(obs) == want
            assert envs.get_attr("last_options", env_ids=[0, 1]) == ({}, {"level": 7})
        # The second episode ends too: the same stored options again, and None clears them.
        envs.set_reset_options(None, env_ids=[4])
        for _ in range(3 if mode is AutoresetMode.NEXT_STEP else 2):
            obs, _, _, trunc, _ = envs.step(actions)
        if mode is AutoresetMode.DISABLED:
            obs = envs.reset(options={"reset_mask": trunc})[0]
        assert _levels(obs) == [-1, 7, 3, -1, -1]
        # Named options win over the stored ones, for that reset only.
        obs, _ = envs.reset(options=[None, {"level": 1}, None, None, None])
        assert _levels(obs) == [-1, 1, 3, -1, -1]
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", offered_modes(), ids=lambda m: m.value)
def test_stored_options_survive_a_worker_restart(mode: AutoresetMode) -> None:
    envs = SubprocVectorEnv(
        [_options_env] * 5, autoreset_mode=mode, on_worker_failure="restart", **LAYOUT
    )
    try:
        envs.reset(seed=0)
        envs.set_reset_options([{"level": 5}, {"level": 6}], env_ids=[2, 0])
        old = envs.worker_pids
        os.kill(old[1], signal.SIGKILL)  # the worker of envs 2 and 3
        obs, _, _, trunc, infos = envs.step(np.zeros(5, dtype=np.int64))
        assert envs.worker_pids[1] != old[1] and len(envs.restarts) == 1
        assert list(infos["_worker_restarted"]) == [False, False, True, True, False]
        # The replacement's reset used the stored options ...
        assert _levels(obs) == [-1, -1, 5, -1, -1]
        assert envs.get_attr("last_options", env_ids=[2, 3]) == ({"level": 5}, None)
        # ... and it keeps them: for a reset that names none, and for its autoresets.
        obs, _ = envs.reset()
        assert _levels(obs) == [6, -1, 5, -1, -1]
        actions = np.zeros(5, dtype=np.int64)
        for _ in range(3 if mode is AutoresetMode.NEXT_STEP else 2):
            obs, _, _, trunc, _ = envs.step(actions)
        if mode is AutoresetMode.DISABLED:
            obs = envs.reset(options={"reset_mask": trunc})[0]
        assert _levels(obs) == [6, -1, 5, -1, -1]
        assert envs.get_attr("resets", env_ids=[2, 3]) == (3, 3)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_a_restart_during_a_reset_resets_with_that_resets_options() -> None:
    envs = SubprocVectorEnv([_options_env] * 5, on_worker_failure="restart", **LAYOUT)
    try:
        envs.reset(seed=0)
        envs.set_reset_options({"level": 9}, env_ids=[3])
        os.kill(envs.worker_pids[1], signal.SIGKILL)  # dies before the reset reaches it
        obs, infos = envs.reset(options=[{"level": i} if i != 3 else None for i in range(5)])
        assert len(envs.restarts) == 1
        assert list(infos["_worker_restarted"]) == [False, False, True, True, False]
        assert _levels(obs) == [0, 1, 2, 9, 4]  # env 3: named none, so its stored ones
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", offered_modes(), ids=lambda m: m.value)
def test_a_recycled_worker_resets_with_the_stored_options(mode: AutoresetMode) -> None:
    # One env per worker (recycling's layout); each worker is replaced after every episode.
    envs = SubprocVectorEnv([_options_env] * 3, autoreset_mode=mode, recycle_every=1)
    try:
        envs.reset(seed=0)
        envs.set_reset_options([{"level": 2}, {"level": 3}], env_ids=[0, 2])
        pids = envs.worker_pids
        actions = np.zeros(3, dtype=np.int64)
        for _ in range(3 if mode is AutoresetMode.NEXT_STEP else 2):
            obs, _, _, trunc, _ = envs.step(actions)
        if mode is AutoresetMode.DISABLED:
            obs = envs.reset(options={"reset_mask": trunc})[0]
        assert len(envs.recycles) == 3
        assert all(new != old for new, old in zip(envs.worker_pids, pids))
        assert _levels(obs) == [2, -1, 3]  # the new envs' first reset used them
        assert envs.get_attr("resets") == (1, 1, 1)  # fresh envs: that was their only reset
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_a_worker_rebuilt_by_reset_gets_the_stored_options() -> None:
    envs = SubprocVectorEnv([_options_env] * 5, **LAYOUT)  # on_worker_failure="raise"
    try:
        envs.reset(seed=0)
        envs.set_reset_options({"level": 8}, env_ids=[3, 4])
        os.kill(envs.worker_pids[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            envs.step(np.zeros(5, dtype=np.int64))
        obs, _ = envs.reset()  # rebuilds worker 1 and resets every env
        assert len(envs.rebuilds) == 1
        assert _levels(obs) == [-1, -1, -1, 8, 8]
        actions = np.zeros(5, dtype=np.int64)
        for _ in range(3):  # the episode ends, then NEXT_STEP resets it
            obs = envs.step(actions)[0]
        assert _levels(obs) == [-1, -1, -1, 8, 8]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_async_reset_and_async_autoresets_take_the_options() -> None:
    envs = SubprocVectorEnv([_options_env] * 5, batch_size=5, **LAYOUT)
    try:
        envs.set_reset_options({"level": 4}, env_ids=[0])
        envs.async_reset(seed=0, options=[None, {"level": 1}, None, {"level": 3}, None])
        obs, _, _, _, infos = envs.drain()
        order = list(infos["env_id"])
        assert sorted(order) == [0, 1, 2, 3, 4]
        assert {e: int(obs[row, 0]) for row, e in enumerate(order)} == {
            0: 4,
            1: 1,
            2: -1,
            3: 3,
            4: -1,
        }
        levels: dict[int, int] = {}
        for _ in range(3):  # two steps end the episode; NEXT_STEP resets on the third
            envs.send(np.zeros(5, dtype=np.int64), np.arange(5))
            obs, _, _, _, infos = envs.drain()
            levels = {int(e): int(obs[row, 0]) for row, e in enumerate(infos["env_id"])}
        assert levels == {0: 4, 1: -1, 2: -1, 3: -1, 4: -1}
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ([{"level": 1}] * 4, ValueError, r"one entry per env \(num_envs = 5\), got 4"),
        ([None, 3, None, None, None], TypeError, "the options of env 1 .* dict or None, got int"),
        (
            [{"reset_mask": np.ones(5, dtype=np.bool_)}] + [None] * 4,
            ValueError,
            "the options of env 0 .* hold 'reset_mask'",
        ),
        ("level=1", TypeError, r"takes a dict .* or None; got str"),
        # gymnasium before 1.4 asserts (tests/test_versions.py)
        ({"reset_mask": [True] * 5}, RESET_MASK_TYPE_ERROR, "must be a numpy array"),
    ],
)
def test_bad_reset_options_say_what_was_expected(
    options: Any, error: type[Exception], message: str
) -> None:
    envs = SubprocVectorEnv([_options_env] * 5, **LAYOUT)
    try:
        before = _seqs(envs)
        with pytest.raises(error, match=message):
            envs.reset(options=options)
        with pytest.raises(error, match=message):
            envs.async_reset(options=options)
        assert _seqs(envs) == before
        obs, _ = envs.reset(options={"level": 2})  # still usable
        assert _levels(obs) == [2] * 5
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("options", "env_ids", "error", "message"),
    [
        ([{"level": 1}], [0, 1], ValueError, r"one entry per env \(len\(env_ids\) = 2\), got 1"),
        ([None, "x"], [3, 4], TypeError, r"the options of env 4 \(entry 1\) must be a dict"),
        (5, None, TypeError, "set_reset_options.options. takes a dict"),
        ({"reset_mask": 1}, [0], ValueError, "hold 'reset_mask'"),
        ({"level": 1}, [0, 7], ValueError, r"env_ids \[7\] out of range"),
    ],
)
def test_bad_stored_options_are_refused_and_change_nothing(
    options: Any, env_ids: Any, error: type[Exception], message: str
) -> None:
    envs = SubprocVectorEnv([_options_env] * 5, **LAYOUT)
    try:
        envs.set_reset_options({"level": 9}, env_ids=[4])
        with pytest.raises(error, match=message):
            envs.set_reset_options(options, env_ids=env_ids)
        assert envs.reset_options == (None, None, None, None, {"level": 9})
        obs, _ = envs.reset()
        assert _levels(obs) == [-1, -1, -1, -1, 9]
    finally:
        envs.close()
