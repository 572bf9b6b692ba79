"""Which envs ended and wait for a reset, where the vector env refuses to step them.

Under autoreset DISABLED (without ``freeze``) an env whose episode ended is not stepped again
until a reset covers it (``reset()``, or ``reset(options={"reset_mask": ...})``). The flags
say which: lock-step steps and chunks, the asynchronous engine's answers, resets,
``reconfigure`` and ``resume`` all change them through :class:`EndedEnvs`, their one writer.
In the other modes nothing is refused and the flags stay False.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["EndedEnvs"]


class EndedEnvs:
    """One flag per env: it ended and waits for a reset (module doc).

    Args:
        num_envs: the vector env's envs.
        tracked: whether the autoreset mode keeps the flags (DISABLED); if not, every write
            leaves them False.
    """

    __slots__ = ("flags", "tracked")

    def __init__(self, num_envs: int, tracked: bool) -> None:
        #: the flags (read anywhere; written by the methods here only)
        self.flags = np.zeros(num_envs, dtype=np.bool_)
        self.tracked = tracked

    def ids(self) -> list[int]:
        """The envs that wait for a reset, ascending."""
        return np.flatnonzero(self.flags).tolist()  # type: ignore[no-any-return]

    def stepped(self, terminations: np.ndarray, truncations: np.ndarray) -> None:
        """A lock-step step (or chunk, its last executed sub-step's flags) of every env."""
        if self.tracked:
            np.logical_or(terminations, truncations, out=self.flags)

    def answered(self, env: int, ended: bool) -> None:
        """Env ``env``'s asynchronous step (or chunk) came back, ``ended`` or not."""
        if self.tracked:
            self.flags[env] = ended

    def reset(self, envs: Sequence[int] | np.ndarray | None) -> None:
        """A reset of ``envs`` (a bool mask, ids, or None: every env) was sent or is done."""
        if envs is None:
            self.flags[:] = False
        else:
            self.flags[envs] = False

    def rebuilt(self, envs: Sequence[int]) -> None:
        """``envs`` are new envs (``reconfigure``): they wait for their first reset."""
        if self.tracked:
            self.flags[list(envs)] = True

    def restore(self, flags: np.ndarray) -> None:
        """The flags as they were (``resume``: the envs that were put back where they were)."""
        self.flags[:] = flags
