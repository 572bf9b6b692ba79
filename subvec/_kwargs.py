"""Keyword options checked by name: an unknown one is refused with the closest option's name.

The vector env classes, ``make_vec`` and the SB3 face share these, so a typo reads the same
wherever it was made.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["accepts_any_keyword", "check_kwargs", "options_of"]


def options_of(cls: type) -> tuple[str, ...]:
    """The options of a vector env class, read from its signature (so they never drift)."""
    return tuple(
        name
        for name, p in inspect.signature(cls.__init__).parameters.items()  # type: ignore[misc]
        if name not in ("self", "env_fns")
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )


def accepts_any_keyword(cls: type) -> bool:
    """Whether ``cls.__init__`` takes ``**kwargs`` (a user's subclass may: nothing to check)."""
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        for p in inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
    )


def check_kwargs(
    given: Mapping[str, Any],
    allowed: Iterable[str],
    where: str,
    *,
    hints: Mapping[str, str] | None = None,
    otherwise: str = "",
) -> None:
    """Reject keyword arguments not in ``allowed``, naming each and saying what to change.

    A known mistake gets its hint, a typo gets the closest allowed name (difflib), anything
    else gets ``otherwise`` (formatted with ``{name}``) and the list of allowed names.
    """
    allowed = list(allowed)
    unknown = [name for name in given if name not in allowed]
    if not unknown:
        return
    hints = hints or {}
    problems = []
    for name in unknown:
        close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
        if name in hints:
            problems.append(f"{name!r}: {hints[name]}")
        elif close:
            problems.append(f"{name!r}: did you mean {close[0]!r}?")
        elif otherwise:
            problems.append(f"{name!r}: " + otherwise.format(name=name))
        else:
            problems.append(f"{name!r} is not one of them")
    plural = "s" if len(unknown) > 1 else ""
    raise TypeError(
        f"{where} got unexpected keyword argument{plural} "
        + ", ".join(repr(n) for n in unknown)
        + ".\n  "
        + "\n  ".join(problems)
        + f"\n  (accepted: {', '.join(allowed)})"
    )
