"""On gymnasium 0.29: SubprocVectorEnv is a 0.29 VectorEnv that behaves as 0.29's own
SyncVectorEnv and AsyncVectorEnv (same-step autoreset, ``final_observation``/``final_info``,
the ``*_async``/``*_wait`` calls, 0.29's wrappers on it), and what 0.29 has not is refused
naming the installed version. These run where gymnasium 0.29 is installed (the matrix's
gymnasium-0.29 leg); tests/test_conformance.py holds every space to 0.29's SyncVectorEnv.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from subvec import SubprocVectorEnv
from subvec._compat import GYM_029
from tests.envs import ZooEnv, make_zoo
from tests.helpers import assert_same

pytestmark = pytest.mark.skipif(not GYM_029, reason="gymnasium 0.29 only")

INSTALLED = f"gymnasium {gym.__version__} is installed"


def _cartpoles(n: int = 4) -> list[Any]:
    return [lambda: gym.make("CartPole-v1", max_episode_steps=15) for _ in range(n)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"autoreset_mode": "NextStep"}, "autoreset_mode='NextStep' needs gymnasium >= 1.0"),
        ({"autoreset_mode": "Disabled"}, "autoreset_mode='Disabled' needs gymnasium >= 1.0"),
        ({"info_format": "gymnasium"}, "info_format='gymnasium' is gymnasium 1.x's"),
        ({"observation_mode": "different"}, "observation_mode='different' needs gymnasium"),
        ({"freeze": True}, "freeze=True keeps ended envs until the caller resets them"),
    ],
    ids=["next_step", "disabled", "gymnasium_infos", "observation_mode", "freeze"],
)
def test_what_029_has_not_is_refused_naming_the_version(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words) as info:
        SubprocVectorEnv(_cartpoles(2), **kwargs)
    assert INSTALLED in str(info.value)


@pytest.mark.timeout(60)
def test_a_029_vector_env_with_029_defaults() -> None:
    with SubprocVectorEnv(_cartpoles(2)) as envs:
        assert isinstance(envs, gym.vector.VectorEnv)
        assert envs.is_vector_env and envs.num_envs == 2
        assert envs.info_format == "legacy" and envs.autoreset_mode.value == "SameStep"
        assert envs.metadata == gym.make("CartPole-v1").metadata  # no autoreset_mode key


@pytest.mark.timeout(60)
def test_the_async_calls_answer_as_029s_async_vector_env() -> None:
    fns = [make_zoo("dict_nest") for _ in range(3)]
    theirs = gym.vector.AsyncVectorEnv(fns)
    ours = SubprocVectorEnv(fns, num_workers=2)
    try:
        for envs in (theirs, ours):
            envs.reset_async(seed=[1, 2, 3])
        assert_same(ours.reset_wait(), theirs.reset_wait(), "reset_wait")
        ours.action_space.seed(0)
        for t in range(20):
            actions = ours.action_space.sample()
            for envs in (theirs, ours):
                envs.step_async(actions)
            assert_same(ours.step_wait(), theirs.step_wait(), f"step_wait {t}")
        for envs in (theirs, ours):
            envs.call_async("render")
        assert_same(ours.call_wait(), theirs.call_wait(), "call_wait")
        assert ours.get_attr("max_steps") == theirs.get_attr("max_steps")
        for envs in (theirs, ours):
            envs.set_attr("marker", ["a", "b", "c"])
        assert ours.get_attr("marker") == theirs.get_attr("marker") == ("a", "b", "c")
        assert_same(ours.call("render"), theirs.call("render"), "call")
    finally:
        ours.close()
        theirs.close()


def _timeless(infos: Any) -> Any:
    """``infos`` without the episodes' wall-clock times (``t``), which no two runs share."""
    if isinstance(infos, dict):
        return {k: _timeless(v) for k, v in infos.items() if k not in ("t", "_t")}
    if isinstance(infos, np.ndarray) and infos.dtype == object:
        return np.array([_timeless(v) for v in infos] + [None], dtype=object)[:-1]
    return infos


@pytest.mark.timeout(60)
# NormalizeObservation reads single_observation_space through RecordEpisodeStatistics, which
# 0.29 allows with this warning (for its own vector envs too)
@pytest.mark.filterwarnings("ignore:.*env.single_observation_space to get variables")
def test_029s_wrappers_on_the_vector_env_and_in_its_envs() -> None:
    # RecordEpisodeStatistics in each env and on the vector env, NormalizeObservation on it:
    # 0.29's vector wrappers read is_vector_env and the same-step infos
    def make() -> gym.Env[Any, Any]:
        return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))

    def wrap(envs: Any) -> Any:
        return gym.wrappers.NormalizeObservation(gym.wrappers.RecordEpisodeStatistics(envs))

    theirs = wrap(gym.vector.SyncVectorEnv([make] * 4))
    ours = wrap(SubprocVectorEnv([make] * 4, num_workers=2))
    try:
        assert_same(ours.reset(seed=5), theirs.reset(seed=5), "reset")
        rng = np.random.default_rng(0)
        episodes = 0
        for t in range(150):
            actions = rng.integers(0, 2, size=4)
            got, want = ours.step(actions), theirs.step(actions)
            assert_same(got[:4], want[:4], f"step {t}")
            assert_same(_timeless(got[4]), _timeless(want[4]), f"step {t} infos")
            episodes += int(got[4].get("_episode", np.zeros(4, bool)).sum())
        assert episodes > 4, "no episode ended: the statistics were not compared"
    finally:
        ours.close()
        theirs.close()


@pytest.mark.timeout(60)
def test_final_observation_and_final_info_with_their_masks() -> None:
    fns = [lambda: ZooEnv(max_steps=3, terminate_prob=0.0)] * 3
    with SubprocVectorEnv(fns, num_workers=2) as envs:
        envs.reset(seed=0)
        actions = np.zeros(3, np.int64)
        envs.step(actions)
        envs.step(actions)
        _, _, _, truncations, infos = envs.step(actions)
        assert truncations.all()
        assert list(infos["_final_observation"]) == [True] * 3
        assert infos["final_observation"].dtype == object
        assert all(isinstance(i, dict) for i in infos["final_info"])
