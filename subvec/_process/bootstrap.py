"""How a worker process starts: without the user's script, with what its factories need from
the script, and tied to the parent's life by the kernel where the platform allows.

**The main module.** Under spawn and forkserver, multiprocessing starts each child by running
the parent's main module again (``spawn.prepare`` -> ``_fixup_main_from_path`` or
``_fixup_main_from_name``, as ``__mp_main__``), so that objects pickled by reference to
``__main__`` can be found there. A worker needs none of that: its entry point lives in subvec
and the factories are cloudpickled, which sends functions and classes of ``__main__`` by value.
Running the script again costs each worker whatever the script imports at the top (torch: about
140 MB of the worker's own memory and over a second of start-up each), and a script without an
``if __name__ == "__main__":`` guard builds its vector env again in every worker, which dies
trying to start processes of its own. :func:`start` starts a worker with preparation data that
names no main module.

It does so through ``multiprocessing.spawn.get_preparation_data``, the one function that decides
(``init_main_from_name`` / ``init_main_from_path``; the same in 3.10-3.13, and read through the
module by ``popen_spawn_posix``, ``popen_forkserver`` and ``popen_spawn_win32`` at every start):
it is wrapped once, and the wrapper drops the two keys only while *this thread* is inside
:func:`start`. Every other caller, on any thread, gets multiprocessing's own answer. Hiding
``__main__.__file__`` and ``__spec__`` around ``process.start()`` would do the same for us but
be seen by every other thread meanwhile: a library starting a spawn process of its own at that
moment would lose its main module.

**What the factories need from the script.** Functions and classes travel with the factories;
modules they reference are imported by name. What does not travel is state the script built at
run time, and the one that matters is gymnasium's registry: an id the script registered (at the
top or inside its main guard) is not registered in a worker that does not run the script. The
parent sends its registry along (:func:`registry_snapshot`); the worker, once the factories are
unpickled (which imports the modules they name, and so their registrations), takes every spec
that it lacks or holds differently (:func:`adopt_registry`), as a SyncVectorEnv's factories would
see them. It first imports the packages on the way to each such spec's string entry point until
the id is registered (``ale_py`` for ``"ale_py.env:AtariEnv"``): a package that registers its
envs on import would otherwise register them again on ``gym.make``, over ours, with a warning
for each id.

**The parent's death.** A daemon thread in each worker waits on the parent's sentinel
(``subvec._process.worker``); it cannot run while the env is in native code that keeps the GIL. On
Linux the worker also asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), which
needs no GIL (:func:`tie_to_parent`). The kernel counts the *thread* that started the process as
its parent, so the parent asks for it only when it starts workers from its main thread
(:func:`lifeline_for`). Under forkserver the worker's parent is the forkserver, which exits once
every holder of its "alive" pipe has gone: the vector env's process and, by multiprocessing's
design, every child the forkserver made. Workers therefore close their copy: the forkserver then
exits when the parent does (its own interpreter shutdown: 0.15-0.3 s on the 2-vCPU VM), and the
kernel kills its workers. Anything else that holds the pipe (a child the parent forked, another
library's forkserver child) keeps the forkserver, and so the workers, alive: the watch thread is
then the only tie.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import multiprocessing
import multiprocessing.spawn
import os
import pickle
import select
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
from gymnasium.envs.registration import EnvSpec, registry

from subvec import _pickling as pickling
from subvec.errors import MissingMainGuardError

__all__ = [
    "Lifeline",
    "adopt_registry",
    "lifeline_for",
    "registry_snapshot",
    "start",
    "tie_to_parent",
]

# --- the main module -------------------------------------------------------------------------

_starting = threading.local()
_install_lock = threading.Lock()


def _without_main(original: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    @functools.wraps(original)
    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if getattr(_starting, "active", False):
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
        return data

    get_preparation_data._subvec_without_main = True  # type: ignore[attr-defined]
    return get_preparation_data


def _install() -> None:
    with _install_lock:
        current = multiprocessing.spawn.get_preparation_data
        if not getattr(current, "_subvec_without_main", False):
            wrapped = _without_main(current)
            multiprocessing.spawn.get_preparation_data = wrapped  # type: ignore[assignment]


def start(process: Any) -> None:
    """Start ``process`` (a multiprocessing process of any start method) so that it does not run
    the parent's main module while it bootstraps.

    Raises:
        MissingMainGuardError: this process is itself a spawn or forkserver child still running
            its parent's main module (a script without a main guard that starts a process of its
            own), from which multiprocessing starts nothing.
    """
    _install()
    _starting.active = True
    try:
        process.start()
    except RuntimeError as exc:
        if not getattr(multiprocessing.current_process(), "_inheriting", False):
            raise
        raise MissingMainGuardError(
            "subvec cannot start its worker processes here: this process is a multiprocessing "
            "child (spawn or forkserver) that is still running its parent's script on start-up, "
            "and the script builds the vector env at the top level. Put the script's top-level "
            'code under `if __name__ == "__main__":`, or pass context="fork" to the vector env '
            "(fork starts workers without this step)"
        ) from exc
    finally:
        _starting.active = False


# --- gymnasium's registry ----------------------------------------------------------------------

_PLAIN_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})
_PLAIN_SEQUENCES = frozenset({tuple, list, frozenset, set})


def _plain(value: Any) -> bool:
    """Builtin data only (exact types): pickles by value with plain pickle, loads anywhere."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is dict:
        return all(type(k) in _PLAIN_SCALARS and _plain(v) for k, v in value.items())
    return kind in _PLAIN_SEQUENCES and all(_plain(v) for v in value)


def _plain_spec(spec: Any) -> bool:
    wrappers = spec.additional_wrappers or ()
    return (
        type(spec.entry_point) in _PLAIN_SCALARS
        and type(spec.vector_entry_point) in _PLAIN_SCALARS
        and _plain(spec.kwargs)
        and all(isinstance(w.entry_point, str) and _plain(w.kwargs) for w in wrappers)
    )


def registry_snapshot() -> bytes:
    """The parent's gymnasium registry as a worker takes it in :func:`adopt_registry`.

    Specs made of builtin data go as one plain pickle; the others (callable entry points, objects
    in their kwargs) one by one with cloudpickle, so that one that cannot travel costs only its
    own id. The objects that ``"__main__:name"`` entry points name go along too (the worker's
    ``__main__`` is not the script).
    """
    plain: dict[str, Any] = {}
    other: dict[str, bytes | str] = {}
    main_names: set[str] = set()
    for env_id, spec in list(registry.items()):
        for entry in (spec.entry_point, spec.vector_entry_point):
            if isinstance(entry, str) and entry.startswith("__main__:"):
                main_names.add(entry.split(":", 1)[1])
        if _plain_spec(spec):
            plain[env_id] = spec
            continue
        try:
            other[env_id] = pickling.dumps(spec)
        except Exception as exc:
            other[env_id] = f"its spec cannot be pickled ({type(exc).__name__}: {exc})"
    main = sys.modules["__main__"]
    main_objects: dict[str, bytes] = {}
    for name in sorted(main_names):
        if hasattr(main, name):
            try:
                main_objects[name] = pickling.dumps(getattr(main, name))
            except Exception:
                pass  # gym.make in the worker says the attribute is missing: that is the cause
    return pickle.dumps((plain, other, main_objects), protocol=pickle.HIGHEST_PROTOCOL)


def _import_registering_modules(shipped: dict[str, Any]) -> None:
    """Import the modules on the way to each shipped spec's string entry point (``a``, then
    ``a.b``, then ``a.b.c`` for ``"a.b.c:Env"``) until its id is registered here: a package that
    registers its envs on import (``ale_py``) must do so before we set the parent's spec, or
    ``gym.make`` would import it later and it would register them again, over ours, with an
    "Overriding environment" warning for each id. The parent has imported these modules; their
    envs need them at ``gym.make`` anyway."""
    ids_by_module: dict[str, list[str]] = {}
    for env_id, spec in shipped.items():
        for entry in (spec.entry_point, spec.vector_entry_point):
            if isinstance(entry, str) and ":" in entry:
                module = entry.split(":", 1)[0]
                if module != "__main__":
                    ids_by_module.setdefault(module, []).append(env_id)
    for module, ids in sorted(ids_by_module.items()):
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):
            if all(env_id in registry for env_id in ids):
                break
            name = ".".join(parts[:depth])
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
            except Exception:
                break  # gym.make imports it again and says why, should a factory need it


def _unavailable(env_id: str, reason: str, **kwargs: Any) -> Any:
    raise RuntimeError(
        f"gymnasium env {env_id!r} is registered in the parent process but cannot be registered "
        f"in the worker: {reason}. Register it in a module that the env factory imports (a "
        f"worker does not run the script), or give it a string entry point"
    )


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # kwargs that do not compare (arrays): take the parent's
        return False


def adopt_registry(snapshot: bytes) -> None:
    """Register in this worker every spec of the parent's registry that it lacks or holds
    differently (the parent's registry is what the factories would see in-process)."""
    plain, other, main_objects = pickle.loads(snapshot)
    main = sys.modules["__main__"]
    for name, blob in main_objects.items():
        if not hasattr(main, name):
            try:
                setattr(main, name, cloudpickle.loads(blob))
            except Exception:
                pass  # as in registry_snapshot: the entry point then names what is missing
    shipped: dict[str, Any] = {k: v for k, v in plain.items() if not _same(registry.get(k), v)}
    missing: dict[str, str] = {}  # id -> why its spec is not here
    for env_id, blob in other.items():
        if isinstance(blob, bytes):
            try:
                spec = cloudpickle.loads(blob)
            except Exception as exc:
                blob = f"its spec cannot be unpickled here ({type(exc).__name__}: {exc})"
            else:
                if not _same(registry.get(env_id), spec):
                    shipped[env_id] = spec
                continue
        if env_id not in registry:
            missing[env_id] = blob
    _import_registering_modules(shipped)
    for env_id, spec in shipped.items():
        if not _same(registry.get(env_id), spec):
            registry[env_id] = spec  # not register(): it would warn about overriding
    for env_id, reason in missing.items():
        if env_id not in registry:  # a spec that cannot come: its creator says why
            creator = functools.partial(_unavailable, env_id, reason)
            registry[env_id] = EnvSpec(id=env_id, entry_point=creator)


# --- the parent's death ------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Lifeline:
    """How a worker ties its life to the parent's.

    Attributes:
        start_method: the worker's multiprocessing start method.
        kernel: ask the kernel to kill the worker when its parent dies (Linux).
    """

    start_method: str
    kernel: bool


def lifeline_for(start_method: str) -> Lifeline:
    """The lifeline for a worker started now, from the calling thread."""
    # The kernel's "parent" is the thread that forked: a worker started from another thread
    # would die with that thread. The forkserver forks from its only thread.
    from_main = threading.current_thread() is threading.main_thread()
    kernel = sys.platform.startswith("linux") and (start_method == "forkserver" or from_main)
    return Lifeline(start_method, kernel)


def tie_to_parent(lifeline: Lifeline) -> None:
    """In the worker: die with the parent even inside native code that keeps the GIL.

    Exits at once if the parent is already gone.
    """
    parent = multiprocessing.parent_process()
    if lifeline.start_method == "forkserver":
        _release_forkserver()
    if not lifeline.kernel or parent is None:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return  # no prctl here: the parent watch thread is all there is
    # The parent may have died before the kernel knew to tell us: look once more.
    if lifeline.start_method == "forkserver":
        sentinel = parent.sentinel
        gone = sentinel is not None and bool(select.select([sentinel], [], [], 0)[0])
    else:
        gone = os.getppid() != parent.pid
    if gone:
        os._exit(0)


def _release_forkserver() -> None:
    """Close this worker's copy of the forkserver's "alive" pipe, so that the forkserver (our
    parent) exits as soon as the vector env's process does. A process started here with
    forkserver launches a forkserver of its own (multiprocessing does so in any forkserver child,
    whose ``_forkserver_pid`` is unset), so nothing here needs that copy."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if server is None or fd is None or getattr(server, "_forkserver_pid", None) is not None:
        return
    try:
        os.close(fd)
    except OSError:
        pass  # not ours to close after all: nothing held
    server._forkserver_alive_fd = None
