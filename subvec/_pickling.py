"""Pickling what the user's script defines, for a process that does not run the script.

Env factories, call arguments and registered entry points defined in ``__main__`` travel by
value: cloudpickle copies their functions and classes, code objects included. cloudpickle 3.1
renames every code object it copies to ``"<dynamic-code>"`` (so that the same function pickles
to the same bytes wherever it is defined), and a traceback through such code then names no file
and shows no source line. A worker runs on the same machine as the script (a Ray actor mostly
does too), where the file is there to read: :func:`dumps` keeps each code object's file name, so
an error in the user's env reads as it would in-process (``File ".../train.py", line 11, in
step`` and the line). Everything else is cloudpickle's own reduction.
"""

from __future__ import annotations

import io
import pickle
import types
from collections import ChainMap
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle


def _code_in_file(rebuild: Callable[..., types.CodeType], args: Any, filename: str) -> Any:
    """Unpickling side: cloudpickle's code object, under its original file name."""
    return rebuild(*args).replace(co_filename=filename)


_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table.get(types.CodeType)


def _reduce_code(code: types.CodeType) -> Any:
    rebuild, args = _cloudpickle_code_reduce(code)
    if code.co_filename.startswith("<"):  # "<stdin>", "<string>": no file to name
        return rebuild, args
    return _code_in_file, (rebuild, args, code.co_filename)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    # Nested code objects (methods, lambdas inside functions) are constants of their parent's
    # code and come through here one by one, so each keeps its own file name.
    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, keeping the file names of the code it copies by value.

    Raises:
        Exception: whatever pickling ``obj`` raises (an unpicklable object it captures).
    """
    if _cloudpickle_code_reduce is None:  # a cloudpickle without a code reducer of its own
        blob: bytes = cloudpickle.dumps(obj)
        return blob
    with io.BytesIO() as buffer:
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        return buffer.getvalue()


def pickle_factories(env_fns: Sequence[Any], count: int, to: str) -> list[bytes]:
    """The first ``count`` env factories, pickled for another process.

    Args:
        env_fns: the vector env's factories, in env order.
        count: how many of them travel (the rest are built in the parent).
        to: where they go, for the error message ("a worker process", "a Ray actor").

    Returns:
        One pickle per factory.

    Raises:
        TypeError: a factory is not callable, or cannot be pickled (naming its env index).
    """
    blobs = []
    for i, fn in enumerate(env_fns):
        if not callable(fn):
            raise TypeError(f"env_fns[{i}] must be a callable returning an env, got {fn!r}")
        if i >= count:
            continue
        try:
            blobs.append(dumps(fn))
        except Exception as exc:
            raise TypeError(
                f"env_fns[{i}] ({fn!r}) cannot be pickled to send it to {to}: {exc}. Capture "
                f"only picklable values in the factory (build the env inside it, not outside)."
            ) from exc
    return blobs
