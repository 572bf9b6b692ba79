"""What subvec does where Linux's calls are missing: the guards, and the reasons they give.

Only Linux runs these tests. The platforms without CPU affinity (macOS, Windows) are played by
removing ``os.sched_getaffinity``/``os.sched_setaffinity`` for the test; with ``context="fork"``
the workers inherit that, so a whole vector env runs as it would there. The spawn start method,
macOS's default, has its own entry in the conformance suite (tests/vectorisers.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from subvec import SubprocVectorEnv
from subvec._process.plan import check_platform
from subvec._process.shm import _cli as shm_cli
from subvec._process.topology import (
    allowed_cpus_now,
    apply_placement,
    can_pin,
    discover,
    plan_placement,
    usable_cpus,
)
from tests.envs import make_zoo
from tests.helpers import assert_same


def test_windows_and_a_missing_poll_are_refused_with_the_reason() -> None:
    with pytest.raises(NotImplementedError, match=r"does not run on win32.*Windows has neither"):
        check_platform("win32", True)
    with pytest.raises(NotImplementedError, match=r"select\.poll, which is missing"):
        check_platform("linux", False)
    check_platform("darwin", True)  # macOS: meant to work
    check_platform()  # this machine


@pytest.fixture
def no_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as on macOS: no CPU affinity calls."""
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.delattr(os, "sched_setaffinity")


@pytest.mark.usefixtures("no_affinity")
def test_without_cpu_affinity_every_cpu_counts_and_nothing_is_pinned(tmp_path: Path) -> None:
    cpus = tuple(range(os.cpu_count() or 1))
    assert not can_pin()
    assert allowed_cpus_now() == cpus
    assert 1 <= usable_cpus() <= len(cpus)
    # No sysfs node tree (macOS): one node of every CPU, which "auto" does not place.
    topology = discover(sysfs_root=tmp_path)
    assert topology.nodes == {0: cpus}
    assert plan_placement("auto", 2, sysfs_root=tmp_path) is None
    with pytest.warns(UserWarning, match=r"cannot pin processes \(no os.sched_setaffinity"):
        assert plan_placement(True, 2, sysfs_root=tmp_path) is None
    report = apply_placement(None)
    assert report.pid == os.getpid() and report.cpus == cpus


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_affinity")
def test_a_vector_env_runs_without_cpu_affinity() -> None:
    fns = [make_zoo("box_f32")] * 4
    with pytest.warns(UserWarning, match="the workers run unpinned"):
        envs = SubprocVectorEnv(fns, num_workers=2, context="fork", numa=True)
    oracle = SyncVectorEnv(fns)
    try:
        # The workers (forked: no affinity calls either) report every CPU, unpinned.
        cpus = tuple(range(os.cpu_count() or 1))
        assert [r.cpus for r in envs.placement] == [cpus, cpus]
        assert [r.node for r in envs.placement] == [None, None]
        assert_same(envs.reset(seed=3), oracle.reset(seed=3), "reset")
        for t in range(10):
            actions = np.array([t % 3, 1, 2, 0])
            assert_same(envs.step(actions), oracle.step(actions), f"step {t}")
    finally:
        envs.close()
        oracle.close()


def test_shm_cli_says_why_it_lists_nothing_without_dev_shm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-shm"
    assert shm_cli(argparse.Namespace(dir=str(missing), clean=True)) == 0
    out = capsys.readouterr().out
    assert f"{missing} does not exist ({sys.platform})" in out
    assert "resource tracker unlinks" in out
