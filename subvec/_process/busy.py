"""How many of the usable CPUs other work keeps busy now: the signal the default layout plans
by on a busy machine (decision 0057).

The kernel's count of runnable tasks (the fourth field of ``/proc/loadavg``, ``running/total``)
less the reader itself, the median of a few reads a millisecond apart (one read catches a
task that happens to be waking), scaled to this process's share of the machine's CPUs (tasks
on CPUs it may not use are not its business). Read once, when a vector env is built: a
learner that starts later is not seen, nor one that has stopped.
"""

from __future__ import annotations

import os
import statistics
import time

__all__ = ["busy_cpus"]

#: reads of the runnable count, and the pause between two
PROBE_READS = 8
PROBE_GAP_S = 0.001


def busy_cpus(cpus: int, path: str = "/proc/loadavg") -> int:
    """How many of ``cpus`` usable CPUs other runnable tasks keep busy, rounded, at most ``cpus``.

    Args:
        cpus: the CPUs this process may use (``topology.usable_cpus``).
        path: the file to read (a test's own).

    Returns:
        The count, 0 where the file cannot be read (not Linux): the quiet machine's plan.
    """
    counts = []
    try:
        for read in range(PROBE_READS):
            if read:
                time.sleep(PROBE_GAP_S)
            with open(path) as f:
                running = int(f.read().split()[3].split("/")[0])
            counts.append(max(0, running - 1))  # less this reader
    except (OSError, ValueError, IndexError):
        return 0
    share = cpus / (os.cpu_count() or cpus)
    return min(cpus, round(statistics.median(counts) * share))
