"""subvec: fast, trustworthy process-based vector environments.

Layout: two rooms and what they share (tests/test_rooms.py holds the rules: the front imports
no process or Ray module, no backend imports the front, no import cycle).

Shared by both rooms (flat):
    _compat           every difference between the gymnasium versions (imported first)
    _requires         what an optional extra's module says when its package is missing
    errors            the exception hierarchy
    _commands         what the front and every backend say: commands, payload records, the
                      reply record (UnitReply), remote errors
    _backend          the face every backend shows the front (units, send, collect, restart)
    _batch            the batch arrays the front reads, whichever backend made them
    _spaces           space -> layout of the batch and rows; action and observation leaves
    _seeding          seed -> per-env seeds
    _slab             EnvSlab: stepping k envs in-process, action chunks too
    _infos            infos on the wire and in the block
    _pickling         what travels by value to a worker or actor (cloudpickle, file names kept)

_front/: the gymnasium VectorEnv contract over any backend
    front             VectorFront: the state machine and the public calls
    setup             construction: hellos, option checks, spaces, nest copies
    state             the call states and guard errors (shared with its components)
    units             the map of units and the one replace-and-reset driver
    exchange          the lock-step exchange: commands to the units, collect with the
                      failure policy, the answers as parts, close
    recovery          the failure policy and lock-step recovery: restarts, broken state
    options           reset options: the reset(options=) forms, the mask, stored options
    observations      the observation batch: slots, by-value observations, the batch out
    step_results      a step's results: restarted envs, final observations, infos
    results           per-env results out of a unit's reply (lock-step and async alike)
    merge             one info merger per info_format
    stepping          the asynchronous engine: async_reset/send/recv/drain
    chunk             step_chunk's component (action chunks run inside the units)
    recycle           recycling: workers replaced between episodes
    async_calls       the mixin for async_reset, send, recv, drain (hands over to stepping)
    calls             the mixin for call, get_attr, set_attr, render

_process/: the process backend
    plan              the layout: workers, env ranges, spin, partner (a pure function)
    shm, block        shared segments and their views; the block's schema and row binding
    wire              the pipe wire: framing, the block's attach spec, STEP_ENVS bytes
    wake              the futex protocol's words, the probe and the choice of protocol
    chunks            the chunk block (per-sub-step results) and one chunk run on a unit
    gpus, topology    GPU discovery and variables; NUMA discovery and placement
    starts            start tokens (max_concurrent_starts) and factory retries
    bootstrap         how a worker starts: no re-run of the script, the registry, the tie
                      to the parent's life
    threads           thread caps inside a worker (environment, loaded BLAS, torch)
    worker            the worker process: cap threads, set its environment, pin, build envs,
                      serve commands
    pool, pool_*      the worker processes as a backend: records and cleanup, the futex
                      waits, the pipes' quick round trip
    local             the parent's own envs (parent_envs) as a backend
    stats             per-worker statistics (stats()) and a process's resident memory

Public classes and faces (they see both rooms):
    vector            SubprocVectorEnv: the process backend's public class
    _inproc           InProcessVectorEnv: the front over the parent's own envs (tests)
    proxy             remote(envs): attribute-style forwarding to any vector env's call()
    factory           make_vec (and the kwargs checks the SB3 face reuses)
    _sb3_ops          per-env operations the SB3 face runs in the workers (no SB3 import)
    sb3               the Stable-Baselines3 VecEnv (imports SB3; never imported from here)
    _ray, _ray_actor  the Ray backend: the driver's side, and the actors holding
                      SubprocVectorEnvs (import ray; never imported from here)
    ray               RayVectorEnv (imports ray; never imported from here)

``import subvec`` never imports torch, Stable-Baselines3 or ray.
"""

from subvec import _compat  # noqa: F401  (first: says so plainly if gymnasium is too old)
from subvec._commands import PerEnv
from subvec.errors import (
    BrokenVectorEnvError,
    EnvError,
    LateBindingWarning,
    MissingMainGuardError,
    PlacementError,
    RecvTimeoutError,
    RemoteEnvError,
    SharedMemoryTooSmallError,
    SubvecError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from subvec.factory import make_vec
from subvec.proxy import RemoteProxy, remote
from subvec.vector import SubprocVectorEnv

__version__ = "0.1.0"

__all__ = [
    "BrokenVectorEnvError",
    "EnvError",
    "LateBindingWarning",
    "MissingMainGuardError",
    "PerEnv",
    "PlacementError",
    "RecvTimeoutError",
    "RemoteEnvError",
    "RemoteProxy",
    "SharedMemoryTooSmallError",
    "SubprocVectorEnv",
    "SubvecError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "__version__",
    "make_vec",
    "remote",
]
