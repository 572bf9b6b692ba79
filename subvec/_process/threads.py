"""Thread caps inside a worker process: BLAS, OpenMP and torch pools of ``worker_threads``.

Every numeric library starts a pool of one thread per CPU by default; with one worker per CPU
that is CPUs x CPUs threads fighting for the CPUs. A worker caps them in three ways, because
no single one reaches every pool:

- the environment variables the libraries read when they load (:data:`THREAD_VARIABLES`),
  set in the worker before it unpickles the env factories, so that what the factories import
  (torch, MKL, numexpr) starts capped. The parent's environment is not touched;
- the BLAS already loaded: numpy is imported before any of our code runs in the worker (the
  forkserver preloads it, a spawn child imports it to unpickle our entry point), so its
  OpenBLAS read the variables long ago. threadpoolctl caps it when it is installed; otherwise
  the ``*openblas_set_num_threads*`` function of each loaded OpenBLAS is called through ctypes
  (:func:`cap_loaded_blas`; the libraries are found in ``/proc/self/maps``, so on Linux only).
  Setting it starts OpenBLAS's pool if it was not running: one thread stays parked;
- torch, when the envs imported it: ``torch.set_num_threads`` after the envs are built
  (:func:`cap_torch`), since torch may already have sized its pool.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

__all__ = ["THREAD_VARIABLES", "cap_environment", "cap_loaded_blas", "cap_torch", "check_threads"]

#: The environment variables that size the usual thread pools when their library loads.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
)

#: The names OpenBLAS builds export their thread setter under (plain, 64-bit-int suffixed,
#: and the ``scipy_openblas`` prefix that numpy's and scipy's wheels use).
_OPENBLAS_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
)


def check_threads(worker_threads: Any) -> int | None:
    """``worker_threads`` checked: a positive int, or None (leave the pools alone).

    Raises:
        TypeError: not an int or None.
        ValueError: an int below 1.
    """
    if worker_threads is None:
        return None
    if isinstance(worker_threads, bool) or not isinstance(worker_threads, int):
        raise TypeError(
            f"worker_threads must be a positive int or None (leave the worker's thread pools "
            f"as the libraries size them), got {worker_threads!r}"
        )
    if worker_threads < 1:
        raise ValueError(
            f"worker_threads must be at least 1 (threads per pool in each worker) or None, "
            f"got {worker_threads}"
        )
    return worker_threads


def cap_environment(threads: int) -> None:
    """Set every :data:`THREAD_VARIABLES` to ``threads`` in this (worker) process."""
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)


def _loaded_libraries() -> list[str]:
    """Paths of the shared libraries mapped into this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line or ".dylib" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def cap_loaded_blas(threads: int) -> list[str]:
    """Cap the BLAS libraries already loaded in this process to ``threads`` threads.

    Returns:
        What was capped: ``["threadpoolctl"]`` or the OpenBLAS paths set through ctypes.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:
        threadpool_limits(limits=threads)
        return ["threadpoolctl"]
    capped = []
    for path in _loaded_libraries():
        if "openblas" not in os.path.basename(path).lower():
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue  # not loadable by name after all: leave it as it is
        for name in _OPENBLAS_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter.restype = None
                setter(threads)
                capped.append(path)
                break
    return capped


def cap_torch(threads: int) -> None:
    """``torch.set_num_threads(threads)`` (and the inter-op pool where torch still allows it),
    when torch is imported in this process."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass  # already used once (an env ran a parallel op at build time): fixed from then on
