"""Waking the workers and learning that they answered with O(1) system calls per command.

With the pipes alone the parent pays a ``write`` per worker to wake it and a ``poll`` and a
``read`` per reply: tens of microseconds per worker and step, which caps a pool of a hundred
workers (docs/decisions/0024-futex-wake-protocol.md). With this protocol, after ATTACH:

    parent                                        worker i
    ------                                        --------
    cmd[i] = seq << 8 | kind   (one numpy
      assignment for a plain STEP to all)
    remaining = workers commanded
    gen += 1; FUTEX_WAKE(gen, FIRST_WAKES) ────►  FUTEX_WAIT(gen) returns; first time woken
                                                 in this generation: FUTEX_WAKE(gen,
                                                 FAN_OUT) (the next sleepers: a cascade)
                                                 cmd[i] is new
                                                 kind STEP: step (actions in the block)
                                                 kind PIPE: read and serve the command
                                                 frames up to seq (as with the pipes alone)
                                                 a payload or an error: a frame on the pipe
    FUTEX_WAIT(remaining)       ◄──────────────  mark[i] = seq << 8 | status; then one
    (the last worker wakes it)                   FUTEX_WAKE_OP: remaining -= 1 and wake the
    scan mark[] with one numpy call              parent if it was at most level + 1

The parent wakes a few workers, and each worker woken wakes a few more before its own work
(the sleepers queue on one word, first in first out, so the cascade reaches every one): the
kernel's work of waking N processes leaves the one thread that serves them all. A worker
wakes others once per generation (woken again, it sleeps on), so the cascade ends, and not at
all once a pass of this generation found fewer sleepers than it asked for (nobody is left to
wake: every commanded worker is awake or sees its new word before it sleeps); a worker
that dies before passing it on is covered by the parent, which wakes every sleeper itself when
a wait outlasts a slice. Commands to some workers wake everyone at once (an idle worker woken
would only go back to sleep).

The parent keeps every worker's last seq and awaited seq in two arrays (:class:`Bell`'s
``seq`` and ``expected``), so that a plain STEP to every worker, and its answers, cost a few
numpy calls whatever the number of workers.

The decrement is atomic (done by the kernel), so only the last worker to answer wakes the
parent; ``level`` lets a wait for some of the workers (``collect_ready``) wake earlier. The
count is only a hint: the marks are the truth, and every wait rechecks them. A stale answer (to
a command the parent stopped waiting for) may skew the count; the parent's wait is cut into
slices (:data:`SLICE_S`), and between slices it also polls the workers' sentinels, so a death
is seen within a slice and a skewed count costs at most one slice.

Everything variable-size (calls, resets, errors, payload replies) still travels on the pipes;
only the wake-ups and the plain answers move to the block. Where the futex is missing (not
Linux, an unknown architecture, a sandbox that forbids the call) the pool keeps the pipes
alone, chosen once at start (:func:`choose`; ``envs.layout.wake``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import time
from typing import Any

import numpy as np

__all__ = [
    "FAN_OUT",
    "FIRST_WAKES",
    "FUTEX",
    "MIN_WORKERS",
    "PIPES",
    "SLICE_S",
    "Bell",
    "available",
    "choose",
    "control_regions",
]

#: the two protocols, as ``Layout.wake`` names them
FUTEX, PIPES = "futex", "pipes"
#: The futex protocol serves pools of at least this many workers; fewer keep the pipes, whose
#: partner and spin rules are tuned for a few workers on a few CPUs (decision 0024: at 8
#: workers the futex saved parent CPU but lost wall time per step; from 32 on it saves 2-3.5x).
MIN_WORKERS = 16
#: The longest a parent wait sleeps without looking at the workers' sentinels.
SLICE_S = 0.01
#: How many sleepers the parent wakes for a command to every worker, and how many more each
#: worker woken wakes in turn (decision 0031: measured at 64 and 128 workers).
FIRST_WAKES, FAN_OUT = 2, 2
#: ``SUBVEC_WAKE=pipes`` keeps the pipes, ``=futex`` takes the futex at any worker count.
ENV_VAR = "SUBVEC_WAKE"

#: kinds of command in ``cmd`` (the low byte); the rest of the word is the command's seq
STEP_KIND, PIPE_KIND = 1, 2
#: statuses in ``mark``: a plain OK (everything in the block), or a frame on the reply pipe
MARK_OK, MARK_PIPE = 1, 2

_SYSCALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
_FUTEX_WAIT, _FUTEX_WAKE, _FUTEX_WAKE_OP = 0, 1, 5
_FUTEX_OP_ADD, _FUTEX_OP_CMP_LE = 1, 3
_WAKE_ALL = 2**31 - 1
_ONE, _SHIFT, _STEP_KIND = np.uint64(1), np.uint64(8), np.uint64(STEP_KIND)
_EAGAIN, _EINTR, _ETIMEDOUT = 11, 4, 110

# The control words (uint32): the generation the workers wait on, and the countdown the parent
# waits on, a cache line apart (the workers write one, the parent the other), then the level,
# a word nobody waits on: FUTEX_WAKE_OP's first word (the kernel wakes one waiter there
# even when asked for none), whether the workers pass the wake-up on (a cascade), and the last
# generation whose cascade found nobody left asleep (written by the workers).
_GEN, _REMAINING, _LEVEL, _NOBODY, _CASCADE, _DRAINED = 0, 16, 17, 18, 19, 20
_WORDS = 32
CONTROL, COMMANDS, MARKS = "wake", "wake_cmd", "wake_mark"


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall() -> tuple[Any, int] | None:
    number = _SYSCALL.get(platform.machine().lower())
    if sys.platform != "linux" or number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    return fn, number


def _bare_syscall() -> Any:
    """``syscall`` again, without argtypes: the worker's calls pass ctypes objects built
    once, which ctypes hands on as they are. Converting seven arguments through argtypes
    cost 0.3 us of a 0.9 us call here (decision 0033); a worker makes three calls a step."""
    try:
        fn = ctypes.CDLL(None)["syscall"]  # item access: a function object of our own
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_FN = _syscall()
_BARE = _bare_syscall() if _FN is not None else None
_probed: bool | None = None


def available() -> bool:
    """Whether shared futexes work here: one FUTEX_WAKE and one FUTEX_WAKE_OP on a word of a
    shared mapping (a seccomp filter may forbid them; other systems lack them). Probed once."""
    global _probed
    if _probed is None:
        _probed = False
        if _FN is not None:
            fn, number = _FN
            area = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_SHARED)
            try:
                word = ctypes.c_uint32.from_buffer(area)
                address = ctypes.addressof(word)
                woke = fn(number, address, _FUTEX_WAKE, 1, None, None, 0)
                op = _wake_op_code(0)
                woke_op = fn(number, address, _FUTEX_WAKE_OP, 0, 1, address, op)
                _probed = woke == 0 and woke_op == 0 and word.value == 2**32 - 1
                del word
            finally:
                area.close()
    return _probed


def choose(num_workers: int, max_active: int | None, environ: Any = None) -> str:
    """The protocol for a pool of ``num_workers``: the futex from :data:`MIN_WORKERS` workers
    when it is available and every worker may work at once (turns keep the pipes); the pipes
    otherwise. ``SUBVEC_WAKE`` (``pipes`` or ``futex``) overrides the count.

    Raises:
        ValueError: ``SUBVEC_WAKE`` is neither ``pipes`` nor ``futex``.
    """
    asked = (os.environ if environ is None else environ).get(ENV_VAR, "")
    if asked not in ("", FUTEX, PIPES):
        raise ValueError(f"{ENV_VAR} must be {FUTEX!r} or {PIPES!r}, got {asked!r}")
    if asked == PIPES or max_active is not None or not available():
        return PIPES
    return FUTEX if asked == FUTEX or num_workers >= MIN_WORKERS else PIPES


def control_regions(num_workers: int) -> list[tuple[str, np.dtype[Any], tuple[int, ...]]]:
    """The block regions of the protocol (see ``_process.block``)."""
    return [
        (CONTROL, np.dtype(np.uint32), (_WORDS,)),
        (COMMANDS, np.dtype(np.uint64), (num_workers,)),
        (MARKS, np.dtype(np.uint64), (num_workers,)),
    ]


def _wake_op_code(level: int) -> int:
    """FUTEX_OP(ADD, -1, CMP_LE, level + 1): decrement, and wake if the old value was at most
    ``level + 1`` (the new one at most ``level``; a stale answer's extra decrement only makes
    the wake come sooner)."""
    return (_FUTEX_OP_ADD << 28) | (_FUTEX_OP_CMP_LE << 24) | (0xFFF << 12) | ((level + 1) & 0xFFF)


_WAKE_AT_LAST = _wake_op_code(0)


class Bell:
    """Both sides of the protocol over the block's control regions.

    Args:
        views: the block's views (the regions of :func:`control_regions`).
        first_wakes, fan_out: the cascade's widths (:data:`FIRST_WAKES`, :data:`FAN_OUT`).

    Attributes:
        seq: the parent's side: each worker's last command seq.
        expected: the parent's side: each worker's awaited answer seq (0: none).
    """

    def __init__(
        self, views: dict[str, np.ndarray], first_wakes: int = FIRST_WAKES, fan_out: int = FAN_OUT
    ) -> None:
        assert _FN is not None and _BARE is not None
        self._fn, self._number = _FN
        self.words = views[CONTROL]
        self.cmd = views[COMMANDS]
        self.mark = views[MARKS]
        self.seq = np.zeros(len(self.cmd), np.uint64)
        self.expected = np.zeros(len(self.cmd), np.uint64)
        self.first_wakes, self.fan_out = first_wakes, fan_out
        base = self.words.ctypes.data
        self._gen = base + 4 * _GEN
        self._remaining = base + 4 * _REMAINING
        self._nobody = base + 4 * _NOBODY
        self._timespec = _Timespec()
        self._timeout = ctypes.addressof(self._timespec)
        #: the worker's side: the last generation it passed the wake-up on in, and the words
        #: as memoryviews (their items are Python ints: a worker reads them a few times per
        #: step, on a CPU it shares with many others, so every call counts)
        self._passed_on = -1
        # Every argument of the worker's calls as a ctypes object (a long, as syscall() reads
        # its arguments), built once; ``_seen`` and ``_fan_out`` change their values.
        long, pointer = ctypes.c_long, ctypes.c_void_p
        self._bare = _BARE
        self._c_number = long(self._number)
        self._c_gen, self._c_remaining = pointer(self._gen), pointer(self._remaining)
        self._c_nobody = pointer(self._nobody)
        self._c_wait, self._c_wake = long(_FUTEX_WAIT), long(_FUTEX_WAKE)
        self._c_wake_op, self._c_zero, self._c_one = long(_FUTEX_WAKE_OP), long(0), long(1)
        self._c_seen, self._c_fan_out = long(0), long(fan_out)
        self._c_wake_at_last = long(_WAKE_AT_LAST)
        self._words_mv = memoryview(self.words.data)
        self._cmd_mv = memoryview(self.cmd.data)
        self._mark_mv = memoryview(self.mark.data)

    # --- parent ----------------------------------------------------------------------------

    def step_all(self) -> None:
        """Announce a plain STEP to every worker (each has answered its last command): the
        next seq of each, in its command word and as the awaited answer."""
        seq = self.seq
        seq += _ONE
        self.cmd[:] = (seq << _SHIFT) | _STEP_KIND
        self.expected[:] = seq

    def ring(self, count: int, level: int = 0, cascade: bool = False) -> None:
        """Wake the waiting workers after their ``cmd`` words were set (``count`` of them
        commanded; the last to answer wakes the parent): every one at once, or with
        ``cascade`` a few, each of whom wakes a few more."""
        words = self.words
        words[_LEVEL] = level
        words[_REMAINING] = count
        words[_CASCADE] = cascade
        words[_GEN] += 1
        wakes = self.first_wakes if cascade else _WAKE_ALL
        self._fn(self._number, self._gen, _FUTEX_WAKE, wakes, None, None, 0)

    def wake_all(self) -> None:
        """Wake every sleeping worker (the cascade's safety net: a worker that died before
        passing the wake-up on)."""
        self._fn(self._number, self._gen, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)

    def cascading(self) -> bool:
        """Whether the last :meth:`ring` left the waking to a cascade."""
        return bool(self.words[_CASCADE])

    def level(self) -> int:
        """The level the workers wake the parent at (see :meth:`ring`)."""
        return int(self.words[_LEVEL])

    def remaining(self) -> int:
        """The countdown (a hint: see the module docstring), signed: stale answers may take
        it below zero."""
        value = int(self.words[_REMAINING])
        return value - 2**32 if value >= 2**31 else value

    def sleep(self, seen: int, timeout: float) -> bool:
        """Sleep while the countdown is ``seen``, at most ``timeout`` seconds. Returns True
        when woken or the countdown had changed, False when the time ran out or a signal came
        (the caller then looks at the sentinels, and Python runs the signal's handler)."""
        spec = self._timespec
        spec.tv_sec = int(timeout)
        spec.tv_nsec = int((timeout - int(timeout)) * 1e9)
        fn = self._fn
        if fn(
            self._number, self._remaining, _FUTEX_WAIT, seen & 0xFFFFFFFF, self._timeout, None, 0
        ):
            return ctypes.get_errno() == _EAGAIN
        return True

    # --- worker ----------------------------------------------------------------------------

    def wait_command(self, index: int, seen: int, spin_s: float) -> int:
        """Block until worker ``index``'s command word differs from ``seen``; return it.
        Busy-looks at it for up to ``spin_s`` first (without a system call). Woken in a
        cascade, passes the wake-up on first (once per generation)."""
        cmd, words, fn, number = self._cmd_mv, self._words_mv, self._bare, self._c_number
        value: int = cmd[index]
        if value != seen:
            return value
        if spin_s:
            deadline = time.perf_counter() + spin_s
            while time.perf_counter() < deadline:
                value = cmd[index]
                if value != seen:
                    return value
        gen, c_seen = self._c_gen, self._c_seen
        while True:
            generation = words[_GEN]
            value = cmd[index]
            if value != seen:
                return value
            c_seen.value = generation
            # FUTEX_WAIT reads no argument after the timeout, FUTEX_WAKE none after the count:
            # syscall() passes only those (each ctypes argument is a conversion).
            fn(number, gen, self._c_wait, c_seen, None)
            generation = words[_GEN]
            if generation != self._passed_on and words[_CASCADE]:
                self._passed_on = generation
                # Once a wake-up found fewer sleepers than it asked for, every commanded
                # worker is awake (or about to see its new word before it sleeps): the rest
                # of this generation's passes would wake nobody, each a system call.
                drained = words[_DRAINED] == generation
                if not drained and fn(number, gen, self._c_wake, self._c_fan_out) < self.fan_out:
                    words[_DRAINED] = generation

    def answer(self, index: int, seq: int, status: int) -> None:
        """Mark worker ``index``'s answer to command ``seq`` and count it down."""
        self._mark_mv[index] = (seq << 8) | status
        level = self._words_mv[_LEVEL]
        op = self._c_wake_at_last if level == 0 else ctypes.c_long(_wake_op_code(level))
        self._bare(
            self._c_number,
            self._c_nobody,
            self._c_wake_op,
            self._c_zero,
            self._c_one,
            self._c_remaining,
            op,
        )

    def close(self) -> None:
        """Drop the views (so that the block can unmap)."""
        for view in (self._words_mv, self._cmd_mv, self._mark_mv):
            view.release()
        self.words = self.cmd = self.mark = np.empty(0, np.uint64)
