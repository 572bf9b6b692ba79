"""RayVectorEnv on a real local Ray: conformance against SyncVectorEnv, failures, placement.

One Ray instance for the module (started by the ``ray_session`` fixture, on 127.0.0.1), with
more logical CPUs than this machine has cores so that several actors fit. After every test no
actor may be alive and no placement group left (asked of Ray itself), besides the conftest
check on child processes.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# Loopback only: without it Ray binds the machine's interface address (read when ray imports).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")

import gymnasium as gym  # noqa: E402  (after the skip: nothing here runs without ray)
import psutil  # noqa: E402
from gymnasium.vector import SyncVectorEnv  # noqa: E402
from ray.util.placement_group import (  # noqa: E402
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from subvec import EnvError, PlacementError, WorkerDiedError  # noqa: E402
from subvec._commands import Command  # noqa: E402
from subvec._compat import GYM_029, AutoresetMode  # noqa: E402
from subvec.ray import RayVectorEnv  # noqa: E402
from tests import vla_checks  # noqa: E402
from tests.chunks import check_async_chunks  # noqa: E402
from tests.envs import (  # noqa: E402
    OptionsEnv,
    StartMethodEnv,
    StepClockEnv,
    ZooEnv,
    crash_fns,
    make_zoo,
)
from tests.failure_checks import (  # noqa: E402
    check_chunk_env_errors_leave_the_other_envs_running,
    check_env_error_in_reset_and_call,
    check_env_error_in_step,
    check_env_errors_leave_the_other_envs_stepped,
    check_factory_error,
    check_lost_unit_is_restarted,
    check_lost_unit_raises_and_reset_rebuilds_it,
)
from tests.helpers import assert_same, child_env  # noqa: E402
from tests.oracle import DEFAULT_MODE, offered_modes  # noqa: E402
from tests.test_async import _expected, check_batches_by, check_trajectories  # noqa: E402
from tests.test_chunks import BOX_ACT  # noqa: E402
from tests.test_chunks import run_against_oracle as run_chunks_against_oracle  # noqa: E402
from tests.test_conformance import _zoo_fns, axis_params, run_side_by_side  # noqa: E402
from tests.test_gym_fidelity import _most_at_once  # noqa: E402
from tests.vectorisers import NEEDS_RAY  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(60)]

#: logical CPUs of the test cluster (actors reserve one each by default)
CPUS = 4


def start_local_ray(num_cpus: int) -> None:
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=100 * 2**20,
        log_to_driver=False,
    )


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    start_local_ray(CPUS)
    try:
        yield
    finally:
        ray.shutdown()


def live_actors() -> list[str]:
    return [a["ActorID"] for a in ray._private.state.actors().values() if a["State"] != "DEAD"]


def cpus_back(bound: float = 10.0) -> float:
    """Ray's available CPUs once they are all back, or after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while True:
        cpus = float(ray.available_resources().get("CPU", 0.0))
        if cpus == CPUS or time.monotonic() > deadline:
            return cpus
        time.sleep(0.05)


def gone(pids: list[int], bound: float = 10.0) -> list[int]:
    """The processes of ``pids`` still alive after ``bound`` seconds (or sooner, when none)."""
    deadline = time.monotonic() + bound
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if psutil.pid_exists(p)]


def live_groups() -> list[str]:
    return [g for g, info in placement_group_table().items() if info["state"] != "REMOVED"]


@pytest.fixture(autouse=True)
def no_ray_leftovers(ray_session: None) -> Iterator[None]:
    """No actor alive and no placement group left once a test is done."""
    yield
    deadline = time.monotonic() + 5.0
    while (live_actors() or live_groups()) and time.monotonic() < deadline:
        time.sleep(0.05)  # a killed actor is marked dead asynchronously
    assert not live_actors(), f"actors outlived the test: {live_actors()}"
    assert not live_groups(), f"placement groups outlived the test: {live_groups()}"


class EnvVarEnv(ZooEnv):
    def env_var(self, name: str) -> str | None:
        return os.environ.get(name)


RayEnvs = functools.partial(RayVectorEnv, num_actors=2, local_workers=1, start_timeout=30)


# --- conformance -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("vectoriser", "space_name", "flavour"), axis_params(NEEDS_RAY), indirect=["vectoriser"]
)
def test_matches_sync(vectoriser: Any, space_name: str, flavour: tuple[AutoresetMode, str]) -> None:
    # the conformance axis' Ray entry (tests/vectorisers.py): a few cases by default, the
    # whole product under -m slow
    mode, info_format = flavour
    run_side_by_side(_zoo_fns(space_name), mode, make=vectoriser, info_format=info_format)


def test_cartpole_matches_sync_with_one_actor_per_env() -> None:
    fns = [lambda: gym.make("CartPole-v1")] * 2
    make = functools.partial(RayVectorEnv, envs_per_actor=1, local_workers=1)
    envs = run_side_by_side(fns, DEFAULT_MODE, 60, make=make)
    assert envs.num_actors == 2


def test_call_get_attr_set_attr_and_render_match_sync() -> None:
    fns = [make_zoo("box_f32", render_mode="rgb_array")] * 3
    sync = SyncVectorEnv(fns)
    with RayEnvs(fns) as envs:
        envs.reset(seed=3)
        sync.reset(seed=3)
        actions = np.array([0, 1, 2])
        envs.step(actions)
        sync.step(actions)
        assert envs.call("get_t", 5) == sync.call("get_t", 5) == (6, 6, 6)
        envs.set_attr("marker", ["a", "b", "c"])
        assert envs.get_attr("marker") == ("a", "b", "c")
        envs.set_attr("marker", "same")
        assert envs.get_attr("marker") == ("same",) * 3
        # 0.29's SyncVectorEnv has no render (subvec's, as 1.x's, is each env's frame)
        assert_same(envs.render(), sync.call("render") if GYM_029 else sync.render(), "render")
        assert envs.remote.get_t() == (1, 1, 1)
        # a batch in another dtype than the space's reaches the envs in it, as Sync hands it
        envs.step(np.array([1, 2, 0], dtype=np.int32))
        assert [type(a) for a in envs.get_attr("last_action")] == [np.int32] * 3
    sync.close()


def test_env_ids_and_reset_options_reach_the_envs_of_each_actor() -> None:
    fns = [functools.partial(OptionsEnv, length=2)] * 4  # two actors of two envs
    with RayEnvs(fns) as envs:
        assert envs.get_attr("resets", env_ids=[3, 0]) == (0, 0)
        envs.reset(seed=0, options=[{"level": i} for i in range(4)])
        assert envs.get_attr("level", env_ids=[2, 1]) == (2, 1)
        envs.set_attr("level", [7, 9], env_ids=[3, 0])
        assert envs.get_attr("level") == (9, 1, 2, 7)
        # Stored options: the automatic resets of envs 1 and 2 (one in each actor) use them.
        envs.set_reset_options({"level": 5}, env_ids=[1, 2])
        for _ in range(3):  # episodes of 2 steps: the third step is the autoreset's
            obs, *_ = envs.step(np.zeros(4, dtype=np.int64))
        assert obs[:, 0].tolist() == [-1, 5, 5, -1]
        assert envs.reset_options == (None, {"level": 5}, {"level": 5}, None)


def worker_of(envs: RayVectorEnv, env: int) -> int:
    """The pid of the worker process (inside its actor) that runs ``env``."""
    record = next(r for r in envs.placement if env in r.env_indices)
    (pid,) = record.worker_pids  # one local worker per actor
    assert pid is not None
    return pid


def test_env_error_in_step_names_the_env_over_the_whole_vector_env() -> None:
    check_env_error_in_step(RayEnvs, worker_of)


def test_env_errors_in_one_step_leave_the_other_envs_stepped() -> None:
    check_env_errors_leave_the_other_envs_stepped(RayEnvs)


def test_env_errors_in_one_chunk_leave_the_other_envs_running() -> None:
    check_chunk_env_errors_leave_the_other_envs_running(RayEnvs)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_env_error_in_reset_and_call_and_one_report_for_many() -> None:
    check_env_error_in_reset_and_call(RayEnvs)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_placement_records_and_actor_handles() -> None:
    with RayVectorEnv([EnvVarEnv] * 5, envs_per_actor=2, start_timeout=30) as envs:
        assert envs.num_actors == 3 and len(envs.actors) == 3
        records = envs.placement
        assert [r.env_indices for r in records] == [(0, 1), (2, 3), (4,)]
        node = ray.get_runtime_context().get_node_id()
        for record in records:
            assert record.node_id == node and record.ip == "127.0.0.1"
            assert psutil.pid_exists(record.pid) and record.pid != os.getpid()
            assert all(psutil.pid_exists(p) for p in record.worker_pids)
        assert envs.restarts == []
        # the thread caps reach the workers
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            assert envs.call("env_var", name) == ("1",) * 5


@pytest.mark.parametrize(
    ("mode", "info_format", "batch_size"),
    [(AutoresetMode.NEXT_STEP, "gymnasium", 2), (AutoresetMode.SAME_STEP, "list", 3)],
    ids=["next-gymnasium-b2", "same-list-b3"],
)
def test_async_send_recv_gives_each_env_its_sync_trajectory(
    mode: AutoresetMode, info_format: str, batch_size: int
) -> None:
    num_envs, steps = 4, 8
    fns = [make_zoo("dict_nest") for _ in range(num_envs)]
    rng = np.random.default_rng(3)
    actions = [rng.integers(0, 3, size=steps).tolist() for _ in range(num_envs)]
    want = _expected(fns, actions, mode, info_format)
    with RayEnvs(fns, autoreset_mode=mode, info_format=info_format, batch_size=batch_size) as envs:
        check_trajectories(envs, actions, want, batch_size)


@pytest.mark.parametrize("how", ["poll", "groups"])
def test_poll_and_group_batches_give_each_env_its_sync_trajectory(how: str) -> None:
    fns = [make_zoo("box_f32") for _ in range(4)]
    rng = np.random.default_rng(4)
    actions = [rng.integers(0, 3, size=6).tolist() for _ in range(4)]
    want = _expected(fns, actions, AutoresetMode.NEXT_STEP, "gymnasium")
    with RayEnvs(fns, batch_size=2) as envs:
        assert envs.env_groups(2) == [[0, 1], [2, 3]]
        check_batches_by(envs, how, actions, want, 2)


def test_async_env_error_surfaces_from_recv_and_the_others_are_kept() -> None:
    fns = crash_fns(4, crash_at=1, how="raise")
    with RayEnvs(fns, batch_size=4) as envs:
        envs.async_reset(seed=0)
        envs.recv()
        envs.send(np.zeros(4, dtype=np.int64), [0, 1, 2, 3])
        received: list[int] = []
        with pytest.raises(KeyError) as info:
            while True:
                received += envs.recv(min_envs=1, max_envs=1)[4]["env_id"].tolist()
        assert isinstance(info.value, EnvError) and info.value.env_index == 1
        received += envs.drain()[4]["env_id"].tolist()
        assert sorted(received) == [0, 2, 3]


def boxes(*highs: float) -> list[Any]:
    """One ZooEnv per high, each observing a Box(0, high, (5,)) of its own."""
    return [
        functools.partial(ZooEnv, gym.spaces.Box(0, h, (5,), np.float32), max_steps=4)
        for h in highs
    ]


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_observation_mode_different_and_custom_match_sync() -> None:
    fns = boxes(1, 2, 3, 4)  # two actors, each with envs of two spaces
    custom = (
        gym.spaces.Box(0, 4, (4, 5), np.float32),
        gym.spaces.Box(0, 4, (5,), np.float32),
    )
    for mode in ("different", custom):
        oracle = SyncVectorEnv(fns, observation_mode=mode)
        with RayEnvs(fns, observation_mode=mode) as envs:
            assert envs.observation_mode == mode
            assert envs.observation_space == oracle.observation_space
            assert envs.single_observation_space == oracle.single_observation_space
            assert_same(envs.reset(seed=1), oracle.reset(seed=1), "reset")
            for t in range(6):  # past the 4-step episodes: autoresets too
                actions = np.array([t % 3] * 4)
                assert_same(envs.step(actions), oracle.step(actions), f"step {t}")
        oracle.close()


def test_observation_spaces_are_checked_over_every_env_naming_its_index() -> None:
    refusal = (
        "observation_mode='similar' needs gymnasium >= 1.0"
        if GYM_029
        else r"Invalid `observation_mode`, expected: 'same'"
    )
    with pytest.raises(ValueError, match=refusal):
        RayEnvs(boxes(1, 1), observation_mode="similar")
    # env 3 is the second env of actor 1: named by its index over the whole vector env
    with pytest.raises(RuntimeError, match=r"not equivalent: env 3 has Box\(0.0, 2.0"):
        RayEnvs(boxes(1, 1, 1, 2))


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_max_concurrency_is_split_over_the_actors() -> None:
    fns = [StepClockEnv] * 4
    with RayEnvs(fns, local_workers=2, max_concurrency=2) as envs:
        assert envs.max_concurrency == 2
        for infos in (envs.reset(seed=0)[1], envs.step(np.zeros(4, dtype=np.int64))[4]):
            intervals = list(zip(infos["start"], infos["end"]))
            assert _most_at_once(intervals) == 2, intervals
    with pytest.raises(ValueError, match="max_concurrency=1 is fewer than the 2 actors"):
        RayEnvs(fns, max_concurrency=1)


# --- failures ------------------------------------------------------------------------------


def kill_actor(envs: RayVectorEnv, actor: int) -> None:
    pid = envs.placement[actor].pid
    ray.kill(envs.actors[actor])
    assert pid is not None and not gone([pid])


def actor_pids(envs: RayVectorEnv) -> list[int | None]:
    return [r.pid for r in envs.placement]


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_killed_actor_raises_naming_its_envs_and_node_and_reset_rebuilds_it() -> None:
    nodes: list[str] = []

    def make(fns: Any, **kwargs: Any) -> RayVectorEnv:
        envs = RayEnvs(fns, **kwargs)
        nodes.append(envs.placement[1].node_id)
        return envs

    err = check_lost_unit_raises_and_reset_rebuilds_it(make, kill_actor, actor_pids)
    assert nodes[0][:12] in str(err) and "envs 2..3" in str(err)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_killed_actor_is_restarted_and_its_envs_come_back_truncated() -> None:
    check_lost_unit_is_restarted(RayEnvs, kill_actor, actor_pids)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_hung_actor_is_replaced_under_restart() -> None:
    fns = crash_fns(2, crash_at=1, how="hang")
    with RayEnvs(fns, timeout=1.0, on_worker_failure="restart") as envs:
        envs.reset(seed=0)
        old = envs.placement[1].pid
        _, _, _, truncated, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert list(truncated) == [False, True]
        assert list(infos["_worker_restarted"]) == [False, True]
        assert envs.placement[1].pid != old and len(envs.restarts) == 1
        assert "did not answer within 1.0s" in envs.restarts[0].reason


@pytest.mark.slow  # a failure case: out of the quick loop, in CI's slow leg
def test_worker_dying_inside_an_actor_raises_naming_its_envs() -> None:
    fns = crash_fns(4, crash_at=2, how="exit")
    with RayEnvs(fns, on_worker_failure="raise") as envs:
        envs.reset(seed=0)
        with pytest.raises(WorkerDiedError) as info:
            envs.step(np.zeros(4, dtype=np.int64))
        assert info.value.env_indices == (2, 3)
        assert envs.placement[1].node_id[:12] in str(info.value)
        assert "lost a worker" in str(info.value)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_worker_dying_inside_an_actor_is_restarted_by_the_actor() -> None:
    fns = crash_fns(4, crash_at=2, how="exit")
    with RayEnvs(fns, on_worker_failure="restart") as envs:
        envs.reset(seed=0)
        actor_pid = envs.placement[1].pid
        _, _, _, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
        # the actor's one worker held envs 2 and 3: both were rebuilt
        assert list(truncated) == [False, False, True, True]
        assert list(infos["_worker_restarted"]) == [False, False, True, True]
        assert envs.placement[1].pid == actor_pid  # the actor itself lived on
        assert [r.env_indices for r in envs.restarts] == [(2, 3)]


# --- placement and lifetime -----------------------------------------------------------------


def test_infeasible_placement_fails_at_once_naming_what_was_asked() -> None:
    start = time.monotonic()
    with pytest.raises(PlacementError) as info:
        RayVectorEnv([make_zoo("box_f32")] * 2, num_actors=2, actor_options={"num_cpus": 100})
    assert time.monotonic() - start < 10
    text = str(info.value)
    assert "2 bundles of {'CPU': 100.0}" in text and f"{CPUS:g} CPUs" in text
    with pytest.raises(PlacementError, match="STRICT_SPREAD"):
        RayVectorEnv([make_zoo("box_f32")] * 2, num_actors=2, placement="strict_spread")


def test_placement_that_cannot_be_met_now_fails_within_its_timeout() -> None:
    hog = placement_group([{"CPU": CPUS}])  # every CPU held: feasible, but not now
    ray.get(hog.ready(), timeout=20)
    try:
        start = time.monotonic()
        with pytest.raises(PlacementError, match="not ready within start_timeout=1"):
            RayVectorEnv([make_zoo("box_f32")] * 2, start_timeout=1)
        assert time.monotonic() - start < 8
    finally:
        remove_placement_group(hog)


def test_factory_error_is_raised_with_its_env_index_and_nothing_is_left() -> None:
    check_factory_error(RayEnvs)


def test_close_leaves_no_actor_process_or_group_and_keeps_the_callers_ray() -> None:
    envs = RayEnvs([make_zoo("box_f32")] * 4)
    envs.reset(seed=0)
    pids = [p for r in envs.placement for p in (r.pid, *r.worker_pids)]
    start = time.monotonic()
    envs.close()
    assert time.monotonic() - start < 15
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if psutil.pid_exists(p)]
    assert ray.is_initialized()  # started by the caller: left up
    envs.close()  # twice is fine


def test_a_dropped_env_gives_back_its_actors_group_and_cpus() -> None:
    envs = RayEnvs([make_zoo("box_f32")] * 4)
    envs.reset(seed=0)
    pids = [p for r in envs.placement for p in (r.pid, *r.worker_pids)]
    assert ray.available_resources().get("CPU") == CPUS - 2  # a bundle of one CPU per actor
    collected = weakref.ref(envs)
    del envs  # never closed
    assert collected() is None  # no reference cycle: freed at once, not by the next gc pass
    assert cpus_back() == CPUS
    assert not gone(pids)
    # no actor or placement group left, no block on /dev/shm: the fixtures check


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
def test_envs_never_closed_are_released_when_collected_and_at_interpreter_exit() -> None:
    root = Path(__file__).resolve().parent.parent
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.run(
        [sys.executable, "-m", "tests.scripts.ray_dropped", address],
        cwd=root,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    # it connected to the cluster itself: collected, it disconnected (the cluster stays up)
    assert lines[0] == {"ray_after_collect": False}
    assert cpus_back() == CPUS
    assert not gone(lines[1]["actor_pids"])


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_close_after_an_actor_hung_is_bounded() -> None:
    fns = crash_fns(2, crash_at=1, how="hang")
    envs = RayEnvs(fns, timeout=1.0)
    envs.reset(seed=0)
    with pytest.raises(TimeoutError):
        envs.step(np.zeros(2, dtype=np.int64))
    start = time.monotonic()
    envs.close(timeout=1.0)
    assert time.monotonic() - start < 6


def test_a_placement_group_of_the_callers_is_used_and_left_alone() -> None:
    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")
    ray.get(group.ready(), timeout=20)
    try:
        with RayEnvs([make_zoo("box_f32")] * 2, placement=group) as envs:
            envs.reset(seed=0)
        assert placement_group_table(group)["state"] == "CREATED"  # not removed by close
    finally:
        remove_placement_group(group)
    with pytest.raises(ValueError, match="placement must be one of"):
        RayVectorEnv([make_zoo("box_f32")], placement="everywhere")


def test_num_cpus_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="num_cpus"):
        RayVectorEnv([make_zoo("box_f32")], actor_options={"num_cpus": 0})


# --- make_vec and the SB3 face ------------------------------------------------------------


def test_make_vec_with_the_ray_backend_matches_gymnasium() -> None:
    import subvec

    envs = subvec.make_vec("CartPole-v1", 3, seed=5, backend="ray", num_actors=2)
    assert isinstance(envs, RayVectorEnv)
    oracle = gym.make_vec("CartPole-v1", 3, vectorization_mode="sync")
    try:
        assert envs.spec is not None and envs.spec.id == "CartPole-v1"
        assert_same(envs.reset(), oracle.reset(seed=5), "reset")
        actions = np.array([0, 1, 1])
        for t in range(20):
            assert_same(envs.step(actions), oracle.step(actions), f"step {t}")
    finally:
        envs.close()
        oracle.close()
    with pytest.raises(TypeError, match=r"(?s)'num_workers'.*accepted: num_actors"):
        subvec.make_vec("CartPole-v1", 2, backend="ray", num_workers=2)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_sb3_face_on_the_ray_backend_matches_dummy_vec_env() -> None:
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from subvec.sb3 import SubprocVecEnv

    fns = [lambda: gym.make("CartPole-v1")] * 3
    vec = SubprocVecEnv(fns, backend="ray", num_actors=2)
    dummy = DummyVecEnv(fns)
    try:
        assert isinstance(vec.vector_env, RayVectorEnv)
        vec.seed(3)
        dummy.seed(3)
        assert_same(vec.reset(), dummy.reset(), "reset")
        actions = np.array([1, 0, 1])
        for t in range(30):
            got, want = vec.step(actions), dummy.step(actions)
            assert_same(got[:3], want[:3], f"step {t}")
            assert [sorted(i) for i in got[3]] == [sorted(i) for i in want[3]]
        assert vec.get_attr("spec", [1])[0].id == "CartPole-v1"
        if not GYM_029:  # gymnasium 0.29's envs keep no np_random_seed
            assert vec.env_method("get_wrapper_attr", "np_random_seed", indices=[0]) == [3]
    finally:
        vec.close()
        dummy.close()
    assert sb3 is not None


# --- the benchmark ------------------------------------------------------------------------


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_benchmark_runs_tiny_and_writes_its_table(tmp_path: Any) -> None:
    from pathlib import Path

    from tests.helpers import load_script

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_ray.py"
    bench = load_script("bench_ray_under_test", script)
    out = bench.main(["--quick", "--out-dir", str(tmp_path)])
    lines = [json.loads(line) for line in (out / "ray.jsonl").read_text().splitlines()]
    rows = [r for r in lines if not r.get("facts")]
    assert [(r["workload"], r["layout"]) for r in rows] == [
        ("CartPole-v1", layout) for layout in ("subproc", "ray_2_actors", "ray_actor_per_env")
    ]
    assert rows[0]["ray_overhead_ms"] is None and rows[1]["ray_overhead_ms"] is not None
    assert all(r["step_ms"] > 0 for r in rows)
    assert "Ray overhead per step" in (out / "ray.md").read_text()
    assert ray.is_initialized()  # the module's Ray: used, not shut down


@pytest.mark.slow  # the process backend runs it by default (tests/test_starts.py, test_gpus.py)
def test_worker_env_and_build_retries_reach_the_workers_inside_the_actors(tmp_path: Any) -> None:
    from tests.start_envs import StartRecorder

    fns = [
        functools.partial(StartRecorder, fail_marker=str(tmp_path / f"env{i}")) for i in range(3)
    ]
    with RayVectorEnv(fns, num_actors=2, build_retries=1, worker_env=_tag_worker) as envs:
        seen = envs.get_attr("environ")
        assert [e["SIM_TAG"] for e in seen] == ["local worker 0"] * 3
        assert all((tmp_path / f"env{i}").exists() for i in range(3))  # each failed once
        assert "SIM_TAG" not in os.environ


def _tag_worker(placement: Any) -> dict[str, str]:
    return {"SIM_TAG": f"local worker {placement.worker}"}


@pytest.mark.parametrize(("start_method", "forked"), [(None, False), ("fork", True)])
def test_sb3_start_method_starts_the_workers_inside_the_actors(
    start_method: str | None, forked: bool
) -> None:
    pytest.importorskip("stable_baselines3")
    from subvec.sb3 import SubprocVecEnv

    vec = SubprocVecEnv([StartMethodEnv] * 2, start_method=start_method, backend="ray")
    try:
        assert vec.get_attr("inherited_ray") == [forked, forked]
    finally:
        vec.close()


def test_an_unknown_start_method_is_refused_before_anything_starts() -> None:
    # multiprocessing's own error, as SB3's SubprocVecEnv raises it
    with pytest.raises(ValueError, match="cannot find context for 'illegal_method'"):
        RayVectorEnv([make_zoo("box_f32")] * 2, context="illegal_method")


# --- action chunks ------------------------------------------------------------------------


def _count_actor_calls(envs: Any) -> list[int]:
    """The commands of every actor call from now on, in order (the list grows)."""
    calls: list[int] = []
    for unit in envs._backends[0].units:
        run = unit.actor.run

        class Counting:
            def remote(self, command: int, payload: Any, run: Any = run) -> Any:
                calls.append(command)
                return run.remote(command, payload)

        unit.actor.run = Counting()
    return calls


@pytest.mark.parametrize("mode", offered_modes(), ids=lambda m: m.value)
def test_chunks_match_sync_per_env_with_one_actor_call_per_chunk(mode: AutoresetMode) -> None:
    fns = [lambda: gym.make("CartPole-v1")] * 4
    with RayEnvs(fns, autoreset_mode=mode) as envs:
        calls = _count_actor_calls(envs)
        calls.clear()
        inside = run_chunks_against_oracle(envs, fns, mode, [1, 3, 8, 8, 5, 8])
        # one per actor per chunk (a chunk of one sub-step is a step, the same command)
        assert calls.count(Command.STEP_ENVS) == 2 * 6 and Command.STEP not in calls
    assert inside >= 1


def test_box_chunks_with_infos_match_sync_per_env() -> None:
    fns = [make_zoo("box_f32", act_space=BOX_ACT, max_steps=6, terminate_prob=0.1)] * 4
    with RayEnvs(fns, autoreset_mode=AutoresetMode.SAME_STEP) as envs:
        run_chunks_against_oracle(envs, fns, AutoresetMode.SAME_STEP, [4, 1, 8, 5])


@pytest.mark.parametrize("mode", offered_modes(), ids=lambda m: m.value)
def test_async_chunks_match_sync_per_env_with_one_actor_call_per_set(mode: AutoresetMode) -> None:
    fns = [make_zoo("box_f32", act_space=BOX_ACT, max_steps=6, terminate_prob=0.15)] * 4
    with RayEnvs(fns, autoreset_mode=mode) as envs:
        calls = _count_actor_calls(envs)
        envs.async_reset(seed=0)
        envs.drain()
        calls.clear()
        envs.send_chunk(np.zeros((2, 3, 2), dtype=np.float32), [2, 3])
        assert envs.recv(env_ids=[2, 3])[4]["chunk_steps"].tolist()[0] >= 1
        assert calls == [Command.STEP_ENVS]  # one actor call for a set of one actor's envs
        # actor 0 holds envs 0-1, actor 1 envs 2-3: sets across both
        check_async_chunks(envs, fns, mode, [[0, 2], [1, 3]], rounds=4)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_killed_actor_mid_chunk_comes_back_truncated_at_sub_step_zero() -> None:
    with RayEnvs([make_zoo("box_f32")] * 4, on_worker_failure="restart") as envs:
        envs.reset(seed=0)
        envs.step_chunk(np.zeros((4, 2), dtype=np.int64))
        kill_actor(envs, 0)  # gone before the chunk is sent: ray.kill returns at once
        _, rewards, _, truncs, infos = envs.step_chunk(np.zeros((4, 3), dtype=np.int64))
        assert infos["chunk_steps"][:2].tolist() == [1, 1]
        assert truncs[:2, 0].all() and rewards[:2].tolist() == [[0.0] * 3] * 2
        assert infos["_worker_restarted"][:, 0].tolist() == [True, True, False, False]
        assert len(envs.restarts) == 1


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_killed_actor_mid_async_chunk_comes_back_truncated_and_the_other_set_runs() -> None:
    with RayEnvs([make_zoo("box_f32")] * 4, on_worker_failure="restart") as envs:
        envs.async_reset(seed=0)
        envs.drain()
        kill_actor(envs, 0)
        envs.send_chunk(np.zeros((2, 3), dtype=np.int64), [2, 3])
        envs.send_chunk(np.zeros((2, 3), dtype=np.int64), [0, 1])
        _, rewards, _, truncs, infos = envs.recv(env_ids=[0, 1])
        assert infos["chunk_steps"].tolist() == [1, 1] and truncs[:, 0].all()
        assert infos["worker_restarted"][:, 0].all() and rewards.tolist() == [[0.0] * 3] * 2
        assert envs.recv(env_ids=[2, 3])[4]["chunk_steps"].tolist() == [3, 3]
        assert len(envs.restarts) == 1
        kill_actor(envs, 1)  # the same for single steps (the lost actor's answer is no step)
        envs.send(np.zeros(2, dtype=np.int64), [2, 3])
        _, _, _, truncs, infos = envs.recv(env_ids=[2, 3])
        assert truncs.all() and infos["worker_restarted"].all() and len(envs.restarts) == 2


# --- robot-learning rollouts (tests/vla_checks.py) --------------------------------------------


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_metadata_none_or_not_a_mapping_reads_as_empty() -> None:
    vla_checks.check_metadata_none_and_non_dict(RayEnvs)


def test_per_env_call_arguments_reach_the_envs_of_each_actor() -> None:
    vla_checks.check_per_env_call_arguments(RayEnvs)


@pytest.mark.slow  # the process backend runs it by default (tests/test_sb3.py)
def test_sb3_env_method_takes_per_env_arguments_on_ray() -> None:
    vla_checks.check_sb3_env_method_per_env(backend="ray", num_actors=2, local_workers=1)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
def test_timeouts_per_command_on_ray() -> None:
    vla_checks.check_timeouts_per_command(RayEnvs)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_hung_reset_step_and_chunk_follow_the_failure_policy_on_ray(policy: str) -> None:
    vla_checks.check_hung_reset_step_and_chunk(RayEnvs, policy)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
def test_hung_step_and_chunk_raise_within_their_bounds_on_ray() -> None:
    vla_checks.check_hung_step_and_chunk_raise(RayEnvs)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
def test_freeze_step_against_single_envs_and_masked_reset_on_ray() -> None:
    vla_checks.check_freeze_step_and_masked_reset(RayEnvs)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
def test_freeze_chunks_against_single_envs_on_ray() -> None:
    vla_checks.check_freeze_chunks(RayEnvs)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
def test_freeze_send_recv_against_single_envs_on_ray() -> None:
    vla_checks.check_freeze_send_recv(RayEnvs)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
def test_freeze_under_record_episode_statistics_and_normalize_reward_on_ray() -> None:
    vla_checks.check_freeze_under_gymnasium_wrappers(RayEnvs)


def actor_worker_pids(envs: RayVectorEnv) -> list[int]:
    return [pid for record in envs.placement for pid in record.worker_pids]


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_reconfigure_all_and_some_envs_inside_the_live_actors() -> None:
    vla_checks.check_reconfigure_all_and_some(RayEnvs, actor_worker_pids)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_reconfigure_refused_keeps_the_old_envs_on_ray(tmp_path: Path) -> None:
    vla_checks.check_reconfigure_refused_keeps_the_old_envs(RayEnvs, str(tmp_path))


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_reconfigured_envs_wait_for_a_reset_on_ray() -> None:
    vla_checks.check_reconfigure_waits_for_a_reset(RayEnvs)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_reconfigure_with_an_actor_worker_dying(policy: str) -> None:
    vla_checks.check_reconfigure_with_a_unit_dying(RayEnvs, policy)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.parametrize("mode", ["NextStep", "freeze"])
def test_suspend_resume_continues_with_the_state_hook_on_ray(mode: str) -> None:
    kwargs = {"freeze": True} if mode == "freeze" else {"autoreset_mode": mode}
    vla_checks.check_suspend_resume_continues_with_the_state_hook(
        RayEnvs, actor_worker_pids, **kwargs
    )


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_suspend_resume_without_the_hook_resets_on_ray() -> None:
    vla_checks.check_suspend_resume_without_the_hook_resets(RayEnvs)


@pytest.mark.slow  # the process backend runs it by default (tests/test_vla.py)
def test_a_resume_that_fails_stays_suspended_on_ray(tmp_path: Path) -> None:
    vla_checks.check_resume_that_fails_stays_suspended(RayEnvs, str(tmp_path / "cannot-start"))


@pytest.mark.slow  # the process backend runs it by default (tests/test_multiagent.py)
@pytest.mark.timeout(120)
def test_agents_as_rows_on_ray_actors() -> None:
    """subvec.multiagent over the Ray backend: the rows equal the serial loop's."""
    pytest.importorskip("pettingzoo")
    from tests.ma_envs import Comings
    from tests.test_multiagent import run_against_oracle

    seen = run_against_oracle(Comings, 4, AutoresetMode.SAME_STEP, 30, backend="ray", num_actors=2)
    assert seen["departed"] > 10 and seen["finals"] == seen["departed"]


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
def test_agents_as_rows_by_group_poll_and_deadline_on_ray(tmp_path: Path) -> None:
    pytest.importorskip("pettingzoo")
    from tests.test_multiagent import check_recv_by_group_poll_and_deadline

    check_recv_by_group_poll_and_deadline(tmp_path, backend="ray", num_actors=4)
