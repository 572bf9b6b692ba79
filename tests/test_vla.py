"""What robot-learning rollouts ask of a vector env (tests/vla_checks.py), on the process and
in-process backends (tests/test_ray.py binds the same checks to Ray)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

from subvec import SubprocVectorEnv
from subvec._inproc import InProcessVectorEnv
from tests import vla_checks as checks

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


def test_timeouts_per_command() -> None:
    checks.check_timeouts_per_command(two_workers)


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_hung_reset_step_and_chunk_follow_the_failure_policy(policy: str) -> None:
    checks.check_hung_reset_step_and_chunk(two_workers, policy)


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
