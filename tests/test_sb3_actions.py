"""Actions through the SB3 face: env i gets what SB3's own VecEnvs hand it, ``actions[i]``.

The oracle is DummyVecEnv: for the same actions, every env must receive an object of the same
type, dtype, shape and bytes (read back with ``get_attr("last_action")``), whether the actions
go through the shared block, are stacked from per-env dicts and tuples, or travel by value.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from stable_baselines3 import A2C, PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper, VecMonitor

from subvec.sb3 import SubprocVecEnv
from tests import sb3_envs
from tests.helpers import assert_same

EnvFn = Callable[[], gym.Env[Any, Any]]

TUPLE2 = spaces.Tuple((spaces.Discrete(5), spaces.Discrete(5)))
MIXED_TUPLE = spaces.Tuple(
    (spaces.Discrete(3), spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32))
)
UINT8_BOX = spaces.Box(0, 255, shape=(2,), dtype=np.uint8)
BOX = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _samples(space: spaces.Space[Any], n: int, seed: int = 3) -> list[Any]:
    space.seed(seed)
    return [space.sample() for _ in range(n)]


# (action space, the actions of two steps for 2 envs)
CASES: dict[str, tuple[spaces.Space[Any], Callable[[], list[Any]]]] = {
    # PPO's and A2C's MultiBinary actions: Bernoulli samples, float32
    "multibinary_float32": (
        spaces.MultiBinary(3),
        lambda: [np.array([[1, 0, 1], [0, 0, 1]], np.float32), np.ones((2, 3), np.float32)],
    ),
    # PPO clips a uint8 Box's float32 actions to its bounds but keeps them float32
    "uint8_box_float32": (
        UINT8_BOX,
        lambda: [np.array([[1.5, 2.0], [3.0, 250.7]], np.float32), np.zeros((2, 2), np.float32)],
    ),
    "uint8_box_int64": (
        UINT8_BOX,
        lambda: [np.array([[1, 2], [3, 250]]), np.array([[0, 255], [7, 8]])],
    ),
    "uint8_box_uint8": (
        UINT8_BOX,
        lambda: [np.array([[1, 2], [3, 250]], np.uint8), np.array([[0, 255], [7, 8]], np.uint8)],
    ),
    "box_float32": (BOX, lambda: [np.full((2, 2), 0.25, np.float32), np.zeros((2, 2), np.float32)]),
    "box_float64_for_float32": (BOX, lambda: [np.full((2, 2), 0.1), np.zeros((2, 2))]),
    "discrete_int64": (spaces.Discrete(3), lambda: [np.array([2, 0]), np.array([1, 1])]),
    "discrete_int32": (
        spaces.Discrete(3),
        lambda: [np.array([2, 0], np.int32), np.array([1, 1], np.int32)],
    ),
    "discrete_python_ints": (spaces.Discrete(3), lambda: [[2, 0], [1, 1]]),
    "discrete_list_of_samples": (spaces.Discrete(3), lambda: [_samples(spaces.Discrete(3), 2)] * 2),
    "box_list_of_samples": (BOX, lambda: [_samples(BOX, 2), _samples(BOX, 2, seed=4)]),
    # SB3's test_vecenv_dict_spaces: a list of per-env samples of a Dict space
    "dict_per_env_samples": (
        sb3_envs.DICT_ACTION_SPACE,
        lambda: [
            _samples(sb3_envs.DICT_ACTION_SPACE, 2),
            _samples(sb3_envs.DICT_ACTION_SPACE, 2, 4),
        ],
    ),
    "dict_per_env_python_values": (
        sb3_envs.DICT_ACTION_SPACE,
        lambda: (
            [
                [
                    {"move": 2, "fire": [1, 0], "force": [0.5, -0.5]},
                    {"move": 0, "fire": [0, 1], "force": [0.0, 1.0]},
                ]
            ]
            * 2
        ),
    ),
    "dict_per_env_keys_reordered": (
        sb3_envs.DICT_ACTION_SPACE,
        lambda: (
            [
                [
                    {
                        "force": np.zeros(2, np.float32),
                        "fire": np.ones(2, np.int8),
                        "move": np.int64(1),
                    },
                    {
                        "force": np.ones(2, np.float32),
                        "fire": np.zeros(2, np.int8),
                        "move": np.int64(2),
                    },
                ]
            ]
            * 2
        ),
    ),
    # as many sub-spaces as envs: the layout that used to be transposed without an error
    "tuple_per_env_samples": (TUPLE2, lambda: [_samples(TUPLE2, 2), _samples(TUPLE2, 2, 4)]),
    "tuple_per_env_python_ints": (TUPLE2, lambda: [[(1, 2), (3, 4)], [(0, 4), (4, 0)]]),
    "tuple_mixed_per_env_samples": (
        MIXED_TUPLE,
        lambda: [_samples(MIXED_TUPLE, 2), _samples(MIXED_TUPLE, 2, 4)],
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_envs_get_what_dummy_vec_env_hands_them(case: str) -> None:
    act_space, make_actions = CASES[case]
    fns: list[EnvFn] = [partial(sb3_envs.action_env, act_space)] * 2
    ours = SubprocVecEnv(fns, num_workers=2)
    oracle = DummyVecEnv(fns)
    try:
        ours.reset()
        oracle.reset()
        for t, actions in enumerate(make_actions()):
            ours.step(actions)
            oracle.step(actions)
            assert_same(
                ours.get_attr("last_action"),
                oracle.get_attr("last_action"),
                f"{case} step {t}: the actions the envs got",
            )
    finally:
        ours.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_bad_actions_are_refused_naming_the_env() -> None:
    dict_space = sb3_envs.DICT_ACTION_SPACE
    fns: list[EnvFn] = [partial(sb3_envs.action_env, dict_space)] * 2
    vec_env = SubprocVecEnv(fns, num_workers=2)
    try:
        vec_env.reset()
        good = _samples(dict_space, 2)
        with pytest.raises(ValueError, match=r"actions\[1\]: missing key 'fire'"):
            vec_env.step([good[0], {"move": 1, "force": np.zeros(2, np.float32)}])
        with pytest.raises(ValueError, match=r"actions\[0\]\['force'\]: expected shape \(2,\)"):
            vec_env.step([{**good[0], "force": np.zeros(3, np.float32)}, good[1]])
        with pytest.raises(TypeError, match=r"actions\[1\]: expected a dict with keys"):
            vec_env.step([good[0], 3])
        with pytest.raises(ValueError, match="expected 2 actions, one per env, got 3"):
            vec_env.step([good[0], good[1], good[0]])
        with pytest.raises(TypeError, match="expected one action per env"):
            vec_env.step(5)
        vec_env.step(good)  # nothing was sent: the env still steps
    finally:
        vec_env.close()
    fns = [partial(sb3_envs.action_env, TUPLE2)] * 2
    vec_env = SubprocVecEnv(fns, num_workers=2)
    try:
        vec_env.reset()
        with pytest.raises(ValueError, match=r"actions\[0\]: expected a tuple of 2 items"):
            vec_env.step([(1, 2, 3), (1, 2)])
        with pytest.raises(ValueError, match=r"actions\[1\]\[0\]: expected shape \(\)"):
            vec_env.step([(1, 2), (np.array([1, 2]), 2)])
    finally:
        vec_env.close()
    fns = [partial(sb3_envs.action_env, spaces.MultiBinary(3))] * 2
    vec_env = SubprocVecEnv(fns, num_workers=2)
    try:
        vec_env.reset()
        with pytest.raises(ValueError, match=r"actions\[0\]: expected shape \(3,\)"):
            vec_env.step(np.zeros((2, 4), np.float32))  # by value: checked all the same
    finally:
        vec_env.close()


# --- training -----------------------------------------------------------------------------------


class DictActions(VecEnvWrapper):
    """What a user writes to train SB3 (whose PPO and A2C take no Dict action spaces) on a
    Dict-action env: the policy acts in a flat Box, and each env gets its own dict."""

    def __init__(self, venv: VecEnv) -> None:
        super().__init__(venv, action_space=spaces.Box(-1.0, 1.0, shape=(7,), dtype=np.float32))

    def step_async(self, actions: np.ndarray) -> None:
        self.venv.step_async(
            [
                {
                    "move": np.argmax(row[:3]),
                    "fire": (row[3:5] > 0).astype(np.int8),
                    "force": row[5:7],
                }
                for row in actions
            ]
        )

    def step_wait(self) -> Any:
        return self.venv.step_wait()

    def reset(self) -> Any:
        return self.venv.reset()


def _ppo(env: VecEnv) -> Any:
    return PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")


def _a2c(env: VecEnv) -> Any:
    return A2C("MlpPolicy", env, n_steps=8, seed=0, device="cpu")


def _learn(algo: Callable[[VecEnv], Any], make: EnvFn, steps: int, dict_actions: bool) -> None:
    venv: VecEnv = VecMonitor(SubprocVecEnv([make, make], num_workers=2))
    env = DictActions(venv) if dict_actions else venv
    try:
        model = algo(env)
        model.learn(total_timesteps=steps)
        assert model.num_timesteps >= steps
        actions, _ = model.predict(env.reset(), deterministic=True)
        env.step(actions)
        last = venv.get_attr("last_action")
        if dict_actions:
            assert [sorted(a) for a in last] == [["fire", "force", "move"]] * 2
        else:  # as DummyVecEnv: SB3's Bernoulli actions reach the env as float32
            assert all(a.dtype == np.float32 and set(a.tolist()) <= {0.0, 1.0} for a in last)
    finally:
        env.close()


LEARNERS = {
    "ppo_multibinary": (_ppo, sb3_envs.multibinary_env, False),
    "a2c_multibinary": (_a2c, sb3_envs.multibinary_env, False),
    "ppo_dict_actions": (_ppo, sb3_envs.dict_action_env, True),
    "a2c_dict_actions": (_a2c, sb3_envs.dict_action_env, True),
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", list(LEARNERS))
def test_algorithms_learn(name: str) -> None:
    """400 steps of rollouts and updates, 1 to 2 s each on 2 cores (PPO and A2C used to
    crash on their first step on a MultiBinary action space)."""
    algo, make, dict_actions = LEARNERS[name]
    _learn(algo, make, 400, dict_actions)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ppo_learns_a_multibinary_task() -> None:
    """3,000 steps of PPO on 4 envs (about 9 s on 2 cores): the deterministic return over
    16-step episodes goes from about 9 (chance: 8) to about 13 for seeds 0 to 2."""
    env = VecMonitor(SubprocVecEnv([sb3_envs.multibinary_env] * 4, num_workers=2))
    try:
        model = PPO(
            "MlpPolicy",
            env,
            n_steps=64,
            batch_size=64,
            n_epochs=4,
            learning_rate=3e-3,
            seed=0,
            device="cpu",
        )
        before, _ = evaluate_policy(model, env, n_eval_episodes=8, deterministic=True)
        model.learn(total_timesteps=3_000)
        after, _ = evaluate_policy(model, env, n_eval_episodes=8, deterministic=True)
        assert after > before + 2, (before, after)
    finally:
        env.close()
