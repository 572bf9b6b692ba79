"""How workers build their envs: a few at a time (``max_concurrent_starts``) and again after a
failure (``build_retries``).

**Tokens.** Simulators that start together can fail or thrash (EGL context storms, an Isaac Sim
taking gigabytes and minutes each). A :class:`StartGate` holds ``limit`` tokens; a worker holds
one while it unpickles and builds its envs, and again while it serves its first ``reset``
(where some simulators load), then gives it back. A token is a POSIX record lock on byte
``k`` of an anonymous file the parent creates: the kernel drops a process's record locks when
it exits, however it exits, so a worker killed while building (a crash, a ``timeout`` restart
that kills it) never takes its token with it. A waiting worker tries every byte without
blocking, then sleeps a little (1 ms, doubling up to 20 ms): starts last seconds, so the
polling costs nothing that shows, and no token is ever held by a process waiting for the
parent (the parent gathers handshakes while the workers build, and sends the first reset
only after every handshake), so the tokens cannot deadlock.

The file has no name (``tempfile.TemporaryFile``): nothing is left on disk, whatever happens
to the parent. Its descriptor reaches a worker as a pipe's does (``multiprocessing``'s
``DupFd``), inherited under fork.

**Reconfigure.** ``reconfigure()`` builds new envs inside live workers the same way (a token,
the retries), beside the old ones, and swaps them in only once every unit built and checked
its own (:func:`reconfigure_slab`).

**Retries.** With ``build_retries=n`` a factory that raises is called again in the same worker,
up to ``n`` more times, after 0.1 s, 0.2 s, ... (at most 2 s); each failed attempt is recorded
(:class:`BuildFailure`) and reported with the worker's handshake. When every attempt fails,
the last error is raised as any factory error (its type kept, the env index named), with a
note listing the attempts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import reduction
from typing import TYPE_CHECKING, Any

import cloudpickle

from subvec.errors import add_note

if TYPE_CHECKING:
    from subvec._commands import ReconfigurePayload
    from subvec._slab import EnvSlab

__all__ = [
    "BUILD_BACKOFF_S",
    "BuildFailure",
    "StartGate",
    "build_env",
    "check_build_retries",
    "check_max_concurrent_starts",
]

#: The first wait between two attempts of a failing factory (doubled each time, at most 2 s).
BUILD_BACKOFF_S = 0.1
_BUILD_BACKOFF_MAX_S = 2.0
#: How long a worker waiting for a token sleeps between two looks (doubled up to the max).
_POLL_S = 0.001
_POLL_MAX_S = 0.02


def check_max_concurrent_starts(value: Any) -> int | None:
    """``max_concurrent_starts`` checked: a positive int or None (no limit).

    Raises:
        TypeError, ValueError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"max_concurrent_starts must be a positive int or None (no limit), got {value!r}"
        )
    if value < 1:
        raise ValueError(f"max_concurrent_starts must be >= 1 (or None: no limit), got {value}")
    return value


def check_build_retries(value: Any) -> int:
    """``build_retries`` checked: an int >= 0.

    Raises:
        TypeError, ValueError: anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"build_retries must be an int >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"build_retries must be >= 0 (0: no retry), got {value}")
    return value


def _rebuild_gate(limit: int, dup: Any) -> StartGate:
    return StartGate(limit, fd=dup.detach())


class StartGate:
    """``limit`` start tokens shared by the parent's workers (see the module docstring).

    Args:
        limit: how many workers may build at once.
        fd: the token file's descriptor (given when rebuilt in a worker); None: create one.
    """

    def __init__(self, limit: int, fd: int | None = None) -> None:
        self.limit = limit
        self._file: Any = None
        if fd is None:
            # Kept open for the vector env's life (closed by close()), not for a with block.
            self._file = tempfile.TemporaryFile(prefix="subvec-starts-")  # noqa: SIM115
            fd = self._file.fileno()
        self.fd: int = fd

    def __reduce__(self) -> tuple[Any, ...]:
        # Sent to a spawn or forkserver child as its pipes are: the descriptor is duplicated
        # into it while it starts.
        return (_rebuild_gate, (self.limit, reduction.DupFd(self.fd)))

    def try_take(self) -> int | None:
        """Take a free token without waiting: its number, or None when all are held."""
        for slot in range(self.limit):
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    continue  # held by another worker
                raise
            return slot
        return None

    def give_back(self, slot: int) -> None:
        """Release token ``slot`` (taken by this process)."""
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, slot)

    @contextlib.contextmanager
    def token(self) -> Iterator[int]:
        """Hold a token for the ``with`` block, waiting for one to be free."""
        pause = _POLL_S
        while (slot := self.try_take()) is None:
            time.sleep(pause)
            pause = min(2 * pause, _POLL_MAX_S)
        try:
            yield slot
        finally:
            self.give_back(slot)

    def close(self) -> None:
        """Close the parent's file (the workers' copies go with them)."""
        if self._file is not None:
            self._file.close()
            self._file = None


@contextlib.contextmanager
def maybe_token(gate: StartGate | None) -> Iterator[None]:
    """A token of ``gate`` for the ``with`` block; nothing without a gate."""
    if gate is None:
        yield
        return
    with gate.token():
        yield


@dataclass(frozen=True)
class BuildFailure:
    """One failed attempt of an env factory that was then tried again (``build_retries``).

    Attributes:
        env_index: the env the factory builds.
        attempt: which attempt failed (1 for the first).
        error: ``"TypeName: message"`` of what it raised.
        pid: the worker process it ran in.
        time: when it failed (``time.monotonic``; the same clock in every process of a
            machine).
        worker: the worker's index (set by the parent when it receives the record).
    """

    env_index: int
    attempt: int
    error: str
    pid: int
    time: float
    worker: int | None = None


def build_env(
    fn: Callable[[], Any],
    env_index: int,
    retries: int,
    failures: list[BuildFailure],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """``fn()``, tried up to ``1 + retries`` times; each failure but the last is appended to
    ``failures`` and followed by a pause (``BUILD_BACKOFF_S``, doubling, at most 2 s).

    Raises:
        Exception: the last attempt's own error, with a note listing the earlier attempts.
    """
    for attempt in range(1, retries + 2):
        try:
            return fn()
        except Exception as exc:
            if attempt > retries:
                if retries:
                    tried = "; ".join(
                        f"attempt {f.attempt}: {f.error}"
                        for f in failures
                        if f.env_index == env_index
                    )
                    add_note(
                        exc,
                        f"env {env_index}: every one of {retries + 1} attempts failed "
                        f"(build_retries={retries}); earlier: {tried}",
                    )
                raise
            error = f"{type(exc).__name__}: {exc}"
            failures.append(BuildFailure(env_index, attempt, error, os.getpid(), time.monotonic()))
            sleep(min(BUILD_BACKOFF_S * 2 ** (attempt - 1), _BUILD_BACKOFF_MAX_S))
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def reconfigure_slab(
    slab: EnvSlab,
    payload: ReconfigurePayload,
    gate: StartGate | None,
    retries: int,
    failures: list[BuildFailure],
) -> None:
    """Run a RECONFIGURE on ``slab``: build the new envs (holding a start token of ``gate``,
    each factory tried ``1 + retries`` times) and stage them beside the old ones (their
    spaces checked), or commit or drop the staged ones. The slab's ``current`` names the env
    a failure is about.

    Raises:
        Exception: a factory's own error (the envs built so far are closed) or the stage's
            space mismatch; the old envs stay.
    """
    if payload.factories is None:
        if payload.commit:
            slab.commit()
        else:
            slab.abort()
        return
    new: list[Any] = []
    try:
        with maybe_token(gate):
            for local, blob in zip(payload.envs, payload.factories):
                slab.current = local
                fn = cloudpickle.loads(blob)
                new.append(build_env(fn, slab.first_index + local, retries, failures))
    except BaseException:
        for env in new:
            try:
                env.close()
            except Exception:
                pass  # the build's error is the one to report
        raise
    slab.stage(payload.envs, new)
