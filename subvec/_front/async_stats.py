"""What bounds an asynchronous loop: the envs, or the consumer (the policy) between them.

The async engine tells an :class:`AsyncRecorder` three things as they happen: envs' results
got ready (a unit answered), a ``recv`` returned some envs, envs were sent new work. From those
it keeps, over a window that ``reset`` restarts, the counts and times that say who waits on
whom: the share of wall time the consumer spent inside ``recv`` waiting for envs, and the share
of env time the envs spent with a result ready (or returned) that the consumer had not yet
answered with new work. :meth:`AsyncRecorder.snapshot` reads them at any time, also while envs
are in flight, as an :class:`AsyncStats`.

Each event costs a clock read and a few list operations per env (about 1-2 us a recv of a
few envs: decision 0050), so the recorder is always on.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["AsyncRecorder", "AsyncStats"]

#: how many of the latest samples the percentiles are taken over
SAMPLES = 4096
#: what ``advice`` asks of both the consumer's and the envs' waits before it suggests stages:
#: this share of the time (the shares of a loop that takes turns add up to about 1, so below
#: it overlapping them gains at most about 1 / 0.85 = 1.18x), and this long per ``recv``
#: (shorter waits are mostly the hand-off itself, which stages add to: on a 2-vCPU VM, two
#: stages lost to lock-step with 0.6 ms waits and gained 1.17-1.35x with 1.7 ms and more;
#: docs/async.md)
OVERLAP_SHARE = 0.15
OVERLAP_WAIT_S = 1e-3


def _percentile(samples: deque[float], q: float) -> float | None:
    return float(np.percentile(np.fromiter(samples, float), q)) if samples else None


@dataclass(frozen=True)
class AsyncStats:
    """A window of asynchronous stepping, read by ``envs.async_stats()``.

    Times are seconds. A percentile is None when the window holds no sample of it.
    """

    #: seconds since the window began
    wall_s: float
    #: ``recv``/``poll`` calls that returned, and those that returned at least one env
    recv_calls: int
    batches: int
    #: envs returned in all; their mean per returned batch
    envs_returned: int
    mean_batch: float
    #: envs returned over the most the calls could have returned (their ``max_envs``)
    fill_ratio: float
    #: the share of returned batches smaller than their ``max_envs``
    partial_share: float
    #: from an env's result arriving in the parent to ``recv`` returning it (queueing)
    queue_p50_s: float | None
    queue_p95_s: float | None
    #: from a ``recv`` returning to the next ``send`` (the consumer's time: the policy)
    policy_p50_s: float | None
    policy_p95_s: float | None
    #: the share of wall time the consumer spent inside ``recv``/``poll``, waiting on envs
    consumer_waiting: float
    #: the share of env time the envs spent waiting on the consumer: from their result
    #: arriving to their next ``send``
    envs_waiting: float

    @property
    def overlap_bound(self) -> float:
        """The most two stages could gain over this loop, if it takes turns (the envs step,
        then the policy runs): its round is the envs' time plus the policy's, and overlapped
        the longer of the two, ``1 / max(consumer_waiting, envs_waiting)``, at most 2."""
        return min(2.0, 1.0 / max(self.consumer_waiting, self.envs_waiting, 0.5))

    @property
    def advice(self) -> str:
        """What this window suggests trying ("" before any ``recv``): two stages when the
        consumer and the envs each wait :data:`OVERLAP_SHARE` of the time or more and
        :data:`OVERLAP_WAIT_S` per ``recv`` (they take turns), else what bounds the loop and
        the knob that moves it."""
        if not self.recv_calls:
            return ""
        cw, ew = self.consumer_waiting, self.envs_waiting
        per_recv = self.wall_s / self.recv_calls
        if min(cw, ew) >= OVERLAP_SHARE and min(cw, ew) * per_recv >= OVERLAP_WAIT_S:
            return (
                f"the envs and the policy take turns (consumer waiting {cw:.0%}, envs "
                f"{ew:.0%}): two stages overlap them (groups = env_groups(2); for each group, "
                f"recv(env_ids=group), then send or send_chunk to it), at most "
                f"{self.overlap_bound:.1f}x"
            )
        if cw >= ew:
            return (
                "env-bound: the envs are the limit (more CPUs or workers for them); a "
                "smaller min_envs lets the policy start on what is ready"
            )
        if self.fill_ratio < 0.5:
            return (
                f"policy-bound with batches {self.fill_ratio:.0%} full: a larger min_envs "
                "(or a deadline) gives each forward pass more envs"
            )
        return "policy-bound: the envs wait on the policy; only a faster policy helps"

    @property
    def verdict(self) -> str:
        """``"env-bound"`` when the consumer waits on the envs more than they wait on it,
        ``"policy-bound"`` the other way round, ``"no data"`` before any ``recv``."""
        if not self.recv_calls:
            return "no data"
        return "env-bound" if self.consumer_waiting >= self.envs_waiting else "policy-bound"

    def __str__(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1e3:.2f} ms"

        return (
            f"{self.verdict}: consumer waiting {self.consumer_waiting:.0%} of the time, envs "
            f"waiting {self.envs_waiting:.0%}; {self.batches} batches of {self.mean_batch:.1f} "
            f"envs (fill {self.fill_ratio:.0%}, {self.partial_share:.0%} partial); queueing "
            f"p50 {ms(self.queue_p50_s)} p95 {ms(self.queue_p95_s)}; policy p50 "
            f"{ms(self.policy_p50_s)} p95 {ms(self.policy_p95_s)}; over {self.wall_s:.1f} s"
        )


class AsyncRecorder:
    """The async engine's record of one window (the engine is its one writer).

    Plain lists and deques, not numpy: a recv's few envs cost less in Python than the calls
    into numpy would.

    Args:
        num_envs: the vector env's envs.
    """

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        #: when each env's latest result arrived (``perf_counter``; -1: none since its send)
        self._ready_at = [-1.0] * num_envs
        self.reset()

    def reset(self) -> None:
        """Start a new window (what is in flight stays in flight)."""
        self._start = time.perf_counter()
        self._recv_calls = self._batches = self._envs = self._partial = self._max_sum = 0
        self._recv_s = self._env_wait_s = 0.0
        self._last_recv_end = -1.0
        self._queue: deque[float] = deque(maxlen=SAMPLES)
        self._policy: deque[float] = deque(maxlen=SAMPLES)

    def ready(self, envs: list[int]) -> None:
        """The results of ``envs`` arrived (a unit answered)."""
        now = time.perf_counter()
        ready_at = self._ready_at
        for env in envs:
            ready_at[env] = now

    def returned(self, ids: list[int], max_envs: int, began: float) -> None:
        """A ``recv`` that began at ``began`` (``perf_counter``) returned ``ids``, of at most
        ``max_envs``."""
        now = time.perf_counter()
        self._recv_calls += 1
        self._recv_s += now - max(began, self._start)
        self._last_recv_end = now
        if ids:
            k = len(ids)
            self._batches += 1
            self._envs += k
            self._max_sum += max_envs
            self._partial += k < max_envs
            ready_at = self._ready_at
            self._queue.extend(now - ready_at[e] for e in ids if ready_at[e] >= 0)

    def sent(self, ids: list[int]) -> None:
        """``ids`` were sent new work (a ``send`` or an ``async_reset``)."""
        now = time.perf_counter()
        ready_at, start = self._ready_at, self._start
        waited = 0.0
        for env in ids:
            at = ready_at[env]
            if at >= 0:
                waited += now - (at if at > start else start)
                ready_at[env] = -1.0
        self._env_wait_s += waited
        if self._last_recv_end >= 0:
            self._policy.append(now - self._last_recv_end)
            self._last_recv_end = -1.0

    def snapshot(self) -> AsyncStats:
        """The window so far."""
        now = time.perf_counter()
        wall = max(now - self._start, 1e-9)
        batches = self._batches
        start = self._start
        # the envs whose result still waits for their send count up to now
        env_wait = self._env_wait_s + sum(now - max(at, start) for at in self._ready_at if at >= 0)
        return AsyncStats(
            wall_s=wall,
            recv_calls=self._recv_calls,
            batches=batches,
            envs_returned=self._envs,
            mean_batch=self._envs / batches if batches else 0.0,
            fill_ratio=self._envs / self._max_sum if self._max_sum else 0.0,
            partial_share=self._partial / batches if batches else 0.0,
            queue_p50_s=_percentile(self._queue, 50),
            queue_p95_s=_percentile(self._queue, 95),
            policy_p50_s=_percentile(self._policy, 50),
            policy_p95_s=_percentile(self._policy, 95),
            consumer_waiting=min(1.0, self._recv_s / wall),
            envs_waiting=min(1.0, env_wait / (wall * self.num_envs)),
        )
