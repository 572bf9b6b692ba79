"""Every test is checked for leaked child processes and shared-memory segments.

``vectoriser``: the conformance axis (tests/vectorisers.py); a test that takes it runs once per
entry of VECTORISERS that needs no Ray, or over a subset given with ``parametrize(...,
indirect=["vectoriser"])`` (the Ray entries: in tests/test_ray.py, whose module starts Ray).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psutil
import pytest

from subvec._process.shm import list_segments
from tests.vectorisers import (
    NEEDS_RAY,
    VECTORISERS,
    VectorFactory,
    check_built_as_asked,
    make_vector_env,
)

# Long-lived helpers that multiprocessing starts once per interpreter, not per vector env.
_SINGLETONS = ("forkserver", "resource_tracker")
#: Ray's pooled idle workers: its raylet starts and retires them on its own schedule, so a test
#: marked ``ray`` does not count them (its actors, named ``ray::EnvActor``, and their workers
#: still count; tests/test_ray.py also checks actors and placement groups through Ray itself).
_RAY_POOL = frozenset({"ray::IDLE"})


def _children(ignore: frozenset[str] = frozenset()) -> dict[int, str]:
    out = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
            if proc.status() == psutil.STATUS_ZOMBIE:
                cmdline += " <zombie>"
        except psutil.Error:
            continue
        if not any(s in cmdline for s in _SINGLETONS) and cmdline.strip() not in ignore:
            out[proc.pid] = cmdline
    return out


@pytest.fixture(autouse=True, scope="session")
def sigint_as_in_a_terminal() -> Iterator[None]:
    """Ctrl-C as in a terminal, however the suite was started: a background job of a
    non-interactive shell (``pytest &``, some CI runners) starts with SIGINT ignored, which the
    scripts it runs inherit, and the Ctrl-C tests would wait for an interrupt that never comes."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True, scope="session")
def sb3_logs_under_pytest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """SB3 makes a log folder in the system's temporary folder for every model built without
    one (``SB3-<date>``) and never removes it: the suite's (and its scripts') go under pytest's
    own temporary folder instead."""
    patch = pytest.MonkeyPatch()
    patch.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan every vector env as on a quiet machine: what a test asserts of a layout must not
    depend on what else runs beside the suite (tests/test_busy.py reads the real probe)."""
    monkeypatch.setattr("subvec.vector.busy_cpus", lambda cpus: 0)


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest):
    """Fail the test if it leaves a child process or a /dev/shm/subvec_* segment behind. Ray's
    services (started by a module fixture, before this) are there before the test already."""
    ignore = _RAY_POOL if request.node.get_closest_marker("ray") else frozenset()
    before_children = set(_children(ignore))
    before_segments = set(list_segments())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = {p: c for p, c in _children(ignore).items() if p not in before_children}
        segments = {n for n in set(list_segments()) - before_segments if _ours(n)}
        if (not leaked and not segments) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # a killed worker may take a moment to be reaped by its parent
    assert not leaked, f"child processes outlived the test: {leaked}"
    assert not segments, f"shared-memory segments outlived the test: {_describe(segments)}"


def _ours(segment: str) -> bool:
    """Created by this test process or one of its descendants, or by a process now dead.

    Segments of unrelated live processes (another test run on the same machine) are not ours.
    """
    try:
        pid = int(segment.split("_")[1])
        proc = psutil.Process(pid)
    except (ValueError, IndexError):
        return False
    except psutil.NoSuchProcess:
        return True
    me = os.getpid()
    try:
        return pid == me or any(p.pid == me for p in proc.parents())
    except psutil.Error:
        return True


def _describe(segments: set[str]) -> list[str]:
    """Name each leaked segment's creator and whether it still runs (to debug a leak)."""
    out = []
    for name in sorted(segments):
        pid = int(name.split("_")[1])
        try:
            proc = psutil.Process(pid)
            who = f"{proc.status()} {' '.join(proc.cmdline())[:120]}"
        except psutil.Error:
            who = "creator gone"
        out.append(f"{name} (creator pid {pid}: {who}; test pid {os.getpid()})")
    return out


@pytest.fixture
def fd_count():
    return lambda: len(os.listdir("/proc/self/fd"))


@pytest.fixture(params=[name for name in VECTORISERS if name not in NEEDS_RAY])
def vectoriser(request: pytest.FixtureRequest) -> VectorFactory:
    """``make(env_fns, **kwargs) -> VectorEnv`` with one entry of VECTORISERS, which also checks
    that the entry's settings took effect."""
    name: str = request.param

    def make(env_fns: Sequence[Callable[[], Any]], **kwargs: Any) -> Any:
        envs = make_vector_env(name, env_fns, **kwargs)
        try:
            check_built_as_asked(name, envs)
        except BaseException:
            envs.close()
            raise
        return envs

    return make


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for a module (torch imported here, only where it is used): on two
    cores, torch's intra-op threads would fight the worker processes for them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say, under pytest's "N deselected", how to run the slow tests it left out."""
    deselected = len(terminalreporter.stats.get("deselected", []))
    config = terminalreporter.config
    if (
        deselected
        and config.getoption("markexpr") == "not slow"
        and not config.getoption("keyword")
    ):
        terminalreporter.write_line(
            f"{deselected} slow tests (the long conformance cases) were left out, as by default: "
            "`python -m pytest -m slow` runs them, `-m 'slow or not slow'` runs everything."
        )
