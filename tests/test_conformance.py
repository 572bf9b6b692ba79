"""Conformance: SubprocVectorEnv against gymnasium's SyncVectorEnv, the oracle.

Same seeds must give byte-identical observations, rewards, terminations, truncations and infos
for every autoreset mode, worker layout, start method and observation space.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from subvec import SubprocVectorEnv
from subvec._infos import InfoBlockReader, merge_columns
from tests.envs import (
    LooseDtypeEnv,
    ScalarInfoEnv,
    SilentEnv,
    SteadyInfoEnv,
    ZooEnv,
    make_zoo,
    space_zoo,
)
from tests.helpers import assert_same

MODES = list(AutoresetMode)
STEPS = 40


def run_side_by_side(
    fns: list[Any], mode: AutoresetMode, steps: int = STEPS, **kwargs: Any
) -> SubprocVectorEnv:
    """Step both implementations with the same actions; assert every result is identical."""
    oracle = SyncVectorEnv(fns, autoreset_mode=mode)
    envs = SubprocVectorEnv(fns, autoreset_mode=mode, **kwargs)
    try:
        assert envs.single_observation_space == oracle.single_observation_space
        assert envs.observation_space == oracle.observation_space
        assert envs.action_space == oracle.action_space
        assert envs.metadata == oracle.metadata
        assert_same(envs.reset(seed=123), oracle.reset(seed=123), "reset")
        envs.action_space.seed(7)
        for t in range(steps):
            actions = envs.action_space.sample()
            got = envs.step(actions)
            want = oracle.step(actions)
            assert_same(got, want, f"step {t}")
            if mode is AutoresetMode.DISABLED and (got[2] | got[3]).any():
                mask = got[2] | got[3]
                options = {"reset_mask": mask, "level": 1}
                snapshot = dict(options)
                got_reset = envs.reset(options=options)
                assert options.keys() == snapshot.keys(), "caller's options were mutated"
                assert_same(got_reset, oracle.reset(options=dict(options)), f"reset at {t}")
        return envs
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("space_name", list(space_zoo()))
def test_every_space_matches_sync(space_name: str, mode: AutoresetMode) -> None:
    fns = [make_zoo(space_name) for _ in range(5)]
    run_side_by_side(fns, mode, num_workers=2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize(
    "layout",
    [{"num_workers": 6}, {"envs_per_worker": 3}, {"num_workers": 4}, {"num_workers": 1}],
    ids=["one_per_worker", "three_per_worker", "uneven", "single_worker"],
)
def test_every_layout_matches_sync(layout: dict[str, int], mode: AutoresetMode) -> None:
    fns = [make_zoo("dict_nest") for _ in range(6)]
    run_side_by_side(fns, mode, **layout)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_every_start_method_matches_sync(context: str, mode: AutoresetMode) -> None:
    # Lambdas and closures as factories: cloudpickle must carry them under every method.
    scale = 3

    def closure():
        return make_zoo("tuple_nest", max_steps=scale + 2)()

    fns = [closure, lambda: make_zoo("box_f32")()][:1] * 4
    run_side_by_side(fns, mode, num_workers=2, context=context)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_pipe_observations_match_sync(mode: AutoresetMode) -> None:
    fns = [make_zoo("dict_nest") for _ in range(4)]
    run_side_by_side(fns, mode, num_workers=2, shared_memory=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "act_space",
    [
        spaces.Box(-1, 1, shape=(2,), dtype=np.float32),
        spaces.MultiDiscrete([3, 2]),
        spaces.Dict({"move": spaces.Discrete(4), "force": spaces.Box(0, 1, (2,))}),
        spaces.Text(max_length=3),
    ],
    ids=["box", "multidiscrete", "dict", "text_by_pipe"],
)
def test_action_spaces_reach_the_env_unchanged(act_space: spaces.Space[Any]) -> None:
    fns = [make_zoo("box_f64", act_space) for _ in range(3)]
    oracle = SyncVectorEnv(fns)
    with_actions = SubprocVectorEnv(fns, num_workers=2)
    try:
        with_actions.reset(seed=1)
        oracle.reset(seed=1)
        with_actions.action_space.seed(3)
        for _ in range(5):
            actions = with_actions.action_space.sample()
            with_actions.step(actions)
            oracle.step(actions)
            assert_same(
                with_actions.get_attr("last_action"),
                tuple(env.unwrapped.last_action for env in oracle.envs),
            )
    finally:
        with_actions.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_cartpole_matches_sync_for_hundreds_of_steps() -> None:
    import gymnasium as gym

    fns = [lambda: gym.make("CartPole-v1") for _ in range(8)]
    run_side_by_side(fns, AutoresetMode.NEXT_STEP, steps=300)
    run_side_by_side(fns, AutoresetMode.SAME_STEP, steps=300, num_workers=3)


@pytest.mark.timeout(60)
def test_observation_mode_different_matches_sync() -> None:
    def factory(high: float):
        return lambda: make_zoo("box_f64")()

    import gymnasium as gym

    fns = [
        lambda: gym.make("Pendulum-v1", g=9.81),
        lambda: gym.make("Pendulum-v1", g=1.62),
        lambda: gym.make("Pendulum-v1", g=3.0),
    ]
    envs = run_side_by_side(fns, AutoresetMode.NEXT_STEP, observation_mode="different")
    assert envs.closed
    # Past Pendulum's 200-step time limit: SAME_STEP final observations from the block
    run_side_by_side(fns, AutoresetMode.SAME_STEP, steps=210, observation_mode="different")


@pytest.mark.timeout(60)
def test_list_info_format_holds_each_envs_events() -> None:
    fns = [make_zoo("box_f32") for _ in range(4)]
    oracle = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    envs = SubprocVectorEnv(fns, autoreset_mode="SameStep", info_format="list", num_workers=2)
    try:
        _, got = envs.reset(seed=5)
        _, want = oracle.reset(seed=5)
        assert [info["reset_count"] for info in got] == list(want["reset_count"])
        envs.action_space.seed(0)
        ended = 0
        for _ in range(30):
            actions = envs.action_space.sample()
            _, _, term, trunc, got = envs.step(actions)
            _, _, _, _, want = oracle.step(actions)
            assert isinstance(got, list) and len(got) == 4
            for i, info in enumerate(got):
                assert ("final_obs" in info) == bool(term[i] or trunc[i])
                if "final_obs" in info:
                    ended += 1
                    assert_same(info["final_obs"], want["final_obs"][i])
                    assert info["reset_count"] == want["reset_count"][i]
                if "score" in info:
                    assert info["score"] == want["score"][i]
        assert ended > 0
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["zoo", "silent"])
def test_legacy_info_format_is_gymnasium_029_layout(kind: str) -> None:
    # silent: no infos at all, so the final events are rebuilt from the flags (SAME_STEP)
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    maker = make_zoo("box_f32") if kind == "zoo" else lambda: SilentEnv(box, terminate_prob=0.2)
    fns = [maker for _ in range(4)]
    oracle = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    envs = SubprocVectorEnv(fns, info_format="legacy", num_workers=2)
    try:
        assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
        envs.reset(seed=5)
        oracle.reset(seed=5)
        envs.action_space.seed(0)
        seen_final = False
        for _ in range(30):
            actions = envs.action_space.sample()
            obs, _, term, trunc, infos = envs.step(actions)
            want_obs, _, _, _, want = oracle.step(actions)
            assert_same(obs, want_obs)
            done = term | trunc
            if done.any():
                seen_final = True
                assert infos["final_observation"].dtype == object
                assert list(infos["_final_observation"]) == list(done)
                for i in range(4):
                    if done[i]:
                        assert_same(infos["final_observation"][i], want["final_obs"][i])
                        assert isinstance(infos["final_info"][i], dict)
                    else:
                        assert infos["final_observation"][i] is None
                        assert infos["final_info"][i] is None
            else:
                assert "final_observation" not in infos
        assert seen_final
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("info_format", ["list", "legacy"])
def test_steady_infos_from_the_block_in_list_and_legacy_formats(
    info_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The oracle: the same vector env with the block's info regions left out, whose infos
    # travel as pickled events (each format's own conformance tests check those).
    fns = [lambda: SteadyInfoEnv(terminate_prob=0.05, max_steps=10**6) for _ in range(5)]
    kwargs: dict[str, Any] = {"info_format": info_format, "num_workers": 2}
    envs = SubprocVectorEnv(fns, **kwargs)
    monkeypatch.setattr("subvec.vector._BLOCK_INFO_FORMATS", ())
    oracle = SubprocVectorEnv(fns, **kwargs)
    try:
        assert envs._info_block is not None and oracle._info_block is None
        assert_same(envs.reset(seed=9), oracle.reset(seed=9), "reset")
        envs.action_space.seed(3)
        flagged = 0
        for t in range(60):
            actions = envs.action_space.sample()
            got = envs.step(actions)
            flagged += envs._info_block.flagged()
            assert_same(got, oracle.step(actions), f"step {t}")  # types and key order too
        assert flagged >= 30
    finally:
        envs.close()
        oracle.close()


class CastingEnv(ZooEnv):
    """Returns observations in another dtype than its space's, as real envs often do."""

    def __init__(self, dtype: Any) -> None:
        super().__init__(spaces.Box(-5, 5, shape=(3,), dtype=np.float32))
        self.out_dtype = dtype

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return obs.astype(self.out_dtype) * 1.1, info

    def step(self, action: Any):
        obs, *rest = super().step(action)
        return (obs.astype(self.out_dtype) * 1.1, *rest)


@pytest.mark.timeout(60)
def test_observation_dtype_is_cast_exactly_as_sync_casts() -> None:
    fns = [lambda: CastingEnv(np.float64), lambda: CastingEnv(np.int64)] * 2
    run_side_by_side(fns, AutoresetMode.NEXT_STEP, num_workers=2)


@pytest.mark.timeout(60)
def test_impossible_observation_cast_fails_like_sync() -> None:
    class ComplexObs(CastingEnv):
        def __init__(self) -> None:
            super().__init__(np.complex128)

    with pytest.raises(TypeError):
        SyncVectorEnv([ComplexObs]).reset(seed=0)
    envs = SubprocVectorEnv([ComplexObs, ComplexObs], num_workers=2)
    try:
        with pytest.raises(TypeError, match=r"env 0: observation of dtype complex128"):
            envs.reset(seed=0)
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("space_name", ["dict_nest", "box_scalar", "text"])
def test_parent_envs_and_spinning_match_sync(space_name: str, mode: AutoresetMode) -> None:
    # The parent steps the last two envs itself while one busy-polling worker steps the rest.
    fns = [make_zoo(space_name) for _ in range(5)]
    envs = run_side_by_side(fns, mode, num_workers=1, parent_envs=2, spin_us=200)
    assert envs.parent_envs == 2 and envs.spin_us == 200


@pytest.mark.timeout(60)
def test_parent_envs_serve_calls_and_attributes() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f32")] * 4, parent_envs=2)
    try:
        assert envs.num_workers == 1  # the default leaves the parent a CPU of its own
        assert envs.spin_us > 0  # one worker + the parent fit on two CPUs: busy-poll
        envs.reset(seed=3)
        envs.step(np.array([0, 1, 2, 0]))
        assert envs.call("get_t", plus=1) == (2, 2, 2, 2)
        envs.set_attr("marker", ["a", "b", "c", "d"])
        assert envs.get_attr("marker") == ("a", "b", "c", "d")
        assert len(envs.worker_pids) == 1
    finally:
        envs.close()


def _final_obs_fns(kind: str) -> list[Any]:
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)

    def fn(i: int) -> Any:
        if kind == "silent" or i < 4:
            return lambda: SilentEnv(box, terminate_prob=0.2)
        if i == 6:
            return lambda: LooseDtypeEnv(box, terminate_prob=0.2, quiet=True)
        return lambda: ZooEnv(box, terminate_prob=0.2, quiet=i != 5)

    return [fn(i) for i in range(8)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["silent", "mixed"])
@pytest.mark.parametrize("layout", ["workers", "parent_envs"])
def test_same_step_final_observations_kept_in_the_block_match_sync(kind: str, layout: str) -> None:
    # SAME_STEP: an ended env's final observation stays in the block and, when its final info
    # is empty, the worker sends no event for it: envs 0-3 (worker 0) have no infos at all,
    # so their ends travel as plain OKs. In "mixed", env 4 sends reset infos that must follow
    # the rebuilt final event, env 5 step infos, and env 6's float64 observations do not fit
    # the float32 block and travel by value.
    kwargs: dict[str, Any] = {"num_workers": 2}
    if layout == "parent_envs":
        kwargs = {"num_workers": 1, "parent_envs": 4}
    envs = run_side_by_side(_final_obs_fns(kind), AutoresetMode.SAME_STEP, steps=80, **kwargs)
    assert envs._final_in_block


@pytest.mark.timeout(60)
def test_same_step_final_observations_in_the_list_format() -> None:
    same_step = AutoresetMode.SAME_STEP
    fns = _final_obs_fns("mixed")
    envs = SubprocVectorEnv(fns, autoreset_mode=same_step, info_format="list", num_workers=2)
    oracle = SyncVectorEnv(fns, autoreset_mode=same_step)
    try:
        envs.reset(seed=5)
        oracle.reset(seed=5)
        envs.action_space.seed(1)
        ended = 0
        for t in range(80):
            actions = envs.action_space.sample()
            got, want = envs.step(actions), oracle.step(actions)
            assert_same(got[:4], want[:4], f"step {t}")
            for i, info in enumerate(got[4]):
                assert ("final_obs" in info) == bool(got[2][i] or got[3][i]), (t, i)
                if "final_obs" in info:
                    ended += 1
                    assert list(info)[:2] == ["final_obs", "final_info"]
                    assert_same(info["final_obs"], want[4]["final_obs"][i], f"{t} {i}")
                    assert (info["final_info"] == {}) == (i != 5)
                    assert ("reset_count" in info) == (i >= 4)
        assert ended > 20
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_ragged_scalar_infos_travel_as_columns_and_match_sync(
    mode: AutoresetMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key only some envs report: not for the block, so the workers send these infos as
    # columns (subvec._infos); the parent merges them per key.
    merged = []

    def counting(parts: Any, num_envs: int) -> Any:
        result = merge_columns(parts, num_envs)
        merged.append(result is not None)
        return result

    monkeypatch.setattr("subvec._merge.merge_columns", counting)
    fns = [
        lambda: SteadyInfoEnv(terminate_prob=0.01, max_steps=10**6, ragged=True) for _ in range(5)
    ]
    run_side_by_side(fns, mode, steps=100, num_workers=2)
    assert sum(merged) >= 80, "the columns were not used"  # steps with an episode end: events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("parent_envs", [0, 1], ids=["workers", "parent_envs"])
def test_steady_scalar_infos_stay_in_the_block_and_match_sync(
    mode: AutoresetMode, parent_envs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same keys from every env every step: each worker leaves them in the block under a
    # schema and answers a plain OK; the parent merges them from there (subvec._infos).
    from_block = []

    def counting(name: str) -> Any:
        method = getattr(InfoBlockReader, name)

        def wrapper(self: Any, *args: Any) -> Any:
            result = method(self, *args)
            from_block.append(result is not None)
            return result

        return wrapper

    for name in ("merged", "columns"):
        monkeypatch.setattr(InfoBlockReader, name, counting(name))
    fns = [lambda: SteadyInfoEnv(terminate_prob=0.01, max_steps=10**6) for _ in range(5)]
    run_side_by_side(fns, mode, steps=100, num_workers=2, parent_envs=parent_envs)
    assert sum(from_block) >= 80, "the block was not used"  # steps with an episode end: events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_scalar_infos_take_the_columnar_path_and_match_sync(mode: AutoresetMode) -> None:
    # Scalar-only infos are merged a column at a time (subvec._infos); keys that
    # come and go and a key that changes type must still give SyncVectorEnv's exact arrays.
    fns = [lambda: ScalarInfoEnv(terminate_prob=0.02) for _ in range(5)]
    run_side_by_side(fns, mode, steps=300, num_workers=2)
