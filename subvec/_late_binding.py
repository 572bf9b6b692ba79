"""The late-binding trap in a list of env factories, found before any worker starts.

``[lambda: gym.make(env_id) for env_id in ids]`` builds the last id in every env: a lambda
reads its free variables when it is called, not when it is made, so every factory made in the
loop reads the loop variable's final value. Such factories are one function sharing one
closure cell. Sharing a cell alone is not the trap (``[lambda: gym.make(env_id) for _ in
range(n)]`` inside a function shares the cell of ``env_id`` and means it): the shared
variable must also be a loop's target. That is read from the bytecode of the code that made
the lambdas, found among the callers' frames or the functions of the lambda's module.
"""

from __future__ import annotations

import dis
import sys
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from subvec.errors import LateBindingWarning

__all__ = ["warn_of_late_binding"]


def _codes_within(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes_within(const)


def _loop_targets(code: types.CodeType) -> set[str]:
    """The cell variables a ``for`` of ``code`` assigns (its targets, unpacking included)."""
    targets: set[str] = set()
    after_for = False
    for ins in dis.get_instructions(code):
        if ins.opname == "FOR_ITER":
            after_for = True
        elif after_for and ins.opname == "STORE_DEREF":
            targets.add(ins.argval)
        elif after_for and not ins.opname.startswith(("STORE_", "UNPACK_", "EXTENDED_ARG")):
            after_for = False
    return targets


def _maker(fn: types.FunctionType, depth: int = 12) -> types.CodeType | None:
    """The code object that made ``fn`` (holds its code as a constant): searched in the
    callers' frames (a script or function that builds the list where it builds the vector
    env), then in the functions and methods of ``fn``'s module (a helper that returns it)."""
    places: list[types.CodeType] = []
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and len(places) < depth:
        places.append(frame.f_code)
        frame = frame.f_back
    for value in list(fn.__globals__.values()):
        members = vars(value).values() if isinstance(value, type) else (value,)
        places.extend(m.__code__ for m in members if isinstance(m, types.FunctionType))
    for place in places:
        for code in _codes_within(place):
            if fn.__code__ in code.co_consts:
                return code
    return None


def warn_of_late_binding(env_fns: Sequence[Any]) -> None:
    """Warn (:class:`LateBindingWarning`) when the factories are one function made in a loop
    whose variable they all read through one shared cell, naming the variable and the fix.

    Args:
        env_fns: the vector env's factories.
    """
    if len(env_fns) < 2:
        return
    first = env_fns[0]
    if not isinstance(first, types.FunctionType) or not first.__closure__:
        return
    if not all(
        isinstance(fn, types.FunctionType)
        and fn.__code__ is first.__code__
        and fn.__closure__ is not None
        and all(a is b for a, b in zip(fn.__closure__, first.__closure__))
        for fn in env_fns[1:]
    ):
        return
    maker = _maker(first)
    if maker is None:
        return
    shared = [name for name in first.__code__.co_freevars if name in _loop_targets(maker)]
    if not shared:
        return
    name = shared[0]
    value = first.__closure__[first.__code__.co_freevars.index(name)].cell_contents
    warnings.warn(
        f"env_fns[0..{len(env_fns) - 1}] are one function ({first.__qualname__}) reading the "
        f"loop variable {name!r} through one shared cell, so every env is built with its last "
        f"value ({value!r}): Python reads a lambda's variables when it is called, not when it "
        f"is made. Bind it when the lambda is made: `lambda {name}={name}: ...` (or "
        "functools.partial).",
        LateBindingWarning,
        stacklevel=4,
    )
