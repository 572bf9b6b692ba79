"""Per-worker statistics: what ``SubprocVectorEnv.stats()`` returns.

The counters come from the workers (``_process.wire.WorkerCounters``: env steps, seconds handling
commands, seconds waiting for them); the resident memory is read here in the parent with
psutil, which is optional: without it ``rss`` is None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from subvec._backend import RestartRecord
from subvec._process.wire import WorkerCounters

__all__ = ["WorkerStats", "process_rss", "worker_stats"]


@dataclass(frozen=True)
class WorkerStats:
    """One worker's activity since its process started (a replacement starts from zero).

    Attributes:
        worker: the worker's index.
        env_indices: the envs it runs.
        pid: its process id.
        steps: env steps it has made (autoreset steps included).
        stepping_s: seconds it spent handling commands (the envs' ``step``/``reset`` and the
            few microseconds around them).
        waiting_s: seconds it spent waiting for the parent's next command.
        restarts: how often this worker was replaced after a failure
            (``on_worker_failure="restart"``).
        recycles: how often it was replaced by recycling (``recycle_every``/``worker_max_rss``).
        rss: its resident memory in bytes (None without psutil, or if it could not be read).
        failed_builds: failed attempts of its env factories that were tried again
            (``build_retries``), over its replacements too.
    """

    worker: int
    env_indices: tuple[int, ...]
    pid: int | None
    steps: int
    stepping_s: float
    waiting_s: float
    restarts: int
    recycles: int
    rss: int | None
    failed_builds: int = 0


def process_rss(pid: int | None) -> int | None:
    """The resident memory of process ``pid`` in bytes; None without psutil or the process."""
    if pid is None:
        return None
    try:
        import psutil
    except ImportError:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return None


def worker_stats(
    workers: Sequence[Any],
    counters: Mapping[int, WorkerCounters],
    restarts: Sequence[RestartRecord],
    recycles: Sequence[RestartRecord],
    build_failures: Sequence[Any] = (),
) -> list[WorkerStats]:
    """The :class:`WorkerStats` of ``workers`` (``_process.pool_workers.Worker``) from their
    ``counters`` (``build_failures``: ``_process.starts.BuildFailure`` records)."""
    out = []
    for w in workers:
        c = counters[w.index]
        out.append(
            WorkerStats(
                worker=w.index,
                env_indices=tuple(range(w.lo, w.hi)),
                pid=w.pid,
                steps=c.env_steps,
                stepping_s=c.busy_s,
                waiting_s=c.waiting_s,
                restarts=sum(1 for r in restarts if r.worker == w.index),
                recycles=sum(1 for r in recycles if r.worker == w.index),
                rss=process_rss(w.pid),
                failed_builds=sum(1 for f in build_failures if f.worker == w.index),
            )
        )
    return out
