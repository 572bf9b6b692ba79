"""The AsyncVectorEnv surface beyond stepping: attributes, calls, rendering, layouts, repr."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from gymnasium.error import ClosedEnvironmentError
from gymnasium.vector import AsyncVectorEnv

from subvec import LateBindingWarning, SubprocVectorEnv, make_vec
from subvec._compat import GYM_029, NAMES_AUTORESET_MODE, AutoresetMode
from subvec._process.plan import plan_layout, split
from tests.chunks import Oracle, check_chunk
from tests.envs import ZooEnv, make_zoo
from tests.oracle import DEFAULT_MODE


@pytest.mark.timeout(60)
def test_call_get_set_attr_render_and_seeds() -> None:
    # No random ends: env 1 is unseeded, and under SAME_STEP an end at step 1 resets its t
    fns = [lambda: ZooEnv(render_mode="rgb_array", terminate_prob=0.0)] * 3
    envs = SubprocVectorEnv(fns, num_workers=2)
    try:
        assert envs.render_mode == "rgb_array"
        assert envs.metadata["render_fps"] == 30
        # gymnasium 1.0 names no autoreset mode in its vector envs' metadata
        assert envs.metadata.get("autoreset_mode") is (
            AutoresetMode.NEXT_STEP if NAMES_AUTORESET_MODE else None
        )
        assert envs.spec is None
        envs.reset(seed=[10, None, 12])
        if not GYM_029:  # 0.29's envs keep no np_random_seed
            seeds = envs.np_random_seed
            assert seeds[0] == 10 and seeds[2] == 12 and isinstance(seeds[1], int)
        envs.step(np.array([0, 1, 2]))
        assert envs.call("get_t", plus=5) == (6, 6, 6)
        assert envs.get_attr("max_steps") == (7, 7, 7)
        envs.set_attr("marker", ["a", "b", "c"])
        assert envs.get_attr("marker") == ("a", "b", "c")
        envs.set_attr("marker", "same")
        assert envs.get_attr("marker") == ("same",) * 3
        with pytest.raises(ValueError, match="Got `2` values for 3 environments"):
            envs.set_attr("marker", ["x", "y"])
        frames = envs.render()
        assert isinstance(frames, tuple) and len(frames) == 3 and frames[0].shape == (4, 4, 3)
        envs.call_async("get_t")
        assert envs.call_wait(timeout=10) == (1, 1, 1)
        generators = envs.np_random
        assert all(isinstance(g, np.random.Generator) for g in generators)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_spaces_and_defaults_match_async_vector_env() -> None:
    fns = [make_zoo("dict_nest")] * 4
    ours = SubprocVectorEnv(fns)
    theirs = AsyncVectorEnv(fns)
    try:
        for name in ("single_observation_space", "observation_space", "action_space"):
            assert getattr(ours, name) == getattr(theirs, name), name
        assert ours.num_envs == theirs.num_envs == 4
        assert ours.num_workers == min(4, len(__import__("os").sched_getaffinity(0)))
        assert ours.context == "forkserver"
    finally:
        ours.close()
        theirs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 2, "envs_per_worker": 1}, "not both"),
        ({"num_workers": 0}, "positive int"),
        ({"num_workers": 9}, "exceeds num_envs=3"),
        ({"autoreset_mode": "sometimes"}, "autoreset_mode must be one of"),
        ({"info_format": "xml"}, "info_format must be"),
        ({"info_format": "legacy", "autoreset_mode": "NextStep"}, "same step"),
        ({"on_worker_failure": "ignore"}, "on_worker_failure must be"),
        (
            {"observation_mode": "similar"},
            "observation_mode='similar' needs gymnasium" if GYM_029 else "observation_mode must be",
        ),
    ],
)
def test_bad_constructor_arguments_say_what_to_change(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        SubprocVectorEnv([make_zoo("box_f32")] * 3, **kwargs)


@pytest.mark.parametrize("keyword", ["observation_space", "action_space"])
def test_0_29s_space_keywords_say_the_spaces_come_from_the_envs(keyword: str) -> None:
    with pytest.raises(TypeError, match=f"'{keyword}': gymnasium 0.29's AsyncVectorEnv took"):
        SubprocVectorEnv([make_zoo("box_f32")] * 2, **{keyword: None})


def test_a_mistyped_option_gets_the_closest_name_before_anything_starts() -> None:
    with pytest.raises(TypeError, match="'num_worker': did you mean 'num_workers'") as err:
        SubprocVectorEnv([make_zoo("box_f32")] * 3, num_worker=2)
    assert "SubprocVectorEnv()" in str(err.value)
    with SubprocVectorEnv(env_fns=[make_zoo("box_f32")], num_workers=1) as envs:  # by name
        assert envs.num_envs == 1

    class Tuned(SubprocVectorEnv):  # a user's subclass taking **kwargs is not second-guessed
        def __init__(self, env_fns: list, **kwargs: object) -> None:
            self.extra = kwargs.pop("extra")
            super().__init__(env_fns, **kwargs)  # type: ignore[arg-type]

    with Tuned([make_zoo("box_f32")], extra=1, num_workers=1) as envs:
        assert envs.extra == 1 and envs.num_workers == 1


@pytest.mark.timeout(60)
def test_errors_name_the_public_class_of_make_vec_s_envs() -> None:
    envs = make_vec("CartPole-v1", 2, seed=0)
    envs.close()
    assert type(envs) is SubprocVectorEnv and repr(envs).startswith("SubprocVectorEnv(")
    with pytest.raises(ClosedEnvironmentError, match="`SubprocVectorEnv`, after a call"):
        envs.step(envs.action_space.sample())


def _build(lengths: list[int]) -> list:
    # the trap: every lambda reads the last value
    return [lambda: ZooEnv(max_steps=steps) for steps in lengths]  # noqa: B023


@pytest.mark.timeout(60)
def test_factories_reading_a_loop_variable_late_are_warned_of() -> None:
    with pytest.warns(LateBindingWarning, match=r"loop variable 'steps'.*last value \(9\)"):
        envs = SubprocVectorEnv(_build([5, 9]))
    with envs:  # what the warning says: every env was built with the last value
        assert envs.get_attr("max_steps") == (9, 9)


@pytest.mark.timeout(60)
def test_factories_sharing_a_variable_on_purpose_are_not_warned_of() -> None:
    steps = 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shared = [lambda: ZooEnv(max_steps=steps) for _ in range(2)]
        bound = [lambda steps=steps: ZooEnv(max_steps=steps) for steps in (5, 9)]
        for fns in (shared, bound):
            SubprocVectorEnv(fns, num_workers=1).close()


def test_no_env_factory_is_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="env_fns is empty"):
        SubprocVectorEnv(iter([]))


@pytest.mark.timeout(60)
def test_layouts_and_autoreset_spellings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("subvec.vector.usable_cpus", lambda: 2)  # more workers than CPUs
    envs = SubprocVectorEnv(
        [make_zoo("box_f32")] * 7, envs_per_worker=3, autoreset_mode="same_step"
    )
    try:
        assert envs.num_workers == 3
        assert envs.worker_envs == (range(0, 3), range(3, 5), range(5, 7))
        assert envs.autoreset_mode is AutoresetMode.SAME_STEP
        assert "num_envs=7, num_workers=3" in repr(envs)
    finally:
        envs.close()
    assert "closed" in repr(envs)


@pytest.mark.timeout(60)
def test_copy_false_returns_views_valid_until_next_call() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f64")] * 2, num_workers=2, copy=False)
    try:
        first, _ = envs.reset(seed=0)
        snapshot = first.copy()
        second, *_ = envs.step(np.array([0, 1]))
        assert second is first or np.shares_memory(second, first)
        assert not np.array_equal(snapshot, second)
    finally:
        del first, second
        envs.close()


def test_import_subvec_does_not_import_torch_sb3_or_multiprocessing_in_core() -> None:
    code = (
        "import sys, subvec, subvec._slab;"
        "bad = [m for m in ('torch', 'stable_baselines3', 'ray') if m in sys.modules];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    import ast

    import subvec._slab

    tree = ast.parse(Path(subvec._slab.__file__).read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {
        m
        for m in imported
        if m.startswith(("multiprocessing", "subvec._process.pool", "subvec._process.worker"))
    }


@pytest.mark.timeout(60)
def test_remote_proxy_property_and_context_manager() -> None:
    with SubprocVectorEnv([make_zoo("box_f32")] * 3, num_workers=2) as envs:
        envs.reset(seed=0)
        assert envs.remote.get_t(4) == (4, 4, 4)
        assert envs.remote.max_steps() == (7, 7, 7)
    assert envs.closed


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("cpus", "spin_us", "parent_envs", "workers", "parent", "partner"),
    [
        (4, None, 0, (300.0, 300.0), 300.0, None),  # a CPU each, the parent's too: all spin
        # the parent shares worker 0's CPU: both block (the parent spins for worker 1 only
        # once worker 0 has answered)
        (2, None, 0, (0.0, 300.0), 0.0, 0),
        (2, None, 1, (300.0, 300.0), 0.0, None),  # the parent steps envs: no partner
        (1, None, 0, (0.0, 0.0), 0.0, None),  # more workers than CPUs: nobody spins
        (2, 50, 0, (50.0, 50.0), 50.0, None),  # an explicit window applies to everyone
        (2, 0, 0, (0.0, 0.0), 0.0, None),
    ],
)
def test_spin_policy_follows_the_usable_cpus(
    cpus: int,
    spin_us: float | None,
    parent_envs: int,
    workers: tuple[float, ...],
    parent: float,
    partner: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SUBVEC_WAKE", "pipes")  # the partner and spin rules of the pipes
    layout = plan_layout(4, cpus=cpus, num_workers=2, spin_us=spin_us, parent_envs=parent_envs)
    assert layout.worker_spin_us == workers
    assert layout.parent_spin_us == parent
    assert layout.partner == partner
    assert layout.late_spin_us == (300.0 if partner is not None else 0.0)
    monkeypatch.setattr("subvec.vector.usable_cpus", lambda: cpus)
    envs = SubprocVectorEnv(
        [make_zoo("box_f32")] * 4, num_workers=2, spin_us=spin_us, parent_envs=parent_envs
    )
    try:
        assert envs.layout == layout
        assert envs.spin_us == max(workers)
        # Whatever the policy, stepping gives the same results (the conformance suite runs
        # every layout; this only checks that the waits end).
        envs.reset(seed=1)
        for _ in range(20):
            envs.step(envs.action_space.sample())
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seconds", [0.0001, 0.003], ids=["within_the_window", "past_it"])
@pytest.mark.parametrize("chunk", [0, 3], ids=["step", "step_chunk"])
def test_a_late_worker_after_the_partner_is_awaited_and_read_in_order(
    seconds: float, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The partner layout: once worker 0 (the partner) has answered, the parent looks for
    # worker 1's reply busy for the late window, then sleeps. Worker 1's envs are slower
    # here, by less than the window or by more: either way its results are the ones read,
    # for steps and chunks alike (the same envs stepped one by one are the reference).
    monkeypatch.setenv("SUBVEC_WAKE", "pipes")
    monkeypatch.setattr("subvec.vector.usable_cpus", lambda: 2)

    def make(i: int) -> ZooEnv:
        return ZooEnv(step_seconds=seconds if i >= 2 else 0.0)

    fns = [lambda i=i: make(i) for i in range(4)]
    oracle = Oracle(fns, DEFAULT_MODE)  # first: where it skips, nothing is left running
    envs = SubprocVectorEnv(fns, num_workers=2)
    try:
        assert envs.layout.partner == 0 and envs.layout.late_spin_us > 0
        envs.reset(seed=5)
        oracle.reset(seed=5)
        rng = np.random.default_rng(0)
        for t in range(12):
            actions = rng.integers(0, 3, size=(4, max(chunk, 1)))
            expected = oracle.chunk(actions, max(chunk, 1), stop_on_done=False)
            if chunk:
                got = envs.step_chunk(actions)
                check_chunk(expected, chunk, *got, where=f"chunk {t}")
            else:
                obs, rewards, terms, truncs, _ = envs.step(actions[:, 0])
                check_chunk(
                    expected,
                    1,
                    obs,
                    rewards[:, None],
                    terms[:, None],
                    truncs[:, None],
                    None,
                    where=f"step {t}",
                )
    finally:
        envs.close()


def test_a_layout_for_first_ready_stepping_has_every_worker_wait_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With batch_size below num_envs no worker partners the parent or spins: a first-ready
    # recv would serve the envs of a worker that answers first more often.
    monkeypatch.setenv("SUBVEC_WAKE", "pipes")
    assert plan_layout(8, cpus=2).partner == 0
    layout = plan_layout(8, cpus=2, first_ready=True)
    assert (layout.partner, layout.worker_spin_us, layout.parent_spin_us) == (None, (0.0,) * 2, 0)
    assert layout.bounds == ((0, 4), (4, 8))
    assert plan_layout(8, cpus=4, num_workers=2, first_ready=True).worker_spin_us == (300.0,) * 2
    monkeypatch.setattr("subvec.vector.usable_cpus", lambda: 2)
    for batch_size, partner in ((3, None), (8, 0), (None, 0)):
        envs = SubprocVectorEnv([make_zoo("box_f32")] * 8, batch_size=batch_size)
        try:
            assert envs.layout.partner == partner
        finally:
            envs.close()


def test_a_cpu_quota_limits_the_default_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    # A container limited to one CPU's worth of time (docker --cpus=1) still sees every CPU of
    # the host in its affinity: the defaults must follow the quota, with nobody spinning.
    monkeypatch.setattr("subvec._process.topology.cpu_quota", lambda: 1.0)
    envs = SubprocVectorEnv([make_zoo("box_f32")] * 4)
    try:
        assert envs.num_workers == 1
        assert envs.spin_us == 0.0 and envs.layout.parent_spin_us == 0.0
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
    finally:
        envs.close()


def test_the_partner_gets_the_smaller_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUBVEC_WAKE", "pipes")  # the partner exists with the pipes only
    assert split(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert split(7, 3, extra_last=True) == [(0, 2), (2, 4), (4, 7)]
    assert split(16, 2, extra_last=True) == [(0, 8), (8, 16)]
    assert split(3, 3, extra_last=True) == [(0, 1), (1, 2), (2, 3)]
    # With a partner (two CPUs, two workers), worker 0 shares the parent's CPU: it gets fewer.
    assert plan_layout(7, cpus=2).bounds == ((0, 3), (3, 7))
    assert plan_layout(7, cpus=4, num_workers=2).bounds == ((0, 4), (4, 7))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 0}, "num_workers must be a positive int"),
        ({"num_workers": 9}, "exceeds num_envs=8"),
        ({"envs_per_worker": 0}, "envs_per_worker must be a positive int"),
        ({"num_workers": 2, "envs_per_worker": 2}, "not both"),
        ({"parent_envs": 8}, "parent_envs must be an int in"),
        ({"spin_us": -1}, "spin_us must be >= 0"),
    ],
)
def test_planning_refuses_bad_counts(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_layout(8, cpus=2, **kwargs)


def test_default_layout_leaves_the_parent_a_cpu_when_it_steps_envs() -> None:
    assert plan_layout(8, cpus=4).num_workers == 4
    assert plan_layout(8, cpus=4, parent_envs=2).num_workers == 3
    assert plan_layout(2, cpus=16).num_workers == 2
    assert plan_layout(9, cpus=4, envs_per_worker=4).bounds == ((0, 3), (3, 6), (6, 9))
