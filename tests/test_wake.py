"""subvec._process.wake: the futex protocol's words in-process (threads as workers), the choice and
its fallback, and a few workers under it (a death between the wake-up and the mark, a stale mark,
Ctrl-C in the wait)."""

from __future__ import annotations

import mmap
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from subvec import SubprocVectorEnv
from subvec._commands import Command, Status
from subvec._process import wake as _wake
from subvec._process.plan import plan_layout
from subvec._process.shm import BlockLayout
from subvec._process.wake import MARK_OK, PIPE_KIND, STEP_KIND, Bell
from subvec.errors import WorkerDiedError, WorkerTimeoutError
from tests.envs import crash_fns

needs_futex = pytest.mark.skipif(not _wake.available(), reason="no shared futex here")


@pytest.fixture
def bell() -> Iterator[Bell]:
    """A Bell for 3 workers over an anonymous shared mapping."""
    layout = BlockLayout.plan(_wake.control_regions(3))
    area = mmap.mmap(-1, layout.size, flags=mmap.MAP_SHARED)
    views = {
        r.name: np.frombuffer(area, np.dtype(r.dtype), int(np.prod(r.shape)), r.offset)
        for r in layout.regions
    }
    b = Bell(views)
    yield b
    b.close()
    del views
    area.close()


def _blocked_in_futex(thread: threading.Thread, timeout: float = 5.0) -> None:
    """Wait until ``thread`` sits in the futex system call (read from /proc)."""
    number = _wake._SYSCALL[os.uname().machine.lower()]
    deadline = time.monotonic() + timeout
    path = f"/proc/self/task/{thread.native_id}/syscall"
    while time.monotonic() < deadline:
        with open(path) as f:
            if f.read().split()[0] == str(number):
                return
        time.sleep(0.001)
    raise AssertionError(f"{thread.name} never blocked in the futex")


def _start(fn: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        out["value"] = fn(*args)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# --- the choice ---------------------------------------------------------------------------


def test_choose_by_count_environment_and_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_wake, "available", lambda: True)
    assert _wake.choose(_wake.MIN_WORKERS, None, {}) == _wake.FUTEX
    assert _wake.choose(_wake.MIN_WORKERS - 1, None, {}) == _wake.PIPES
    assert _wake.choose(2, None, {"SUBVEC_WAKE": "futex"}) == _wake.FUTEX
    assert _wake.choose(64, None, {"SUBVEC_WAKE": "pipes"}) == _wake.PIPES
    assert _wake.choose(64, 4, {}) == _wake.PIPES  # turns keep the pipes
    with pytest.raises(ValueError, match="SUBVEC_WAKE must be 'futex' or 'pipes', got 'fast'"):
        _wake.choose(64, None, {"SUBVEC_WAKE": "fast"})


def test_fallback_where_the_futex_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the system call (not Linux, a seccomp filter): the probe says no, and even a
    request for the futex gets the pipes."""
    monkeypatch.setattr(_wake, "_FN", None)
    monkeypatch.setattr(_wake, "_probed", None)
    assert not _wake.available()
    assert _wake.choose(64, None, {"SUBVEC_WAKE": "futex"}) == _wake.PIPES
    assert plan_layout(64, cpus=2).wake == _wake.PIPES


def test_plan_records_the_protocol() -> None:
    layout = plan_layout(2, cpus=2, wake="futex")
    assert layout.wake == "futex" and layout.partner is None
    assert plan_layout(2, cpus=2, wake="pipes").partner == 0
    with pytest.raises(ValueError, match="wake must be 'futex' or 'pipes', got 'x'"):
        plan_layout(2, cpus=2, wake="x")


# --- the words, threads as workers ---------------------------------------------------------


@needs_futex
def test_one_ring_wakes_every_waiting_worker(bell: Bell) -> None:
    threads = [_start(bell.wait_command, i, 0, 0.0) for i in range(3)]
    for thread, _ in threads:
        _blocked_in_futex(thread)
    for i in range(3):
        bell.cmd[i] = (7 << 8) | STEP_KIND
    bell.ring(3)
    for i, (thread, out) in enumerate(threads):
        thread.join(5.0)
        assert not thread.is_alive()
        assert out["value"] == (7 << 8) | STEP_KIND, i


def _views_of(bell: Bell) -> dict[str, np.ndarray]:
    return {_wake.CONTROL: bell.words, _wake.COMMANDS: bell.cmd, _wake.MARKS: bell.mark}


@needs_futex
@pytest.mark.parametrize("fan_out", [1, 2])
def test_a_cascade_wakes_every_worker(bell: Bell, fan_out: int) -> None:
    """The parent wakes one sleeper; each passes the wake-up on (each worker has its own Bell,
    as each process does)."""
    workers = [Bell(_views_of(bell), fan_out=fan_out) for _ in range(3)]
    threads = [_start(w.wait_command, i, 0, 0.0) for i, w in enumerate(workers)]
    for thread, _ in threads:
        _blocked_in_futex(thread)
    bell.first_wakes = 1
    bell.step_all()
    bell.ring(3, cascade=True)
    for i, (thread, out) in enumerate(threads):
        thread.join(5.0)
        assert out["value"] == (1 << 8) | STEP_KIND, i
    assert bell.expected.tolist() == [1, 1, 1] and bell.seq.tolist() == [1, 1, 1]
    for w in workers:
        w.close()


@needs_futex
def test_a_broken_cascade_is_mended_by_waking_all(bell: Bell) -> None:
    """A worker that does not pass the wake-up on (as one that died would not): the others
    sleep on until the parent wakes every sleeper."""
    workers = [Bell(_views_of(bell), fan_out=1) for _ in range(3)]
    for w in workers:  # as if each had passed this generation's wake-up on already
        w._passed_on = int(bell.words[0]) + 1
    threads = [_start(w.wait_command, i, 0, 0.0) for i, w in enumerate(workers)]
    try:
        for thread, _ in threads:
            _blocked_in_futex(thread)
        bell.first_wakes = 1
        bell.step_all()
        bell.ring(3, cascade=True)
        assert bell.cascading()
        deadline = time.monotonic() + 5.0
        while sum(t.is_alive() for t, _ in threads) > 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        asleep = [t for t, _ in threads if t.is_alive()]
        assert len(asleep) == 2
        for thread in asleep:
            _blocked_in_futex(thread)
    finally:
        bell.wake_all()
    for thread, out in threads:
        thread.join(5.0)
        assert out["value"] == (1 << 8) | STEP_KIND
    for w in workers:
        w.close()


@needs_futex
def test_a_worker_whose_word_did_not_change_sleeps_on(bell: Bell) -> None:
    """The generation moves for everyone; only a worker whose command word changed returns."""
    idle, out = _start(bell.wait_command, 2, 0, 0.0)
    _blocked_in_futex(idle)
    bell.cmd[0] = (1 << 8) | PIPE_KIND
    bell.ring(1)
    _blocked_in_futex(idle)  # woken by the generation, back to sleep
    assert "value" not in out
    bell.cmd[2] = (1 << 8) | STEP_KIND
    bell.ring(1)
    idle.join(5.0)
    assert out["value"] == (1 << 8) | STEP_KIND


@needs_futex
def test_only_the_last_answer_wakes_the_parent(bell: Bell) -> None:
    bell.ring(3)
    parent, out = _start(bell.sleep, 3, 30.0)
    _blocked_in_futex(parent)
    bell.answer(0, 5, MARK_OK)
    bell.answer(1, 5, MARK_OK)
    _blocked_in_futex(parent)  # two answers of three: still asleep
    assert "value" not in out and bell.remaining() == 1
    bell.answer(2, 5, MARK_OK)
    parent.join(5.0)
    assert out["value"] is True and bell.remaining() == 0
    assert bell.mark.tolist() == [(5 << 8) | MARK_OK] * 3


@needs_futex
def test_waiting_for_some_every_answer_wakes(bell: Bell) -> None:
    bell.ring(3, level=2000)
    parent, out = _start(bell.sleep, 3, 30.0)
    _blocked_in_futex(parent)
    bell.answer(1, 9, MARK_OK)
    parent.join(5.0)
    assert out["value"] is True and bell.remaining() == 2


@needs_futex
def test_a_stale_answer_only_makes_the_wake_sooner(bell: Bell) -> None:
    """An answer to an abandoned command counts down too; the countdown goes below zero and
    the real last answer still wakes the parent (the marks say which is which)."""
    bell.ring(1)
    bell.answer(0, 3, MARK_OK)  # stale: an earlier command's answer
    assert bell.remaining() == 0
    parent, out = _start(bell.sleep, 0, 30.0)
    _blocked_in_futex(parent)
    bell.answer(0, 4, MARK_OK)
    parent.join(5.0)
    assert out["value"] is True and bell.remaining() == -1
    assert int(bell.mark[0]) >> 8 == 4


@needs_futex
def test_sleep_times_out(bell: Bell) -> None:
    bell.ring(1)
    started = time.monotonic()
    assert bell.sleep(1, 0.05) is False
    assert 0.04 < time.monotonic() - started < 2.0
    assert bell.sleep(0, 1.0) is True  # the countdown is not 0: no sleep at all


# --- workers under the futex protocol ------------------------------------------------------


@pytest.fixture
def futex(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _wake.available():
        pytest.skip("no shared futex here")
    monkeypatch.setenv("SUBVEC_WAKE", "futex")


@pytest.mark.timeout(30)
def test_a_worker_dying_between_wake_and_mark(futex: None) -> None:
    envs = SubprocVectorEnv(crash_fns(3, 1, "exit", quiet=True), num_workers=3)
    try:
        assert envs.layout.wake == "futex"
        envs.reset(seed=0)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"worker 1 .* died with exit code 3"):
            envs.step(envs.action_space.sample())
        assert time.monotonic() - started < 2.0
    finally:
        envs.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("wake", "kwargs"), [("futex", {}), ("pipes", {"spin_us": 50.0})], ids=["futex", "spinning"]
)
def test_a_stale_mark_is_not_the_next_answer(
    wake: str, kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step abandoned at its timeout is answered late; the next step waits for its own (on
    the futex protocol, and on the pipes where the parent spins: ``SpinRound``)."""
    if wake == "futex" and not _wake.available():
        pytest.skip("no shared futexes here")
    monkeypatch.setenv(_wake.ENV_VAR, wake)
    fns = crash_fns(2, 1, "hang", quiet=True, seconds=0.6)
    envs = SubprocVectorEnv(fns, num_workers=2, **kwargs)
    try:
        envs.reset(seed=0)
        actions = envs.action_space.sample()
        envs.step_async(actions)
        with pytest.raises(WorkerTimeoutError, match="worker 1"):
            envs.step_wait(timeout=0.2)
        for _ in range(3):
            obs, *_ = envs.step(actions)  # the late answer lands meanwhile: stale
        assert obs.shape[0] == 2
        assert envs.get_attr("t") == (4, 4)  # every step ran once, the abandoned one too
    finally:
        envs.close()


@pytest.mark.timeout(30)
def test_ctrl_c_interrupts_the_wait(futex: None) -> None:
    envs = SubprocVectorEnv(crash_fns(2, 0, "hang", quiet=True), num_workers=2)
    try:
        envs.reset(seed=0)
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            envs.step(envs.action_space.sample())
        assert time.monotonic() - started < 2.0
        timer.join()
    finally:
        started = time.monotonic()
        envs.close(timeout=0.5)
        assert time.monotonic() - started < 5.0


@needs_futex
def test_a_cascade_stops_passing_on_once_nobody_sleeps(bell: Bell) -> None:
    """A wake-up that finds fewer sleepers than its fan-out drained the queue: it says so in
    the control words, and the workers woken after it pass nothing on."""
    workers = [Bell(_views_of(bell), fan_out=2) for _ in range(3)]
    threads = [_start(w.wait_command, i, 0, 0.0) for i, w in enumerate(workers)]
    for thread, _ in threads:
        _blocked_in_futex(thread)
    bell.first_wakes = 1
    bell.step_all()
    bell.ring(3, cascade=True)
    for thread, out in threads:
        thread.join(5.0)
        assert out["value"] == (1 << 8) | STEP_KIND
    # the first woken found the other two asleep; a later pass found nobody
    assert int(bell.words[_wake._DRAINED]) == int(bell.words[_wake._GEN])
    for w in workers:
        w.close()


@pytest.mark.parametrize(
    ("kwargs", "wake", "kind"),
    [
        ({}, "pipes", "PartnerRound"),
        ({"spin_us": 50.0}, "pipes", "SpinRound"),
        ({"spin_us": 0.0}, "pipes", "PollRound"),
        ({"max_concurrency": 1}, "pipes", "TurnsRound"),
        ({}, "futex", "BellExchange"),
    ],
    ids=["partner", "spinning", "no_partner", "turns", "futex"],
)
def test_every_way_of_waiting_says_none_for_plain_answers(
    kwargs: dict[str, Any], wake: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round-trip object per way of waiting, bound once for the workers, and every one
    returns None when each answer was a plain OK (the front's short result path), the
    spinning layout's included; an answer with a payload comes back decoded."""
    if wake == "futex" and not _wake.available():
        pytest.skip("no shared futexes here")
    monkeypatch.setenv(_wake.ENV_VAR, wake)
    fns = [lambda: gym.make("CartPole-v1")] * 4
    with SubprocVectorEnv(fns, num_workers=2, **kwargs) as envs:
        envs.reset(seed=0)
        pool = envs._pool  # type: ignore[attr-defined]
        assert pool.exchange(Command.STEP, 10.0, "stepping") is None
        bound = pool._round_trip()
        assert type(bound).__name__ == kind
        assert pool.exchange(Command.STEP, 10.0, "stepping") is None
        assert pool._round_trip() is bound
        pool.send(Command.STATS)
        collected = pool.collect(10.0, "reporting stats")
        assert collected is not None
        assert {status for status, _ in collected.outcomes.values()} == {Status.OK_PAYLOAD}


@pytest.mark.timeout(60)
def test_the_spinning_round_past_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipes' round where the parent spins (``SpinRound``): a reply later than the spin
    window is awaited all the same, and a worker that dies in a step is named at once."""
    monkeypatch.setenv(_wake.ENV_VAR, "pipes")
    fns = crash_fns(2, 1, "hang", quiet=True, seconds=0.6)
    with SubprocVectorEnv(fns, num_workers=2, spin_us=50.0) as envs:
        envs.reset(seed=0)
        actions = envs.action_space.sample()
        assert type(envs._pool._round_trip()).__name__ == "SpinRound"  # type: ignore[attr-defined]
        started = time.monotonic()
        envs.step(actions)  # env 1 hangs 0.6 s in its first step: 12,000 spin windows
        assert time.monotonic() - started >= 0.6
        envs.step(actions)
        assert envs.get_attr("t") == (2, 2)
    envs = SubprocVectorEnv(crash_fns(2, 1, "exit", quiet=True), num_workers=2, spin_us=50.0)
    try:
        envs.reset(seed=0)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"worker 1 .* died with exit code 3"):
            envs.step(actions)
        assert time.monotonic() - started < 2.0
    finally:
        envs.close()
