"""What runs inside the workers: thread caps (``worker_threads``), ``stats()`` and
``subvec tune``."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError

from subvec import SubprocVectorEnv, make_vec
from subvec._process.threads import THREAD_VARIABLES
from subvec.cli import main
from tests.envs import CrashEnv, MatmulEnv, ZooEnv

pytestmark = pytest.mark.timeout(90)


def _worker_threads(use_torch: bool, **kw: Any) -> tuple[dict[str, Any], ...]:
    fns = [functools.partial(MatmulEnv, 64, use_torch)] * 2
    with SubprocVectorEnv(fns, **kw) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        return envs.call("threads")


@pytest.mark.parametrize("use_torch", [False, True], ids=["numpy", "numpy+torch"])
def test_worker_threads_caps_every_pool_in_the_worker_only(use_torch: bool) -> None:
    if use_torch:
        pytest.importorskip("torch")
    parent_environ = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    torch = sys.modules.get("torch")
    parent_threads = None if torch is None else torch.get_num_threads()
    for report in _worker_threads(use_torch):  # worker_threads=1 is the default
        assert report["environ"] == dict.fromkeys(THREAD_VARIABLES, "1")
        # numpy's OpenBLAS was loaded before the worker ran (forkserver preload): capped by
        # call, so a burst of big matmuls runs on the main thread alone
        assert report["busy_threads"] == 1, report
        if use_torch:
            assert report["torch"] == 1
            assert report["torch_interop"] == 1
    # the parent's environment and torch settings are untouched
    assert {name: os.environ.get(name) for name in THREAD_VARIABLES} == parent_environ
    if torch is not None:
        assert torch.get_num_threads() == parent_threads


def test_worker_threads_none_leaves_the_pools_alone() -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("BLAS starts no second thread on one CPU")
    for report in _worker_threads(False, worker_threads=None):
        assert report["environ"] == {name: os.environ.get(name) for name in THREAD_VARIABLES}
        assert report["busy_threads"] >= 2, report


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (0, ValueError, "worker_threads must be at least 1"),
        (-2, ValueError, "worker_threads must be at least 1"),
        (1.0, TypeError, "worker_threads must be a positive int or None"),
        ("1", TypeError, "worker_threads must be a positive int or None"),
        (True, TypeError, "worker_threads must be a positive int or None"),
    ],
)
def test_bad_worker_threads(value: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SubprocVectorEnv([ZooEnv], worker_threads=value)


def test_stats_count_each_workers_steps_time_and_memory() -> None:
    fns = [functools.partial(ZooEnv, step_seconds=0.002, terminate_prob=0.0)] * 3
    with SubprocVectorEnv(fns, num_workers=2, timeout=20) as envs:
        envs.reset(seed=0)
        for _ in range(10):
            envs.step(envs.action_space.sample())
        stats = envs.stats()
        assert [s.worker for s in stats] == [0, 1]
        assert [s.env_indices for s in stats] == [tuple(r) for r in envs.worker_envs]
        assert [s.pid for s in stats] == list(envs.worker_pids)
        assert [s.steps for s in stats] == [10 * len(r) for r in envs.worker_envs]
        for s in stats:
            # 2 ms a step: at least that much time stepping, and the rest waiting
            assert s.stepping_s >= 0.002 * s.steps * 0.9
            assert s.waiting_s > 0.0
            assert s.restarts == 0 and s.recycles == 0
            # read in the parent: a Python with numpy and gymnasium loaded
            assert s.rss is not None and 10 * 2**20 < s.rss < 2**31
        later = envs.stats()  # counting goes on; the stats round trip is not a step
        assert [s.steps for s in later] == [s.steps for s in stats]
        assert all(b.waiting_s >= a.waiting_s for a, b in zip(stats, later))
        envs.step_async(envs.action_space.sample())
        with pytest.raises(AlreadyPendingCallError):
            envs.stats()
        envs.step_wait()
    with pytest.raises(ClosedEnvironmentError):
        envs.stats()


def test_stats_count_restarts_and_start_again_in_the_replacement() -> None:
    fns = [
        functools.partial(CrashEnv, "exit", at_step=3, max_steps=10**6, terminate_prob=0.0),
        functools.partial(ZooEnv, max_steps=10**6, terminate_prob=0.0),
    ]
    with SubprocVectorEnv(fns, on_worker_failure="restart", timeout=20) as envs:
        envs.reset(seed=0)
        for _ in range(5):
            envs.step(envs.action_space.sample())
        stats = envs.stats()
    assert [s.restarts for s in stats] == [1, 0]
    assert stats[1].steps == 5
    assert stats[0].steps == 2  # the replacement's: the two steps after the restart


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_tune_tries_layouts_and_names_the_best(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", "CartPole-v1", "-n", "2", "--duration", "0.05", "--warmup", "0.01"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| envs per worker |" in out
    rows = [
        line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")
    ]
    assert len(rows) == 4  # 1 and 2 envs per worker, spin default and off
    best = next(line for line in out.splitlines() if line.startswith("best: "))
    assert best.startswith("best: SubprocVectorEnv(..., envs_per_worker=")
    assert "None" not in best and best.endswith("env-steps/s")


def test_the_command_line_says_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    import subvec

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"subvec {subvec.__version__}"


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_make_vec_and_the_sb3_face_pass_worker_threads_on() -> None:
    with make_vec(functools.partial(MatmulEnv, 8), 1, worker_threads=2) as envs:
        assert envs.worker_threads == 2
        assert envs.call("threads")[0]["environ"]["OMP_NUM_THREADS"] == "2"
    sb3 = pytest.importorskip("subvec.sb3")
    venv = sb3.SubprocVecEnv([functools.partial(MatmulEnv, 8)], worker_threads=3)
    try:
        assert venv.env_method("threads")[0]["environ"]["MKL_NUM_THREADS"] == "3"
    finally:
        venv.close()
