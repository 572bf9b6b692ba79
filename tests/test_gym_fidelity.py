"""Fidelity to gymnasium 1.4: what its own tests/vector checks of AsyncVectorEnv, and the cases
its issue tracker knows, with SubprocVectorEnv in its place (docs/compat.md)."""

from __future__ import annotations

import inspect
import re
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from subvec import SubprocVectorEnv
from subvec._compat import DEFAULT_INFO_FORMAT, GYM_029, AutoresetMode
from subvec._process.plan import plan_layout
from tests.envs import (
    ArrayRewardEnv,
    OneBufferEnv,
    OptionsEnv,
    SleepActionEnv,
    StepClockEnv,
    make_zoo,
)
from tests.helpers import assert_same
from tests.oracle import DEFAULT_MODE, sync_vector_env

# --- actions reach the envs exactly as the caller passed them ------------------------------

BOX32 = spaces.Box(-1, 1, shape=(2,), dtype=np.float32)
SCALAR32 = spaces.Box(-1, 1, shape=(), dtype=np.float32)
DICT = spaces.Dict({"move": spaces.Discrete(4), "force": BOX32})


def _actions(case: str) -> tuple[spaces.Space[Any], Any]:
    """(action space, a batch of 3 actions) for each way callers hand actions over."""
    rng = np.random.default_rng(0)
    f64 = rng.uniform(-1, 1, (3, 2))
    return {
        "float64_for_float32_box": (BOX32, f64),
        "float16_for_float32_box": (BOX32, f64.astype(np.float16)),
        "int64_for_float32_box": (BOX32, np.array([[0, 1], [1, 0], [-1, 1]])),
        "float64_for_scalar_box": (SCALAR32, f64[:, 0]),
        "python_floats": (SCALAR32, [0.25, -0.5, 0.75]),
        "list_of_float64_rows": (BOX32, list(f64)),
        "int32_for_discrete": (spaces.Discrete(3), np.array([0, 2, 1], dtype=np.int32)),
        "uint8_for_discrete": (spaces.Discrete(3), np.array([0, 2, 1], dtype=np.uint8)),
        "python_ints_for_discrete": (spaces.Discrete(3), [0, 2, 1]),
        "numpy_ints_for_discrete": (spaces.Discrete(3), [np.int64(0), np.int64(2), np.int64(1)]),
        "float64_for_discrete": (spaces.Discrete(3), np.array([0.0, 2.0, 1.0])),
        "int64_for_multibinary": (spaces.MultiBinary(3), rng.integers(0, 2, (3, 3))),
        "bool_for_multibinary": (spaces.MultiBinary(3), rng.integers(0, 2, (3, 3)) > 0),
        "big_endian_for_float32_box": (BOX32, f64.astype(">f4")),
        "complex128_for_float32_box": (BOX32, f64.astype(np.complex128)),
        "object_for_discrete": (spaces.Discrete(3), np.array([0, 2, 1], dtype=object)),
        "dict_mixed": (
            DICT,
            {"move": np.array([3, 0, 1], dtype=np.int16), "force": f64},
        ),
        "dict_with_a_list": (DICT, {"move": [3, 0, 1], "force": f64.astype(np.float32)}),
        "space_dtype": (BOX32, f64.astype(np.float32)),
    }[case]


ACTION_CASES = [
    "float64_for_float32_box",
    "float16_for_float32_box",
    "int64_for_float32_box",
    "float64_for_scalar_box",
    "python_floats",
    "list_of_float64_rows",
    "int32_for_discrete",
    "uint8_for_discrete",
    "python_ints_for_discrete",
    "numpy_ints_for_discrete",
    "float64_for_discrete",
    "int64_for_multibinary",
    "bool_for_multibinary",
    "big_endian_for_float32_box",
    "complex128_for_float32_box",
    "object_for_discrete",
    "dict_mixed",
    "dict_with_a_list",
    "space_dtype",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("layout", [{"num_workers": 2}, {"num_workers": 1, "parent_envs": 1}])
@pytest.mark.parametrize("case", ACTION_CASES)
def test_each_env_gets_its_action_as_sync_hands_it(case: str, layout: dict[str, int]) -> None:
    act_space, actions = _actions(case)
    fns = [make_zoo("box_f64", act_space) for _ in range(3)]
    oracle = SyncVectorEnv(fns)
    envs = SubprocVectorEnv(fns, **layout)
    try:
        envs.reset(seed=1)
        oracle.reset(seed=1)
        for _ in range(2):  # the second step: the same kind of batch again
            assert_same(envs.step(actions), oracle.step(actions))
            # type, dtype, shape and bytes of each env's own action, as SyncVectorEnv gave it
            assert_same(
                envs.get_attr("last_action"),
                tuple(env.unwrapped.last_action for env in oracle.envs),  # type: ignore[attr-defined]
            )
        # and then a batch in the space's own dtype again (the block's usual path)
        plain = envs.action_space.sample()
        assert_same(envs.step(plain), oracle.step(plain))
        assert_same(
            envs.get_attr("last_action"),
            tuple(env.unwrapped.last_action for env in oracle.envs),  # type: ignore[attr-defined]
        )
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_pendulum_with_float64_actions_steps_byte_for_byte_as_sync() -> None:
    fns = [lambda: gym.make("Pendulum-v1") for _ in range(4)]
    oracle = SyncVectorEnv(fns)
    envs = SubprocVectorEnv(fns)
    try:
        assert_same(envs.reset(seed=3), oracle.reset(seed=3))
        rng = np.random.default_rng(3)
        for t in range(30):
            actions = rng.uniform(-2, 2, (4, 1))  # float64, the space is float32
            assert_same(envs.step(actions), oracle.step(actions), f"step {t}")
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shared_memory", [True, False])
def test_an_env_that_sleeps_for_its_float64_action_works(shared_memory: bool) -> None:
    envs = SubprocVectorEnv([SleepActionEnv] * 2, shared_memory=shared_memory)
    try:
        envs.reset(seed=0)
        envs.step(np.array([0.001, 0.002]))  # float64 for a float32 space: np.float64 arrives
        envs.step([0.001, 0.0])  # Python floats arrive
    finally:
        envs.close()


# --- errors and warnings as gymnasium's ----------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("act_space", [spaces.Discrete(3), spaces.Text(3)], ids=["block", "pipe"])
def test_a_scalar_for_a_batch_is_refused_as_sync_refuses_it(act_space: spaces.Space[Any]) -> None:
    fns = [make_zoo("box_f64", act_space)] * 2
    oracle = SyncVectorEnv(fns)
    envs = SubprocVectorEnv(fns)
    try:
        envs.reset(seed=0)
        oracle.reset(seed=0)
        for scalar in (0, np.array(0)):
            with pytest.raises(Exception) as want:
                oracle.step(scalar)
            if isinstance(act_space, spaces.Discrete):
                assert want.type is TypeError  # what gymnasium's own tests ask for
            with pytest.raises(want.type):
                envs.step(scalar)
        with pytest.raises(ValueError):
            envs.step(envs.action_space.sample()[:1])  # too few: a ValueError, as Sync's
        envs.step(envs.action_space.sample())  # and nothing was sent or broken
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_close_with_a_call_pending_warns_as_async_then_closes() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f64")] * 2)
    envs.reset(seed=0)
    envs.step_async(envs.action_space.sample())
    with pytest.raises(
        AlreadyPendingCallError,
        match=re.escape("Calling `reset_async` while waiting for a pending call to `step`"),
    ):
        envs.reset_async()
    with pytest.warns(
        UserWarning,
        match=re.escape("Calling `close` while waiting for a pending call to `step` to complete."),
    ):
        envs.close()
    assert envs.closed

    envs = SubprocVectorEnv([make_zoo("box_f64")] * 2)
    envs.call_async("get_t")
    with pytest.warns(UserWarning, match="pending call to `call` to complete"):
        envs.close()


@pytest.mark.timeout(60)
def test_close_releases_everything_when_its_warning_is_an_error() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f64")] * 2)
    envs.reset(seed=0)
    envs.step_async(envs.action_space.sample())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="pending call to `step`"):
            envs.close()
    assert envs.closed  # and no worker or segment outlives the test (conftest checks)
    envs.close()


@pytest.mark.timeout(60)
def test_mismatched_spaces_and_modes_say_what_gymnasium_says() -> None:
    if not GYM_029:  # there no observation_mode exists (tests/test_gym029.py)
        with pytest.raises(
            ValueError, match=re.escape("Invalid `observation_mode`, expected: 'same'")
        ):
            SubprocVectorEnv([make_zoo("box_f64")] * 2, observation_mode="similar")
    fns = [make_zoo("box_f64"), make_zoo("box_f32")]
    with pytest.raises(
        RuntimeError,
        match=r"the sub-environments observation spaces are not equivalent. .*env 1 has .*"
        r"If this is intentional, use `observation_mode='different'` instead.",
    ):
        SubprocVectorEnv(fns)
    fns = [make_zoo("box_f64"), make_zoo("box_f64", spaces.Discrete(5))]
    with pytest.raises(RuntimeError, match=r"action space different from .*env 1 has Discrete"):
        SubprocVectorEnv(fns)


# --- gymnasium 1.4's AsyncVectorEnv signature ----------------------------------------------


@pytest.mark.skipif(
    GYM_029,
    reason="0.29's AsyncVectorEnv takes the spaces second and third; subvec keeps 1.x's order",
)
def test_signature_takes_async_vector_envs_arguments() -> None:
    ours = inspect.signature(SubprocVectorEnv.__init__).parameters
    theirs = inspect.signature(AsyncVectorEnv.__init__).parameters
    names = list(theirs)
    positional = ["self", "env_fns", "shared_memory", "copy", "context", "daemon"]
    assert names[: len(positional)] == positional
    assert list(ours)[: len(positional)] == positional
    for name in positional[1:]:
        assert ours[name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for name in names[len(positional) :]:
        assert ours[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        if name == "autoreset_mode":
            # None: gymnasium's NEXT_STEP, or SAME_STEP with info_format="legacy" (one default
            # cannot be both, and an object that only reads as NEXT_STEP would mislead callers
            # that compare it)
            assert ours[name].default is None
            continue
        assert ours[name].default == theirs[name].default, name
    others = [p for p in list(ours)[len(positional) :] if p not in theirs]
    assert all(ours[p].kind is inspect.Parameter.KEYWORD_ONLY for p in others)


@pytest.mark.timeout(60)
def test_positional_arguments_and_autoreset_defaults() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f64")] * 2, False, False, "spawn", True)
    try:
        assert (envs.shared_memory, envs.copy, envs.context, envs.daemon) == (
            False,
            False,
            "spawn",
            True,
        )
        assert envs.autoreset_mode is DEFAULT_MODE
    finally:
        envs.close()
    envs = SubprocVectorEnv([make_zoo("box_f64")] * 2, info_format="legacy")
    try:
        assert envs.autoreset_mode is AutoresetMode.SAME_STEP  # the legacy format's one mode
    finally:
        envs.close()
    with pytest.raises(ValueError, match="same step"):
        SubprocVectorEnv(
            [make_zoo("box_f64")] * 2,
            info_format="legacy",
            autoreset_mode=AutoresetMode.NEXT_STEP,
        )


def test_a_custom_worker_is_refused_saying_why() -> None:
    def worker(*args: Any) -> None:
        pass  # never runs: refused before any process starts

    with pytest.raises(ValueError, match="several envs, built from cloudpickled env_fns"):
        SubprocVectorEnv([make_zoo("box_f64")] * 2, worker=worker)


@pytest.mark.parametrize("value", [0, -1, 1.5, "2"])
def test_a_bad_max_concurrency_is_refused_as_gymnasium_refuses_it(value: Any) -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        SubprocVectorEnv([make_zoo("box_f64")] * 2, max_concurrency=value)


def test_max_concurrency_and_parent_envs_are_one_or_the_other() -> None:
    with pytest.raises(ValueError, match="pass one of the two"):
        SubprocVectorEnv([make_zoo("box_f64")] * 3, max_concurrency=1, parent_envs=1)


def test_max_concurrency_caps_the_default_workers_or_makes_them_take_turns() -> None:
    by_default = plan_layout(8, cpus=8, max_concurrency=3)
    assert (by_default.num_workers, by_default.max_active) == (3, None)
    in_turns = plan_layout(8, cpus=8, num_workers=4, max_concurrency=3)
    assert (in_turns.num_workers, in_turns.max_active) == (4, 3)
    assert in_turns.partner is None and not any(in_turns.worker_spin_us)
    assert plan_layout(8, cpus=8, num_workers=2, max_concurrency=3).max_active is None


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = most = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit", [1, 2])
def test_max_concurrency_bounds_the_envs_stepping_at_once(limit: int) -> None:
    envs = SubprocVectorEnv([StepClockEnv] * 4, num_workers=4, max_concurrency=limit)
    try:
        assert envs.max_concurrency == limit
        for infos in (envs.reset(seed=0)[1], envs.step(np.zeros(4, dtype=np.int64))[4]):
            intervals = list(zip(infos["start"], infos["end"]))
            assert _most_at_once(intervals) == limit, intervals
        # calls are not limited, as in gymnasium
        assert envs.call("get_wrapper_attr", "seconds") == (0.05,) * 4
    finally:
        envs.close()
    envs = SubprocVectorEnv([StepClockEnv] * 4, max_concurrency=2)
    try:
        assert envs.num_workers <= 2  # by default no more workers than may step at once
    finally:
        envs.close()


# --- rewards and final observations --------------------------------------------------------


@pytest.mark.timeout(60)
def test_an_array_reward_of_shape_1_fares_as_with_sync() -> None:
    oracle = SyncVectorEnv([ArrayRewardEnv] * 2)
    envs = SubprocVectorEnv([ArrayRewardEnv] * 2)
    try:
        oracle.reset(seed=0)
        envs.reset(seed=0)
        try:
            with warnings.catch_warnings():
                # numpy < 2.4 takes the element with a DeprecationWarning, in SyncVectorEnv as
                # in the workers, where the suite's filterwarnings=error does not reach
                warnings.simplefilter("ignore", DeprecationWarning)
                want = oracle.step(np.zeros(2, dtype=np.int64))
        except (TypeError, ValueError) as exc:  # numpy >= 2.4 refuses it in SyncVectorEnv
            with pytest.raises(type(exc), match=r"reward as an array of shape \(1,\)") as got:
                envs.step(np.zeros(2, dtype=np.int64))
            assert getattr(got.value, "env_index", None) == 0
        else:  # older numpy takes the single element (with a DeprecationWarning)
            assert_same(envs.step(np.zeros(2, dtype=np.int64)), want)
    finally:
        envs.close()
        oracle.close()


BOX = spaces.Box(0, 100, shape=(3,), dtype=np.float32)
BUFFER_CASES = {
    "block": ({}, BOX),
    "by_value": ({"shared_memory": False}, BOX),
    "dict_in_block": ({}, spaces.Dict({"a": BOX, "b": spaces.Box(0, 100, (2,), np.int64)})),
    "parent_envs": ({"num_workers": 1, "parent_envs": 1}, BOX),
    "legacy": ({"info_format": "legacy"}, BOX),
    "list": ({"info_format": "list"}, BOX),
}


def _final_obs_of(infos: Any, info_format: str, env: int) -> Any:
    if info_format == "legacy":
        return infos["final_observation"][env]
    if info_format == "list":
        return infos[env]["final_obs"]
    return infos["final_obs"][env]


def _final_info_t_of(infos: Any, info_format: str, env: int) -> Any:
    if info_format == "legacy":
        return infos["final_info"][env]["t"]
    if info_format == "list":
        return infos[env]["final_info"]["t"]
    return infos["final_info"]["t"][env]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["step", "send_recv"])
@pytest.mark.parametrize("case", list(BUFFER_CASES))
def test_final_obs_of_an_env_that_reuses_its_buffer_is_the_final_one(case: str, how: str) -> None:
    kwargs, space = BUFFER_CASES[case]
    info_format = kwargs.get("info_format", DEFAULT_INFO_FORMAT)

    def make() -> OneBufferEnv:
        return OneBufferEnv(space)

    envs = SubprocVectorEnv([make] * 2, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)
    try:
        envs.reset(seed=0)
        kept = []
        for _ in range(2):  # two episode ends: the one kept must not change with the second
            for _ in range(3):
                if how == "step":
                    obs, _, terminated, _, infos = envs.step(np.zeros(2, dtype=np.int64))
                else:  # both envs' results in one batch (in either order: both alike)
                    envs.send(np.zeros(2, dtype=np.int64), env_ids=[0, 1])
                    obs, _, terminated, _, infos = envs.drain()
            assert terminated.all()
            for env in range(2):
                final = _final_obs_of(infos, info_format, env)
                leaves = final.values() if isinstance(final, dict) else [final]
                assert all((leaf == 3).all() for leaf in leaves), final  # not the reset's 0
                assert _final_info_t_of(infos, info_format, env) == 3
            leaves = obs.values() if isinstance(obs, dict) else [obs]
            assert all((leaf == 0).all() for leaf in leaves), obs
            kept.append(infos)
        first = _final_obs_of(kept[0], info_format, 0)  # still the first episode's end
        assert all(
            (leaf == 3).all() for leaf in (first.values() if isinstance(first, dict) else [first])
        )
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_final_info_of_an_env_that_reuses_its_info_dict_matches_sync() -> None:
    fns = [OneBufferEnv] * 2
    oracle = sync_vector_env(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    envs = SubprocVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        envs.reset(seed=0)
        oracle.reset(seed=0)
        for _ in range(3):
            got = envs.step(np.zeros(2, dtype=np.int64))
            want = oracle.step(np.zeros(2, dtype=np.int64))
        # SyncVectorEnv copies the final info's values as it batches them (its final_obs is
        # the buffer itself, so shows the reset's contents: see docs/compat.md)
        if GYM_029:  # 0.29's SyncVectorEnv keeps the env's dict itself, which the reset
            # then rewrote (docs/compat.md): subvec's is the episode's last info
            assert [info["t"] for info in got[4]["final_info"]] == [3, 3]
        else:
            assert_same(got[4]["final_info"], want[4]["final_info"])
            assert got[4]["final_info"]["t"].tolist() == [3, 3]
        assert_same(got[4]["t"], want[4]["t"])
    finally:
        envs.close()
        oracle.close()


def test_step_clock_env_measures_its_own_sleep() -> None:
    # The clock the concurrency test relies on: start and end bracket the sleep.
    env = StepClockEnv(0.01)
    before = time.monotonic()
    _, info = env.reset(seed=0)
    assert before <= info["start"] < info["end"] <= time.monotonic()


# --- reset() after an episode ended on the step before ---------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shared_memory", [True, False])
def test_the_first_step_after_reset_steps_even_when_the_last_one_ended(shared_memory: bool) -> None:
    # gymnasium 1.0-1.4's AsyncVectorEnv(shared_memory=False) clears a worker's autoreset flag
    # only on its shared-memory path: there, an env that ended on the step before reset()
    # spends the next step resetting again. subvec steps it, as SyncVectorEnv does.
    fns = [lambda: OptionsEnv(length=2)] * 2
    sync = SyncVectorEnv(fns)
    envs = SubprocVectorEnv(fns, num_workers=2, shared_memory=shared_memory)
    try:
        for vec in (sync, envs):
            vec.reset(seed=0)
            vec.step(np.zeros(2, np.int64))
            _, _, _, truncated, _ = vec.step(np.zeros(2, np.int64))
            assert truncated.all()  # both ended on the step before the reset
            vec.reset(seed=1)
            obs, *_ = vec.step(np.zeros(2, np.int64))
            assert obs[:, 1].tolist() == [1.0, 1.0]  # t = 1: stepped, not reset again
    finally:
        envs.close()
        sync.close()
