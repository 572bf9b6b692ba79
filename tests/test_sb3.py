"""subvec.sb3.SubprocVecEnv against Stable-Baselines3's DummyVecEnv, the oracle for the SB3 face.

Same seeds and actions must give identical observations, rewards, dones, infos (terminal
observations included) and reset infos; SB3's wrappers, helpers and algorithms run on top.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from stable_baselines3 import A2C, DQN, PPO, SAC
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)

import subvec.sb3
from subvec.sb3 import SubprocVecEnv
from tests import sb3_envs
from tests.helpers import assert_same

EnvFn = Callable[[], gym.Env[Any, Any]]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def plain(value: Any) -> Any:
    """OrderedDict (DummyVecEnv's Dict observations) -> dict, recursively; drops the wall-clock
    time of Monitor's episode records (``info["episode"]["t"]``), which no two runs share."""
    if isinstance(value, (dict, OrderedDict)):
        return {k: plain(v) for k, v in value.items() if not (k == "t" and "r" in value)}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def sample_actions(space: gym.Space[Any], n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=n)
    assert isinstance(space, gym.spaces.Box)
    return rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(space.dtype)


def assert_step_same(got: Any, want: Any, where: str) -> None:
    obs, rewards, dones, infos = got
    assert_same(plain(obs), plain(want[0]), f"{where} obs")
    assert_same(rewards, want[1], f"{where} rewards")
    assert_same(dones, want[2], f"{where} dones")
    assert_same(plain(infos), plain(want[3]), f"{where} infos")


def run_against_dummy(
    fns: list[EnvFn], steps: int, seed: int = 11, wrap: Callable[[VecEnv], VecEnv] = lambda v: v
) -> None:
    inner = SubprocVecEnv(fns, num_workers=2)
    try:
        ours, oracle = wrap(inner), wrap(DummyVecEnv(fns))
    except BaseException:
        inner.close()
        raise
    try:
        assert ours.observation_space == oracle.observation_space
        assert ours.action_space == oracle.action_space
        assert ours.render_mode == oracle.render_mode
        assert ours.seed(seed) == oracle.seed(seed)
        assert_same(plain(ours.reset()), plain(oracle.reset()), "reset")
        assert_same(ours.reset_infos, oracle.reset_infos, "reset_infos")
        rng = np.random.default_rng(seed)
        ended = 0
        for t in range(steps):
            actions = sample_actions(ours.action_space, ours.num_envs, rng)
            got, want = ours.step(actions), oracle.step(actions)
            assert_step_same(got, want, f"step {t}")
            assert_same(ours.reset_infos, oracle.reset_infos, f"reset_infos at step {t}")
            ended += int(got[2].sum())
        assert ended > 0, "no episode ended: the test saw no terminal observation"
    finally:
        ours.close()
        oracle.close()


# --- the contract -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "make",
    [cartpole, sb3_envs.dict_env, sb3_envs.image_env, sb3_envs.box_env],
    ids=["cartpole", "dict_obs", "image", "box_actions"],
)
def test_rollouts_match_dummy_vec_env(make: EnvFn) -> None:
    run_against_dummy([make for _ in range(5)], steps=300)


@pytest.mark.timeout(60)
def test_step_results_are_sb3_typed() -> None:
    envs = SubprocVecEnv([sb3_envs.zoo_env for _ in range(3)])
    try:
        envs.reset()
        obs, rewards, dones, infos = envs.step(np.zeros(3, dtype=np.int64))
        again = envs.step(np.zeros(3, dtype=np.int64))
        assert rewards.dtype == np.float32 and rewards.flags.writeable
        assert dones.dtype == np.bool_ and dones.shape == (3,)
        assert rewards is not again[1] and not np.shares_memory(rewards, again[1])
        assert not np.shares_memory(obs, again[0])
        rewards += 1.0  # PPO adds bootstrapped values in place
        assert isinstance(infos, list) and all(type(i) is dict for i in infos)
        infos[0]["mine"] = 1  # mutable and private to the caller
        assert all("TimeLimit.truncated" in i for i in infos)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_truncation_is_reported_as_sb3_does() -> None:
    envs = SubprocVecEnv([partial(sb3_envs.zoo_env, max_steps=1) for _ in range(2)])
    try:
        envs.seed(0)
        first = envs.reset()
        _, _, dones, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert dones.all()
        for info in infos:
            assert info["terminal_observation"].shape == first.shape[1:]
            # TimeLimit.truncated is True only if the episode was cut, not also terminated.
            assert isinstance(info["TimeLimit.truncated"], bool)
        assert all("reset_count" in r for r in envs.reset_infos)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_seed_and_options_apply_at_next_reset_only() -> None:
    fns = [sb3_envs.zoo_env for _ in range(4)]
    ours, oracle = SubprocVecEnv(fns, num_workers=2), DummyVecEnv(fns)
    try:
        for venv in (ours, oracle):
            venv.seed(5)
            venv.set_options([{"a": 1}, {}, {"a": 1}, {"b": np.zeros(2)}])
        assert_same(ours.reset(), oracle.reset(), "reset with per-env options")
        assert_same(ours.reset_infos, oracle.reset_infos, "reset infos with per-env options")
        assert [i.get("options_seen") for i in ours.reset_infos] == [["a"], None, ["a"], ["b"]]
        # Seeds and options are used once: the next reset draws on, without options.
        assert_same(ours.reset(), oracle.reset(), "second reset")
        assert_same(ours.reset_infos, oracle.reset_infos, "second reset infos")
        assert all("options_seen" not in i for i in ours.reset_infos)
        for venv in (ours, oracle):
            venv.set_options({"same": True})
        assert_same(ours.reset(), oracle.reset(), "reset with shared options")
        assert all(i["options_seen"] == ["same"] for i in ours.reset_infos)
    finally:
        ours.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_per_index_access() -> None:
    envs = SubprocVecEnv([sb3_envs.zoo_env for _ in range(5)], num_workers=2)
    try:
        envs.reset()
        envs.step(np.zeros(5, dtype=np.int64))
        assert envs.get_attr("max_steps") == [7] * 5
        envs.set_attr("marker", "x", indices=[1, 3])
        assert envs.get_attr("marker") == ["default", "x", "default", "x", "default"]
        envs.set_attr("marker", "y", indices=np.int64(4))
        assert envs.get_attr("marker", indices=[4, -1, 0]) == ["y", "y", "default"]
        # Each env gets its own copy of a mutable value, as with one process per env.
        envs.set_attr("box", [], indices=[0, 1])
        envs.env_method("get_wrapper_attr", "box", indices=0)[0].append(1)  # a copy: no effect
        assert envs.get_attr("box", indices=[0, 1]) == [[], []]
        # Methods run only on the given envs, in the given order, repeats included.
        ts = envs.get_attr("t")
        assert envs.env_method("get_t", 10, indices=[2, 0]) == [ts[2] + 10, ts[0] + 10]
        assert envs.env_method("get_t", plus=1, indices=[3, 3]) == [ts[3] + 1] * 2
        assert envs.env_method("get_t", indices=[]) == []
        assert envs.has_attr("marker") and not envs.has_attr("nonexistent")
        with pytest.raises(AttributeError, match="nonexistent"):
            envs.get_attr("nonexistent")
        with pytest.raises(IndexError, match="out of range"):
            envs.get_attr("marker", indices=[5])
        with pytest.raises(TypeError, match="ints"):
            envs.get_attr("marker", indices=["0"])
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_indices_reach_only_the_workers_holding_them() -> None:
    envs = SubprocVecEnv([sb3_envs.zoo_env for _ in range(4)], num_workers=2)
    try:
        pool = envs.vector_env._pool
        workers = pool.workers
        envs.reset()
        before = [pool.seq(w) for w in workers]
        assert envs.env_method("get_t", 1, indices=[1, 0, 1]) == [1, 1, 1]
        envs.set_attr("marker", "x", indices=[0])
        assert envs.get_attr("marker", indices=-1) == ["default"]
        assert envs.env_is_wrapped(gym.Wrapper, indices=[3]) == [False]
        assert [pool.seq(w) for w in workers] == [before[0] + 2, before[1] + 2]
        # The envs carry nothing of the adapter's (no per-env helper attribute).
        assert not envs.has_attr("_subvec_ops")
        # Per-env options go out in one reset, as DummyVecEnv hands them (empty: none).
        envs.set_options([{"a": 1}, {}, {"b": 2}, {}])
        before = [pool.seq(w) for w in workers]
        envs.reset()
        assert [pool.seq(w) for w in workers] == [before[0] + 1, before[1] + 1]
        assert [i.get("options_seen") for i in envs.reset_infos] == [["a"], None, ["b"], None]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_set_attr_side_effects_stay_on_the_targeted_envs() -> None:
    ours = SubprocVecEnv([sb3_envs.zoo_env for _ in range(4)], num_workers=2)
    oracle = DummyVecEnv([sb3_envs.zoo_env for _ in range(4)])
    try:
        for venv in (ours, oracle):
            venv.seed(1)
            venv.reset()
            venv.env_method("reset", seed=99, indices=[2])
            venv.set_attr("max_steps", 2, indices=[0, 2])
        assert_same(ours.get_attr("t"), oracle.get_attr("t"))
        actions = np.zeros(4, dtype=np.int64)
        for t in range(6):
            assert_step_same(ours.step(actions), oracle.step(actions), f"step {t}")
    finally:
        ours.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_env_is_wrapped() -> None:
    fns = [sb3_envs.marked_zoo, sb3_envs.zoo_env, lambda: Monitor(sb3_envs.zoo_env())]
    envs = SubprocVecEnv(fns)
    try:
        assert envs.env_is_wrapped(sb3_envs.Marker) == [True, False, False]
        assert envs.env_is_wrapped(gym.Wrapper) == [True, False, True]
        assert envs.env_is_wrapped(Monitor, indices=[2, 0]) == [True, False]

        class Local(gym.Wrapper[Any, Any, Any, Any]):  # by value under cloudpickle: by name here
            pass

        assert envs.env_is_wrapped(Local) == [False, False, False]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_env_refusing_attributes_still_works() -> None:
    envs = SubprocVecEnv([sb3_envs.FrozenEnv for _ in range(2)])
    try:
        envs.reset()
        assert envs.get_attr("marker", indices=[1]) == ["default"]
        assert envs.env_method("get_t", indices=[0]) == [0]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_render_and_images() -> None:
    envs = SubprocVecEnv([partial(sb3_envs.zoo_env, render_mode="rgb_array")] * 4)
    try:
        envs.reset()
        images = envs.get_images()
        assert len(images) == 4 and all(img.shape == (4, 4, 3) for img in images)
        big = envs.render()
        assert big is not None and big.shape == (8, 8, 3)
        assert envs.metadata["render_modes"] == ["rgb_array"]
    finally:
        envs.close()
    envs = SubprocVecEnv([sb3_envs.zoo_env])
    try:
        with pytest.warns(UserWarning, match="rgb_array"):
            assert envs.get_images() == [None]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_env_errors_keep_their_type_and_index() -> None:
    from tests.envs import CrashEnv

    # No episode may end before step 2 (an autoreset would restart the step count).
    calm = {"max_steps": 10**6, "terminate_prob": 0.0}
    envs = SubprocVecEnv(
        [lambda: CrashEnv(**calm), lambda: CrashEnv(how="raise", at_step=2, **calm)]
    )
    try:
        envs.reset()
        envs.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(KeyError, match="boom") as info:
            envs.step(np.zeros(2, dtype=np.int64))
        assert isinstance(info.value, subvec.EnvError) and info.value.env_index == 1
    finally:
        envs.close()


def test_options_the_adapter_owns_are_refused_by_name() -> None:
    fns = [cartpole]
    with pytest.raises(TypeError, match="'autoreset_mode': SB3 resets envs in the same step"):
        SubprocVecEnv(fns, autoreset_mode="NextStep")
    with pytest.raises(TypeError, match="'context': pass start_method"):
        SubprocVecEnv(fns, context="spawn")
    with pytest.raises(TypeError, match="'num_worker': did you mean 'num_workers'"):
        SubprocVecEnv(fns, num_worker=2)
    with pytest.raises(ValueError, match="copy=False"):
        SubprocVecEnv(fns, copy=False)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(60)
def test_close_is_idempotent_and_start_method_is_passed() -> None:
    envs = SubprocVecEnv([cartpole, cartpole], start_method="spawn", num_workers=1)
    assert envs.vector_env.context == "spawn" and envs.vector_env.num_workers == 1
    envs.close()
    envs.close()
    assert envs.closed


@pytest.mark.timeout(90)
def test_import_subvec_leaves_sb3_and_torch_out() -> None:
    code = textwrap.dedent(
        """
        import sys
        import subvec
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("torch", "stable_baselines3", "ray")
                       or m == "subvec.sb3")
        print(heavy)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


# --- SB3's helpers and wrappers on top ----------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("use_sb3_helper", [True, False], ids=["sb3_make_vec_env", "subvec"])
def test_make_vec_env(use_sb3_helper: bool) -> None:
    if use_sb3_helper:
        ours = make_vec_env("CartPole-v1", n_envs=3, seed=4, vec_env_cls=SubprocVecEnv)
    else:
        ours = subvec.sb3.make_vec_env("CartPole-v1", n_envs=3, seed=4, num_workers=2)
        assert ours.vector_env.num_workers == 2
    oracle = make_vec_env("CartPole-v1", n_envs=3, seed=4)
    try:
        assert isinstance(ours, SubprocVecEnv)
        assert ours.env_is_wrapped(Monitor) == [True] * 3
        assert ours.render_mode == oracle.render_mode == "rgb_array"
        assert_same(ours.reset(), oracle.reset(), "reset")
        rng = np.random.default_rng(0)
        for t in range(60):
            actions = rng.integers(0, 2, size=3)
            assert_step_same(ours.step(actions), oracle.step(actions), f"step {t}")
    finally:
        ours.close()
        oracle.close()


def test_make_vec_env_rejects_unknown_options() -> None:
    with pytest.raises(TypeError, match="'envs_per_workers': did you mean 'envs_per_worker'"):
        subvec.sb3.make_vec_env("CartPole-v1", n_envs=2, envs_per_workers=2)
    with pytest.raises(TypeError, match="both in vec_env_kwargs and as keyword"):
        subvec.sb3.make_vec_env(
            "CartPole-v1", n_envs=2, vec_env_kwargs={"num_workers": 1}, num_workers=2
        )


def _normalize(venv: VecEnv) -> VecEnv:
    return VecNormalize(venv, gamma=0.9)


def _frame_stack(venv: VecEnv) -> VecEnv:
    return VecFrameStack(VecMonitor(venv), n_stack=3)


def _transpose(venv: VecEnv) -> VecEnv:
    return VecFrameStack(VecTransposeImage(venv), n_stack=2, channels_order="first")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("make", "wrap"),
    [
        (cartpole, _normalize),
        (sb3_envs.box_dict_env, _normalize),
        (cartpole, _frame_stack),
        (sb3_envs.box_dict_env, _frame_stack),
        (sb3_envs.image_env, _transpose),
    ],
    ids=["normalize", "normalize_dict", "monitor_framestack", "framestack_dict", "transpose"],
)
def test_sb3_wrappers_on_top_match_dummy(make: EnvFn, wrap: Callable[[VecEnv], VecEnv]) -> None:
    run_against_dummy([make for _ in range(4)], steps=150, wrap=wrap)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wrap", [None, _transpose], ids=["bare", "transpose_framestack"])
def test_observation_slots_under_sb3(wrap: Callable[[VecEnv], VecEnv] | None) -> None:
    # SB3 keeps the last observations (self._last_obs) while it steps again: a batch from an
    # observation slot must stay as it was, and results must match DummyVecEnv's.
    fns = [sb3_envs.big_image_env for _ in range(4)]
    run_against_dummy(fns, steps=60, wrap=wrap or (lambda v: v))
    venv = SubprocVecEnv(fns, num_workers=2)
    try:
        venv.seed(3)
        last = venv.reset()
        rng = np.random.default_rng(0)
        used = set()
        for t in range(40):
            previous, value = last, last.copy()
            last = venv.step(sample_actions(venv.action_space, 4, rng))[0]
            used.add(venv.vector_env._obs.slot)
            assert_same(previous, value, f"the previous batch after step {t}")
        assert used >= {1, 2}, "the slots were not used"
        held, value = last, last.copy()
        for _ in range(5):
            venv.step(sample_actions(venv.action_space, 4, rng))
            assert_same(held, value, "a held batch")
    finally:
        venv.close()


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(90)
def test_evaluate_policy_matches_dummy() -> None:
    fns = [cartpole for _ in range(4)]
    ours, oracle = VecMonitor(SubprocVecEnv(fns)), VecMonitor(DummyVecEnv(fns))
    try:
        model = PPO("MlpPolicy", oracle, n_steps=16, seed=0, device="cpu")
        results = []
        for venv in (ours, oracle):
            venv.seed(3)
            results.append(
                evaluate_policy(model, venv, n_eval_episodes=8, return_episode_rewards=True)
            )
        assert results[0] == results[1]
    finally:
        ours.close()
        oracle.close()


# --- algorithms ---------------------------------------------------------------------------------


def _ppo(env: VecEnv) -> Any:
    return PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")


def _ppo_dict(env: VecEnv) -> Any:
    return PPO("MultiInputPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")


def _a2c(env: VecEnv) -> Any:
    return A2C("MlpPolicy", env, n_steps=8, seed=0, device="cpu")


def _dqn(env: VecEnv) -> Any:
    return DQN(
        "MlpPolicy", env, learning_starts=50, buffer_size=500, batch_size=16, seed=0, device="cpu"
    )


def _sac(env: VecEnv) -> Any:
    return SAC(
        "MlpPolicy", env, learning_starts=50, buffer_size=500, batch_size=16, seed=0, device="cpu"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("algo", "make"),
    [
        (_ppo, cartpole),
        (_ppo_dict, sb3_envs.dict_env),
        (_a2c, cartpole),
        (_dqn, cartpole),
        (_sac, partial(gym.make, "Pendulum-v1")),
        (_sac, sb3_envs.box_env),
    ],
    ids=["ppo", "ppo_dict_obs", "a2c", "dqn", "sac_pendulum", "sac_box"],
)
def test_algorithms_learn(algo: Callable[[VecEnv], Any], make: EnvFn) -> None:
    env = VecMonitor(SubprocVecEnv([make, make]))
    try:
        model = algo(env)
        model.learn(total_timesteps=300)
        assert model.num_timesteps >= 300
        obs = env.reset()
        actions, _ = model.predict(obs, deterministic=True)
        env.step(actions)
    finally:
        env.close()


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
def test_ppo_learns_cartpole() -> None:
    """A small learning smoke test: 16k steps of PPO on 8 CartPoles (about 6 s on 2 cores).

    Returns are measured with the stochastic policy on the same envs: about 20 before
    training; after, 90 to 500 over the seeds tried (docs/sb3.md has the numbers).
    """
    env = VecMonitor(SubprocVecEnv([cartpole for _ in range(8)]))
    try:
        env.seed(0)
        model = PPO(
            "MlpPolicy",
            env,
            n_steps=32,
            batch_size=256,
            n_epochs=20,
            gamma=0.98,
            gae_lambda=0.8,
            learning_rate=1e-3,
            ent_coef=0.0,
            seed=0,
            device="cpu",
        )
        before, _ = evaluate_policy(model, env, n_eval_episodes=24, deterministic=False)
        model.learn(total_timesteps=16_000)
        after, _ = evaluate_policy(model, env, n_eval_episodes=24, deterministic=False)
        print(f"PPO CartPole mean return: before {before:.1f}, after {after:.1f}")
        assert before < 40
        assert after > before + 50, (before, after)
    finally:
        env.close()


@pytest.mark.timeout(60)
def test_restarted_worker_reads_as_a_truncation_without_terminal_observation() -> None:
    from tests.envs import crash_fns

    vec_env = SubprocVecEnv(
        crash_fns(4, 3, "kill", at_step=2), num_workers=2, on_worker_failure="restart"
    )
    try:
        vec_env.reset()
        actions = np.zeros(4, dtype=np.int64)
        vec_env.step(actions)
        _, rewards, dones, infos = vec_env.step(actions)
        assert list(dones) == [False, False, True, True]
        assert rewards.dtype == np.float32 and rewards[3] == 0.0
        assert infos[3] == {"TimeLimit.truncated": True, "worker_restarted": True}
        assert "terminal_observation" not in infos[3]
        assert "worker_restarted" not in vec_env.reset_infos[3]
        vec_env.step(actions)
    finally:
        vec_env.close()
