"""The scheduler slice a thread asks for (Linux 6.12 and later: ``sched_setattr``'s
``sched_runtime`` under ``SCHED_OTHER``, EEVDF's custom slice).

A thread with a shorter slice gets an earlier virtual deadline: woken while other tasks hold
every CPU, it runs at once rather than after the running task's slice; its share of the CPU is
unchanged. The parent asks for a short one, so that its own busy workers do not hold it back
when it wakes from a policy's wait or for an answer (decision 0062); a worker goes back to the
kernel's default, whatever it inherited. A kernel that does not know custom slices accepts the
call and ignores it (``thread_slice`` then says so); other platforms have no such call.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
import threading

__all__ = [
    "DEFAULT_SLICE_US",
    "ParentSlice",
    "check_slice",
    "set_thread_slice",
    "thread_slice",
]

#: (sched_setattr, sched_getattr) system call numbers
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
_SCHED_OTHER, _SCHED_BATCH = 0, 3
_SCHED_FLAG_RESET_ON_FORK = 0x01
#: the kernel clamps a custom slice to 0.1-100 ms
MIN_US, MAX_US = 100, 100_000
#: the parent's slice by default: the shortest the kernel allows (decision 0062)
DEFAULT_SLICE_US = MIN_US


class _Attr(ctypes.Structure):
    """``struct sched_attr`` up to ``sched_period`` (SCHED_ATTR_SIZE_VER0, 48 bytes)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("policy", ctypes.c_uint32),
        ("flags", ctypes.c_uint64),
        ("nice", ctypes.c_int32),
        ("priority", ctypes.c_uint32),
        ("runtime", ctypes.c_uint64),
        ("deadline", ctypes.c_uint64),
        ("period", ctypes.c_uint64),
    ]


@functools.cache  # one libc handle for every call, not one per call
def _calls() -> tuple[ctypes.CDLL, int, int] | None:
    numbers = _SYSCALLS.get(platform.machine()) if sys.platform == "linux" else None
    if numbers is None:
        return None
    return ctypes.CDLL(None, use_errno=True), *numbers


def _get(tid: int) -> _Attr | None:
    calls = _calls()
    if calls is None:
        return None
    libc, _, getattr_nr = calls
    attr = _Attr()
    if libc.syscall(getattr_nr, tid, ctypes.byref(attr), ctypes.sizeof(_Attr), 0) != 0:
        return None
    return attr


def thread_slice(tid: int = 0) -> int | None:
    """The slice, in ns, the kernel reports for thread ``tid`` (0: the calling thread); None
    where it cannot be read or the thread is not under ``SCHED_OTHER``/``SCHED_BATCH``. A
    kernel without custom slices reports 0."""
    attr = _get(tid)
    if attr is None or attr.policy not in (_SCHED_OTHER, _SCHED_BATCH):
        return None
    return int(attr.runtime)


def set_thread_slice(us: int | None, tid: int = 0) -> bool:
    """Ask for a slice of ``us`` microseconds for thread ``tid`` (None: the kernel's
    default), keeping its policy, nice value and reset-on-fork flag. Returns whether the
    call was made (never for real-time or idle threads, nor off Linux)."""
    calls = _calls()
    attr = _get(tid)
    if calls is None or attr is None or attr.policy not in (_SCHED_OTHER, _SCHED_BATCH):
        return False
    libc, setattr_nr, _ = calls
    attr.size = ctypes.sizeof(_Attr)
    attr.flags &= _SCHED_FLAG_RESET_ON_FORK
    attr.runtime = 0 if us is None else int(us) * 1000
    attr.deadline = attr.period = 0
    return bool(libc.syscall(setattr_nr, tid, ctypes.byref(attr), 0) == 0)


def check_slice(us: object) -> int | None:
    """``parent_slice_us`` checked.

    Raises:
        ValueError: not None and not an int within the kernel's 100-100,000 us.
    """
    if us is None:
        return None
    if isinstance(us, bool) or not isinstance(us, int) or not MIN_US <= us <= MAX_US:
        raise ValueError(
            f"parent_slice_us must be None or an int in [{MIN_US}, {MAX_US}] "
            f"(microseconds, the kernel's bounds), got {us!r}"
        )
    return us


_held_lock = threading.Lock()
#: thread id -> vector envs that asked for its slice (the last one gives it back)
_held: dict[int, int] = {}


class ParentSlice:
    """The short slice of the thread that built a vector env, given back at ``release``.

    ``us`` is what the kernel took (it reads back), else None: no slice asked for, a kernel
    without custom slices, or a thread it does not apply to."""

    def __init__(self, us: int | None) -> None:
        self.tid = threading.get_native_id()
        self.us: int | None = None
        if us is None:
            return
        if set_thread_slice(us) and thread_slice() == us * 1000:
            self.us = us
            with _held_lock:
                _held[self.tid] = _held.get(self.tid, 0) + 1

    def release(self) -> None:
        """Give the thread the kernel's default slice back once no vector env holds it
        (idempotent; the thread may be gone)."""
        if self.us is None:
            return
        self.us = None
        with _held_lock:
            left = _held.get(self.tid, 1) - 1
            if left > 0:
                _held[self.tid] = left
                return
            _held.pop(self.tid, None)
        set_thread_slice(None, self.tid)
