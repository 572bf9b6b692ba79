"""Start-up under load: ``max_concurrent_starts`` (measured from inside the env constructors and
first resets), start tokens that a dying worker cannot keep, and ``build_retries``."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pytest

from subvec import EnvError, SubprocVectorEnv, WorkerDiedError, make_vec
from subvec._process.starts import StartGate, build_env
from tests.helpers import wait_until
from tests.start_envs import SimulatorStartError, StartRecorder

BUILD_S = 0.25


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals open at one moment (an end before a start at the same instant)."""
    events = sorted(e for lo, hi in intervals for e in ((lo, 1), (hi, -1)))
    most = open_now = 0
    for _, step in events:
        open_now += step
        most = max(most, open_now)
    return most


def start_intervals(envs: SubprocVectorEnv) -> list[tuple[float, float]]:
    """Each env's construction and first reset, as recorded inside the workers."""
    built = list(envs.get_attr("built"))
    first = [r for r in envs.get_attr("first_reset") if r is not None]
    return built + first


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("limit", "expected"), [(None, 4), (2, 2)])
def test_max_concurrent_starts_bounds_builds_and_first_resets(
    limit: int | None, expected: int
) -> None:
    fn = functools.partial(StartRecorder, build_s=BUILD_S, reset_s=BUILD_S)
    envs = SubprocVectorEnv([fn] * 4, num_workers=4, max_concurrent_starts=limit)
    try:
        envs.reset(seed=0)
        overlap = max_overlap(start_intervals(envs))
        if limit is None:
            # Unbounded, the four builds overlap (the measurement sees concurrency when there
            # is some): they are started together and each sleeps BUILD_S.
            assert overlap > 2
        else:
            assert overlap <= expected
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_max_concurrent_starts_bounds_a_rebuild_with_the_others() -> None:
    # A broken vector env rebuilds its dead workers in reset(): those builds and their first
    # resets take tokens too, so with one token the two rebuilds never overlap.
    fn = functools.partial(StartRecorder, build_s=0.15, reset_s=0.15)
    envs = SubprocVectorEnv([fn] * 2, num_workers=2, max_concurrent_starts=1)
    try:
        envs.reset(seed=0)
        pids = envs.worker_pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        # both seen dead by the parent before the step, so that reset() finds both dead (a
        # worker the parent still thought alive would die during the reset instead: another
        # WorkerDiedError). The process being gone is not enough: the parent learns a
        # forkserver child's exit from the fork server, a moment later.
        workers = envs._pool.workers
        assert wait_until(lambda: not any(w.process.is_alive() for w in workers), 10.0)
        with pytest.raises(WorkerDiedError):
            envs.step(np.zeros(2, np.int64))
        envs.reset(seed=1)
        assert len(envs.rebuilds) == 2
        assert max_overlap(start_intervals(envs)) == 1
    finally:
        envs.close()


def _hold_token_and_die(gate: StartGate, conn: Connection) -> None:
    slot = gate.try_take()
    conn.send(slot)
    conn.recv()  # wait until the parent has seen the token held
    os._exit(3)  # no release, no cleanup: as a crash


@pytest.mark.timeout(30)
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_dead_worker_does_not_keep_its_token(method: str) -> None:
    ctx = multiprocessing.get_context(method)
    gate = StartGate(1)
    here, there = ctx.Pipe()
    child = ctx.Process(target=_hold_token_and_die, args=(gate, there))
    try:
        child.start()
        assert here.recv() == 0
        assert gate.try_take() is None  # held by the child
        here.send("die")
        child.join(10)
        assert child.exitcode == 3
        slot = gate.try_take()  # the kernel dropped the dead child's lock
        assert slot == 0
        gate.give_back(slot)
    finally:
        child.join(10)
        gate.close()
        here.close()
        there.close()


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_max_concurrent_starts_is_checked(value: object) -> None:
    with pytest.raises((TypeError, ValueError), match="max_concurrent_starts"):
        SubprocVectorEnv([StartRecorder], max_concurrent_starts=value)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- build_retries


@pytest.mark.timeout(60)
def test_build_retries_recover_a_factory_that_fails_once(tmp_path: Path) -> None:
    fns = [
        functools.partial(StartRecorder, fail_marker=str(tmp_path / f"env{i}")) for i in range(3)
    ]
    envs = SubprocVectorEnv(fns, num_workers=2, build_retries=1)
    try:
        envs.reset(seed=0)
        failures = envs.build_failures
        worker_of = {env: w for w, envs_of in enumerate(envs.worker_envs) for env in envs_of}
        assert [(f.worker, f.env_index, f.attempt) for f in failures] == [
            (worker_of[env], env, 1) for env in range(3)
        ]
        assert all(f.error == "SimulatorStartError: EGL context storm" for f in failures)
        assert [f.pid for f in failures] == [envs.worker_pids[worker_of[e]] for e in range(3)]
        assert [s.failed_builds for s in envs.stats()] == [len(r) for r in envs.worker_envs]
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_build_retries_report_a_factory_that_always_fails() -> None:
    fns = [StartRecorder, functools.partial(StartRecorder, always_fail=True)]
    with pytest.raises(SimulatorStartError) as caught:
        SubprocVectorEnv(fns, num_workers=1, build_retries=2)
    error = caught.value
    assert isinstance(error, EnvError) and error.env_index == 1 and error.command == "make"
    assert "EGL device not found" in str(error)
    notes = " ".join(getattr(error, "__notes__", []))
    assert "env 1: every one of 3 attempts failed (build_retries=2)" in notes
    assert "attempt 1: SimulatorStartError: EGL device not found" in notes
    assert "attempt 2:" in notes


@pytest.mark.timeout(60)
def test_no_retry_by_default(tmp_path: Path) -> None:
    fn = functools.partial(StartRecorder, fail_marker=str(tmp_path / "env0"))
    with pytest.raises(SimulatorStartError, match="EGL context storm") as caught:
        make_vec(fn, 1)
    assert caught.value.env_index == 0  # type: ignore[attr-defined]


def test_build_env_backs_off_between_attempts() -> None:
    calls: list[int] = []
    pauses: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise OSError(f"try {len(calls)}")
        return "env"

    failures: list = []
    assert build_env(flaky, 5, 3, failures, sleep=pauses.append) == "env"
    assert pauses == [0.1, 0.2, 0.4]
    assert [(f.env_index, f.attempt, f.error) for f in failures] == [
        (5, 1, "OSError: try 1"),
        (5, 2, "OSError: try 2"),
        (5, 3, "OSError: try 3"),
    ]


@pytest.mark.parametrize("value", [-1, 1.0, None])
def test_build_retries_is_checked(value: object) -> None:
    with pytest.raises((TypeError, ValueError), match="build_retries"):
        SubprocVectorEnv([StartRecorder], build_retries=value)  # type: ignore[arg-type]
