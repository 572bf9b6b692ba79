"""Failure checks written once, bound to each backend by the test modules.

Each ``check_*`` takes ``make(env_fns, **kwargs) -> VectorEnv``, which must put four envs on
two units of two envs each (a worker process, a Ray actor), and, where a unit is lost, a
``kill(envs, unit)`` that kills unit ``unit`` and returns once it is gone, and ``unit_pids(envs)``,
each unit's pid in unit order. tests/test_failures.py binds them to the process backend (and
the env errors to the in-process one), tests/test_ray.py to Ray, each adding what only its
backend has (signals, nodes, hangs).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from subvec import BrokenVectorEnvError, EnvError, SubvecError, WorkerDiedError
from subvec.errors import RemoteTraceback
from tests.envs import ZooEnv, crash_fns, make_zoo
from tests.helpers import assert_same

Make = Callable[..., Any]
Kill = Callable[[Any, int], None]
UnitPids = Callable[[Any], list[int]]
#: the pid an env's error names (its worker's; the parent's for envs run in-process)
EnvPid = Callable[[Any, int], int]

ACTIONS = np.zeros(4, dtype=np.int64)


def endless() -> gym.Env[Any, Any]:
    return ZooEnv(max_steps=10**6, terminate_prob=0.0)


# --- an env raises ----------------------------------------------------------------------------


def check_env_error_in_step(make: Make, env_pid: EnvPid) -> None:
    """An env's exception in ``step`` keeps its type, names the env (not its unit's first),
    the command and the process, carries the remote traceback, and leaves the env usable."""
    with make(crash_fns(4, 3, "raise")) as envs:
        envs.reset(seed=0)
        with pytest.raises(KeyError) as info:
            envs.step(ACTIONS)
        err = info.value
        assert isinstance(err, EnvError) and isinstance(err, SubvecError)
        assert err.env_index == 3 and err.command == "step"
        assert err.worker_pid == env_pid(envs, 3)
        assert "env 3" in str(err) and f"pid {err.worker_pid}" in str(err) and "boom" in str(err)
        assert isinstance(err.__cause__, RemoteTraceback)
        assert "_misbehave" in err.__cause__.text and "KeyError" in err.__cause__.text
        envs.reset(seed=1)
        envs.step(ACTIONS)


def check_env_errors_leave_the_other_envs_stepped(make: Make) -> None:
    """Envs 0 and 2 (the first of each unit) raise in the same step: every other env still
    steps (a unit's error does not end its step), ``step`` raises env 0's error with a note
    naming env 2's, and the next step runs every env again."""
    fns = crash_fns(4, 0, "raise")
    fns[2] = fns[0]
    with make(fns) as envs:
        envs.reset(seed=0)
        with pytest.raises(KeyError) as info:
            envs.step(ACTIONS)
        err = info.value
        assert err.env_index == 0
        assert any("env 2: KeyError" in note for note in getattr(err, "__notes__", ()))
        assert list(envs.get_attr("t")) == [1, 1, 1, 1]
        envs.step(ACTIONS)
        assert list(envs.get_attr("t")) == [2, 2, 2, 2]


def check_chunk_env_errors_leave_the_other_envs_running(make: Make) -> None:
    """Envs 0 and 2 (the first of each unit) raise at the first sub-step of a chunk: every
    other env runs its whole chunk, as in ``step()``; ``step_chunk`` raises env 0's error,
    naming the command and the sub-step, with a note naming env 2's, and the next chunk runs
    every env again."""
    fns = crash_fns(4, 0, "raise")
    fns[2] = fns[0]
    chunk = np.zeros((4, 3), dtype=np.int64)
    with make(fns) as envs:
        envs.reset(seed=0)
        with pytest.raises(KeyError) as info:
            envs.step_chunk(chunk)
        err = info.value
        assert err.env_index == 0 and err.command == "step_chunk"
        notes = "".join(getattr(err, "__notes__", ()))
        assert "raised at sub-step 0 of an action chunk of 3" in notes
        assert "env 2: KeyError" in notes
        assert list(envs.get_attr("t")) == [1, 3, 1, 3]
        _, rewards, *_, infos = envs.step_chunk(chunk)
        assert rewards.shape == (4, 3) and infos["chunk_steps"].tolist() == [3, 3, 3, 3]
        assert list(envs.get_attr("t")) == [4, 6, 4, 6]


def check_env_error_in_reset_and_call(make: Make, *, one_unit: bool = False) -> None:
    """Errors in ``reset`` and ``call`` name the env and the command; when envs of several
    units raise, one exception (the lowest env's) and the others in a note (``one_unit``:
    every env in one unit, which stops at its first failing env: no note)."""
    with make(crash_fns(4, 1, "raise_on_reset")) as envs:
        with pytest.raises(ValueError, match="bad reset option") as info:
            envs.reset(options={"explode": True})
        assert isinstance(info.value, EnvError) and info.value.env_index == 1
        assert info.value.command == "reset"
        with pytest.raises(AttributeError) as info2:
            envs.call("no_such_method")
        assert isinstance(info2.value, EnvError) and info2.value.env_index == 0
        if sys.version_info >= (3, 11) and not one_unit:
            notes = info2.value.__notes__
            assert any("1 more env(s)" in note and "env 2" in note for note in notes), notes
        assert envs.reset(seed=0)[0].shape == (4, 3)


def check_factory_error(make: Make) -> None:
    """A factory that raises fails the construction with its error, type and errno kept,
    naming the env (the callers' leak checks see that nothing is left running)."""

    def broken() -> Any:
        raise OSError(28, "no space left for the simulator")

    with pytest.raises(OSError, match="no space left") as info:
        make([make_zoo("box_f32")] * 3 + [broken])
    assert isinstance(info.value, EnvError) and info.value.env_index == 3
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "no space left" in info.value.__cause__.text
    assert info.value.errno == 28 and info.value.command == "make"


# --- a unit dies --------------------------------------------------------------------------------


def check_lost_unit_raises_and_reset_rebuilds_it(
    make: Make, kill: Kill, unit_pids: UnitPids
) -> WorkerDiedError:
    """``on_worker_failure="raise"``: a unit lost while idle is reported by the next call
    naming its envs, every call then raises broken, and ``reset()`` rebuilds that unit (a new
    process, not a restart) and gives what a fresh vector env gives. Returns the error."""
    reference = gym.vector.SyncVectorEnv([endless] * 4)
    try:
        with make([endless] * 4, on_worker_failure="raise") as envs:
            envs.reset(seed=0)
            envs.step(ACTIONS)
            old = unit_pids(envs)
            kill(envs, 1)
            with pytest.raises(WorkerDiedError, match=r"reset\(\) rebuilds") as info:
                envs.step(ACTIONS)
            assert info.value.env_indices == (2, 3)
            with pytest.raises(BrokenVectorEnvError):
                envs.get_attr("t")
            assert_same(envs.reset(seed=7), reference.reset(seed=7), "the reset that rebuilt")
            for k in range(2):
                assert_same(envs.step(ACTIONS), reference.step(ACTIONS), f"step {k}")
            assert envs.restarts == []  # not restarts: max_restarts is untouched
            assert [r.env_indices for r in envs.rebuilds] == [(2, 3)]
            new = unit_pids(envs)
            assert new[0] == old[0] and new[1] != old[1]
            return info.value
    finally:
        reference.close()


def check_lost_unit_is_restarted(make: Make, kill: Kill, unit_pids: UnitPids) -> None:
    """``on_worker_failure="restart"``: the next step replaces a lost unit, reports its envs
    truncated with zero reward and ``worker_restarted``, records the restart, and the new
    envs start afresh while the others carry on."""
    with make([endless] * 4, on_worker_failure="restart") as envs:
        envs.reset(seed=0)
        envs.step(ACTIONS)
        old = unit_pids(envs)
        kill(envs, 0)
        _, rewards, terminated, truncated, infos = envs.step(ACTIONS)
        assert list(truncated) == [True, True, False, False] and not terminated.any()
        assert list(rewards[:2]) == [0.0, 0.0]
        assert list(infos["_worker_restarted"]) == [True, True, False, False]
        assert len(envs.restarts) == 1 and envs.restarts[0].env_indices == (0, 1)
        new = unit_pids(envs)
        assert new[0] != old[0] and new[1] == old[1]
        assert envs.get_attr("t") == (0, 0, 2, 2)
        infos = envs.step(ACTIONS)[4]
        assert "worker_restarted" not in infos
        assert envs.get_attr("t") == (1, 1, 3, 3)
