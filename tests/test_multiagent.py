"""subvec.multiagent.MultiAgentVectorEnv against a plain serial loop over the same seeded
ParallelEnvs (tests.ma_envs.SerialRows, the oracle), on our own env whose agents leave and come
back and on PettingZoo's real ones (MPE2's simple_spread, pistonball, knights_archers_zombies)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pettingzoo")


from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from pettingzoo import ParallelEnv

from subvec import EnvError
from subvec.concat import concat_vec_envs
from subvec.multiagent import MultiAgentVectorEnv
from tests.ma_envs import Comings, SerialRows

NEXT, SAME, DISABLED = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED

LAYOUTS = {
    "one-worker": {"num_workers": 1},
    "env-per-worker": {"envs_per_worker": 1},
    "two-per-worker": {"envs_per_worker": 2},
    "parent-env": {"num_workers": 1, "parent_envs": 1},
    "pickled": {"num_workers": 2, "shared_memory": False},
}


def spread() -> Any:
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(max_cycles=9, continuous_actions=False)


def pistonball() -> Any:
    import pettingzoo

    return pettingzoo.make("parallel", "butterfly/pistonball-v6", n_pistons=6, max_cycles=7)


def _sample_rows(envs: MultiAgentVectorEnv, rng: np.random.Generator) -> np.ndarray:
    space = envs.single_action_space
    if isinstance(space, spaces.Discrete):
        return rng.integers(0, int(space.n), envs.num_envs)
    assert isinstance(space, spaces.Box)
    return rng.uniform(space.low, space.high, (envs.num_envs, *space.shape)).astype(space.dtype)


def run_against_oracle(
    make: Callable[[], Any], n: int, mode: AutoresetMode, steps: int, **kwargs: Any
) -> dict[str, int]:
    """Step the vector env and the oracle side by side with the same actions; every row's
    arrays must be equal. Returns counts of what happened (to check the run saw it)."""
    envs = MultiAgentVectorEnv([make] * n, autoreset_mode=mode, **kwargs)
    black_death = kwargs.get("black_death", False)
    ref = SerialRows([make() for _ in range(n)], mode, black_death=black_death)
    seen = {"departed": 0, "padded": 0, "truncated": 0, "finals": 0, "env_resets": 0}
    try:
        obs, infos = envs.reset(seed=3)
        ref_obs, ref_active = ref.reset(seed=3)
        np.testing.assert_array_equal(obs, ref_obs)
        np.testing.assert_array_equal(infos["active"], ref_active)
        rng = np.random.default_rng(1)
        for t in range(steps):
            actions = _sample_rows(envs, rng)
            obs, rew, term, trunc, infos = envs.step(actions)
            r_obs, r_rew, r_term, r_trunc, r_active, finals = ref.step(actions)
            for name, got, want in (
                ("obs", obs, r_obs),
                ("rewards", rew, r_rew),
                ("terminations", term, r_term),
                ("truncations", trunc, r_trunc),
                ("active", infos["active"], r_active),
            ):
                np.testing.assert_array_equal(got, want, err_msg=f"{name} at step {t}")
            assert rew.dtype == np.float64 and term.dtype == trunc.dtype == np.bool_
            if mode is SAME:
                mask = infos.get("_final_obs", np.zeros(envs.num_envs, bool))
                assert sorted(np.flatnonzero(mask).tolist()) == sorted(finals)
                for r, final in finals.items():
                    np.testing.assert_array_equal(infos["final_obs"][r], final)
                seen["finals"] += len(finals)
            else:
                assert "final_obs" not in infos
            ended = term | trunc
            if black_death:  # rows end a whole env at a time
                per_env = ended.reshape(n, envs.agents_per_env)
                assert (per_env.all(axis=1) | ~per_env.any(axis=1)).all(), f"step {t}"
            if mode is DISABLED:
                done_envs = [i for i, e in enumerate(ref.envs) if not e.agents]
                if done_envs:
                    mask = np.zeros(envs.num_envs, bool)
                    for i in done_envs:  # the rows that ended this step, as a user's loop has
                        mask[i * envs.agents_per_env : (i + 1) * envs.agents_per_env] = True
                    mask &= ended | ~infos["active"]
                    env_mask = np.zeros(n, bool)
                    env_mask[done_envs] = True
                    obs, infos = envs.reset(options={"reset_mask": mask})
                    r_obs, r_active = ref.reset(mask=env_mask)
                    np.testing.assert_array_equal(obs, r_obs)
                    np.testing.assert_array_equal(infos["active"], r_active)
                    seen["env_resets"] += len(done_envs)
            seen["departed"] += int(ended.sum())
            seen["truncated"] += int(trunc.sum())
            seen["padded"] += int((~infos["active"]).sum())
    finally:
        envs.close()
    return seen


@pytest.mark.timeout(90)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", [NEXT, SAME, DISABLED], ids=lambda m: m.value)
def test_rows_equal_the_serial_loop_with_agents_that_leave(
    mode: AutoresetMode, layout: str
) -> None:
    seen = run_against_oracle(Comings, 4, mode, 50, **LAYOUTS[layout])
    # the run saw agents leave mid-episode, padding, truncation and (SAME_STEP) final obs
    assert seen["departed"] > 20 and seen["padded"] > 20 and seen["truncated"] > 0
    assert mode is not SAME or seen["finals"] == seen["departed"]
    assert mode is not DISABLED or seen["env_resets"] >= 4


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.value)
def test_simple_spread_ends_on_truncation_as_the_loop_does(mode: AutoresetMode) -> None:
    seen = run_against_oracle(spread, 3, mode, 25, num_workers=2)
    assert seen["truncated"] >= 2 * 3 * 3  # every env truncated at least twice, all 3 agents


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("pymunk"),
    reason="pettingzoo[butterfly] not installed",
)
def test_pistonball_rows_equal_the_serial_loop() -> None:
    seen = run_against_oracle(pistonball, 2, SAME, 10, num_workers=2)
    assert seen["truncated"] == 2 * 6


def kaz() -> Any:
    import pettingzoo

    return pettingzoo.make(
        "parallel", "butterfly/knights_archers_zombies-v11", spawn_delay=2, max_cycles=400
    )


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("pygame"),
    reason="pettingzoo[butterfly] not installed",
)
@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.value)
def test_knights_archers_zombies_agents_die_as_in_the_loop(mode: AutoresetMode) -> None:
    # PettingZoo's own env whose agents leave: zombies kill knights and archers mid-episode
    seen = run_against_oracle(kaz, 2, mode, 400, num_workers=2)
    assert seen["departed"] > 8 and seen["padded"] > 0


def _first_obs(seed: int) -> np.ndarray:
    env = Comings()
    obs, _ = env.reset(seed=seed)
    return np.stack([obs[a] for a in env.agents])


@pytest.mark.timeout(60)
def test_each_env_gets_its_own_seed_across_workers() -> None:
    envs = MultiAgentVectorEnv([Comings] * 4, num_workers=2)
    try:
        obs, _ = envs.reset(seed=0)
        per_env = obs.reshape(4, 8, 4)[:, :7]  # agent a7 joins late: padded at reset
        for i in range(4):
            np.testing.assert_array_equal(per_env[i], _first_obs(i))
        noise = per_env[:, :, 3]
        assert len({row.tobytes() for row in noise}) == 4  # no two envs alike
        obs, _ = envs.reset(seed=[10, 20, 30, 40])
        np.testing.assert_array_equal(obs.reshape(4, 8, 4)[2, :7], _first_obs(30))
        with pytest.raises(ValueError, match="num_envs=4"):
            envs.reset(seed=[1] * envs.num_envs)  # one per ParallelEnv, not per row
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_spaces_rows_and_attributes() -> None:
    envs = MultiAgentVectorEnv([partial(Comings, num_agents=5)] * 3, num_workers=2)
    try:
        assert (envs.num_envs, envs.num_parallel_envs, envs.agents_per_env) == (15, 3, 5)
        assert envs.possible_agents == [f"a{j}" for j in range(5)]
        assert envs.single_observation_space == spaces.Box(-np.inf, np.inf, (4,), np.float32)
        assert envs.single_action_space == spaces.Discrete(3)
        assert envs.observation_space.shape == (15, 4)
        assert envs.action_space == spaces.MultiDiscrete([3] * 15)
        assert envs.env_and_agent(7) == (1, "a2")
        obs, _ = envs.reset(seed=0)
        obs, *_ = envs.step(np.full(15, 2))
        # row i * A + j is env i's agent j: the observation says so ([t, j, last action, noise])
        np.testing.assert_array_equal(obs[:, 1].reshape(3, 5)[:, :4], [[0, 1, 2, 3]] * 3)
        assert envs.get_attr("max_steps") == (12, 12, 12)
        assert envs.call("ping", 7, env_ids=[2]) == ((7, 1),)
        envs.set_attr("max_steps", [3, 4], env_ids=[0, 1])
        assert envs.get_attr("max_steps") == (3, 4, 12)
        assert envs.metadata["autoreset_mode"] is NEXT
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_infos_per_row_in_each_format() -> None:
    formats = {}
    for fmt in ("gymnasium", "legacy", "list"):
        envs = MultiAgentVectorEnv([Comings] * 2, num_workers=1, info_format=fmt)
        try:
            envs.reset(seed=1)
            steps = [envs.step(np.ones(16, dtype=np.int64)) for _ in range(12)]
            formats[fmt] = steps
        finally:
            envs.close()
    # step 3: every present agent reports {"score", "t"}; the gymnasium format masks the rows
    _, rew, *_, infos = formats["gymnasium"][2]
    mask = infos["_score"]
    # the agents present at the step's start (an agent that comes back says nothing yet)
    assert mask.sum() >= 10 and not (mask & ~infos["active"]).any()
    np.testing.assert_array_equal(infos["score"][mask], rew[mask])
    assert infos["t"].dtype == np.int64 and set(infos["t"][mask]) == {3}
    legacy_infos = formats["legacy"][2][-1]
    # SAME_STEP: a row that ended has its step's info in final_info instead
    ended_rows = legacy_infos.get("_final_info", np.zeros(16, bool))
    assert ended_rows.any()
    np.testing.assert_array_equal(legacy_infos["_score"] | ended_rows, mask)
    assert all("score" in legacy_infos["final_info"][r] for r in np.flatnonzero(ended_rows))
    listed = formats["list"][2][-1]
    assert isinstance(listed, list) and len(listed) == 16
    for r in range(16):
        assert listed[r]["active"] == infos["active"][r]
        assert ("score" in listed[r]) == mask[r]
    # legacy is SAME_STEP: an ended row has final_observation/final_info object arrays
    ended = [(t, s) for t, s in enumerate(formats["legacy"]) if (s[2] | s[3]).any()]
    _, (_, _, term, trunc, infos) = ended[0]
    rows = np.flatnonzero(term | trunc)
    assert infos["final_observation"].dtype == object
    np.testing.assert_array_equal(np.flatnonzero(infos["_final_observation"]), rows)
    assert all(isinstance(infos["final_info"][r], dict) for r in rows)


@pytest.mark.timeout(60)
def test_gymnasium_vector_wrappers_run_on_the_rows() -> None:
    from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics

    envs = MultiAgentVectorEnv([Comings] * 3, num_workers=2)
    ref = SerialRows([Comings() for _ in range(3)], NEXT)
    try:
        wrapped = NormalizeObservation(RecordEpisodeStatistics(envs))
        wrapped.reset(seed=0)
        ref.reset(seed=0)
        returns = np.zeros(envs.num_envs)
        episodes = 0
        rng = np.random.default_rng(0)
        for _ in range(40):
            actions = rng.integers(0, 3, envs.num_envs)
            obs, *_, infos = wrapped.step(actions)
            _, r_rew, r_term, r_trunc, *_ = ref.step(actions)
            returns += r_rew
            done = r_term | r_trunc
            if done.any():
                np.testing.assert_array_equal(infos["_episode"], done)
                np.testing.assert_allclose(infos["episode"]["r"][done], returns[done])
                episodes += int(done.sum())
                returns[done] = 0
            assert obs.shape == (24, 4) and np.isfinite(obs).all()
        assert episodes > 10
        assert abs(float(obs[:, 0].mean())) < 3  # normalised by the running statistics
    finally:
        envs.close()


class Unequal(ParallelEnv):  # type: ignore[misc]
    possible_agents = ["small", "big"]
    metadata: dict[str, Any] = {}

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0, 1, (2 if agent == "small" else 3,))

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)


@pytest.mark.timeout(60)
def test_bad_input_is_refused_clearly() -> None:
    with pytest.raises(EnvError, match=r"agent 'big' has the observation space Box.*agent 'small'"):
        MultiAgentVectorEnv([Unequal], num_workers=1)
    with pytest.raises(TypeError, match=r"observation_mode.: every ParallelEnv must share"):
        MultiAgentVectorEnv([Comings], info_format="gymnasium", observation_mode="different")
    envs = MultiAgentVectorEnv([Comings] * 2, num_workers=1, autoreset_mode=DISABLED)
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"16 rows \(2 envs x 8 agents\), got 15 rows"):
            envs.step(np.zeros(15, dtype=np.int64))
        with pytest.raises(ValueError, match="got a scalar"):
            envs.step(0)
        envs.step(np.zeros(16, dtype=np.int64))  # still usable
        with pytest.raises(ValueError, match=r"row 9 \(env 1, agent 'a1'\) .* still running"):
            envs.reset(options={"reset_mask": np.eye(16, dtype=bool)[9]})
        with pytest.raises(ValueError, match="bool array of 16 rows"):
            envs.reset(options={"reset_mask": np.ones(2, bool)})
        envs.step(np.zeros(16, dtype=np.int64))
    finally:
        envs.close()


class BadObs(Comings):
    def step(self, actions: dict[str, Any]) -> Any:
        obs, *rest = super().step(actions)
        if "a2" in obs:
            obs["a2"] = obs["a2"][:3]
        return (obs, *rest)


@pytest.mark.timeout(60)
def test_an_agents_observation_of_another_shape_names_the_env_and_agent() -> None:
    envs = MultiAgentVectorEnv([Comings, BadObs], num_workers=1)
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"agent 'a2'.s observation has shape \(3,\)") as err:
            envs.step(np.zeros(16, dtype=np.int64))
        assert isinstance(err.value, EnvError) and err.value.env_index == 1
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_an_env_error_names_the_env_and_keeps_its_type() -> None:
    envs = MultiAgentVectorEnv(
        [Comings, partial(Comings, fail_at=2)], num_workers=2, autoreset_mode=NEXT
    )
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(16, dtype=np.int64))
        with pytest.raises(RuntimeError, match="boom at t=2") as err:
            envs.step(np.zeros(16, dtype=np.int64))
        assert isinstance(err.value, EnvError) and err.value.env_index == 1
        envs.reset(seed=0)  # usable again
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_concat_vec_envs_takes_superSuits_arguments() -> None:
    ss = pytest.importorskip("supersuit")
    par = spread()
    # SuperSuit's own conversion in front, and one of its per-env wrappers
    markov = ss.pettingzoo_env_to_vec_env_v1(ss.dtype_v0(par, np.float64))
    envs = concat_vec_envs(markov, 3, num_cpus=2)
    try:
        assert isinstance(envs, MultiAgentVectorEnv)
        assert envs.num_envs == 9 and envs.env_vector.num_workers == 2  # type: ignore[attr-defined]
        assert envs.single_observation_space.dtype == np.float64
        obs, _ = envs.reset(seed=0)
        assert obs.dtype == np.float64
        # env instances are copies: different seeds give different envs
        assert not np.array_equal(obs[:3], obs[3:6])
    finally:
        envs.close()
    with pytest.raises(ValueError, match="base_class"):
        concat_vec_envs(par, 2, base_class="sb3")
    with pytest.raises(ValueError, match="got 2 env factories for num_vec_envs=3"):
        concat_vec_envs([spread, spread], 3)


def test_import_subvec_imports_no_pettingzoo() -> None:
    code = (
        "import sys, subvec, subvec.multiagent;"
        "print([m for m in ('pettingzoo', 'supersuit', 'stable_baselines3', 'torch') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(60)
def test_a_lost_worker_is_restarted_and_its_rows_truncated() -> None:
    import os
    import signal

    from tests.helpers import gone, wait_until

    envs = MultiAgentVectorEnv(
        [partial(Comings, num_agents=3, leave_p=0.0, late=0)] * 4,
        envs_per_worker=2,
        on_worker_failure="restart",
    )
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(12, dtype=np.int64))
        pid = envs.env_vector.placement[1].pid  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: gone(pid), 5)
        obs, rew, term, trunc, infos = envs.step(np.zeros(12, dtype=np.int64))
        # worker 1 held envs 2 and 3: rows 6..11 end truncated, with no reward
        assert list(trunc) == [False] * 6 + [True] * 6 and not term.any()
        assert not rew[6:].any()
        assert list(infos["_worker_restarted"]) == [False] * 6 + [True] * 6
        assert obs[6:, 0].tolist() == [0.0] * 6  # the new envs' first observations (t = 0)
        obs, *_ = envs.step(np.zeros(12, dtype=np.int64))
        assert obs[:6, 0].tolist() == [3.0] * 6 and obs[6:, 0].tolist() == [1.0] * 6
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_copy_false_rows_are_views_of_the_block() -> None:
    envs = MultiAgentVectorEnv([Comings] * 2, num_workers=1, copy=False)
    ref = SerialRows([Comings() for _ in range(2)], NEXT)
    try:
        first, _ = envs.reset(seed=4)
        ref.reset(seed=4)
        kept = []
        for _ in range(5):
            actions = np.ones(16, dtype=np.int64)
            obs, rew, term, *_ = envs.step(actions)
            want = ref.step(actions)
            np.testing.assert_array_equal(obs, want[0])
            kept.append((rew, want[1], term, want[2]))
        assert np.shares_memory(obs, first)  # the same block rows, no copy
        for rew, want_rew, term, want_term in kept:  # rewards and flags stay as handed out
            np.testing.assert_array_equal(rew, want_rew)
            np.testing.assert_array_equal(term, want_term)
    finally:
        del first, obs
        envs.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.value)
def test_send_recv_by_env_equal_each_envs_serial_loop(mode: AutoresetMode) -> None:
    n, a = 4, 8
    envs = MultiAgentVectorEnv([Comings] * n, envs_per_worker=1, autoreset_mode=mode)
    # one oracle per env: recv returns envs in any order, each env's rows follow its own loop
    refs = [SerialRows([Comings()], mode) for _ in range(n)]
    rng = np.random.default_rng(5)
    try:
        envs.async_reset(seed=11)
        for i, ref in enumerate(refs):
            ref.reset(seed=11 + i)
        zeros = (np.zeros(a), np.zeros(a, bool), np.zeros(a, bool))
        expect = {i: (ref.obs.copy(), ref.active.copy(), *zeros) for i, ref in enumerate(refs)}
        served = 0
        for _ in range(60):
            obs, rew, term, trunc, infos = envs.recv(min_envs=2)
            ids = infos["env_id"][::a].tolist()
            assert len(ids) >= 2 and list(infos["env_id"]) == np.repeat(ids, a).tolist()
            for k, i in enumerate(ids):
                rows = slice(k * a, (k + 1) * a)
                got = (obs[rows], infos["active"][rows], rew[rows], term[rows], trunc[rows])
                for name, g, w in zip(("obs", "active", "rew", "term", "trunc"), got, expect[i]):
                    np.testing.assert_array_equal(g, w, err_msg=f"env {i} {name}")
            actions = rng.integers(0, 3, len(ids) * a)
            for k, i in enumerate(ids):
                r_obs, r_rew, r_term, r_trunc, r_active, _ = refs[i].step(
                    actions[k * a : (k + 1) * a]
                )
                expect[i] = (r_obs, r_active, r_rew, r_term, r_trunc)
            envs.send(actions, ids)
            served += len(ids)
        obs, rew, *_ = envs.drain()
        assert served >= 120 and obs.shape[1:] == (4,) and len(rew) == len(obs)
        envs.reset(seed=0)  # idle again: lock-step works
    finally:
        envs.close()


@pytest.mark.timeout(90)
def test_recv_by_group_poll_and_deadline_by_rows(tmp_path: Any) -> None:
    check_recv_by_group_poll_and_deadline(tmp_path, envs_per_worker=1)


def check_recv_by_group_poll_and_deadline(tmp_path: Any, **kwargs: Any) -> None:
    """recv(env_ids=), poll() and recv(deadline=) return whole ParallelEnvs' rows, each env's
    equal to its own serial loop; envs whose step waits on a gate file are surely not ready.
    ``kwargs``: the layout or backend, one ParallelEnv per worker."""
    from subvec import RecvTimeoutError

    n, a = 4, 8
    gates = [tmp_path / f"gate{i}" for i in range(n)]
    fns = [partial(Comings, gate=str(g)) for g in gates]
    envs = MultiAgentVectorEnv(fns, **kwargs)
    refs = [SerialRows([Comings()], NEXT) for _ in range(n)]
    for i, ref in enumerate(refs):
        ref.reset(seed=4 + i)

    def check(batch: Any, ids: list[int], want: dict[int, tuple[Any, ...]]) -> None:
        obs, rew, term, trunc, infos = batch
        assert infos["env_id"].tolist() == np.repeat(ids, a).tolist()
        for k, i in enumerate(ids):
            rows = slice(k * a, (k + 1) * a)
            got = (obs[rows], infos["active"][rows], rew[rows], term[rows], trunc[rows])
            for name, g, w in zip(("obs", "active", "rew", "term", "trunc"), got, want[i]):
                np.testing.assert_array_equal(g, w, err_msg=f"env {i} {name}")

    try:
        assert envs.env_groups(2) == [[0, 1], [2, 3]]
        envs.async_reset(seed=4)
        zeros = (np.zeros(a), np.zeros(a, bool), np.zeros(a, bool))
        want = {i: (ref.obs.copy(), ref.active.copy(), *zeros) for i, ref in enumerate(refs)}
        check(envs.recv(env_ids=[3, 1]), [3, 1], want)
        check(envs.recv(env_ids=[0, 2]), [0, 2], want)
        actions = np.random.default_rng(2).integers(0, 3, n * a)
        for i, ref in enumerate(refs):
            r_obs, r_rew, r_term, r_trunc, r_active, _ = ref.step(actions[i * a : (i + 1) * a])
            want[i] = (r_obs, r_active, r_rew, r_term, r_trunc)
        envs.send(actions, [0, 1, 2, 3])
        obs, rew, term, trunc, infos = envs.poll()  # every gate shut: no env, rows shaped
        assert obs.shape == (0, 4) and obs.dtype == np.float32
        assert rew.shape == term.shape == trunc.shape == infos["active"].shape == (0,)
        assert infos["env_id"].shape == (0,)
        with pytest.raises(RecvTimeoutError):
            envs.recv(env_ids=[2], timeout=0.2)
        gates[2].touch()
        check(envs.recv(env_ids=[2]), [2], want)  # nothing was lost by the timeout
        for g in gates:
            g.touch()
        batch = envs.recv(min_envs=1, max_envs=3, deadline=30.0)
        ids = batch[4]["env_id"][::a].tolist()
        assert len(ids) == 3 and sorted(ids) == [0, 1, 3]  # filled to max_envs, not to 1
        check(batch, ids, want)
        stats = envs.async_stats()
        assert stats.batches == 4 and stats.recv_calls == 5 and stats.envs_returned == 8
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_nested_spaces_as_rows() -> None:
    from tests.ma_envs import Nested

    envs = MultiAgentVectorEnv([Nested] * 2, num_workers=1, pad_value=-1)
    try:
        assert isinstance(envs.single_observation_space, spaces.Dict)
        obs, _ = envs.reset(seed=10)
        assert obs["pos"].shape == (6, 2) and obs["last"].shape == (6,)
        np.testing.assert_array_equal(obs["pos"][:, 0], [10, 11, 12, 11, 12, 13])
        for t in range(1, 5):
            kind = np.arange(6) % 4
            move = np.full((6, 2), 0.5, np.float32) * (np.arange(6)[:, None] + 1)
            obs, rew, term, trunc, infos = envs.step((kind, move))
            active = infos["active"].reshape(2, 3)
            # b (rows 1 and 4) leaves at t = 2 and is padding (-1) from t = 3
            assert active[:, 1].tolist() == [t <= 2] * 2
            live = infos["active"]
            np.testing.assert_array_equal(obs["last"][live], kind[live])
            np.testing.assert_array_equal(obs["pos"][live, 1], t + move[live, 1])
            np.testing.assert_array_equal(rew[live], kind[live])
            assert (obs["pos"][~live] == -1).all() and (obs["last"][~live] == -1).all()
            assert term.tolist() == [False, t == 2, False] * 2
            assert trunc.tolist() == ([t == 4, False, t == 4] * 2)
        with pytest.raises(TypeError, match=r"actions: expected a tuple of 2 items"):
            envs.step(kind)
    finally:
        envs.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", [NEXT, SAME, DISABLED], ids=lambda m: m.value)
def test_black_death_rows_end_with_their_env_only(mode: AutoresetMode) -> None:
    seen = run_against_oracle(Comings, 4, mode, 50, black_death=True, num_workers=2)
    # agents left mid-episode (padding) without ending their rows; whole envs ended, some
    # on truncation, every row of them (8 agents each)
    assert seen["padded"] > 20 and seen["truncated"] > 0
    assert seen["departed"] > 0 and seen["departed"] % 8 == 0
    assert mode is not SAME or seen["finals"] == seen["departed"]
    with pytest.raises(TypeError, match="black_death must be a bool"):
        MultiAgentVectorEnv([Comings], black_death="yes")  # type: ignore[arg-type]


def _sub_step_infos(infos: dict[str, Any], k: int) -> dict[str, Any]:
    """Sub-step ``k`` of a chunk's gymnasium infos, as that ``step()``'s infos: the arrays'
    chunk axis taken, keys and masks kept only where some row reported them."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or key in ("chunk_steps",):
            continue
        mask = infos["_" + key][:, k]
        if mask.any():
            out[key] = _sub_step_infos(value, k) if isinstance(value, dict) else value[:, k]
            out["_" + key] = mask
    return out


def _same_infos(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    assert sorted(got) == sorted(want), where
    for key, value in want.items():
        if isinstance(value, dict):
            _same_infos(got[key], value, f"{where}[{key}]")
        elif value.dtype == object:  # final_obs, final_info: one object per row
            assert len(got[key]) == len(value), where
            for r, (g, w) in enumerate(zip(got[key], value)):
                if isinstance(w, dict):
                    _same_infos(g, w, f"{where}[{key}][{r}]")
                else:
                    np.testing.assert_array_equal(g, w, err_msg=f"{where}[{key}][{r}]")
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=f"{where}[{key}]")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("all_obs", [False, True], ids=["last-obs", "all-obs"])
@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.value)
def test_step_chunk_by_rows_is_k_steps(mode: AutoresetMode, all_obs: bool) -> None:
    """Sub-step k of every row is exactly its k-th step(): rewards, flags, observations and
    infos (active, the agents' own, SAME_STEP's final_obs) against a twin stepped K times."""
    kwargs = {"autoreset_mode": mode, "num_workers": 2}
    chunked = MultiAgentVectorEnv([Comings] * 4, **kwargs)
    stepped = MultiAgentVectorEnv([Comings] * 4, **kwargs)
    rng = np.random.default_rng(0)
    seen = {"ended": 0, "padded": 0, "finals": 0}
    try:
        chunked.reset(seed=5)
        stepped.reset(seed=5)
        for chunk in (3, 5, 1, 4, 6, 4):
            actions = rng.integers(0, 3, (chunked.num_envs, chunk))
            obs, rew, term, trunc, infos = chunked.step_chunk(actions, all_obs=all_obs)
            assert rew.shape == term.shape == trunc.shape == (chunked.num_envs, chunk)
            assert infos["chunk_steps"].tolist() == [chunk] * chunked.num_envs
            for k in range(chunk):
                s_obs, s_rew, s_term, s_trunc, s_infos = stepped.step(actions[:, k])
                where = f"K={chunk} sub-step {k}"
                if all_obs:
                    np.testing.assert_array_equal(obs[:, k], s_obs, err_msg=where)
                np.testing.assert_array_equal(rew[:, k], s_rew, err_msg=where)
                np.testing.assert_array_equal(term[:, k], s_term, err_msg=where)
                np.testing.assert_array_equal(trunc[:, k], s_trunc, err_msg=where)
                _same_infos(_sub_step_infos(infos, k), s_infos, where)
                seen["ended"] += int((s_term | s_trunc).sum())
                seen["padded"] += int((~s_infos["active"]).sum())
                seen["finals"] += int(s_infos.get("_final_obs", np.zeros(1, bool)).sum())
            if not all_obs:
                np.testing.assert_array_equal(obs, s_obs)
            np.testing.assert_array_equal(chunked.ended_envs, stepped.ended_envs)
    finally:
        chunked.close()
        stepped.close()
    assert seen["ended"] > 10 and seen["padded"] > 10
    assert mode is not SAME or seen["finals"] == seen["ended"]


@pytest.mark.timeout(90)
def test_step_chunk_by_rows_stops_an_ended_env_and_refuses_bad_chunks() -> None:
    envs = MultiAgentVectorEnv([Comings] * 3, num_workers=1, info_format="list")
    try:
        envs.reset(seed=1)
        rng = np.random.default_rng(2)
        stopped = 0
        for _ in range(6):
            actions = rng.integers(0, 3, (envs.num_envs, 6))
            _, rew, term, trunc, infos = envs.step_chunk(actions, stop_on_done=True)
            a = envs.agents_per_env
            for i in range(3):
                steps = infos[i * a]["chunk_steps"]
                assert all(infos[i * a + j]["chunk_steps"] == steps for j in range(a))
                assert len(infos[i * a]["infos"]) == steps
                assert all("active" in sub for sub in infos[i * a]["infos"])
                rows = slice(i * a, (i + 1) * a)
                # nothing after the sub-step its env ended
                assert not rew[rows, steps:].any() and not term[rows, steps:].any()
                if steps < 6:
                    stopped += 1
                    assert (term[rows, steps - 1] | trunc[rows, steps - 1]).any()
        assert stopped > 0
        with pytest.raises(ValueError, match=r"one chunk per agent, \(24, K, \.\.\.\)"):
            envs.step_chunk(np.zeros(envs.num_envs, dtype=np.int64))
        with pytest.raises(ValueError, match="one chunk per agent"):
            envs.step_chunk(np.zeros((envs.num_envs - 1, 2), dtype=np.int64))
        envs.step_chunk(np.zeros((envs.num_envs, 2), dtype=np.int64))  # still usable
    finally:
        envs.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("all_obs", [False, True], ids=["last-obs", "all-obs"])
def test_send_chunk_by_rows_equals_step_chunk_per_env(all_obs: bool) -> None:
    """Two halves of the envs run chunks concurrently (send_chunk, recv as they come); each
    env's rows equal what a twin's lock-step step_chunk of the same actions gave them."""
    kwargs = {"envs_per_worker": 1, "autoreset_mode": SAME}
    staged = MultiAgentVectorEnv([Comings] * 4, **kwargs)
    twin = MultiAgentVectorEnv([Comings] * 4, **kwargs)
    a = staged.agents_per_env
    rng = np.random.default_rng(3)
    try:
        staged.reset(seed=9)
        twin.reset(seed=9)
        for chunk in (3, 3, 5, 2):
            actions = rng.integers(0, 3, (staged.num_envs, chunk))
            want = twin.step_chunk(actions, all_obs=all_obs)
            for half in ([0, 1], [2, 3]):
                rows = np.concatenate([np.arange(i * a, (i + 1) * a) for i in half])
                staged.send_chunk(actions[rows], half, all_obs=all_obs)
            got_envs: list[int] = []
            while len(got_envs) < 4:
                obs, rew, term, trunc, infos = staged.recv(min_envs=1)
                ids = sorted(set(infos["env_id"].tolist()))
                for pos, i in enumerate(infos["env_id"][::a].tolist()):
                    mine, theirs = slice(pos * a, (pos + 1) * a), slice(i * a, (i + 1) * a)
                    where = f"K={chunk} env {i}"
                    np.testing.assert_array_equal(obs[mine], want[0][theirs], err_msg=where)
                    np.testing.assert_array_equal(rew[mine], want[1][theirs], err_msg=where)
                    np.testing.assert_array_equal(term[mine], want[2][theirs], err_msg=where)
                    np.testing.assert_array_equal(trunc[mine], want[3][theirs], err_msg=where)
                    np.testing.assert_array_equal(
                        infos["active"][mine], want[4]["active"][theirs], err_msg=where
                    )
                got_envs += ids
            assert sorted(got_envs) == [0, 1, 2, 3]
            np.testing.assert_array_equal(staged.ended_envs, twin.ended_envs)
        staged.send_chunk(np.zeros((2 * a, 2), dtype=np.int64), [0, 1], all_obs=all_obs)
        with pytest.raises(ValueError, match=r"all_obs=.* chunks in flight"):
            staged.send_chunk(np.zeros((2 * a, 2), dtype=np.int64), [2, 3], all_obs=not all_obs)
        staged.drain()
    finally:
        staged.close()
        twin.close()
