"""Worker placement wired into SubprocVectorEnv, with an injected two-node topology that maps
onto this machine's CPUs (node 0 = CPU 0, node 1 = CPU 1)."""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import psutil
import pytest
from gymnasium import spaces

from subvec import SubprocVectorEnv
from subvec._compat import AutoresetMode
from tests.envs import ZooEnv, make_zoo
from tests.oracle import offered_modes
from tests.test_conformance import run_side_by_side

pytestmark = pytest.mark.skipif(
    not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1 available"
)
TWO_NODES = {0: [0], 1: [1]}


def thread_affinities(pid: int) -> dict[int, set[int]]:
    return {t.id: os.sched_getaffinity(t.id) for t in psutil.Process(pid).threads()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("context", ["forkserver", "spawn"])
def test_workers_are_pinned_round_robin_with_every_thread(context: str) -> None:
    envs = SubprocVectorEnv(
        [make_zoo("box_f32")] * 4, num_workers=4, numa=TWO_NODES, context=context
    )
    try:
        assert [r.node for r in envs.placement] == [0, 1, 0, 1]
        for report, cpus in zip(envs.placement, [{0}, {1}, {0}, {1}]):
            assert set(report.cpus) == cpus
            assert os.sched_getaffinity(report.pid) == cpus
            threads = thread_affinities(report.pid)
            assert len(threads) >= 2  # the main thread and the parent-watch thread at least
            assert all(affinity == cpus for affinity in threads.values()), threads
        assert "nodes=[0, 1, 0, 1]" in repr(envs)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_no_placement_leaves_workers_unpinned() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f32")] * 2, num_workers=2, numa=None)
    try:
        allowed = os.sched_getaffinity(0)
        assert all(os.sched_getaffinity(r.pid) == allowed for r in envs.placement)
        assert all(r.node is None for r in envs.placement)
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", offered_modes(), ids=lambda m: m.value)
def test_placement_never_changes_results(mode: AutoresetMode) -> None:
    fns = [make_zoo("dict_nest") for _ in range(5)]
    run_side_by_side(fns, mode, num_workers=3, numa=TWO_NODES)


def resident_pages(array: np.ndarray) -> list[bool]:
    """mincore(2) over the pages that hold ``array``: which are backed by memory."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = array.ctypes.data - array.ctypes.data % page
    length = array.ctypes.data + array.nbytes - start
    count = -(-length // page)
    vec = (ctypes.c_ubyte * count)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return [bool(b & 1) for b in vec]


@pytest.mark.timeout(60)
def test_parent_never_touches_observation_pages_first() -> None:
    # 4 envs x 64 KiB observations: 16 pages per env, so each worker owns whole pages.
    big = spaces.Box(0, 255, shape=(128, 128, 4), dtype=np.uint8)
    envs = SubprocVectorEnv([lambda: ZooEnv(big)] * 4, num_workers=2, numa=TWO_NODES, copy=False)
    try:
        obs_region = envs._obs.observations
        assert not any(resident_pages(obs_region)), "obs pages exist before any worker wrote"
        envs.reset(seed=0)
        assert all(resident_pages(obs_region)), "workers wrote every row on reset"
    finally:
        del obs_region
        envs.close()
