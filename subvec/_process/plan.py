"""Planning a process layout: how many workers, which envs each runs, who spins, who partners.

A pure function of the arguments and the usable CPUs (passed in, so tests need no processes and
no patched machine facts). The vector env plans once, at construction; see docs/design.md
("Layout and waiting") for why the spin and partner rules are what they are.
"""

from __future__ import annotations

import multiprocessing
import select
import sys
from dataclasses import dataclass
from multiprocessing.context import BaseContext

import numpy as np

from subvec._process import wake as _wake

__all__ = [
    "DEFAULT_SPIN_US",
    "Layout",
    "check_max_concurrency",
    "plan_layout",
    "resolve_context",
    "split",
]

#: Busy-poll window (microseconds) before blocking, used by processes that own a CPU. On a
#: 2-vCPU VM a blocking wake-up costs tens of microseconds, more than a cheap env's step; the
#: window must outlast the other side's turn (the parent's own envs with parent_envs):
#: 50 us measured too short there (docs/decisions/0005-adaptive-spin-window.md).
DEFAULT_SPIN_US = 300.0


@dataclass(frozen=True)
class Layout:
    """Where the envs run and how each process waits.

    Attributes:
        bounds: ``(first, one past the last)`` env index of each worker, in worker order.
        parent_envs: how many envs (the last ones) the parent steps itself.
        worker_spin_us: per worker, the busy-poll window for its next command (0: none).
        parent_spin_us: the parent's busy-poll window for replies (0: it blocks at once).
        partner: the worker that shares the parent's CPU and never spins, if any.
        late_spin_us: with a partner, the parent's busy-poll window for the other workers'
            replies once the partner has answered (0: it blocks). The parent's CPU has
            nothing else to run then (the partner sleeps until its next command), while a
            parent asleep there is woken from the other worker's CPU, which on a VM can
            cost more than a cheap env's step.
        max_active: the most workers commanded to step or reset at once (``max_concurrency``
            below the number of workers), or None: every worker at once.
    """

    bounds: tuple[tuple[int, int], ...]
    parent_envs: int
    worker_spin_us: tuple[float, ...]
    parent_spin_us: float
    partner: int | None
    max_active: int | None = None
    late_spin_us: float = 0.0
    #: how the parent wakes the workers and learns of their answers: ``"futex"`` (one system
    #: call per command for the whole pool) or ``"pipes"`` (a write and a read per worker);
    #: see ``subvec._process.wake``
    wake: str = _wake.PIPES
    #: the CPUs the plan was made for: the usable ones, less those other work kept busy when
    #: at least one was left free and no layout option was given (decision 0057); with none
    #: left free, the usable ones with every spin window 0
    planned_cpus: int = 1
    #: how many of the usable CPUs other work kept busy when the plan was made
    busy_cpus: int = 0

    @property
    def num_workers(self) -> int:
        return len(self.bounds)


def split(num_envs: int, num_workers: int, extra_last: bool = False) -> list[tuple[int, int]]:
    """Consecutive env ranges, as even as possible; the remainder goes to the first workers,
    or with ``extra_last`` to the last ones (worker 0 as the parent's partner also carries the
    parent's own work on its CPU)."""
    base, extra = divmod(num_envs, num_workers)
    bounds, lo = [], 0
    for w in range(num_workers):
        gets_extra = w >= num_workers - extra if extra_last else w < extra
        hi = lo + base + (1 if gets_extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _num_workers(
    n: int,
    num_workers: int | None,
    envs_per_worker: int | None,
    cpus: int,
    parent_envs: int,
    max_concurrency: int | None,
) -> int:
    if num_workers is not None and envs_per_worker is not None:
        raise ValueError(
            "give num_workers or envs_per_worker, not both "
            f"(got num_workers={num_workers}, envs_per_worker={envs_per_worker})"
        )
    if num_workers is not None:
        if not isinstance(num_workers, (int, np.integer)) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        if num_workers > n:
            raise ValueError(
                f"num_workers={num_workers} exceeds num_envs={n}: each worker needs an env"
            )
        return int(num_workers)
    if envs_per_worker is not None:
        if not isinstance(envs_per_worker, (int, np.integer)) or envs_per_worker < 1:
            raise ValueError(f"envs_per_worker must be a positive int, got {envs_per_worker!r}")
        return -(-n // int(envs_per_worker))
    # The parent stepping envs itself is a process at work too: leave it a CPU. No more
    # workers than may step at once: each steps its envs one after the other, so that many
    # workers honour max_concurrency with no waiting at all.
    limit = n if max_concurrency is None else min(n, max_concurrency)
    return max(1, min(limit, cpus - (1 if parent_envs else 0)))


def check_max_concurrency(max_concurrency: object) -> int | None:
    """``max_concurrency`` as gymnasium's AsyncVectorEnv checks it.

    Raises:
        ValueError: neither None nor a positive int.
    """
    if max_concurrency is None:
        return None
    if not isinstance(max_concurrency, (int, np.integer)):
        raise ValueError(
            f"`max_concurrency` must be an integer or None, got {type(max_concurrency)}."
        )
    if max_concurrency < 1:
        raise ValueError(
            f"`max_concurrency` must be a positive integer or None, got {max_concurrency}."
        )
    return int(max_concurrency)


def _spin(
    n: int, spin_us: float | None, cpus: int, parent_envs: int, first_ready: bool = False
) -> tuple[tuple[float, ...], float, int | None]:
    """Per-worker spin, parent spin, and the partner worker (if any).

    A spinner that owns its CPU spares a sleep and a wake-up, which on a VM costs more than a
    cheap env's step; one that shares its CPU steals time from a process at work. So:

    - every worker and the parent have a CPU each (``n + 1 <= cpus``): all spin;
    - only the workers do (``n == cpus``): the parent shares a CPU with one of them. Worker 0
      becomes its *partner*: it never spins, so the moment it has replied it sleeps and the
      parent has the CPU, and the parent sleeps until the partner replies, so the partner has
      the CPU meanwhile: two context switches on one CPU per step, no cross-CPU wake-up. The
      other workers spin; the parent doesn't (with ``parent_envs`` there is no partner: the
      parent is busy stepping its own envs, so the workers spin). With ``first_ready``
      (asynchronous stepping planned: ``batch_size`` below ``num_envs``) nobody spins and
      there is no partner: a first-ready ``recv`` wakes at the first answers, so a worker
      that gets the CPU whenever the parent sleeps, or one that spins while another sleeps,
      answers first and has its envs served more often than the others' (identical envs
      were served 2:1); workers that all wait alike are served alike;
    - more workers than CPUs: nobody spins.
    """
    if spin_us is not None:
        if spin_us < 0:
            raise ValueError(f"spin_us must be >= 0 (0 disables spinning), got {spin_us!r}")
        return (float(spin_us),) * n, float(spin_us), None
    if n + 1 <= cpus:
        return (DEFAULT_SPIN_US,) * n, DEFAULT_SPIN_US, None
    if n > cpus:
        return (0.0,) * n, 0.0, None
    if parent_envs:
        return (DEFAULT_SPIN_US,) * n, 0.0, None
    if first_ready:
        return (0.0,) * n, 0.0, None
    return (0.0,) + (DEFAULT_SPIN_US,) * (n - 1), 0.0, 0


def plan_layout(
    num_envs: int,
    *,
    cpus: int,
    parent_envs: int = 0,
    num_workers: int | None = None,
    envs_per_worker: int | None = None,
    spin_us: float | None = None,
    max_concurrency: int | None = None,
    wake: str | None = None,
    first_ready: bool = False,
    busy: int = 0,
) -> Layout:
    """Plan the workers for ``num_envs`` envs on ``cpus`` usable CPUs.

    Args:
        num_envs: envs in the vector env.
        cpus: usable CPUs (affinity and CPU quota counted; see ``_process.topology.usable_cpus``).
        parent_envs: envs (the last ones) the parent steps itself, in [0, num_envs - 1].
        num_workers: worker processes; default ``min(envs in workers, cpus)``.
        envs_per_worker: alternatively, envs per worker.
        spin_us: one busy-poll window for every process; None picks per process.
        max_concurrency: the most envs that may be in ``step`` or ``reset`` at once. By
            default there are no more workers than that; with more workers (given by
            ``num_workers`` or ``envs_per_worker``), ``max_active`` says how many may work at
            once, and then nobody spins and there is no partner (a worker may wait for its
            turn, and the parent for several turns).
        wake: ``"futex"`` or ``"pipes"``; None: by ``_process.wake.choose`` (the futex from
            ``_process.wake.MIN_WORKERS`` workers where it works, and without turns).
        first_ready: the envs will mostly step asynchronously, ``recv`` returning the
            first ready (``batch_size`` below ``num_envs``): every worker waits alike, so
            that identical envs are served alike (see ``_spin``).
        busy: how many of the ``cpus`` other work keeps busy (``_process.busy.busy_cpus``).
            Where none of ``num_workers``, ``envs_per_worker`` and ``spin_us`` is given: with
            at least one CPU left free, the plan is made for the free CPUs only; with none,
            it keeps the quiet machine's workers and nobody spins (decision 0057).

    Returns:
        The :class:`Layout`.

    Raises:
        ValueError: a count out of range, both ``num_workers`` and ``envs_per_worker``, or
            ``max_concurrency`` with ``parent_envs`` (the parent's own envs step alongside
            the workers, outside any limit).
    """
    max_concurrency = check_max_concurrency(max_concurrency)
    if max_concurrency is not None and parent_envs:
        raise ValueError(
            f"max_concurrency={max_concurrency} limits how many workers step at once, but "
            f"parent_envs={parent_envs} envs step in the parent alongside them; pass one of "
            "the two"
        )
    if not isinstance(parent_envs, (int, np.integer)) or not 0 <= parent_envs < num_envs:
        raise ValueError(
            f"parent_envs must be an int in [0, num_envs - 1] = [0, {num_envs - 1}] "
            f"(at least one env runs in a worker), got {parent_envs!r}"
        )
    in_workers = num_envs - int(parent_envs)
    planned = cpus
    if busy > 0 and num_workers is None and envs_per_worker is None and spin_us is None:
        # A busy machine (decision 0057): a worker or a spinner on a CPU another process
        # wants takes time from both. With a CPU left free, plan for the free ones; with
        # none, the quiet plan's workers (heavy envs win CPU share with them), none spinning.
        if busy < cpus:
            planned = cpus - busy
        else:
            spin_us = 0.0
    n = _num_workers(
        in_workers, num_workers, envs_per_worker, planned, int(parent_envs), max_concurrency
    )
    max_active = max_concurrency if max_concurrency is not None and max_concurrency < n else None
    if max_active is None:
        worker_spin, parent_spin, partner = _spin(
            n, spin_us, planned, int(parent_envs), first_ready
        )
    else:
        # Turns: a worker waits for its turn and the parent for several; nobody spins unless
        # told to, and no worker partners the parent (it would not always reply last).
        worker_spin, parent_spin, partner = _spin(n, spin_us if spin_us else 0.0, planned, 0)
    if wake is None:
        wake = _wake.choose(n, max_active)
    elif wake not in (_wake.FUTEX, _wake.PIPES):
        raise ValueError(f"wake must be {_wake.FUTEX!r} or {_wake.PIPES!r}, got {wake!r}")
    if wake == _wake.FUTEX:
        # The futex protocol has no partner: nobody is woken by a pipe, and the parent sleeps
        # on the countdown, not on one worker's reply.
        partner = None
    return Layout(
        bounds=tuple(split(in_workers, n, extra_last=partner is not None)),
        parent_envs=int(parent_envs),
        worker_spin_us=worker_spin,
        parent_spin_us=parent_spin,
        partner=partner,
        max_active=max_active,
        late_spin_us=DEFAULT_SPIN_US if partner is not None else 0.0,
        wake=wake,
        planned_cpus=planned,
        busy_cpus=busy,
    )


def check_platform(platform: str | None = None, has_poll: bool | None = None) -> None:
    """Refuse a platform the process backend cannot run on, saying why.

    The parent and the workers frame messages on the raw file descriptors of their pipes
    (``os.read``/``os.write``) and wait on them with ``select.poll``. On Windows the pipes of
    multiprocessing are named-pipe handles, not file descriptors, and ``select.poll`` does not
    exist. Linux is tested; macOS has both, and its other differences (spawn by default, no
    CPU affinity, no ``/dev/shm`` or sysfs) are guarded where they are used.

    Args:
        platform: ``sys.platform`` (default: this one's).
        has_poll: whether ``select.poll`` exists (default: this interpreter's).

    Raises:
        NotImplementedError: on Windows or without ``select.poll``.
    """
    platform = sys.platform if platform is None else platform
    has_poll = hasattr(select, "poll") if has_poll is None else has_poll
    if platform == "win32" or not has_poll:
        raise NotImplementedError(
            f"subvec's process backend does not run on {platform}: its workers exchange "
            "frames over raw pipe file descriptors and wait with select.poll"
            + (", and Windows has neither" if platform == "win32" else ", which is missing")
            + ". Use gymnasium.vector.AsyncVectorEnv there (or WSL); Linux is tested, macOS "
            "is meant to work"
        )


def _default_start_method() -> str:
    # forkserver: safe when the parent already runs threads (torch, BLAS); fork would copy
    # their locks mid-flight. Elsewhere spawn, the platform's own default.
    return "forkserver" if sys.platform == "linux" else "spawn"


def resolve_context(context: str | BaseContext | None) -> BaseContext:
    """The multiprocessing context for ``context`` (None: forkserver on Linux, else spawn)."""
    if isinstance(context, BaseContext):
        ctx = context
    else:
        ctx = multiprocessing.get_context(context or _default_start_method())
    if ctx.get_start_method() == "forkserver":
        # Preloading makes each new worker a cheap fork of a server that already imported
        # numpy and gymnasium (0.37 s instead of 2.7 s for 8 CartPole workers). It only takes
        # effect if the server is not running yet.
        ctx.set_forkserver_preload(["numpy", "gymnasium", "subvec._process.worker"])
    return ctx
