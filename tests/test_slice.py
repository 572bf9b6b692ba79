"""The parent's short scheduler slice (``parent_slice_us``, decision 0062): taken by the thread
that builds the vector env, never by the workers, given back at close.

Each test runs its vector envs in a thread of its own, so that the test process's main thread
keeps its slice whatever happens.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest

from subvec import SubprocVectorEnv
from subvec._process.slice import set_thread_slice, thread_slice


def in_thread(body: Callable[[], Any]) -> Any:
    """Run ``body`` in a new thread and return what it returned (re-raising what it raised)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = body()
        except BaseException as exc:  # handed to the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _kernel_takes_slices() -> bool:
    def probe() -> bool:
        return set_thread_slice(300) and thread_slice() == 300_000

    return bool(in_thread(probe))


needs_slices = pytest.mark.skipif(
    not _kernel_takes_slices(), reason="the kernel has no custom slices (Linux 6.12+)"
)


def cartpoles(n: int, **kwargs: Any) -> SubprocVectorEnv:
    return SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * n, **kwargs)


@needs_slices
@pytest.mark.timeout(60)
@pytest.mark.parametrize("context", ["forkserver", "fork"])
def test_the_building_thread_takes_the_slice_and_the_workers_keep_the_default(
    context: str,
) -> None:
    def body() -> tuple[int | None, ...]:
        default = thread_slice()
        with cartpoles(4, num_workers=2, context=context) as envs:
            envs.reset(seed=0)
            envs.step(envs.action_space.sample())
            during = thread_slice()
            workers = [thread_slice(pid) for pid in envs.worker_pids]
            taken = envs.parent_slice
        return default, during, taken, *workers, thread_slice()

    default, during, taken, worker_a, worker_b, after = in_thread(body)
    assert default != 100_000
    assert (during, taken) == (100_000, 100)
    # a forked worker inherited the short slice and gave it up; a fork server's never had it
    assert worker_a == worker_b == default
    assert after == default


@needs_slices
@pytest.mark.timeout(60)
def test_the_last_vector_env_of_a_thread_gives_the_slice_back() -> None:
    def body() -> list[int | None]:
        seen = [thread_slice()]
        first = cartpoles(2)
        second = cartpoles(2, parent_slice_us=100)
        first.close()
        seen.append(thread_slice())  # the second still holds it
        second.close()
        seen.append(thread_slice())
        third = cartpoles(2)
        del third  # never closed: the finalizer gives it back
        gc.collect()
        seen.append(thread_slice())
        return seen

    default, one_left, none_left, collected = in_thread(body)
    assert one_left == 100_000
    assert none_left == collected == default


@needs_slices
@pytest.mark.timeout(60)
def test_none_leaves_the_thread_alone() -> None:
    def body() -> tuple[int | None, int | None, int | None]:
        assert set_thread_slice(2000)
        with cartpoles(2, parent_slice_us=None) as envs:
            during = thread_slice()
            taken = envs.parent_slice
        return during, taken, thread_slice()

    assert in_thread(body) == (2_000_000, None, 2_000_000)


@needs_slices
def test_the_slice_keeps_the_threads_nice_value() -> None:
    def body() -> tuple[int, int | None]:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, 5)  # on Linux, the nice value of this thread
        assert set_thread_slice(100)
        return os.getpriority(os.PRIO_PROCESS, tid), thread_slice()

    assert in_thread(body) == (5, 100_000)


@pytest.mark.parametrize("value", [0, 50, 100_001, 1.5, True, "100"])
def test_bad_values_are_refused_before_any_worker_starts(value: object) -> None:
    with pytest.raises(ValueError, match=r"parent_slice_us must be None or an int in \[100, "):
        SubprocVectorEnv([lambda: gym.make("CartPole-v1")], parent_slice_us=value)  # type: ignore[arg-type]


def test_a_misspelt_option_names_it() -> None:
    with pytest.raises(TypeError, match="parent_slice_us"):
        SubprocVectorEnv([lambda: gym.make("CartPole-v1")], parent_slice=100)  # type: ignore[call-arg]
