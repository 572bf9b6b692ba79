"""The failure model (docs/reliability.md): a crash matrix of what fails x when it fails.

Each test is bounded by a timeout, so a hang fails instead of stalling CI, and the autouse
fixture in conftest.py checks that no child process and no shared-memory segment survives it.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError

from subvec import (
    BrokenVectorEnvError,
    EnvError,
    SharedMemoryTooSmallError,
    SubprocVectorEnv,
    WorkerDiedError,
    WorkerTimeoutError,
)
from subvec._commands import CallPayload, Command, Status
from subvec._inproc import InProcessVectorEnv
from subvec._process.shm import SEGMENT_PREFIX, list_segments, remove_stale_segments
from subvec.errors import RemoteTraceback
from tests.envs import (
    BigIntInfoEnv,
    BuildOnce,
    CrashEnv,
    ExitAfterReplyEnv,
    UnpicklableInfoEnv,
    ZooEnv,
    checked,
    crash_fns,
    make_zoo,
)
from tests.failure_checks import (
    check_chunk_env_errors_leave_the_other_envs_running,
    check_env_error_in_reset_and_call,
    check_env_error_in_step,
    check_env_errors_leave_the_other_envs_stepped,
    check_factory_error,
    check_lost_unit_is_restarted,
    check_lost_unit_raises_and_reset_rebuilds_it,
)
from tests.helpers import assert_same, child_env, gone, wait_until
from tests.oracle import require_offered

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def warm_singletons() -> None:
    """Start the forkserver and the resource tracker once: they hold fds for the session."""
    for context in ("forkserver", "fork", "spawn"):
        SubprocVectorEnv([make_zoo("box_f32")], context=context).close()


@pytest.fixture(autouse=True)
def no_fd_growth(warm_singletons: None, fd_count: Any) -> Any:
    """No crash, hang or cleanup path may leak a file descriptor in the parent."""
    before = fd_count()
    yield
    assert fd_count() == before, "file descriptors leaked"


def worker_pids(envs: SubprocVectorEnv) -> list[int]:
    return [report.pid for report in envs.placement]


# --- 1. an env raises -------------------------------------------------------------------------


#: the failure checks' binding (tests/failure_checks.py): four envs on two workers
two_workers = functools.partial(SubprocVectorEnv, num_workers=2)


def worker_of(envs: SubprocVectorEnv, env: int) -> int:
    """The pid of the worker that runs ``env``."""
    return next(r.pid for r, envs_of in zip(envs.placement, envs.worker_envs) if env in envs_of)


def parent(envs: Any, env: int) -> int:
    return os.getpid()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("make", "env_pid"),
    [(two_workers, worker_of), (InProcessVectorEnv, parent)],
    ids=["workers", "in_process"],
)
def test_env_error_in_step_keeps_type_index_pid_and_traceback(make: Any, env_pid: Any) -> None:
    # Env 3 is worker 1's second env: the report names the env that raised, not its worker's first.
    check_env_error_in_step(make, env_pid)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [two_workers, InProcessVectorEnv], ids=["workers", "in_process"])
def test_env_errors_in_one_step_leave_the_other_envs_stepped(make: Any) -> None:
    check_env_errors_leave_the_other_envs_stepped(make)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [two_workers, InProcessVectorEnv], ids=["workers", "in_process"])
def test_env_errors_in_one_chunk_leave_the_other_envs_running(make: Any) -> None:
    check_chunk_env_errors_leave_the_other_envs_running(make)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [two_workers, InProcessVectorEnv], ids=["workers", "in_process"])
def test_env_error_in_reset_and_call_and_one_report_for_many(make: Any) -> None:
    check_env_error_in_reset_and_call(make, one_unit=make is InProcessVectorEnv)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [two_workers, InProcessVectorEnv], ids=["workers", "in_process"])
def test_factory_error_names_env_and_leaves_nothing_running(make: Any) -> None:
    check_factory_error(make)


@pytest.mark.timeout(30)
def test_unpicklable_factory_fails_before_any_process_starts() -> None:
    lock = threading.Lock()

    def holds_lock() -> Any:
        with lock:
            return ZooEnv()

    before = multiprocessing.active_children()
    with pytest.raises(TypeError, match=r"env_fns\[1\]"):
        SubprocVectorEnv([make_zoo("box_f32"), holds_lock])
    assert multiprocessing.active_children() == before


# --- 2. a worker dies -------------------------------------------------------------------------


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("how", "signature"),
    [("kill", "SIGKILL(-9)"), ("segv", "SIGSEGV(-11)"), ("exit", "exit code 3")],
)
@pytest.mark.parametrize("cpus", [2, 8], ids=["partner", "all_spin"])
def test_worker_death_mid_step_is_seen_at_once_while_others_are_busy(
    how: str, signature: str, cpus: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # env 0 (worker 0) sleeps 30 s inside step; env 3 (worker 1) dies. The error must not wait
    # for the sleeper. With as many CPUs as workers, worker 0 is the parent's partner, whose
    # reply the parent awaits first: the death must still be seen during that wait.
    monkeypatch.setattr("subvec.vector.usable_cpus", lambda: cpus)
    fns = crash_fns(4, 3, how)
    fns[0] = lambda: __import__("tests.envs").envs.CrashEnv("hang", seconds=30, terminate_prob=0)
    envs = SubprocVectorEnv(fns, num_workers=2)
    # (the futex protocol has no partner: SUBVEC_WAKE=futex runs these tests through it)
    partnered = cpus == 2 and envs.layout.wake == "pipes"
    assert envs.layout.partner == (0 if partnered else None)
    try:
        envs.reset(seed=0)
        pid = worker_pids(envs)[1]
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            envs.step(envs.action_space.sample())
        assert time.monotonic() - start < 15, "death was not noticed while worker 0 slept"
        err = info.value
        assert signature in str(err) and f"pid {pid}" in str(err)
        assert err.env_indices == (2, 3) and err.pid == pid
        with pytest.raises(BrokenVectorEnvError, match="died"):
            envs.step(envs.action_space.sample())
    finally:
        start = time.monotonic()
        envs.close()
        assert time.monotonic() - start < 10


def kill_worker(envs: SubprocVectorEnv, worker: int) -> None:
    pid = worker_pids(envs)[worker]
    os.kill(pid, signal.SIGKILL)
    # Forked workers are our own children: once `gone`, the parent can tell they are dead (a
    # forkserver reports the exit a moment after the process is reaped).
    assert wait_until(lambda: gone(pid), 5)


#: forked, so that a worker killed here is seen dead as soon as it is gone
forked_workers = functools.partial(SubprocVectorEnv, num_workers=2, context="fork")


@pytest.mark.timeout(60)
def test_worker_killed_while_idle_is_reported_on_next_call_and_reset_rebuilds_it() -> None:
    err = check_lost_unit_raises_and_reset_rebuilds_it(forked_workers, kill_worker, worker_pids)
    assert "SIGKILL(-9)" in str(err)


@pytest.mark.timeout(60)
def test_worker_killed_while_idle_is_restarted_by_the_next_step() -> None:
    check_lost_unit_is_restarted(forked_workers, kill_worker, worker_pids)


def endless() -> gym.Env[Any, Any]:
    return ZooEnv(max_steps=10**6, terminate_prob=0.0)


@pytest.mark.timeout(60)
def test_reset_rebuilds_a_broken_vector_env_with_a_masked_reset() -> None:
    # Workers 1 and 2 die together: the step sees one death, reset() rebuilds both. A masked
    # reset resets the rebuilt envs too (they have no state to keep), and only the asked ones
    # of the living worker.
    envs = SubprocVectorEnv([endless] * 6, num_workers=3, context="fork")
    try:
        envs.reset(seed=0)
        actions = np.zeros(6, dtype=np.int64)
        envs.step(actions)
        old = worker_pids(envs)
        for worker in (1, 2):
            kill_worker(envs, worker)
        with pytest.raises(WorkerDiedError, match=r"reset\(\) rebuilds the failed workers"):
            envs.step(actions)
        with pytest.raises(BrokenVectorEnvError, match=r"died.*reset\(\) rebuilds"):
            envs.get_attr("t")
        mask = np.array([True, False, False, False, False, False])
        _, infos = envs.reset(seed=7, options={"reset_mask": mask})
        assert list(infos["_reset_count"]) == [True, False, True, True, True, True]
        # env 1 kept its state: two steps (worker 0 took the step that met the deaths)
        assert envs.get_attr("t") == (0, 2, 0, 0, 0, 0)
        assert envs.restarts == []  # not restarts: max_restarts is untouched
        assert [r.worker for r in envs.rebuilds] == [1, 2]
        assert [r.env_indices for r in envs.rebuilds] == [(2, 3), (4, 5)]
        assert all("rebuilt by reset()" in r.reason and "died" in r.reason for r in envs.rebuilds)
        new = worker_pids(envs)
        assert new[0] == old[0] and new[1] != old[1] and new[2] != old[2]
    finally:
        envs.close()


# --- 3. a worker hangs ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("infos", ["zoo", "quiet", "steady", "slots"])
def test_timeout_names_stuck_envs_and_no_stale_reply_is_returned_later(infos: str) -> None:
    # quiet: no infos, so the late reply is a plain OK that differs from the awaited one
    # only in its sequence number; steady: the same, with the infos in the block; slots:
    # image observations, written to a slot per step. Slow steps: a parent that took the late
    # reply for the awaited one would return the block while worker 0 is still writing the
    # next step.
    quiet, steady = infos in ("quiet", "slots"), infos == "steady"
    obs_space = spaces.Box(0, 255, (48, 48, 3), np.uint8) if infos == "slots" else None
    fns = crash_fns(
        4, 1, "hang", seconds=1.0, quiet=quiet, steady=steady, step_seconds=0.1, obs_space=obs_space
    )
    envs = SubprocVectorEnv(fns, num_workers=2)
    try:
        envs.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        envs.step_async(actions)
        with pytest.raises(WorkerTimeoutError) as info:
            envs.step_wait(timeout=0.2)
        err = info.value
        assert isinstance(err, TimeoutError) and isinstance(err, multiprocessing.TimeoutError)
        assert err.env_indices == (0, 1)
        assert "worker 0" in str(err)
        # The stuck worker answers the timed-out step late; that answer must be dropped and
        # this step's answer returned: every env has now taken exactly two steps, and the
        # results (the infos travel in the replies) are the second step's, as in-process.
        second = envs.step(actions)
        assert envs.get_attr("t") == (2, 2, 2, 2)
        assert (envs.block_plan.obs_slots > 0) == (infos == "slots")
        reference = gym.vector.SyncVectorEnv(
            [
                lambda: ZooEnv(
                    obs_space, max_steps=10**6, terminate_prob=0.0, quiet=quiet, steady=steady
                )
            ]
            * 4
        )
        reference.reset(seed=0)
        reference.step(actions)
        assert_same(second, reference.step(actions), "the step after the timeout")
        reference.close()
        # A batch from a slot keeps the block mapped (and its fd open) while it is held, and
        # pytest's `info` keeps this frame alive in a cycle: let go of it here.
        del second
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stuck", [0, 1], ids=["partner", "other_worker"])
def test_constructor_timeout_applies_to_every_wait(
    stuck: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The partner layout: the parent sleeps on worker 0's reply, then reads the plain OKs it
    # finds ready (quiet envs: no infos). A stuck worker 1 must not make that read block.
    monkeypatch.setattr("subvec.vector.usable_cpus", lambda: 2)
    fns = crash_fns(2, stuck, "hang", seconds=30, quiet=True)
    envs = SubprocVectorEnv(fns, num_workers=2, timeout=0.2)
    assert envs.layout.partner == (0 if envs.layout.wake == "pipes" else None)
    try:
        envs.reset(seed=0)
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            envs.step(envs.action_space.sample())
        assert time.monotonic() - start < 10
        assert info.value.env_indices == (stuck,)
    finally:
        envs.close(terminate=True)


@pytest.mark.timeout(60)
def test_close_terminate_escalates_to_sigkill_within_a_bound() -> None:
    envs = SubprocVectorEnv(crash_fns(2, 0, "hang_ignoring_sigterm"), num_workers=2)
    envs.reset(seed=0)
    pids = worker_pids(envs)
    envs.step_async(envs.action_space.sample())
    with pytest.raises(WorkerTimeoutError):
        envs.step_wait(timeout=0.3)
    start = time.monotonic()
    envs.close(terminate=True)
    assert time.monotonic() - start < 8
    assert all(gone(pid) for pid in pids)


@pytest.mark.timeout(60)
def test_close_with_timeout_on_a_hung_worker_is_bounded() -> None:
    envs = SubprocVectorEnv(crash_fns(2, 1, "hang"), num_workers=2)
    envs.reset(seed=0)
    envs.step_async(envs.action_space.sample())
    start = time.monotonic()
    with pytest.warns(UserWarning, match="pending call to `step`"):
        envs.close(timeout=0.5)
    assert time.monotonic() - start < 8


# --- 4. opt-in restart ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("steady", [False, True], ids=["zoo_infos", "block_infos"])
def test_restart_replaces_a_dead_worker_and_reports_truncation(steady: bool) -> None:
    # steady: the infos live in the block; the dead worker's flag must not be read as the
    # restarted one's (its reply is a reset's).
    envs = SubprocVectorEnv(
        crash_fns(4, 3, "kill", at_step=2, steady=steady),
        num_workers=2,
        on_worker_failure="restart",
    )
    try:
        envs.reset(seed=0)
        old = worker_pids(envs)
        actions = np.zeros(4, dtype=np.int64)
        _, _, _, trunc, infos = envs.step(actions)
        assert not trunc.any() and "worker_restarted" not in infos
        _, rew, term, trunc, infos = envs.step(actions)  # env 3 dies here
        assert list(trunc) == [False, False, True, True]
        assert list(term) == [False] * 4
        assert rew[2] == 0.0 and rew[3] == 0.0
        assert list(infos["_worker_restarted"]) == [False, False, True, True]
        if steady:  # the others' step infos from the block, the restarted envs' reset infos
            assert list(infos["_x_position"]) == [True, True, False, False]
            assert list(infos["_reset_count"]) == [False, False, True, True]
        assert len(envs.restarts) == 1
        record = envs.restarts[0]
        assert record.worker == 1 and record.env_indices == (2, 3)
        assert "SIGKILL(-9)" in record.reason
        assert envs.worker_pids[1] != old[1] and envs.worker_pids[0] == old[0]
        # The replaced worker's envs start afresh; the other worker's envs carry on.
        assert envs.get_attr("t") == (2, 2, 0, 0)
        infos = envs.step(actions)[4]
        assert envs.get_attr("t") == (3, 3, 1, 1)
        if steady:
            assert list(infos["_x_position"]) == [True] * 4 and "worker_restarted" not in infos
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_restart_of_a_hung_worker_and_max_restarts() -> None:
    envs = SubprocVectorEnv(
        crash_fns(2, 0, "hang", at_step=1),
        num_workers=2,
        on_worker_failure="restart",
        max_restarts=1,
        timeout=0.5,
    )
    try:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        _, _, _, trunc, infos = envs.step(actions)  # env 0 hangs: replaced
        assert list(trunc) == [True, False] and list(infos["_worker_restarted"]) == [True, False]
        with pytest.raises(WorkerTimeoutError, match="no reply") as info:
            envs.step(actions)  # hangs again: restarts are used up
        if sys.version_info >= (3, 11):
            assert any("max_restarts=1" in n for n in info.value.__notes__)
        with pytest.raises(BrokenVectorEnvError):
            envs.step(actions)
    finally:
        envs.close(terminate=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["raise", "hang", "hang_start_timeout"])
def test_a_replacement_that_cannot_be_built_breaks_the_env_within_the_bound(
    how: str, tmp_path: Path
) -> None:
    # Env 1's worker dies at step 2; its factory then raises, or hangs past the bound: the
    # constructor's timeout, or start_timeout (which bounds every build of the envs).
    bounds = {"timeout": None, "start_timeout": 1.0} if how == "hang_start_timeout" else {}
    crashing = BuildOnce(
        str(tmp_path / "built"),
        how.split("_")[0],
        lambda: CrashEnv("kill", at_step=2, max_steps=10**6, terminate_prob=0.0),
    )
    envs = SubprocVectorEnv(
        [endless, crashing],
        num_workers=2,
        on_worker_failure="restart",
        **({"timeout": 1.0} | bounds),  # type: ignore[arg-type]
    )
    try:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        envs.step(actions)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="its replacement failed") as info:
            envs.step(actions)
        assert time.monotonic() - start < 8, "the replacement's build was not bounded"
        err = info.value
        assert err.env_indices == (1,) and "SIGKILL(-9)" in str(err)
        assert "reset() rebuilds the failed workers" in str(err)
        if how == "raise":
            assert isinstance(err.__cause__, ValueError) and isinstance(err.__cause__, EnvError)
            assert err.__cause__.command == "make" and err.__cause__.env_index == 1
        else:
            assert isinstance(err.__cause__, WorkerTimeoutError)
            assert "building the envs" in str(err.__cause__)
        # The failed replacement counts against max_restarts, and says why it failed.
        assert len(envs.restarts) == 1 and "its replacement failed" in envs.restarts[0].reason
        # A defined state: broken, never a step that did not run.
        with pytest.raises(BrokenVectorEnvError, match="its replacement failed"):
            envs.step_wait()
        with pytest.raises(BrokenVectorEnvError):
            envs.step(actions)
        if how == "raise":
            # reset() rebuilds, the factory raises again: still broken, and it says so.
            with pytest.raises(ValueError, match="cannot be built again") as again:
                envs.reset(seed=0)
            if sys.version_info >= (3, 11):
                assert any("stays broken" in note for note in again.value.__notes__)
            with pytest.raises(BrokenVectorEnvError):
                envs.step(actions)
            assert envs.rebuilds == [] and len(envs.restarts) == 1
    finally:
        envs.close(terminate=True)


def checked_endless() -> gym.Env[Any, Any]:
    return checked(ZooEnv(max_steps=10**6, terminate_prob=0.0))


def checked_images() -> gym.Env[Any, Any]:
    space = spaces.Box(0, 255, (48, 48, 3), np.uint8)
    return checked(ZooEnv(space, max_steps=10**6, terminate_prob=0.0))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("obs", "then"),
    [("shared", "step"), ("slots", "step"), ("by_value", "step"), ("shared", "reset")],
)
def test_a_restart_during_a_call_resets_the_new_envs(obs: str, then: str) -> None:
    # gymnasium's order checks (as gym.make builds envs) refuse a step before the first reset:
    # the replaced envs must be reset before anything steps them. The next step reports them
    # as a restart during a step does (that reset's observation, truncated, reward 0,
    # worker_restarted) and does not step them; the step after it steps them.
    envs = SubprocVectorEnv(
        [checked_images if obs == "slots" else checked_endless] * 4,
        num_workers=2,
        on_worker_failure="restart",
        shared_memory=obs != "by_value",
    )
    try:
        assert (envs.block_plan.obs_slots > 0) == (obs == "slots")
        envs.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        held = envs.step(actions)[0]
        kept = held.copy()
        victim = worker_pids(envs)[1]
        os.kill(victim, signal.SIGKILL)
        assert wait_until(lambda: gone(victim), 5)
        with pytest.raises(WorkerDiedError, match="while waiting for call") as info:
            envs.get_attr("t")
        assert info.value.env_indices == (2, 3)
        if sys.version_info >= (3, 11):
            assert any("remains usable" in note for note in info.value.__notes__)
        assert len(envs.restarts) == 1 and envs.restarts[0].env_indices == (2, 3)
        assert envs.get_attr("t") == (1, 1, 0, 0)  # rebuilt and reset
        if then == "reset":
            _, infos = envs.reset(seed=1)
            assert list(infos["_worker_restarted"]) == [False, False, True, True]
        else:
            got, rew, term, trunc, infos = envs.step(actions)
            assert list(trunc) == [False, False, True, True] and not term.any()
            assert rew[2] == 0.0 and rew[3] == 0.0
            assert list(infos["_worker_restarted"]) == [False, False, True, True]
            assert list(infos["_reset_count"]) == [False, False, True, True]
            assert envs.get_attr("t") == (2, 2, 0, 0)  # not stepped: their reset is reported
            last = envs.get_attr("last_obs")
            for i in range(4):
                assert np.array_equal(got[i], last[i]), f"env {i}"
            assert_same(held, kept, "a batch held across the restart")
        infos = envs.step(actions)[4]
        assert "worker_restarted" not in infos
        assert envs.get_attr("t")[2:] == (1, 1)
        # A slot batch keeps the block mapped, and pytest's `info` keeps this frame alive.
        held = got = None
    finally:
        envs.close()


# --- 5. the parent dies or is interrupted -----------------------------------------------------


def run_script(context: str, mode: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.scripts.lifecycle", context, mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["idle", "midstep"])
@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_parent_sigkill_takes_workers_and_segment_with_it(context: str, mode: str) -> None:
    proc = run_script(context, mode)
    try:
        assert proc.stdout is not None
        report = json.loads(proc.stdout.readline())
        if mode == "midstep":
            assert proc.stdout.readline().strip() == "stepping"
        pids, segment = report["pids"], report["segment"]
        assert all(not gone(pid) for pid in pids)
        assert segment in list_segments()
        proc.kill()
        proc.wait(10)
        assert wait_until(lambda: all(gone(pid) for pid in pids), 3.0), "workers outlived parent"
        assert wait_until(lambda: segment not in list_segments(), 10.0), "segment leaked"
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_parent_sigkill_takes_workers_stuck_in_native_code_that_holds_the_gil(
    context: str,
) -> None:
    # The worker's parent watch is a Python thread: it cannot run while the env sits in native
    # code that keeps the GIL (here 60 s of libc sleep through ctypes.PyDLL). The kernel's
    # parent-death signal does not need the GIL.
    proc = run_script(context, "native")
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        pids = json.loads(proc.stdout.readline())["pids"]
        # Two lines, ours and the worker's, whose writes may interleave (each is atomic).
        text = proc.stdout.readline() + proc.stdout.readline()
        assert "stepping" in text and "in native code" in text, text
        proc.kill()
        proc.wait(10)
        assert wait_until(lambda: all(gone(pid) for pid in pids), 2.0), "workers outlived parent"
    finally:
        # A worker that outlived the parent is no child of ours, and it holds the parent's
        # stdout open: end it before reading the rest.
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_workers_outlive_the_thread_that_started_them(context: str) -> None:
    # The kernel's parent-death signal fires when the *thread* that forked exits: workers
    # started from a thread that then ends must not die with it.
    import threading

    built: list[SubprocVectorEnv] = []
    thread = threading.Thread(
        target=lambda: built.append(
            SubprocVectorEnv([make_zoo("box_f32")] * 2, num_workers=2, context=context)
        )
    )
    thread.start()
    thread.join(60)
    # join() returns when the thread's Python code is done; the kernel sends the signal as the
    # OS thread exits, before its /proc entry goes.
    task = f"/proc/self/task/{thread.native_id}"
    assert wait_until(lambda: not os.path.exists(task), 10.0)
    envs = built[0]
    try:
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
        assert all(not gone(pid) for pid in worker_pids(envs))
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_ctrl_c_interrupts_the_parent_once_and_workers_stay_quiet() -> None:
    proc = run_script("forkserver", "interrupt", start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        json.loads(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "looping"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        out, err = proc.communicate(timeout=30)
        assert out.split() == ["interrupted", "closed"]
        assert proc.returncode == 0
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["close", "step", "recv"])
def test_ctrl_c_interrupts_every_blocking_wait(where: str) -> None:
    # Env 1 sleeps 3 s in its close() (or in its first step): Ctrl-C 0.3 s in must not wait
    # for it, and a second close() still releases everything (the leak check).
    how = "slow_close" if where == "close" else "hang"
    envs = SubprocVectorEnv(crash_fns(2, 1, how, seconds=3.0), num_workers=2)
    envs.reset(seed=0)
    actions = envs.action_space.sample()
    fired: list[float] = []

    def interrupt(signum: int, frame: Any) -> None:
        fired.append(time.monotonic())
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            if where == "close":
                envs.close()
            elif where == "step":
                envs.step(actions)
            else:
                envs.send(actions, env_ids=[0, 1])
                envs.recv()
        latency = time.monotonic() - fired[0]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # measured in milliseconds; the bound only has to tell it from the 2.7 s the env still needs
    assert latency < 0.5, latency
    envs.close(timeout=1.0)
    assert envs.closed


# --- 6. no close() ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_script_that_never_closes_exits_promptly_and_cleans_up() -> None:
    proc = run_script("forkserver", "noclose")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    report = json.loads(out.splitlines()[0])
    assert wait_until(lambda: all(gone(pid) for pid in report["pids"]), 3.0)
    assert report["segment"] not in list_segments()
    assert "leaked" not in err, err


@pytest.mark.timeout(60)
def test_dropped_env_is_freed_at_once_and_reaps_its_workers() -> None:
    import weakref

    envs = SubprocVectorEnv([make_zoo("box_f32")] * 2, num_workers=2, batch_size=1)
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    envs.step_chunk(np.zeros((2, 3), dtype=np.int64))  # the chunk arrays' owner too
    envs.async_reset(seed=1)
    envs.recv()  # the asynchronous path's mergers too
    envs.drain()
    pids = worker_pids(envs)
    collected = weakref.ref(envs)
    del envs
    # No reference cycle: freed by its reference count, not at the cycle collector's next pass
    # (which may come late in a long-running program, its workers held all that time).
    assert collected() is None
    assert all(gone(pid) for pid in pids)


# --- 7. bad input -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_bad_actions_are_refused_before_sending_and_env_stays_usable() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f32")] * 3, num_workers=2)
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"batch of 3 actions.*got 2"):
            envs.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(ValueError, match=r"expected shape \(3,\), got \(3, 2\)"):
            envs.step(np.zeros((3, 2), dtype=np.int64))
        with pytest.raises(TypeError, match="0-d array"):
            envs.step(np.array(1))
        # a scalar is no batch: a TypeError, as gymnasium's, saying what was expected
        with pytest.raises(
            TypeError, match=r"expected a batch of shape \(3,\), one per env, got 1"
        ):
            envs.step(1)
        with pytest.raises(
            TypeError, match=r"expected a batch of shape \(2,\), one per env in env_ids, got 1"
        ):
            envs.send(1, env_ids=[1, 2])
        with pytest.raises(ValueError, match="expected 3 actions, one per env, got 2"):
            envs.step([0, 1])
        assert envs.get_attr("t") == (0, 0, 0)
        envs.step(np.array([0, 1, 2]))
        assert envs.get_attr("t") == (1, 1, 1)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_an_info_that_cannot_be_sent_names_the_env_and_loses_nothing() -> None:
    # Env 2 is worker 1's first env: the error must name it, not the env its worker stepped last.
    fns: list[Any] = [lambda: ZooEnv(max_steps=10**6, terminate_prob=0.0)] * 4
    fns[2] = lambda: UnpicklableInfoEnv(max_steps=10**6, terminate_prob=0.0)
    envs = SubprocVectorEnv(fns, num_workers=2)
    try:
        envs.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        envs.step(actions)
        with pytest.raises(TypeError, match="cannot be pickled") as info:
            envs.step(actions)
        assert isinstance(info.value, EnvError) and info.value.command == "step"
        assert info.value.env_index == 2 and "env 2" in str(info.value)
        envs.step(actions)  # the env and its worker are fine: the next step goes through
        assert envs.get_attr("t") == (3, 3, 3, 3)
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("info_format", "nested", "value"),
    [
        ("gymnasium", False, 2**70),
        ("gymnasium", True, -(2**70)),
        ("legacy", False, 2**63),
        ("list", False, 2**70),
    ],
)
def test_an_info_int_beyond_int64_is_a_clear_error_as_sync_fails(
    info_format: str, nested: bool, value: int
) -> None:
    # gymnasium's merge stores ints in an int64 array: SyncVectorEnv raises a bare
    # OverflowError. The same type here, naming the env and the key; the list format keeps
    # the int as it is. The next step (plain ints again) goes through.
    require_offered(info_format=info_format)
    fns = [
        lambda: BigIntInfoEnv(1, nested, max_steps=10**6, terminate_prob=0.0),
        lambda: BigIntInfoEnv(value, nested, max_steps=10**6, terminate_prob=0.0),
    ]
    envs = SubprocVectorEnv(fns, num_workers=2, info_format=info_format)
    try:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        if info_format == "list":
            infos = envs.step(actions)[4]
            assert infos[1] == {"big": value} and type(infos[1]["big"]) is int
        else:
            sync = gym.vector.SyncVectorEnv(fns)
            sync.reset(seed=0)
            with pytest.raises(OverflowError):
                sync.step(actions)
            sync.close()
            key = "'n' -> 'deep'" if nested else "'big'"
            with pytest.raises(OverflowError, match=f"env 1: info {key} = {value}") as info:
                envs.step(actions)
            assert "int64" in str(info.value)
        infos = envs.step(actions)[4]
        if info_format == "gymnasium" and not nested:
            assert list(infos["big"]) == [1, 1]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_wrong_observation_shape_names_env_expected_and_actual() -> None:
    envs = SubprocVectorEnv(crash_fns(3, 2, "bad_shape"), num_workers=2)
    try:
        envs.reset(seed=0)
        with pytest.raises(
            ValueError, match=r"env 2: observation has shape \(5,\), expected \(3,\)"
        ):
            envs.step(envs.action_space.sample())
        envs.reset(seed=0)  # still usable
    finally:
        envs.close()


@pytest.mark.timeout(30)
def test_shm_too_small_is_a_clear_error_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    from subvec._process import shm as _shm

    real = os.statvfs

    class Tiny:
        f_bavail, f_frsize = 1, 4096

    monkeypatch.setattr(_shm.os, "statvfs", lambda path: Tiny() if "shm" in path else real(path))
    with pytest.raises(SharedMemoryTooSmallError, match=r"needs .* MiB .* has only") as info:
        SubprocVectorEnv([make_zoo("box_u8_image")] * 2, num_workers=2)
    assert info.value.needed > info.value.available == 4096


# --- 8. resources -----------------------------------------------------------------------------


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(180)
def test_no_growth_of_fds_children_or_segments_over_100_cycles(fd_count: Any) -> None:
    def cycle() -> None:
        envs = SubprocVectorEnv([make_zoo("box_f32")] * 2, num_workers=2)
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
        envs.close()

    cycle()  # the first cycle starts the forkserver and the resource tracker
    fds = fd_count()
    for _ in range(100):
        cycle()
    assert fd_count() == fds
    assert not multiprocessing.active_children()
    assert not [n for n in list_segments() if n.startswith(f"{SEGMENT_PREFIX}{os.getpid()}_")]


def test_stale_segments_are_removed_by_prefix_and_live_ones_kept(tmp_path: Path) -> None:
    dead = tmp_path / f"{SEGMENT_PREFIX}999999999_abcd"
    live = tmp_path / f"{SEGMENT_PREFIX}{os.getpid()}_abcd"
    other = tmp_path / "psm_12345"
    for path in (dead, live, other):
        path.write_bytes(b"x")
    assert remove_stale_segments(str(tmp_path)) == [dead.name]
    assert live.exists() and other.exists() and not dead.exists()


def test_shm_cli_lists_and_cleans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from subvec.cli import main

    (tmp_path / f"{SEGMENT_PREFIX}999999999_ab").write_bytes(b"x")
    assert main(["shm", "--dir", str(tmp_path)]) == 0
    assert "stale" in capsys.readouterr().out
    assert main(["shm", "--clean", "--dir", str(tmp_path)]) == 0
    assert "removed" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


# --- 9. close() from every state, and state misuse --------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("state", ["pending_step", "after_crash", "after_timeout", "interrupted"])
def test_close_is_bounded_and_idempotent_from_every_state(state: str) -> None:
    how = {"after_crash": "kill", "after_timeout": "hang", "interrupted": "hang"}.get(state, "")
    envs = SubprocVectorEnv(crash_fns(2, 1, how), num_workers=2)
    envs.reset(seed=0)
    actions = envs.action_space.sample()
    if state == "pending_step":
        envs.step_async(actions)
    elif state == "after_crash":
        with pytest.raises(WorkerDiedError):
            envs.step(actions)
    elif state == "after_timeout":
        envs.step_async(actions)
        with pytest.raises(WorkerTimeoutError):
            envs.step_wait(timeout=0.2)
    else:

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(KeyboardInterrupt):
                envs.step(actions)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    start = time.monotonic()
    if state == "pending_step":
        with pytest.warns(UserWarning, match="pending call to `step`"):  # as AsyncVectorEnv
            envs.close(timeout=1.0)
    else:
        envs.close(timeout=1.0)
    assert time.monotonic() - start < 8
    envs.close()
    assert envs.closed
    with pytest.raises(ClosedEnvironmentError):
        envs.step(actions)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cpus", [2, 8], ids=["partner", "all_spin"])
def test_a_reply_and_the_exit_in_one_wait_then_close_releases_everything(
    cpus: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Worker 1 exits right after replying to step 2 (tests.envs.exit_after_next_write): its
    # reply, its EOF and its sentinel are all ready at the parent's next wait.
    monkeypatch.setattr("subvec.vector.usable_cpus", lambda: cpus)
    fns: list[Any] = [endless, lambda: ExitAfterReplyEnv(2, max_steps=10**6, terminate_prob=0)]
    envs = SubprocVectorEnv(fns, num_workers=2)
    try:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        envs.step(actions)
        pid = worker_pids(envs)[1]
        envs.step_async(actions)
        assert wait_until(lambda: gone(pid), 5)
        envs.step_wait()  # its reply came in whole: the step went through
        with pytest.raises(WorkerDiedError, match="exit code 3"):
            envs.step(actions)
    finally:
        envs.close()  # never raises from bookkeeping; the fixtures check what it released


@pytest.mark.timeout(60)
def test_a_reply_and_the_exit_in_one_wait_of_some_workers() -> None:
    # A wait for some workers only (closing, restarting, rebuilding) keeps a poll object of
    # its own: a reply and the exit of its worker in one poll must be taken once each. Driven
    # through the backend's face: no public call waits for one worker right after it exited.
    fns: list[Any] = [endless, lambda: ExitAfterReplyEnv(max_steps=10**6, terminate_prob=0)]
    envs = SubprocVectorEnv(fns, num_workers=2)
    try:
        envs.reset(seed=0)
        pool = envs._pool
        worker = pool.workers[1]
        pool.send(Command.CALL, CallPayload("exit_after_reply", (), {}), units=[worker])
        assert wait_until(lambda: gone(worker.process.pid), 5)
        got = pool.collect(5.0, "testing", units=[worker])
        assert got is not None and not got.failures
        assert got.outcomes[1] == (Status.OK_PAYLOAD, [0])
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("parent_envs", [0, 2])
def test_an_env_close_error_names_the_env_that_raised(parent_envs: int) -> None:
    # Env 2 is the first of the last two envs (worker 1's, or the parent's own): the report
    # names it, not the env closed last.
    fns = crash_fns(4, 2, "raise_on_close")
    envs = SubprocVectorEnv(fns, num_workers=2 - parent_envs // 2, parent_envs=parent_envs)
    envs.reset(seed=0)
    with pytest.raises(OSError, match="cannot close") as info:
        envs.close()
    assert isinstance(info.value, EnvError) and info.value.command == "close"
    assert info.value.env_index == 2 and "env 2" in str(info.value)
    assert envs.closed


@pytest.mark.timeout(60)
def test_state_misuse_raises_gymnasiums_errors() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f32")] * 2, num_workers=2)
    try:
        envs.reset(seed=0)
        with pytest.raises(NoAsyncCallError):
            envs.step_wait()
        envs.step_async(envs.action_space.sample())
        with pytest.raises(AlreadyPendingCallError):
            envs.reset_async()
        with pytest.raises(AlreadyPendingCallError):
            envs.call_async("get_t")
        envs.step_wait()
        with pytest.raises(NoAsyncCallError):
            envs.call_wait()
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_parent_env_errors_look_like_worker_env_errors() -> None:
    envs = SubprocVectorEnv(crash_fns(3, 2, "raise"), num_workers=1, parent_envs=1)
    try:
        envs.reset(seed=0)
        with pytest.raises(KeyError) as info:
            envs.step(envs.action_space.sample())
        err = info.value
        assert isinstance(err, EnvError) and err.env_index == 2 and err.worker_pid == os.getpid()
        assert isinstance(err.__cause__, RemoteTraceback) and "_misbehave" in err.__cause__.text
        envs.reset(seed=1)  # still usable
    finally:
        envs.close()

    def broken() -> Any:
        raise OSError(5, "no simulator here")

    with pytest.raises(OSError) as info2:
        SubprocVectorEnv([make_zoo("box_f32"), broken], parent_envs=1)
    assert isinstance(info2.value, EnvError) and info2.value.env_index == 1


def _interrupted(step_seconds: float, then: str) -> dict[str, Any]:
    """tests/scripts/interrupted.py in its own session, so that its Ctrl-C (SIGINT to its
    process group, as a terminal sends it) reaches only it and its workers."""
    env = child_env()
    script = Path(__file__).resolve().parent / "scripts" / "interrupted.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(step_seconds), then],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
def test_after_ctrl_c_in_a_30_s_step_the_next_call_says_what_it_waits_for_and_close_is_prompt() -> (
    None
):
    report = _interrupted(30.0, "stop")  # Ctrl-C again 2 s into the next call's wait
    assert report["step"] == "interrupted" and report["step_s"] < 5
    assert report["next"] == "interrupted" and report["next_s"] < 10
    ((at, message),) = report["notices"]  # close() waits a second at most, silently
    assert at < 5  # a second, on a quiet machine
    assert "`call` waits for worker 0 (pid" in message and "worker 1 (pid" in message
    assert "step interrupted" in message and "Ctrl-C again to stop waiting" in message
    assert report["close_s"] < 10  # not the 28 s the step still had to run
    assert report["left"] == []


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
def test_after_ctrl_c_the_next_call_waits_for_the_interrupted_step_then_runs() -> None:
    report = _interrupted(3.0, "wait")
    assert report["step"] == "interrupted" and report["next"] == "returned"
    ((at, message),) = report["notices"]
    assert at < report["next_s"] and "to finish the step interrupted" in message
    assert report["marker"] == ["after", "after"]
    # The interrupted step ran in the envs (their state moved on); only its results were
    # dropped: the next step is their second.
    assert report["t_before_step"] == [1, 1] and report["t_after_step"] == [2, 2]
    assert report["close_s"] < 5 and report["left"] == []
