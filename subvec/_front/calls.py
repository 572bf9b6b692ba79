"""Calls and attributes on the front: ``call``, ``get_attr``, ``set_attr``, ``render``, each on
every env or on the envs of ``env_ids``.

A call goes to every unit, or (with ``env_ids``) only to the units holding those envs, each
told which of its envs to call, in the caller's order; the answers are dealt back into that
order. A mixin of :class:`subvec._front.front.VectorFront`: it uses the front's state machine and
its lock-step exchange (``_front.exchange``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from subvec._backend import Unit
from subvec._commands import CallPayload, Command, PerEnv, SetAttrPayload
from subvec._front.exchange import LockstepExchange
from subvec._front.merge import Part
from subvec._front.state import _State
from subvec._front.units import Units

__all__ = ["EnvCalls", "EnvIds"]

#: ``env_ids=``: env indices (a list, tuple, range or 1-d integer array), or None for all
EnvIds = Sequence[int] | np.ndarray | None


class CallSteps:
    """The front's steps of one call, which its mixins (:class:`EnvCalls`, ``EnvReconfigure``,
    ``Suspension``) drive: declared here for the type checker; ``VectorFront`` defines them."""

    if TYPE_CHECKING:

        def _begin(self, state: _State) -> None: ...
        def _enter(self, state: _State) -> None: ...
        def _collect(
            self,
            state: _State,
            timeout: float | None = None,
            only: frozenset[int] | None = None,
        ) -> list[Part]: ...


class EnvCalls(CallSteps):
    """The calls and attributes of :class:`subvec._front.front.VectorFront` (a mixin)."""

    # The front's, declared for the type checker.
    num_envs: int
    _units: Units
    _call_ids: list[int] | None
    _call_units: frozenset[int] | None
    _exchange: LockstepExchange

    if TYPE_CHECKING:

        def _finish(self, state: _State, method: str) -> None: ...

    def call_async(self, name: str, /, *args: Any, env_ids: EnvIds = None, **kwargs: Any) -> None:
        """Start calling method ``name`` of the envs; :meth:`call_wait` returns the results.

        Args:
            name: a method or attribute of the envs (through their wrappers).
            *args: positional arguments of the call; a :class:`subvec.PerEnv` gives the
                ``j``-th env called its ``j``-th value (env ``env_ids[j]``, or env ``j``).
            env_ids: the envs to call, in the order of the results (default: every env).
                Only the workers holding them get the command. (A keyword argument of the
                method named ``env_ids`` cannot be passed through ``call``.)
            **kwargs: keyword arguments of the call.

        Raises:
            ValueError, TypeError: an unknown, negative, repeated or non-integer env id, or
                a PerEnv argument without one value per env called (nothing is sent).
            AlreadyPendingCallError: another call is pending.
            ClosedEnvironmentError: the vector env is closed.
        """
        self._begin(_State.WAITING_CALL)
        ids = self._checked_env_ids(env_ids, "call")
        self._start_call(CallPayload(name, args, kwargs), ids)

    def _start_call(self, payload: CallPayload, ids: list[int] | None) -> None:
        """Send a CALL to every unit (``ids`` None) or to the units holding ``ids`` (checked;
        repeats allowed), each told which of its envs to call, in the order of ``ids``."""
        per_env = PerEnv.in_call(payload.args, payload.kwargs)
        if per_env:  # checked before anything is sent
            count = self.num_envs if ids is None else len(ids)
            PerEnv.check(payload.args, payload.kwargs, count, payload.name)
        self._call_ids = ids
        if ids is None:
            self._call_units = None
            if not per_env:
                self._exchange.send(Command.CALL, payload)
            else:

                def each_unit(unit: Unit) -> CallPayload:
                    args, kwargs = PerEnv.pick(
                        payload.args, payload.kwargs, range(unit.lo, unit.hi)
                    )
                    return payload._replace(args=args, kwargs=kwargs)

                self._exchange.send(Command.CALL, per_unit=each_unit)
        else:
            targets = self._by_unit(ids)
            self._call_units = frozenset(targets)
            # each unit's envs' positions in ``ids``: its share of the PerEnv arguments
            positions: dict[int, list[int]] = {}
            if per_env:
                for j, e in enumerate(ids):
                    positions.setdefault(self._units.index_of_env(e), []).append(j)
            if targets:

                def per_unit(unit: Unit) -> CallPayload:
                    part = payload._replace(envs=[e - unit.lo for e in targets[unit.index]])
                    if not per_env:
                        return part
                    args, kwargs = PerEnv.pick(payload.args, payload.kwargs, positions[unit.index])
                    return part._replace(args=args, kwargs=kwargs)

                self._exchange.send(Command.CALL, per_unit=per_unit, only=self._call_units)
        self._enter(_State.WAITING_CALL)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call :meth:`call_async` started.

        Args:
            timeout: seconds to wait (None: the constructor's ``timeout``).

        Returns:
            One result per env called, in the order of its ``env_ids`` (default: env order;
            the attribute itself if not callable).

        Raises:
            NoAsyncCallError: no call is pending.
            EnvError: an env raised (its type kept, naming the env).
            WorkerDiedError, WorkerTimeoutError: a worker died or did not answer in time.
        """
        self._finish(_State.WAITING_CALL, "call_wait")
        ids, only = self._call_ids, self._call_units
        parts = self._collect(_State.WAITING_CALL, timeout, only)
        if ids is None:
            results: list[Any] = []
            for _, data in parts:
                results.extend(data)
            return tuple(results)
        # Each unit answered for its envs in the order of ``ids``: deal them back out.
        by_lo = {lo: iter(data) for lo, data in parts}
        units = self._units
        return tuple(next(by_lo[units.unit(units.index_of_env(e)).lo]) for e in ids)

    def call(self, name: str, *args: Any, env_ids: EnvIds = None, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of the envs (or read the attribute if not callable).

        Args:
            name: a method or attribute of the envs (through their wrappers).
            *args, **kwargs: the call's arguments; a :class:`subvec.PerEnv` argument gives
                the ``j``-th env called its ``j``-th value.
            env_ids: the envs to call (default: every env); the other envs' workers stay idle.

        Returns:
            One result per env, in the order of ``env_ids`` (default: env order).

        Raises:
            ValueError, TypeError: an unknown, negative, repeated or non-integer env id, or
                a PerEnv argument without one value per env called.
            EnvError: an env raised (its type kept, naming the env).
        """
        self.call_async(name, *args, env_ids=env_ids, **kwargs)
        return self.call_wait()

    def _call_envs(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        env_ids: Sequence[int] | None,
        name: str,
    ) -> tuple[Any, ...]:
        """``function(env, *args)`` on each env of ``env_ids`` (valid indices; repeats run
        again; None: every env), results in that order: the SB3 face's per-env operations.
        ``name`` names the operation in error reports."""
        self._begin(_State.WAITING_CALL)
        ids = None if env_ids is None else [int(e) for e in env_ids]
        self._start_call(CallPayload(name, args, {}, None, function), ids)
        return self.call_wait()

    def get_attr(self, name: str, env_ids: EnvIds = None) -> tuple[Any, ...]:
        """The attribute ``name`` of the envs (through wrappers).

        Args:
            name: the attribute.
            env_ids: the envs to read (default: every env).

        Returns:
            One value per env, in the order of ``env_ids`` (default: env order).

        Raises:
            ValueError, TypeError: an unknown, negative, repeated or non-integer env id.
        """
        return self.call(name, env_ids=env_ids)

    def set_attr(
        self, name: str, values: list[Any] | tuple[Any, ...] | Any, env_ids: EnvIds = None
    ) -> None:
        """Set ``name`` on the envs.

        Args:
            name: the attribute (set through wrappers).
            values: a list/tuple of one value per env of ``env_ids``, or one value for all.
            env_ids: the envs to set (default: every env); the other envs' workers stay idle.

        Raises:
            ValueError: a list/tuple whose length is not ``len(env_ids)`` (``num_envs``), or
                an unknown, negative or repeated env id (nothing is set).
            TypeError: a non-integer env id.
            EnvError: an env raised (its type kept, naming the env).
        """
        self._begin(_State.WAITING_CALL)
        ids = self._checked_env_ids(env_ids, "set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * (self.num_envs if ids is None else len(ids))
        if ids is None:
            if len(values) != self.num_envs:
                raise ValueError(
                    "Values must be a list or tuple with length equal to the number of "
                    f"environments. Got `{len(values)}` values for {self.num_envs} environments."
                )
            per_env = list(values)
            self._exchange.send(
                Command.SET_ATTR, per_unit=lambda u: SetAttrPayload(name, per_env[u.lo : u.hi])
            )
            self._enter(_State.WAITING_CALL)
            self._collect(_State.WAITING_CALL, None)
            return
        if len(values) != len(ids):
            raise ValueError(
                f"set_attr({name!r}): a list or tuple of values needs one value per env of "
                f"env_ids ({len(ids)}: {ids}), got {len(values)} values; pass one value "
                "(not a list) to set it on every env of env_ids"
            )
        value_of = dict(zip(ids, values))
        targets = self._by_unit(ids)
        if not targets:
            return

        def per_unit(unit: Unit) -> SetAttrPayload:
            envs = targets[unit.index]
            return SetAttrPayload(name, [value_of[e] for e in envs], [e - unit.lo for e in envs])

        only = frozenset(targets)
        self._exchange.send(Command.SET_ATTR, per_unit=per_unit, only=only)
        self._enter(_State.WAITING_CALL)
        self._collect(_State.WAITING_CALL, None, only)

    def render(self, env_ids: EnvIds = None) -> tuple[Any, ...] | None:
        """The frames of the envs, as ``call("render", env_ids=env_ids)``.

        Args:
            env_ids: the envs to render (default: every env).
        """
        return self.call("render", env_ids=env_ids)

    def _checked_env_ids(self, env_ids: EnvIds, where: str) -> list[int] | None:
        return checked_env_ids(env_ids, self.num_envs, where)

    def _by_unit(self, ids: Sequence[int]) -> dict[int, list[int]]:
        """The envs of ``ids`` (valid indices) by the index of the unit holding them, each
        unit's in the order of ``ids``."""
        targets: dict[int, list[int]] = {}
        for e in ids:
            targets.setdefault(self._units.index_of_env(e), []).append(e)
        return targets


def checked_env_ids(env_ids: EnvIds, num_envs: int, where: str) -> list[int] | None:
    """``env_ids`` as a list of distinct env indices in ``[0, num_envs)`` (None stays None): the
    one check of every ``env_ids=`` (calls, attributes, reset options, ``send``).

    Args:
        env_ids: what the caller passed.
        num_envs: the vector env's number of envs.
        where: the method, for the message (``"call"``).

    Returns:
        The indices, or None.

    Raises:
        TypeError: not a sequence of ints (a bare int, floats, bools, strings).
        ValueError: an index out of range, negative or repeated.
    """
    if env_ids is None:
        return None
    n = num_envs
    expected = f"a list, tuple or 1-d array of distinct env indices in [0, {n})"
    if isinstance(env_ids, (int, np.integer)):
        raise TypeError(
            f"{where}: env_ids must be {expected}, got the int {env_ids!r}; pass [{env_ids!r}]"
        )
    if isinstance(env_ids, np.ndarray):
        if env_ids.ndim != 1 or not (env_ids.size == 0 or np.issubdtype(env_ids.dtype, np.integer)):
            raise TypeError(
                f"{where}: env_ids must be {expected}, got an array of shape "
                f"{env_ids.shape} and dtype {env_ids.dtype}"
            )
        items: list[Any] = env_ids.tolist()
    elif isinstance(env_ids, (str, bytes, dict)) or not isinstance(env_ids, Iterable):
        raise TypeError(f"{where}: env_ids must be {expected}, got {env_ids!r}")
    else:
        items = list(env_ids)
    ids: list[int] = []
    for item in items:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise TypeError(
                f"{where}: env_ids must be {expected}, got {item!r} "
                f"({type(item).__name__}) in {items!r}"
            )
        ids.append(int(item))
    bad = [e for e in ids if not 0 <= e < n]
    if bad:
        raise ValueError(
            f"{where}: env_ids {bad} out of range: expected env indices in [0, {n}) (the "
            f"envs are 0..{n - 1}; negative indices are refused), got {ids}"
        )
    if len(set(ids)) != len(ids):
        repeated = sorted({e for e in ids if ids.count(e) > 1})
        raise ValueError(f"{where}: env_ids {ids} repeat env(s) {repeated}: expected each env once")
    return ids
