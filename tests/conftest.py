"""Every test is checked for leaked child processes and shared-memory segments."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from subvec._shm import list_segments

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


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail the test if it leaves a child process or a /dev/shm/subvec_* segment behind."""
    before_children = set(_children())
    before_segments = set(list_segments())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = {p: c for p, c in _children().items() if p not in before_children}
        segments = set(list_segments()) - before_segments
        if (not leaked and not segments) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # a killed worker may take a moment to be reaped by its parent
    assert not leaked, f"child processes outlived the test: {leaked}"
    assert not segments, f"shared-memory segments outlived the test: {segments}"


@pytest.fixture
def fd_count():
    return lambda: len(os.listdir("/proc/self/fd"))
