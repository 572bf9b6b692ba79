"""The default layout on a busy machine: the probe of the CPUs other work keeps busy, and the
plan made for the free ones (decision 0057)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import psutil
import pytest

from subvec import SubprocVectorEnv
from subvec._process.busy import busy_cpus
from subvec._process.plan import plan_layout
from subvec._process.topology import usable_cpus
from tests.helpers import wait_until


@pytest.mark.parametrize(
    ("cpus", "busy", "workers", "partner", "spin", "planned"),
    [
        (2, 0, 2, 0, (0.0, 300.0), 2),  # quiet: a worker per CPU, worker 0 the partner
        (2, 1, 1, 0, (0.0,), 1),  # one CPU free: one worker, the parent's partner
        (16, 4, 12, 0, (0.0,) + (300.0,) * 11, 12),  # twelve free: twelve workers
        (2, 2, 2, None, (0.0, 0.0), 2),  # none free: a worker per CPU, nobody spinning
        (2, 5, 2, None, (0.0, 0.0), 2),
    ],
)
def test_the_default_plans_for_the_cpus_other_work_leaves(
    cpus: int,
    busy: int,
    workers: int,
    partner: int | None,
    spin: tuple[float, ...],
    planned: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SUBVEC_WAKE", "pipes")
    layout = plan_layout(16, cpus=cpus, busy=busy)
    assert layout.num_workers == workers
    assert layout.partner == partner
    assert layout.worker_spin_us == spin and layout.parent_spin_us == 0.0
    assert layout.planned_cpus == planned and layout.busy_cpus == busy
    # the same plan as a quiet machine with that many CPUs (and, with none free, spin_us=0)
    quiet = plan_layout(16, cpus=planned, spin_us=0.0 if busy >= cpus else None)
    assert layout.bounds == quiet.bounds and layout.worker_spin_us == quiet.worker_spin_us


@pytest.mark.parametrize(
    "options", [{"num_workers": 2}, {"envs_per_worker": 8}, {"spin_us": 300.0}, {"spin_us": 0}]
)
def test_a_layout_option_keeps_the_quiet_plan(
    options: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUBVEC_WAKE", "pipes")
    layout = plan_layout(16, cpus=2, busy=1, **options)  # type: ignore[arg-type]
    quiet = plan_layout(16, cpus=2, **options)  # type: ignore[arg-type]
    assert layout.bounds == quiet.bounds and layout.worker_spin_us == quiet.worker_spin_us
    assert layout.planned_cpus == 2 and layout.busy_cpus == 1


def test_the_probe_reads_the_runnable_count_less_itself(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    machine = os.cpu_count() or 1
    loadavg.write_text("3.10 2.00 1.50 3/412 98765\n")
    # two other runnable tasks, on this process's share of the machine's CPUs
    assert busy_cpus(machine, str(loadavg)) == min(machine, 2)
    if machine >= 2:
        half = machine // 2
        assert busy_cpus(half, str(loadavg)) == min(half, round(2 * half / machine))
    loadavg.write_text("0.00 0.00 0.00 1/300 4\n")  # only the reader runs
    assert busy_cpus(machine, str(loadavg)) == 0
    loadavg.write_text("garbled\n")
    assert busy_cpus(machine, str(loadavg)) == 0
    assert busy_cpus(machine, str(tmp_path / "missing")) == 0


@pytest.fixture
def busy_loop() -> Iterator[psutil.Process]:
    """One CPU-bound process beside the test: a stand-in learner."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loop = psutil.Process(proc.pid)
        assert wait_until(lambda: sum(loop.cpu_times()[:2]) > 0.05, 10.0)
        yield loop
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/loadavg is Linux's")
def test_a_vector_env_built_beside_a_busy_loop_plans_around_it(
    busy_loop: psutil.Process, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpus = usable_cpus()
    if cpus != os.cpu_count():
        pytest.skip("the probe scales by this process's share of the machine: use all CPUs")
    monkeypatch.setattr("subvec.vector.busy_cpus", busy_cpus)  # the real probe
    envs = SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    try:
        layout = envs.layout
        assert layout.busy_cpus >= 1  # the loop is runnable whenever the probe reads
        free = cpus - layout.busy_cpus
        assert layout.planned_cpus == (free if free > 0 else cpus)
        assert envs.num_workers == min(4, layout.planned_cpus)
        if free <= 0:
            assert envs.spin_us == 0
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
    finally:
        envs.close()
