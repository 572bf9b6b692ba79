"""What the front and every backend say to each other: the commands, their payload records,
the statuses, the reply record and the errors raised in an env, rebuilt in the parent.

Backend-neutral: the process backend frames these records on its pipes (``_process.wire``), the
parent's own envs take them as Python objects (``_process.local``) and Ray carries them in actor
calls (``_ray``). Nothing here knows pipes, processes or Ray.
"""

from __future__ import annotations

import importlib
import pickle
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from subvec.errors import EnvError, RemoteEnvError, RemoteTraceback, add_note

__all__ = [
    "CallPayload",
    "ChunkBlockSpec",
    "Command",
    "EnvSnapshot",
    "ErrorRecord",
    "PerEnv",
    "ReconfigurePayload",
    "ResetOptionsPayload",
    "ResetPayload",
    "RestorePayload",
    "SetAttrPayload",
    "Status",
    "StepEnvsPayload",
    "UnitReply",
    "raise_first",
    "rebuild_remote_error",
    "with_remote_cause",
]


def _dumps(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


class Command(IntEnum):
    """Parent -> worker."""

    ATTACH = 1  # payload: AttachSpec; map the shared block, bind the envs' rows
    RESET = 2  # payload: ResetPayload
    #: the short form of a STEP_ENVS of every env of a unit with the actions in the block in
    #: the space's dtypes and one sub-step (the steady step): no payload, the same reply
    STEP = 3
    CALL = 4  # payload: CallPayload; get_attr is CALL of a non-callable
    SET_ATTR = 5  # payload: SetAttrPayload
    CLOSE = 6  # payload: empty; the worker closes its envs, replies, exits
    STEP_ENVS = 7  # payload: StepEnvsPayload; the step command of lock-step, async and chunks
    #: (no payload on the process wire: the worker's last chunk again, ``_process.chunks``)
    STATS = 8  # payload: empty; the reply is a pickled WorkerCounters
    SET_RESET_OPTIONS = 9  # payload: ResetOptionsPayload; the options of later autoresets
    #: payload: ReconfigurePayload; build new envs beside the old (checked), then swap or drop
    RECONFIGURE = 10
    SNAPSHOT = 11  # payload: empty; the reply: one EnvSnapshot per env of the unit
    RESTORE = 12  # payload: RestorePayload; each env back to its EnvSnapshot


class Status(IntEnum):
    """Worker -> parent."""

    OK = 0  # empty payload
    OK_PAYLOAD = 1  # pickled payload (infos, pipe-carried observations, call results)
    ERROR = 2  # pickled ErrorRecord
    READY = 3  # handshake after the envs are built: pickled WorkerHello


# --- payloads ------------------------------------------------------------------------------


class ResetPayload(NamedTuple):
    """RESET: one seed per env of the unit, the options (one dict every env gets, or one dict
    or None per env of the unit; None: each env's stored options, see
    :class:`ResetOptionsPayload`), and which envs reset (None: all)."""

    seeds: Sequence[int | None]
    options: dict[str, Any] | Sequence[dict[str, Any] | None] | None
    mask: Sequence[bool] | None
    #: the envs' stored options, one per env, kept before they reset: a replacement (restarted,
    #: rebuilt, recycled) has none yet (None: none are stored)
    stored: Sequence[dict[str, Any] | None] | None = None


class ResetOptionsPayload(NamedTuple):
    """SET_RESET_OPTIONS: the options these envs (local indices) reset with from now on when
    no options are named for them (their autoresets); None clears an env's."""

    envs: Sequence[int]
    options: Sequence[dict[str, Any] | None]


class ChunkBlockSpec(NamedTuple):
    """The chunk block (``_process.chunks``): its segment's name (None where a backend keeps the
    chunk's arrays itself: Ray), for ``num_envs`` envs and chunks of up to ``capacity``
    sub-steps, with or without observation rows. A unit derives the layout from these and
    its spaces (``_process.chunks.plan_chunk_block``)."""

    name: str | None
    num_envs: int
    capacity: int
    obs_rows: bool


class StepEnvsPayload(NamedTuple):
    """STEP_ENVS, the one step command: step these envs (local indices, ascending; None:
    every env of the unit, a lock-step ``step()``) ``substeps`` times each, with these
    actions, by value, or (None) with the actions in their rows of the block, in the space's
    dtypes or in ``action_dtypes``. The reply is a :class:`UnitReply` (or a plain OK): an env
    that raises is reported in its ``errors`` as ``(local env, ErrorRecord)`` and the others
    still step; the front's ``step()`` then raises the first of them.

    With a chunk ``block`` it is an action chunk of K = ``substeps`` (``step_chunk``,
    ``send_chunk``; ``_process.chunks.run_chunk``): each env runs K sub-steps before the unit
    answers, the actions and per-sub-step results in the chunk block ``block`` (actions by
    value: the unit's rows of each action leaf, ``(unit's envs, K, *shape)``). The reply
    then holds chunk events ``(local env, sub-step, info)``; an env that raises stops at that
    sub-step, is reported in ``errors``, and the unit's other envs run their chunk."""

    envs: Sequence[int] | None
    actions: Sequence[Any] | None
    #: sub-steps each env runs before the unit answers (``step()`` and ``send()``: 1)
    substeps: int = 1
    #: a chunk's: stop an env after the sub-step its episode ended in
    stop_on_done: bool = False
    #: a chunk's: report every sub-step's observation
    all_obs: bool = False
    #: a chunk's block (None: Ray, whose actors answer with their arrays)
    block: ChunkBlockSpec | None = None
    #: the dtypes the parent stored the actions in the block with, ``np.dtype.str`` per
    #: action leaf, where they are not the space's (None: the space's)
    action_dtypes: tuple[str, ...] | None = None

    @property
    def is_chunk(self) -> bool:
        """Whether this is an action chunk (it names the chunk's block: ``step_chunk``, or
        ``send_chunk`` of any K, one sub-step included)."""
        return self.block is not None


class CallPayload(NamedTuple):
    """CALL: ``env.get_wrapper_attr(name)``, called with the arguments if callable, on the
    unit's envs ``envs`` (local indices, in that order, repeats run again; None: every env).
    The reply holds one result per env called, in that order."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    envs: Sequence[int] | None = None
    #: run ``function(env, *args, **kwargs)`` instead of the attribute ``name`` (the SB3
    #: face's per-env operations: a module-level function, pickled by reference)
    function: Callable[..., Any] | None = None


class PerEnv:
    """A call argument that differs per env: the ``j``-th env a call addresses receives
    ``values[j]`` (``call("set_init_state", PerEnv(states), env_ids=ids)``: env ``ids[j]``
    gets ``states[j]``; without ``env_ids``, env ``i`` gets ``values[i]``). Any positional or
    keyword argument of ``call`` (and of the SB3 face's ``env_method``) may be one; the
    others go to every env alike.

    Args:
        values: one value per env called, in the order of the call's ``env_ids`` (default:
            env order).
    """

    __slots__ = ("values",)

    def __init__(self, values: Sequence[Any]) -> None:
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
            raise TypeError(
                f"PerEnv takes a sequence of one value per env, got {type(values).__name__}"
            )
        self.values = list(values)

    def __repr__(self) -> str:
        return f"PerEnv({self.values!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is PerEnv and other.values == self.values

    __hash__ = None  # type: ignore[assignment]

    @staticmethod
    def in_call(args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        """Whether any argument of a call is a :class:`PerEnv`."""
        return any(type(a) is PerEnv for a in args) or any(
            type(v) is PerEnv for v in kwargs.values()
        )

    @staticmethod
    def check(args: Sequence[Any], kwargs: dict[str, Any], count: int, name: str) -> None:
        """Every :class:`PerEnv` argument of a call of ``name`` on ``count`` envs has
        ``count`` values.

        Raises:
            ValueError: one has another length (named: its position or keyword).
        """
        named = [(f"argument {j}", a) for j, a in enumerate(args)]
        named += [(f"keyword {k!r}", v) for k, v in kwargs.items()]
        for where, arg in named:
            if type(arg) is PerEnv and len(arg.values) != count:
                raise ValueError(
                    f"call({name!r}): PerEnv {where} has {len(arg.values)} values, expected "
                    f"one per env called ({count})"
                )

    @staticmethod
    def pick(
        args: tuple[Any, ...], kwargs: dict[str, Any], positions: Sequence[int]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments with each :class:`PerEnv` cut down to ``values[p]`` for the
        ``p`` of ``positions`` (a unit's share of the call, in its order)."""

        def cut(arg: Any) -> Any:
            if type(arg) is PerEnv:
                return PerEnv([arg.values[p] for p in positions])
            return arg

        return tuple(cut(a) for a in args), {k: cut(v) for k, v in kwargs.items()}

    @staticmethod
    def of_env(
        args: Sequence[Any], kwargs: dict[str, Any], j: int
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments the ``j``-th env called receives: each :class:`PerEnv` replaced by
        its ``values[j]``."""

        def value(arg: Any) -> Any:
            return arg.values[j] if type(arg) is PerEnv else arg

        return tuple(value(a) for a in args), {k: value(v) for k, v in kwargs.items()}


class ReconfigurePayload(NamedTuple):
    """RECONFIGURE, in two steps: with ``factories``, build a new env for each of the unit's
    envs ``envs`` (local indices) beside the old ones and check its spaces against the old
    one's (an error drops them all, the old envs stay); without, ``commit``: swap the built
    envs in (closing the old ones), or drop them."""

    envs: Sequence[int]
    #: one cloudpickled factory per env of ``envs`` (None: the second step)
    factories: Sequence[bytes] | None = None
    commit: bool = False


class EnvSnapshot(NamedTuple):
    """One env as ``suspend()`` found it: its own state, where it has the hook (``get_state``),
    and what its unit keeps of it (NEXT_STEP's pending reset, a frozen env's observation)."""

    has_state: bool
    state: Any
    needs_reset: bool
    final_obs: Any


class RestorePayload(NamedTuple):
    """RESTORE: the unit's envs, in order, back to their snapshots (those with a state get
    ``set_state(state)``; the others keep the reset they just had)."""

    snapshots: Sequence[EnvSnapshot]


class SetAttrPayload(NamedTuple):
    """SET_ATTR: one value per env of the unit, or per env of ``envs`` (local indices)."""

    name: str
    values: Sequence[Any]
    envs: Sequence[int] | None = None


# --- remote errors -------------------------------------------------------------------------


@dataclass
class ErrorRecord:
    """An exception raised in a worker, in a form that always pickles."""

    pickled: bytes | None  # the exception itself when it pickles (keeps type and attributes)
    type_module: str
    type_qualname: str
    message: str
    traceback_text: str
    env_index: int | None
    command: str

    @classmethod
    def capture(cls, exc: BaseException, env_index: int | None, command: str) -> ErrorRecord:
        tb_text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        pickled: bytes | None = None
        try:
            data = _dumps(exc)
            pickle.loads(data)  # some exceptions pickle but fail to unpickle (custom __init__)
            pickled = data
        except Exception:
            pass  # sent without it: type name, message and traceback text still go
        return cls(
            pickled=pickled,
            type_module=type(exc).__module__,
            type_qualname=type(exc).__qualname__,
            message=str(exc),
            traceback_text=tb_text,
            env_index=env_index,
            command=command,
        )


_remote_classes: dict[type[BaseException], type[BaseException]] = {}


def _remote_class(base: type[BaseException]) -> type[BaseException] | None:
    """A subclass of both ``base`` and EnvError, cached so ``except`` and ``type()`` are stable."""
    if issubclass(base, EnvError):
        return base
    if base in _remote_classes:
        return _remote_classes[base]

    def __str__(self: BaseException) -> str:
        inner = base.__str__(self)
        where = (
            f"env {getattr(self, 'env_index', '?')} (worker pid {getattr(self, 'worker_pid', '?')})"
        )
        return f"{inner} [raised in {where} during {getattr(self, 'command', '?')}]"

    def __reduce__(self: BaseException) -> tuple[Any, ...]:
        return (_rebuild_pickled, (base, self.args, dict(self.__dict__)))

    try:
        cls = type(base.__name__, (base, EnvError), {"__str__": __str__, "__reduce__": __reduce__})
    except TypeError:  # layout conflict or a final class: fall back to RemoteEnvError
        return None
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    _remote_classes[base] = cls
    return cls


def _rebuild_pickled(
    base: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException:
    cls = _remote_class(base) or RemoteEnvError
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def _import_type(module: str, qualname: str) -> type[BaseException] | None:
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return obj
    return None


def rebuild_remote_error(record: ErrorRecord, worker_pid: int | None) -> BaseException:
    """Turn a worker's ErrorRecord into an exception of the original type that is also an
    EnvError, naming the env and worker, with the remote traceback as ``__cause__``."""
    original: BaseException | None = None
    if record.pickled is not None:
        try:
            original = pickle.loads(record.pickled)
        except Exception:
            original = None
    if original is not None:
        base: type[BaseException] | None = type(original)
        args: tuple[Any, ...] = original.args
        state = dict(getattr(original, "__dict__", {}))
    else:
        base = _import_type(record.type_module, record.type_qualname)
        args = (record.message,)
        state = {}
    cls = _remote_class(base) if base is not None else None
    exc: BaseException
    if cls is None:
        exc = RemoteEnvError(f"{record.type_module}.{record.type_qualname}: {record.message}")
    else:
        try:
            exc = cls.__new__(cls, *args)
            exc.args = args
            exc.__dict__.update(state)
        except Exception:
            exc = RemoteEnvError(f"{record.type_module}.{record.type_qualname}: {record.message}")
    exc.env_index = record.env_index  # type: ignore[attr-defined]
    exc.worker_pid = worker_pid  # type: ignore[attr-defined]
    exc.command = record.command  # type: ignore[attr-defined]
    exc.remote_traceback = record.traceback_text  # type: ignore[attr-defined]
    exc.__cause__ = RemoteTraceback(record.traceback_text)
    return exc


def with_remote_cause(exc: BaseException) -> BaseException:
    """``exc`` with its remote traceback as ``__cause__`` again: pickling an exception drops
    its cause, and an env error from a Ray actor reaches the driver pickled."""
    text = getattr(exc, "remote_traceback", "")
    if text and exc.__cause__ is None:
        exc.__cause__ = RemoteTraceback(text)
    return exc


def raise_first(errors: Sequence[BaseException]) -> None:
    """Raise the first of a call's env errors (lowest env index first), noting the others."""
    if not errors:
        return
    first = errors[0]
    if len(errors) > 1:
        others = ", ".join(
            f"env {getattr(e, 'env_index', '?')}: {type(e).__name__}" for e in errors[1:]
        )
        add_note(first, f"{len(errors) - 1} more env(s) failed in the same call: {others}")
    raise first


# --- replies -------------------------------------------------------------------------------


class UnitReply(NamedTuple):
    """What a unit says back to a step or a reset beyond the batch arrays
    (``Status.OK_PAYLOAD``): its envs' info events (local env indices; a list of
    ``(env, info)`` or columns, see ``_infos``), the observations that travel by value
    (``[(local env, obs)]`` or None), and the envs whose step raised
    (``[(local env, ErrorRecord)]`` or None; the others still stepped)."""

    infos: Any
    obs: Sequence[tuple[int, Any]] | None
    errors: Sequence[tuple[int, ErrorRecord]] | None = None
    #: an action chunk's (a chunk ``block``): with ``all_obs`` and no observation rows in the
    #: blocks, each env's observations after its executed sub-steps ``[(local env, [obs,
    #: ...])]``; and, from a unit that keeps no block rows (Ray), its arrays ``(rewards,
    #: terminations, truncations, steps, observations)`` (observations ``(envs, K, ...)``
    #: with ``all_obs``, else ``(envs, ...)``, None when they travel by value)
    sub_obs: Sequence[tuple[int, list[Any]]] | None = None
    arrays: tuple[Any, ...] | None = None
