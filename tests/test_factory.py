"""subvec.make_vec against gymnasium.make_vec / SyncVectorEnv, and the remote() proxy."""

from __future__ import annotations

from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import NameNotFound
from gymnasium.vector import SyncVectorEnv

import subvec
from subvec._compat import GYM_029, NAMES_AUTORESET_MODE, AutoresetMode
from subvec.factory import VECTOR_KWARGS, EnvFactory
from tests.envs import ZooEnv
from tests.helpers import assert_same
from tests.oracle import require_oracle


def step_both(envs: Any, oracle: Any, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for t in range(steps):
        actions = rng.integers(0, 2, size=envs.num_envs)
        assert_same(envs.step(actions), oracle.step(actions), f"step {t}")


@pytest.mark.timeout(60)
def test_seed_seeds_the_first_reset_and_the_action_spaces() -> None:
    envs = subvec.make_vec("CartPole-v1", 4, seed=7, num_workers=2)
    oracle = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync")
    try:
        assert_same(envs.reset(), oracle.reset(seed=7), "first reset")
        step_both(envs, oracle, 50)
        # Later resets without a seed continue each env's stream; they do not reseed.
        assert_same(envs.reset(), oracle.reset(), "second reset")
        oracle.action_space.seed(7)
        oracle.single_action_space.seed(7)
        assert_same(envs.action_space.sample(), oracle.action_space.sample())
        assert_same(envs.single_action_space.sample(), oracle.single_action_space.sample())
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_an_explicit_seed_at_the_first_reset_wins() -> None:
    envs = subvec.make_vec("CartPole-v1", 3, seed=7)
    oracle = gym.make_vec("CartPole-v1", 3, vectorization_mode="sync")
    try:
        assert_same(envs.reset(seed=[1, 2, 3]), oracle.reset(seed=[1, 2, 3]))
        assert_same(envs.reset(), oracle.reset(), "the stored seed is forgotten")
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_no_seed_leaves_each_env_its_own_entropy() -> None:
    envs = subvec.make_vec("CartPole-v1", 3)
    try:
        obs, _ = envs.reset()
        assert len({row.tobytes() for row in obs}) == 3
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.skipif(GYM_029, reason="gymnasium 0.29 has no ClipReward, its make_vec no modes")
def test_env_kwargs_and_wrappers_match_gymnasium_make_vec() -> None:
    wrappers = [
        gym.wrappers.RecordEpisodeStatistics,
        partial(gym.wrappers.ClipReward, max_reward=0.5),
    ]
    require_oracle(AutoresetMode.SAME_STEP)
    envs = subvec.make_vec(
        "CartPole-v1",
        3,
        seed=3,
        env_kwargs={"max_episode_steps": 5},
        wrappers=wrappers,
        autoreset_mode="SameStep",
    )
    oracle = gym.make_vec(
        "CartPole-v1",
        3,
        vectorization_mode="sync",
        wrappers=wrappers,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        max_episode_steps=5,
    )
    try:
        assert envs.spec is not None and envs.spec.id == "CartPole-v1"
        assert envs.spec.kwargs["max_episode_steps"] == 5 and envs.spec.kwargs["num_envs"] == 3
        # gymnasium 1.0 names no autoreset mode in its vector envs' metadata
        assert envs.metadata.get("autoreset_mode") is (
            AutoresetMode.SAME_STEP if NAMES_AUTORESET_MODE else None
        )
        assert_same(envs.reset(), oracle.reset(seed=3), "reset")
        rng = np.random.default_rng(0)
        for t in range(12):
            actions = rng.integers(0, 2, size=3)
            got, want = envs.step(actions), oracle.step(actions)
            for infos in (got[4], want[4]):  # wall-clock episode times differ by nature
                if "final_info" in infos and "episode" in infos["final_info"]:
                    del infos["final_info"]["episode"]["t"]
            assert_same(got, want, f"step {t}")
            if t == 4:  # truncated by max_episode_steps, recorded by the wrapper
                assert got[3].all() and (got[4]["final_info"]["episode"]["l"] == 5).all()
        assert_same(envs.get_attr("spec"), oracle.get_attr("spec"))
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_callable_with_env_kwargs() -> None:
    envs = subvec.make_vec(ZooEnv, 4, seed=1, env_kwargs={"max_steps": 2}, num_workers=2)
    oracle = SyncVectorEnv([partial(ZooEnv, max_steps=2) for _ in range(4)])
    try:
        assert envs.spec is None
        assert envs.get_attr("max_steps") == (2, 2, 2, 2)
        assert_same(envs.reset(), oracle.reset(seed=1), "reset")
        rng = np.random.default_rng(1)
        for t in range(20):
            actions = rng.integers(0, 3, size=4)
            assert_same(envs.step(actions), oracle.step(actions), f"step {t}")
    finally:
        envs.close()
        oracle.close()


class _Registered(ZooEnv):
    """Registered under an id in the test process only: workers never ran the registration."""


@pytest.mark.timeout(60)
def test_ids_registered_only_in_the_parent_build_in_workers() -> None:
    gym.register("SubvecTestOnly-v0", entry_point=_Registered, kwargs={"max_steps": 3})
    try:
        with pytest.warns(UserWarning, match="latest versioned"):
            envs = subvec.make_vec("SubvecTestOnly", 2, context="spawn")
        try:
            assert envs.get_attr("max_steps") == (3, 3)
            assert envs.spec is not None and envs.spec.id == "SubvecTestOnly-v0"
        finally:
            envs.close()
    finally:
        del gym.registry["SubvecTestOnly-v0"]


def test_unknown_id_fails_in_the_parent() -> None:
    with pytest.raises(NameNotFound, match="CartPol"):
        subvec.make_vec("CartPol-v1", 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_worker": 2}, "'num_worker': did you mean 'num_workers'"),
        ({"autoreset": "SameStep"}, "did you mean 'autoreset_mode'"),
        ({"max_episode_steps": 5}, r"pass env_kwargs=\{'max_episode_steps': ...\}"),
        ({"vectorization_mode": "async"}, "always runs the envs in worker processes"),
        ({"vector_kwargs": {"copy": False}}, "pass SubprocVectorEnv's options directly"),
        ({"env_fns": []}, "call subvec.SubprocVectorEnv"),
    ],
)
def test_unknown_kwargs_say_what_to_change(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message) as info:
        subvec.make_vec("CartPole-v1", 2, **kwargs)
    assert "accepted: " + ", ".join(VECTOR_KWARGS) in str(info.value)


def test_every_unknown_kwarg_is_named() -> None:
    with pytest.raises(TypeError, match="arguments 'num_worker', 'gravity'"):
        subvec.make_vec("CartPole-v1", 2, num_worker=2, gravity=3.0)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("CartPole-v1", 0), {}, ValueError, "num_envs must be a positive int"),
        (("CartPole-v1", 2), {"seed": [1, 2]}, TypeError, "reset\\(seed=\\[...\\]\\)"),
        (("CartPole-v1", 2), {"seed": True}, TypeError, "seed must be an int"),
        (("CartPole-v1", 2), {"wrappers": [3]}, TypeError, "wrappers\\[0\\]"),
        (("CartPole-v1", 2), {"env_kwargs": [("a", 1)]}, TypeError, "env_kwargs must be a dict"),
        ((42, 2), {}, TypeError, "registered env id, an EnvSpec or a callable"),
    ],
)
def test_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        subvec.make_vec(*args, **kwargs)


def test_env_factory_rejects_non_envs() -> None:
    with pytest.raises(TypeError, match=r"not a gymnasium\.Env"):
        EnvFactory(lambda: 3)()
    assert "CartPole-v1" in repr(EnvFactory(gym.spec("CartPole-v1")))


# --- remote() ------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_remote_proxy_forwards_to_call() -> None:
    envs = subvec.make_vec(ZooEnv, 3, seed=0, num_workers=2)
    oracle = SyncVectorEnv([ZooEnv for _ in range(3)])
    try:
        for venv in (envs, oracle):
            venv.reset(seed=0)
            venv.step(np.zeros(3, dtype=np.int64))
        rem = subvec.remote(envs)
        assert rem.get_t(10) == envs.call("get_t", 10) == subvec.remote(oracle).get_t(10)
        assert rem.get_t(plus=1) == tuple(t + 1 for t in envs.get_attr("t"))
        assert rem.marker() == ("default",) * 3  # a non-callable attribute is read
        assert "get_t" in repr(rem.get_t)
        with pytest.raises(AttributeError, match="private names"):
            _ = rem._secret
        with pytest.raises(AttributeError, match="set_attr"):
            rem.marker = "x"
        with pytest.raises(AttributeError, match="nonexistent"):
            rem.nonexistent()
    finally:
        envs.close()
        oracle.close()


def test_remote_needs_call() -> None:
    with pytest.raises(TypeError, match="call\\(\\) method"):
        subvec.remote(object())  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "build",
    [
        "subvec.make_vec('CartPole-v1', 2, backend='ray')",
        "import subvec.sb3; subvec.sb3.SubprocVecEnv([lambda: None] * 2, backend='ray')",
    ],
)
def test_the_ray_backend_without_ray_says_what_to_install(build: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    if "sb3" in build:
        pytest.importorskip("stable_baselines3")
    # sys.modules["ray"] = None: the import fails as it does where ray is not installed
    code = f"import sys; sys.modules['ray'] = None; import subvec; {build}"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError") and 'pip install "subvec[ray]"' in last, last
