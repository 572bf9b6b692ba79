"""subvec._process.wire in-process: frames over os.pipe, and errors captured and rebuilt."""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from subvec._commands import (
    ChunkBlockSpec,
    Command,
    ErrorRecord,
    Status,
    StepEnvsPayload,
    rebuild_remote_error,
)
from subvec._process import wire as proto
from subvec._process.wire import (
    HEADER,
    dumps,
    finish_frame,
    loads,
    read_frame,
    write_frame,
)
from subvec.errors import EnvError, RemoteEnvError, RemoteTraceback


class Pipe:
    """An os.pipe whose ends are closed once, by the test or after it."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self._open = {self.r, self.w}

    def close_writer(self) -> None:
        self._open.discard(self.w)
        os.close(self.w)

    def close(self) -> None:
        for fd in self._open:
            os.close(fd)
        self._open.clear()


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    p = Pipe()
    yield p
    p.close()


def _in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``fn`` in a thread; the returned ``join()`` gives its result or raises its error."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(10)
        assert not thread.is_alive(), "the thread is stuck"
        if "error" in out:
            raise out["error"]
        return out["result"]

    return join


# --- frames -------------------------------------------------------------------------------


def test_the_header_is_nine_bytes() -> None:
    assert HEADER.size == 9
    assert HEADER.pack(5, Status.OK_PAYLOAD, 7) == b"\x05\x00\x00\x00\x01\x07\x00\x00\x00"


def test_frames_round_trip_in_order(pipe: Pipe) -> None:
    r, w = pipe.r, pipe.w
    write_frame(w, Command.STEP, 1)
    write_frame(w, Command.RESET, 2**32 - 1, dumps(([1, None], {"a": 1}, None)))
    write_frame(w, Status.OK, 3, b"")
    assert read_frame(r) == (Command.STEP, 1, b"")
    code, seq, payload = read_frame(r)
    assert (code, seq, loads(payload)) == (Command.RESET, 2**32 - 1, ([1, None], {"a": 1}, None))
    assert read_frame(r) == (Status.OK, 3, b"")


@pytest.mark.parametrize("size", [70_000, 3 * 2**20])
def test_a_payload_larger_than_the_pipe_buffer(pipe: Pipe, size: int) -> None:
    r, w = pipe.r, pipe.w
    payload = os.urandom(size)  # the writer blocks until the reader has drained the pipe
    join = _in_thread(lambda: read_frame(r))
    write_frame(w, Status.OK_PAYLOAD, 9, payload)
    assert join() == (Status.OK_PAYLOAD, 9, payload)


def test_finish_frame_reads_the_rest_of_a_frame_begun_elsewhere(pipe: Pipe) -> None:
    r, w = pipe.r, pipe.w
    write_frame(w, Status.ERROR, 5, b"payload")
    head = os.read(r, 4)  # a per-step path read part of the header
    assert finish_frame(r, head) == (Status.ERROR, 5, b"payload")
    write_frame(w, Status.OK, 6)
    assert finish_frame(r, os.read(r, HEADER.size)) == (Status.OK, 6, b"")


def test_a_frame_that_arrives_in_pieces(pipe: Pipe) -> None:
    r, w = pipe.r, pipe.w
    frame = HEADER.pack(6, Status.OK_PAYLOAD, 8) + b"abcdef"

    def trickle() -> None:
        for piece in (frame[:3], frame[3:11], frame[11:]):
            os.write(w, piece)
            time.sleep(0.02)

    join = _in_thread(trickle)
    assert read_frame(r) == (Status.OK_PAYLOAD, 8, b"abcdef")
    join()


def test_a_closed_pipe_raises_eof_error(pipe: Pipe) -> None:
    r = pipe.r
    pipe.close_writer()
    with pytest.raises(EOFError, match="pipe closed"):
        read_frame(r)
    with pytest.raises(EOFError, match="pipe closed"):
        finish_frame(r, b"")


def test_a_pipe_closed_mid_header_raises_eof_error(pipe: Pipe) -> None:
    r, w = pipe.r, pipe.w
    os.write(w, HEADER.pack(0, Status.OK, 1)[:5])
    pipe.close_writer()
    with pytest.raises(EOFError):
        read_frame(r)


def test_a_pipe_closed_mid_payload_raises_eof_error(pipe: Pipe) -> None:
    r, w = pipe.r, pipe.w
    os.write(w, HEADER.pack(10, Status.OK_PAYLOAD, 1) + b"abc")
    pipe.close_writer()
    with pytest.raises(EOFError, match="mid-frame"):
        read_frame(r)


# --- errors -------------------------------------------------------------------------------


class WithState(ValueError):
    """Keeps an attribute of its own."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> Any:
        return (WithState, (self.args[0], self.code))


class TwoArgs(Exception):
    """Pickles but does not unpickle: its args are one message, its __init__ wants two."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}-{b}")


class HoldsALock(RuntimeError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class StrictNew(Exception):
    """Cannot be rebuilt from its message alone: __new__ wants two arguments."""

    def __new__(cls, a: str, b: str) -> StrictNew:
        return super().__new__(cls, a, b)

    def __init__(self, a: str, b: str) -> None:
        super().__init__(a, b)
        self.lock = threading.Lock()  # and never pickles


class AlreadyEnvError(EnvError):
    pass


def _raise_here(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _through_the_pipe(record: ErrorRecord) -> ErrorRecord:
    copy = loads(dumps(record))
    assert copy == record
    return copy


def test_capture_keeps_the_exception_and_its_traceback() -> None:
    record = ErrorRecord.capture(_raise_here(KeyError("boom")), 3, "step")
    assert record.pickled is not None
    assert (record.type_module, record.type_qualname) == ("builtins", "KeyError")
    assert record.message == "'boom'"
    assert (record.env_index, record.command) == (3, "step")
    assert "_raise_here" in record.traceback_text
    assert record.traceback_text.rstrip().endswith("KeyError: 'boom'")


def test_a_rebuilt_error_keeps_its_type_env_index_and_traceback() -> None:
    record = _through_the_pipe(ErrorRecord.capture(_raise_here(KeyError("boom")), 3, "step"))
    exc = rebuild_remote_error(record, 4321)
    assert isinstance(exc, KeyError) and isinstance(exc, EnvError)
    assert type(exc).__name__ == "KeyError" and type(exc).__module__ == "builtins"
    assert exc.args == ("boom",)
    assert (exc.env_index, exc.worker_pid, exc.command) == (3, 4321, "step")
    assert exc.remote_traceback == record.traceback_text
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert exc.__cause__.text == record.traceback_text
    assert "_raise_here" in str(exc.__cause__)
    assert str(exc) == "'boom' [raised in env 3 (worker pid 4321) during step]"
    # one class per original type, so that type() comparisons and except clauses are stable
    again = rebuild_remote_error(record, 1)
    assert type(again) is type(exc)
    with pytest.raises(KeyError):
        raise exc


def test_a_rebuilt_error_pickles_as_itself() -> None:
    exc = rebuild_remote_error(ErrorRecord.capture(KeyError("boom"), 2, "reset"), 99)
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc)
    assert (copy.args, copy.env_index, copy.worker_pid, copy.command) == (
        ("boom",),
        2,
        99,
        "reset",
    )


def test_a_rebuilt_error_keeps_its_attributes() -> None:
    record = _through_the_pipe(ErrorRecord.capture(WithState("bad", 17), 0, "call"))
    exc = rebuild_remote_error(record, None)
    assert isinstance(exc, WithState) and isinstance(exc, ValueError)
    assert exc.code == 17 and exc.args == ("bad",) and exc.env_index == 0


def test_an_env_error_is_rebuilt_as_its_own_class() -> None:
    exc = rebuild_remote_error(ErrorRecord.capture(AlreadyEnvError("x"), 1, "step"), 5)
    assert type(exc) is AlreadyEnvError and exc.env_index == 1


@pytest.mark.parametrize(
    ("exc", "kind", "message"),
    [(TwoArgs("x", "y"), TwoArgs, "x-y"), (HoldsALock("locked"), HoldsALock, "locked")],
    ids=["does_not_unpickle", "does_not_pickle"],
)
def test_an_error_that_does_not_travel_keeps_its_type_and_message(
    exc: BaseException, kind: type[BaseException], message: str
) -> None:
    record = _through_the_pipe(ErrorRecord.capture(_raise_here(exc), 4, "step"))
    assert record.pickled is None
    assert record.type_qualname == kind.__qualname__ and record.message == message
    rebuilt = rebuild_remote_error(record, 7)
    assert isinstance(rebuilt, kind) and isinstance(rebuilt, EnvError)
    assert rebuilt.args == (message,) and rebuilt.env_index == 4
    assert "_raise_here" in rebuilt.__cause__.text


def test_an_error_of_a_type_the_parent_cannot_import_becomes_remote_env_error() -> None:
    class Local(Exception):  # pickles by reference, which a local class cannot
        pass

    record = _through_the_pipe(ErrorRecord.capture(_raise_here(Local("lost")), 6, "reset"))
    assert record.pickled is None
    exc = rebuild_remote_error(record, 8)
    assert type(exc) is RemoteEnvError and isinstance(exc, RuntimeError)
    assert str(exc.args[0]) == f"{__name__}.{Local.__qualname__}: lost"
    assert (exc.env_index, exc.worker_pid, exc.command) == (6, 8, "reset")
    assert isinstance(exc.__cause__, RemoteTraceback)


def test_an_error_that_cannot_be_rebuilt_from_its_message_becomes_remote_env_error() -> None:
    record = ErrorRecord.capture(_raise_here(StrictNew("a", "b")), 0, "step")
    assert record.pickled is None
    exc = rebuild_remote_error(record, 1)
    assert type(exc) is RemoteEnvError
    assert exc.args[0].startswith(f"{__name__}.StrictNew: ")
    assert exc.env_index == 0


@pytest.mark.parametrize(
    "payload",
    [
        StepEnvsPayload([3], None),
        StepEnvsPayload([0, 2, 5], None),
        StepEnvsPayload([1, 70_000], None),  # past u16: pickled
        StepEnvsPayload([0, 1], [np.int64(2), [1, 2]]),
        # action chunks: compact with the actions in the chunk block, else pickled
        StepEnvsPayload(range(3), None, 8, True, False, ChunkBlockSpec("subvec_1_ab", 7, 16, True)),
        StepEnvsPayload(range(2), None, 5, False, True, ChunkBlockSpec("subvec_1_cd", 2, 8, False)),
        StepEnvsPayload(
            range(2), [np.zeros((2, 4))], 4, False, False, ChunkBlockSpec("x", 2, 8, False)
        ),
        StepEnvsPayload([1, 2], None, 4, False, False, ChunkBlockSpec("subvec_1_ef", 4, 8, False)),
    ],
)
def test_step_envs_payloads_survive_the_wire(payload: StepEnvsPayload) -> None:
    data = proto.encode_step_envs(payload)
    back = proto.decode_step_envs(memoryview(data))
    assert list(back.envs) == list(payload.envs)
    assert back[2:] == payload[2:]  # sub-steps, the chunk's flags and block
    if payload.substeps > 1 and payload.actions is None and type(payload.envs) is range:
        assert len(data) < 40  # the compact form
    assert (back.actions is None) == (payload.actions is None)
    if payload.actions is not None:
        assert back.actions is not None
        assert [np.asarray(a).tolist() for a in back.actions] == [
            np.asarray(a).tolist() for a in payload.actions
        ]
    if payload.actions is None and payload.substeps == 1 and payload.envs[-1] < 1 << 16:
        assert len(data) == 1 + 2 * len(payload.envs)  # no pickle on the usual path
