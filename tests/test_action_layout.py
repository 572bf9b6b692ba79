"""The gymnasium face's batched action layout: one batch per key or sub-space, never per env.

A list of per-env tuples (Stable-Baselines3's layout) used to be read as one batch per sub-space
when the Tuple had as many sub-spaces as there are envs: env 0 got the first item of every env's
tuple, with no error. Where the layout tells (a tuple where a fixed-size leaf's batch belongs),
the face now refuses it, for shared and for by-value action spaces alike.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from gymnasium import spaces

from subvec import SubprocVectorEnv
from tests.envs import ZooEnv

TUPLE2 = spaces.Tuple((spaces.Discrete(5), spaces.Discrete(5)))
# Text makes the space unshareable: its actions travel by value
TEXT_TUPLE = spaces.Tuple((spaces.Text(max_length=4), spaces.Discrete(5)))
DICT = spaces.Dict({"move": spaces.Discrete(3), "fire": spaces.MultiBinary(2)})


def _envs(act_space: spaces.Space, n: int = 2, **kwargs: object) -> SubprocVectorEnv:
    return SubprocVectorEnv([partial(ZooEnv, None, act_space)] * n, num_workers=2, **kwargs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("space", [TUPLE2, TEXT_TUPLE], ids=["shared", "by_value"])
def test_per_env_tuples_are_refused_not_transposed(space: spaces.Tuple) -> None:
    envs = _envs(space)
    try:
        envs.reset(seed=0)
        first = "ab" if space is TEXT_TUPLE else 1
        per_env = [(first, 2), (first, 4)]
        with pytest.raises(TypeError, match=r"2 tuples of 2 items.*one action per env"):
            envs.step(per_env)
        with pytest.raises(TypeError, match="one action per env"):
            envs.step(tuple(per_env))
        # The batched form: one batch per sub-space; env i gets item i of each.
        batch0 = ("ab", "ab") if space is TEXT_TUPLE else np.array([1, 1])
        envs.step((batch0, np.array([2, 4])))
        got = envs.get_attr("last_action")
        assert [tuple(a) for a in got] == [(first, 2), (first, 4)]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_leaf_batches_as_arrays_or_lists_still_read_as_batches() -> None:
    envs = _envs(TUPLE2)
    try:
        envs.reset(seed=0)
        envs.step([[1, 3], np.array([2, 4])])  # a list of batches: no tuple where a leaf's goes
        assert [tuple(a) for a in envs.get_attr("last_action")] == [(1, 2), (3, 4)]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_per_env_dicts_get_an_error_that_says_so() -> None:
    envs = _envs(DICT)
    try:
        envs.reset(seed=0)
        per_env = [{"move": 1, "fire": np.array([0, 1])}, {"move": 2, "fire": np.array([1, 1])}]
        with pytest.raises(TypeError, match=r"list of 2 dicts, one action per env"):
            envs.step(per_env)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_actions_by_value_leave_the_observations_the_caller_holds() -> None:
    """Observations large enough to come from slots of the block, actions that travel by value:
    each step must write a batch the caller does not hold, as on the shared-actions path."""
    obs_space = spaces.Box(0, 255, shape=(64, 64, 3), dtype=np.uint8)  # 2 x 12 KiB: slots
    envs = SubprocVectorEnv(
        [partial(ZooEnv, obs_space, spaces.Text(max_length=3))] * 2, num_workers=2
    )
    try:
        envs.reset(seed=0)
        held = [envs.step(("a", "b"))[0] for _ in range(2)]
        kept = [obs.copy() for obs in held]
        envs.step(("c", "d"))
        for t, (obs, copy) in enumerate(zip(held, kept)):
            assert np.array_equal(obs, copy), f"the batch of step {t} changed under the caller"
    finally:
        envs.close()
