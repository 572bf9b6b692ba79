"""The subvec exception hierarchy.

Every error subvec raises on its own account derives from :class:`SubvecError` and mixes in the
builtin it resembles, so ``except TimeoutError`` or ``except RuntimeError`` keep working for code
written against gymnasium's ``AsyncVectorEnv``.  Exceptions raised *inside an environment* are
re-raised in the parent as instances of both their original type and :class:`EnvError` (see
``subvec._process.wire.rebuild_remote_error``).
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Sequence

__all__ = [
    "BrokenVectorEnvError",
    "EnvError",
    "LateBindingWarning",
    "MissingMainGuardError",
    "PlacementError",
    "RemoteEnvError",
    "RemoteTraceback",
    "SharedMemoryTooSmallError",
    "SubvecError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "describe_exitcode",
]


class SubvecError(Exception):
    """Base class of every error raised by subvec."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; attached as ``__cause__`` of remote errors."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text.rstrip("\n") + "\n(traceback from the worker process)"


class EnvError(SubvecError):
    """Mixin base of every exception that an environment raised in a worker process.

    A rebuilt remote exception is an instance of its original type *and* of this class. It
    carries ``env_index``, ``worker_pid``, ``command`` (``"step"``, ``"reset"``, ...) and the
    worker's ``remote_traceback`` text, which is also attached as ``__cause__``.
    """

    env_index: int | None = None
    worker_pid: int | None = None
    command: str = ""
    remote_traceback: str = ""


class RemoteEnvError(EnvError, RuntimeError):
    """Used when the original exception type cannot be rebuilt in the parent."""


class WorkerDiedError(SubvecError, RuntimeError):
    """A worker process exited while the vector env still needed it."""

    def __init__(
        self,
        message: str,
        *,
        env_indices: Sequence[int] = (),
        pid: int | None = None,
        exitcode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.env_indices = tuple(env_indices)
        self.pid = pid
        self.exitcode = exitcode


class _EnvsTimeout(SubvecError, TimeoutError):
    """A timeout that names the envs it concerns and the bound it ran past."""

    def __init__(self, message: str, *, env_indices: Sequence[int] = (), timeout: float = 0.0):
        super().__init__(message)
        self.env_indices = tuple(env_indices)
        self.timeout = timeout

    def __str__(self) -> str:
        # OSError's __str__ would format args as (errno, strerror); keep the plain message.
        return str(self.args[0]) if self.args else ""


class WorkerTimeoutError(_EnvsTimeout, multiprocessing.TimeoutError):
    """A wait ran out of time; also a ``multiprocessing.TimeoutError`` like gymnasium raises."""


class RecvTimeoutError(_EnvsTimeout):
    """``recv`` ran out of time before enough envs were ready. Nothing is lost: the envs named
    in ``env_indices`` stay in flight, and what was collected is returned by a later ``recv``."""


class PlacementError(SubvecError, RuntimeError):
    """A Ray placement group that cannot be placed: more than the cluster has, or not ready
    within ``start_timeout``. The message names what was asked and what the cluster has."""


class BrokenVectorEnvError(SubvecError, RuntimeError):
    """The vector env lost a worker and can no longer step: ``reset()`` rebuilds the failed
    workers (and resets every env), ``close()`` releases everything; any other call raises
    this."""


class MissingMainGuardError(SubvecError, RuntimeError):
    """Workers cannot start from here: this process is a spawn or forkserver child that is still
    running its parent's script on start-up (the script has no ``if __name__ == "__main__":``
    guard and starts a process of its own). The message names both fixes: the guard, or
    ``context="fork"`` for the process that runs the script again."""


class LateBindingWarning(UserWarning):
    """The env factories are one lambda made in a loop, all reading the loop variable's last
    value through one shared cell (``[lambda: gym.make(i) for i in ids]``): every env would be
    built alike. The message names the variable and the fix (``lambda i=i: ...``)."""


class SharedMemoryTooSmallError(SubvecError, OSError):
    """``/dev/shm`` (or the platform's shared-memory filesystem) lacks room for the block."""

    def __init__(self, message: str, *, needed: int = 0, available: int = 0) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def describe_exitcode(exitcode: int | None) -> str:
    """Render a ``Process.exitcode`` for humans: ``SIGKILL(-9)``, ``exit code 3``, ``running``."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"{signal.Signals(-exitcode).name}({exitcode})"
        except ValueError:
            return f"signal {-exitcode}({exitcode})"
    return f"exit code {exitcode}"


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10, which has no ``add_note`` and prints no notes,
    the note goes into ``exc.__notes__`` all the same (code reading the notes runs alike on
    every Python) and into the message, which the traceback prints.

    Args:
        exc: the exception to annotate.
        note: the text to add.
    """
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        adder(note)
        return
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        notes.append(note)
    else:
        setattr(exc, "__notes__", [note])  # noqa: B010  (3.10's typeshed has no __notes__)
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n{note}", *exc.args[1:])
    elif not exc.args:
        exc.args = (note,)


def first_line(exc: BaseException) -> str:
    """``Type: the first line of its message``, for a record's reason or a failure's message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
