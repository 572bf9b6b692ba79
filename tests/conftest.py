"""Every test is checked for leaked child processes and shared-memory segments."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from subvec._shm import SEGMENT_PREFIX, list_segments

# Long-lived helpers that multiprocessing starts once per interpreter, not per vector env.
_SINGLETONS = ("forkserver", "resource_tracker")


def _children() -> dict[int, str]:
    out = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
            if proc.status() == psutil.STATUS_ZOMBIE:
                cmdline += " <zombie>"
        except psutil.Error:
            continue
        if not any(s in cmdline for s in _SINGLETONS):
            out[proc.pid] = cmdline
    return out


def _foreign(segment: str) -> bool:
    """A segment made by a live process outside this test run (another test run or a benchmark
    on the same machine shares /dev/shm); a dead creator's segment is never foreign."""
    try:
        pid = int(segment[len(SEGMENT_PREFIX) :].split("_", 1)[0])
    except ValueError:
        return False
    if pid == os.getpid() or not psutil.pid_exists(pid):
        return False
    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    return pid not in ours


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail the test if it leaves a child process or a /dev/shm/subvec_* segment behind."""
    before_children = set(_children())
    before_segments = set(list_segments())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = {p: c for p, c in _children().items() if p not in before_children}
        segments = {s for s in set(list_segments()) - before_segments if not _foreign(s)}
        if (not leaked and not segments) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # a killed worker may take a moment to be reaped by its parent
    assert not leaked, f"child processes outlived the test: {leaked}"
    assert not segments, f"shared-memory segments outlived the test: {segments}"


@pytest.fixture
def fd_count():
    return lambda: len(os.listdir("/proc/self/fd"))
