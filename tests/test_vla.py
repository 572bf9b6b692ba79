"""What robot-learning rollouts ask of a vector env (tests/vla_checks.py), on the process and
in-process backends (tests/test_ray.py binds the same checks to Ray)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from subvec import SubprocVectorEnv
from subvec._compat import GYM_029
from subvec._inproc import InProcessVectorEnv
from tests import vla_checks as checks
from tests.helpers import assert_same, load_script
from tests.oracle import DEFAULT_MODE

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(90)

#: four envs on two workers (the checks' binding)
two_workers = functools.partial(SubprocVectorEnv, num_workers=2)
BACKENDS = pytest.mark.parametrize(
    "make", [two_workers, InProcessVectorEnv], ids=["workers", "in_process"]
)


@BACKENDS
def test_metadata_none_or_not_a_mapping_reads_as_empty(make: Any) -> None:
    checks.check_metadata_none_and_non_dict(make)


@BACKENDS
def test_per_env_call_arguments(make: Any) -> None:
    checks.check_per_env_call_arguments(make)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_timeouts_per_command() -> None:
    checks.check_timeouts_per_command(two_workers)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_hung_reset_step_and_chunk_follow_the_failure_policy(policy: str) -> None:
    checks.check_hung_reset_step_and_chunk(two_workers, policy)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_hung_step_and_chunk_raise_within_their_bounds() -> None:
    checks.check_hung_step_and_chunk_raise(two_workers)


def test_sb3_env_method_takes_per_env_arguments() -> None:
    checks.check_sb3_env_method_per_env(num_workers=2)


@BACKENDS
def test_freeze_step_against_single_envs_and_masked_reset(make: Any) -> None:
    checks.check_freeze_step_and_masked_reset(make)


@BACKENDS
def test_freeze_chunks_against_single_envs(make: Any) -> None:
    checks.check_freeze_chunks(make)


@BACKENDS
def test_freeze_send_recv_against_single_envs(make: Any) -> None:
    checks.check_freeze_send_recv(make)


@BACKENDS
def test_freeze_under_record_episode_statistics_and_normalize_reward(make: Any) -> None:
    checks.check_freeze_under_gymnasium_wrappers(make)


def worker_pids(envs: Any) -> list[int]:
    return list(getattr(envs, "worker_pids", [os.getpid()]))


@BACKENDS
def test_reconfigure_all_and_some_envs_inside_the_live_units(make: Any) -> None:
    checks.check_reconfigure_all_and_some(make, worker_pids)


@BACKENDS
def test_reconfigure_refused_keeps_the_old_envs(make: Any, tmp_path: Path) -> None:
    checks.check_reconfigure_refused_keeps_the_old_envs(make, str(tmp_path))


@BACKENDS
def test_reconfigured_envs_wait_for_a_reset(make: Any) -> None:
    checks.check_reconfigure_waits_for_a_reset(make)


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_reconfigure_with_a_worker_dying(policy: str) -> None:
    checks.check_reconfigure_with_a_unit_dying(two_workers, policy)


def test_reconfigure_under_start_tokens() -> None:
    # one worker builds at a time: the second waits for the first's token, no deadlock
    make = functools.partial(SubprocVectorEnv, num_workers=2, max_concurrent_starts=1)
    checks.check_reconfigure_all_and_some(make, worker_pids)


@BACKENDS
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "freeze"])
def test_suspend_resume_continues_with_the_state_hook(make: Any, mode: str) -> None:
    kwargs = {"freeze": True} if mode == "freeze" else {"autoreset_mode": mode}
    checks.check_suspend_resume_continues_with_the_state_hook(make, worker_pids, **kwargs)


@BACKENDS
def test_suspend_resume_without_the_hook_resets(make: Any) -> None:
    checks.check_suspend_resume_without_the_hook_resets(make)


@BACKENDS
def test_a_resume_that_fails_stays_suspended(make: Any, tmp_path: Path) -> None:
    checks.check_resume_that_fails_stays_suspended(make, str(tmp_path / "cannot-start"))


# --- on a simulator that renders ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cheetah() -> Iterator[Any]:
    pytest.importorskip("mujoco")
    module = load_script("vla_rollout", ROOT / "examples" / "vla_rollout.py")
    # The workers cannot import the example by name: its env travels by value.
    cloudpickle.register_pickle_by_value(module)
    yield module
    cloudpickle.unregister_pickle_by_value(module)


def _frames_differ_from_blank(pixels: np.ndarray) -> None:
    flat = pixels.reshape(len(pixels), -1)
    assert (flat.std(axis=1) > 5.0).all(), "a blank frame"


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(240)
def test_rendered_cheetah_groups_freeze_swap_and_suspend(cheetah: Any) -> None:
    """HalfCheetah-v5 rendering 128x128 frames through EGL in the workers, as a Dict(pixels,
    state, instruction): the frames are not blank; envs of a GRPO group (same init state)
    see the same first frame; chunks freeze the envs that reached the goal; reconfigure swaps
    the task in the live workers; suspend/resume continues every episode byte for byte."""
    fns = [cheetah.make_task("far", 128, 48)] * 4
    init = [{"init_state": i // 2} for i in range(4)]
    kwargs: dict[str, Any] = {"freeze": True, "worker_env": cheetah.WORKER_ENV, "num_workers": 2}
    weights = np.random.default_rng(0).normal(0, 0.3, (17, 6))

    def chunks(envs: Any, obs: Any, lo: int, hi: int) -> list[Any]:
        out = []
        for c in range(lo, hi):
            actions = cheetah.policy(obs["state"], c * 8, 8, weights, 0.0)
            out.append(envs.step_chunk(actions))
            obs = out[-1][0]
        return out

    with SubprocVectorEnv(fns, **kwargs) as reference:
        obs, _ = reference.reset(seed=0, options=init)
        want = chunks(reference, obs, 0, 6)
    with SubprocVectorEnv(fns, **kwargs) as envs:
        obs, _ = envs.reset(seed=0, options=init)
        assert obs["pixels"].shape == (4, 128, 128, 3) and obs["pixels"].dtype == np.uint8
        _frames_differ_from_blank(obs["pixels"])
        assert list(obs["instruction"]) == [cheetah.TASKS["far"][1]] * 4
        np.testing.assert_array_equal(obs["pixels"][0], obs["pixels"][1])  # one group
        assert not np.array_equal(obs["pixels"][0], obs["pixels"][2])  # another
        got = chunks(envs, obs, 0, 3)
        pids = list(envs.worker_pids)
        envs.suspend()
        envs.resume()
        assert set(envs.worker_pids).isdisjoint(pids)
        got += chunks(envs, got[-1][0], 3, 6)
        assert_same(got, want, "the chunks across suspend/resume")
        steps = np.stack([g[4]["chunk_steps"] for g in got])
        assert (steps[-1] == 0).any(), "no env reached the goal and froze"
        _frames_differ_from_blank(got[-1][0]["pixels"])
        envs.reconfigure([cheetah.make_task("near", 128, 48)] * 4)
        obs, _ = envs.reset(seed=1, options=init)
        assert list(obs["instruction"]) == [cheetah.TASKS["near"][1]] * 4
        _frames_differ_from_blank(obs["pixels"])


#: two envs in one worker, the last two stepped by the parent itself
with_parent_envs = functools.partial(SubprocVectorEnv, num_workers=1, parent_envs=2)


def test_reconfigure_and_suspend_with_parent_envs() -> None:
    checks.check_reconfigure_all_and_some(with_parent_envs, worker_pids)
    checks.check_suspend_resume_continues_with_the_state_hook(
        with_parent_envs, worker_pids, autoreset_mode=DEFAULT_MODE
    )
    checks.check_freeze_step_and_masked_reset(with_parent_envs)


def test_timeout_mappings_are_checked_on_every_backend() -> None:
    with InProcessVectorEnv([checks.armed] * 2, timeout={"reset": 5, "step": 0.5}) as envs:
        assert (envs.timeouts.reset, envs.timeouts.step, envs.timeouts.call) == (5.0, 0.5, None)
        assert envs.timeouts.chunk(8) == 4.0
    for bad, error, match in (
        ({"rest": 1}, ValueError, r"unknown command\(s\) \['rest'\].*\['reset', 'step', 'call'\]"),
        ({"step": -1}, ValueError, r"timeout\['step'\] must be seconds"),
        ({"call": "60"}, TypeError, r"timeout\['call'\] must be a number"),
        (True, TypeError, "must be a number"),
    ):
        with pytest.raises(error, match=match):
            InProcessVectorEnv([checks.armed] * 2, timeout=bad)
    plain = InProcessVectorEnv([checks.armed] * 2, timeout=3)
    assert (plain.timeouts.reset, plain.timeouts.step, plain.timeouts.call) == (3.0,) * 3
    plain.close()


# --- start="lazy" ------------------------------------------------------------------------


def _workers_alive(envs: SubprocVectorEnv) -> list[int]:
    return [w.process.pid for w in envs._pool.workers if w.process.is_alive()]  # type: ignore[attr-defined]


@pytest.mark.parametrize("wake", ["pipes", "futex"])
def test_lazy_start_runs_no_worker_until_the_first_call_then_steps_as_sync(
    wake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from subvec._process import wake as _wake
    from tests.envs import ZooEnv

    if wake == "futex" and not _wake.available():
        pytest.skip("no shared futexes here")
    monkeypatch.setenv(_wake.ENV_VAR, wake)  # the block holds the futex words, or not
    fns = [functools.partial(ZooEnv, max_steps=10**6)] * 4
    envs = SubprocVectorEnv(fns, num_workers=2, start="lazy")
    eager = SubprocVectorEnv(fns, num_workers=2)
    try:
        assert not envs.started and _workers_alive(envs) == [] and envs.placement == ()
        for name in ("single_observation_space", "single_action_space", "observation_space"):
            assert getattr(envs, name) == getattr(eager, name), name
        assert envs.metadata == eager.metadata and envs.render_mode == eager.render_mode
        got = envs.reset(seed=5)  # the first call starts both workers, then resets
        assert envs.started and len(_workers_alive(envs)) == 2 and len(envs.placement) == 2
        assert_same(got, eager.reset(seed=5))
        assert envs.layout.wake == eager.layout.wake == wake
        actions = np.array([0, 1, 2, 1])
        for _ in range(6):
            assert_same(envs.step(actions), eager.step(actions))
        chunk = np.tile(actions[:, None], (1, 3))
        assert_same(envs.step_chunk(chunk), eager.step_chunk(chunk))
    finally:
        envs.close()
        eager.close()


@pytest.mark.parametrize("first_call", ["get_attr", "resume", "async_reset"])
def test_any_first_call_starts_a_lazy_vector_env(first_call: str) -> None:
    from tests.envs import ZooEnv

    envs = SubprocVectorEnv([ZooEnv] * 2, num_workers=2, start="lazy")
    try:
        if first_call == "get_attr":
            assert envs.get_attr("max_steps") == (7, 7)
        elif first_call == "resume":
            envs.resume()
            envs.reset(seed=0)
        else:
            envs.async_reset(seed=0)
            envs.drain()
        assert envs.started and len(_workers_alive(envs)) == 2 and not envs.suspended
    finally:
        envs.close()


def test_lazy_start_finds_an_env_with_other_spaces_at_the_first_call() -> None:
    from gymnasium import spaces

    from tests.envs import ZooEnv

    fns = [ZooEnv] * 3 + [functools.partial(ZooEnv, act_space=spaces.Discrete(5))]
    envs = SubprocVectorEnv(fns, envs_per_worker=1, start="lazy")
    try:
        assert envs.single_action_space == spaces.Discrete(3)  # env 0's, read at construction
        for _ in range(2):  # refused, and again: nothing stays started
            with pytest.raises(ValueError, match=r"env 3 has .* action space Discrete\(5\)"):
                envs.reset(seed=0)
            assert not envs.started and _workers_alive(envs) == []
    finally:
        envs.close()


def test_lazy_start_refuses_what_it_cannot_do_and_probes_errors_at_construction() -> None:
    from subvec import EnvError
    from tests.envs import ZooEnv

    with pytest.raises(ValueError, match="start must be 'now' or 'lazy'"):
        SubprocVectorEnv([ZooEnv] * 2, start="later")
    with pytest.raises(ValueError, match="parent_envs"):
        SubprocVectorEnv([ZooEnv] * 2, num_workers=1, parent_envs=1, start="lazy")
    with pytest.raises(ValueError, match="recycle_every"):
        SubprocVectorEnv([ZooEnv] * 2, envs_per_worker=1, recycle_every=2, start="lazy")

    def broken() -> Any:
        raise RuntimeError("no simulator here")

    with pytest.raises(EnvError, match="no simulator here"):
        SubprocVectorEnv([broken, ZooEnv], num_workers=2, start="lazy")


@pytest.mark.skipif(GYM_029, reason="gymnasium 0.29 has no observation_mode")
def test_resume_of_envs_with_different_spaces_is_not_checked_as_a_lazy_start() -> None:
    from gymnasium import spaces

    from tests.envs import ZooEnv

    fns = [functools.partial(ZooEnv, obs_space=spaces.Box(0, 1 + i, (3,))) for i in range(2)]
    envs = SubprocVectorEnv(fns, num_workers=2, observation_mode="different")
    try:
        envs.reset(seed=0)
        envs.suspend()
        envs.resume()  # the envs' own spaces differ by design: no lazy start's check
        assert envs.step(np.array([0, 1]))[0].shape == (2, 3)
    finally:
        envs.close()
