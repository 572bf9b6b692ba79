"""subvec.multiagent_sb3.MultiAgentVecEnv against a serial DummyVecEnv-style VecEnv written
here over the same ParallelEnvs (the oracle); SB3's wrappers, evaluate_policy and PPO on top."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("stable_baselines3")

from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecEnv, VecMonitor, VecNormalize

from subvec.concat import concat_vec_envs
from subvec.multiagent_sb3 import MultiAgentVecEnv
from tests.ma_envs import Comings

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def spread() -> Any:
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(max_cycles=10, continuous_actions=False)


class SerialAgentsVecEnv(VecEnv):  # type: ignore[misc]
    """What a DummyVecEnv over agents as rows does, written as a plain loop over the
    ParallelEnvs: rows env-major, padding (zeros) for absent agents, an env reset in the step
    its last agent leaves, each ended row with its terminal observation. With ``black_death``
    no row ends before its env; then every row of it does."""

    def __init__(self, par_env_fns: Sequence[Callable[[], Any]], black_death: bool = False) -> None:
        self.black_death = black_death
        self.envs = [fn() for fn in par_env_fns]
        self.agents = list(self.envs[0].possible_agents)
        self.A = len(self.agents)
        first = self.agents[0]
        obs_space = self.envs[0].observation_space(first)
        super().__init__(len(self.envs) * self.A, obs_space, self.envs[0].action_space(first))
        self.obs = np.zeros((self.num_envs, *obs_space.shape), obs_space.dtype)
        self.active = np.zeros(self.num_envs, bool)
        self.seed_value: int | None = None
        self.actions: Any = None

    def _put(self, i: int, obs: dict[str, Any]) -> None:
        for j, a in enumerate(self.agents):
            r = i * self.A + j
            self.active[r] = a in obs
            self.obs[r] = obs.get(a, 0)

    def seed(self, seed: int | None = None) -> list[int | None]:
        self.seed_value = seed
        return [None] * self.num_envs

    def reset(self) -> np.ndarray:
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if self.seed_value is None else self.seed_value + i)
            self._put(i, obs)
        self.seed_value = None
        return self.obs.copy()

    def step_async(self, actions: np.ndarray) -> None:
        self.actions = actions

    def step_wait(self) -> Any:
        n = self.num_envs
        rew = np.zeros(n, np.float32)
        dones = np.zeros(n, bool)
        infos: list[dict[str, Any]] = [{} for _ in range(n)]
        for i, env in enumerate(self.envs):
            live = list(env.agents)
            acts = {a: self.actions[i * self.A + self.agents.index(a)] for a in live}
            obs, r, te, tr, inf = env.step(acts)
            self._put(i, obs)
            cut = not env.agents and any(tr[a] for a in obs)
            for j, a in enumerate(self.agents):
                k = i * self.A + j
                if a in obs:
                    rew[k] = r[a]
                    infos[k] = dict(inf.get(a, {}))
                if self.black_death:
                    ended, truncated = not env.agents, cut
                elif a in obs:
                    ended, truncated = te[a] or tr[a], bool(tr[a] and not te[a])
                else:
                    continue
                if ended:
                    dones[k] = True
                    infos[k]["terminal_observation"] = self.obs[k].copy()
                    infos[k]["TimeLimit.truncated"] = truncated
            if not env.agents:
                obs, _ = env.reset()
                self._put(i, obs)
        for k, info in enumerate(infos):
            info["active"] = bool(self.active[k])
            info.setdefault("TimeLimit.truncated", False)
        return self.obs.copy(), rew, dones, infos

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self.envs[r // self.A], attr_name, None) for r in range(self.num_envs)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        raise NotImplementedError

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kw: Any) -> list[Any]:
        raise NotImplementedError

    def env_is_wrapped(self, wrapper_class: Any, indices: Any = None) -> list[bool]:
        return [False] * self.num_envs


def _same_infos(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for r, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w), (r, sorted(g), sorted(w))
        for key in w:
            np.testing.assert_array_equal(g[key], w[key], err_msg=f"row {r} {key}")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("black_death", [False, True], ids=["pad", "black_death"])
@pytest.mark.parametrize("make", [Comings, spread], ids=["comings", "simple_spread"])
def test_steps_like_the_serial_reference(make: Callable[[], Any], black_death: bool) -> None:
    n = 3
    venv = MultiAgentVecEnv([make] * n, num_workers=2, black_death=black_death)
    ref = SerialAgentsVecEnv([make] * n, black_death=black_death)
    try:
        assert venv.num_envs == ref.num_envs
        assert venv.seed(7)[: ref.A + 1] == [7] * ref.A + [8]
        ref.seed(7)
        np.testing.assert_array_equal(venv.reset(), ref.reset())
        rng = np.random.default_rng(0)
        done_rows = truncated_rows = 0
        for _ in range(30):
            actions = rng.integers(0, int(venv.action_space.n), venv.num_envs)
            obs, rew, dones, infos = venv.step(actions)
            r_obs, r_rew, r_dones, r_infos = ref.step(actions)
            np.testing.assert_array_equal(obs, r_obs)
            assert rew.dtype == np.float32
            np.testing.assert_array_equal(rew, r_rew)
            np.testing.assert_array_equal(dones, r_dones)
            _same_infos(infos, r_infos)
            done_rows += int(dones.sum())
            truncated_rows += sum(bool(i["TimeLimit.truncated"]) for i in infos)
        assert done_rows > 9 and truncated_rows > 0
    finally:
        venv.close()
        ref.close()


@pytest.mark.timeout(90)
def test_vec_monitor_and_vec_normalize_match_the_reference() -> None:
    fns = [Comings] * 2
    venv = VecNormalize(VecMonitor(MultiAgentVecEnv(fns, num_workers=2)), gamma=0.9)
    ref = VecNormalize(VecMonitor(SerialAgentsVecEnv(fns)), gamma=0.9)
    try:
        venv.seed(0)
        ref.seed(0)
        np.testing.assert_allclose(venv.reset(), ref.reset())
        rng = np.random.default_rng(3)
        episodes = 0
        for _ in range(40):
            actions = rng.integers(0, 3, venv.num_envs)
            obs, rew, dones, infos = venv.step(actions)
            r_obs, r_rew, r_dones, r_infos = ref.step(actions)
            np.testing.assert_allclose(obs, r_obs)
            np.testing.assert_allclose(rew, r_rew)
            np.testing.assert_array_equal(dones, r_dones)
            for g, w in zip(infos, r_infos):
                assert ("episode" in g) == ("episode" in w)
                if "episode" in w:
                    assert (g["episode"]["r"], g["episode"]["l"]) == (
                        w["episode"]["r"],
                        w["episode"]["l"],
                    )
                    episodes += 1
        assert episodes > 10
        np.testing.assert_allclose(venv.obs_rms.mean, ref.obs_rms.mean)
    finally:
        venv.close()
        ref.close()


@pytest.mark.timeout(120)
def test_ppo_learns_the_same_weights_as_over_the_serial_reference() -> None:
    def train(venv: VecEnv) -> dict[str, Any]:
        model = PPO("MlpPolicy", venv, n_steps=16, batch_size=32, n_epochs=2, seed=0)
        model.learn(total_timesteps=3 * 16 * venv.num_envs)
        weights = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
        weights["_eval"] = evaluate_policy(  # type: ignore[assignment]
            model, VecMonitor(venv), n_eval_episodes=6, return_episode_rewards=True
        )
        return weights

    fns = [partial(Comings, num_agents=4)] * 2
    venv = MultiAgentVecEnv(fns, envs_per_worker=1)
    ref = SerialAgentsVecEnv(fns)
    try:
        got, want = train(venv), train(ref)
    finally:
        venv.close()
        ref.close()
    returns, lengths = got.pop("_eval")
    assert (returns, lengths) == want.pop("_eval") and len(returns) == 6
    assert set(got) == set(want)
    for k in want:
        assert (got[k] == want[k]).all(), k


@pytest.mark.timeout(60)
def test_attributes_and_methods_by_env() -> None:
    venv = MultiAgentVecEnv([partial(Comings, num_agents=3)] * 3, num_workers=2)
    try:
        venv.reset()
        assert venv.get_attr("max_steps") == [12] * 9
        venv.set_attr("max_steps", 5, indices=[4])  # row 4 is env 1's agent a1
        assert venv.get_attr("max_steps", indices=[0, 3, 5, 8]) == [12, 5, 5, 12]
        # each env's method runs once, its result given to each of its rows asked for
        assert venv.env_method("ping", 1, indices=[3, 4, 0]) == [(1, 1), (1, 1), (1, 1)]
        assert venv.env_is_wrapped(VecMonitor) == [False] * 9
        venv.set_options({"anything": 1})  # reaches every ParallelEnv's reset, once
        venv.reset()
        assert venv.get_attr("last_options") == [{"anything": 1}] * 9
        venv.reset()
        assert venv.get_attr("last_options") == [None] * 9
        with pytest.raises(TypeError, match="one dict for every ParallelEnv"):
            venv.set_options([{}] * 9)
        with pytest.raises(IndexError, match="row index 9 out of range for 9 rows"):
            venv.get_attr("max_steps", indices=[9])
        with pytest.raises(ValueError, match=r"9 rows \(3 envs x 3 agents\), got 8"):
            venv.step(np.zeros(8, dtype=np.int64))
    finally:
        venv.close()
    with pytest.raises(TypeError, match="sets autoreset_mode itself"):
        MultiAgentVecEnv([Comings], autoreset_mode="next_step")


@pytest.mark.timeout(90)
def test_ppo_seed_and_the_supersuit_swap() -> None:
    ss = pytest.importorskip("supersuit")
    venv = concat_vec_envs(
        ss.pettingzoo_env_to_vec_env_v1(spread()), 4, num_cpus=2, base_class="stable_baselines3"
    )
    try:
        assert isinstance(venv, MultiAgentVecEnv) and venv.num_envs == 12
        PPO("MlpPolicy", venv, n_steps=8, batch_size=48, n_epochs=1, seed=0).learn(96)
        venv.reset()
        venv.seed(0)
        again = venv.reset()
        venv.seed(0)
        np.testing.assert_array_equal(venv.reset(), again)
        # envs differ from each other: no overlapping seeds
        per_env = again.reshape(4, 3, -1)
        assert len({e.tobytes() for e in per_env}) == 4
    finally:
        venv.close()
