"""Helpers shared by the test modules: comparisons, bounded waits on processes, and the
environment of a child interpreter."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout first on ``PYTHONPATH`` (and ``extra``
    set): a child interpreter imports this checkout's subvec and tests package, and keeps
    whatever this one reaches through ``PYTHONPATH`` (dependencies installed that way)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def load_script(name: str, path: Path) -> ModuleType:
    """Import the script at ``path`` as module ``name`` (once: later calls get the same one)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def assert_same(a: Any, b: Any, where: str = "value") -> None:
    """Recursive equality that also demands equal types, dtypes, shapes and bytes."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), (where, type(a), type(b))
        assert a.dtype == b.dtype, (where, a.dtype, b.dtype)
        assert a.shape == b.shape, (where, a.shape, b.shape)
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a.ravel(), b.ravel())):
                assert_same(x, y, f"{where}[{i}]")
        else:
            assert a.tobytes() == b.tobytes(), (where, a, b)
        return
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), (where, list(a), list(b))
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif hasattr(a, "nodes") and hasattr(a, "edges"):  # GraphInstance
        for name in ("nodes", "edges", "edge_links"):
            assert_same(getattr(a, name), getattr(b, name), f"{where}.{name}")
    else:
        assert a == b, (where, a, b)


def gone(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        # A killed process's first thread can be a zombie while another thread is still
        # exiting; until it has, its parent cannot wait for it (nor see it dead).
        return proc.status() == psutil.STATUS_ZOMBIE and proc.num_threads() <= 1
    except psutil.NoSuchProcess:
        return True


def wait_until(predicate: Any, bound: float) -> bool:
    """Poll ``predicate`` until true or ``bound`` seconds pass (a bound, not a sleep-race)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())
