"""subvec: fast, trustworthy process-based vector environments.

General layout (lower layers never import higher ones):

    _requires         what must be installed (checked first)
    errors            the exception hierarchy
    _commands         what the front and every backend say: commands, payload records, the
                      reply record (UnitReply), remote errors
    _protocol         the pipe wire: framing, the block's attach spec, STEP_ENVS bytes
    _spaces, _shm     space -> shared-memory layout; the block and its views
    _seeding          seed -> per-env seeds
    _slab             EnvSlab: stepping k envs in-process, action chunks too (no multiprocessing)
    _infos, _merge    infos on the wire and in the block; one merger per info_format
    _batch            the batch arrays the front reads, whichever backend made them
    _block            the block's schema: regions, observation slots, row binding (both sides)
    _chunks           the chunk block (per-sub-step results) and one chunk run on a unit
    _plan             the process layout: workers, env ranges, spin, partner (a pure function)
    _gpus             GPU discovery, the EGL index, a worker's GPU and worker_env variables
    _topology         NUMA discovery and placement (next to the workers' GPUs)
    _starts           start tokens (max_concurrent_starts) and factory retries (build_retries)
    _bootstrap        how a worker starts: no re-run of the script, the parent's env registry,
                      the kernel-level tie to the parent's life
    _threads          thread caps inside a worker (environment, loaded BLAS, torch)
    _worker           the worker process: cap threads, set its environment, pin, build envs,
                      serve commands
    _backend          the face every backend shows the front (units, send, collect, restart)
    _units            the front's map of units and the one replace-and-reset driver
    _results          per-env results out of a unit's reply (lock-step and async alike),
                      the lock-step results off the steady path
    _pool, _local     backends: worker processes; the parent's own envs (parent_envs)
    _failures         the failure policy (raise, or restart and report) and the front's
                      recovery: lock-step restarts, broken state, rebuilds
    _stats            per-worker statistics (stats()) and a process's resident memory
    _recycle          recycling: workers replaced between episodes (the front's Recycler)
    _state            the front's call states and guard errors (shared with its components)
    _options          reset options: the reset(options=) forms, the mask, stored options
    _async            the front's asynchronous engine: async_reset/send/recv/drain
    _calls            the front's mixin: call, get_attr, set_attr, render
    _chunk_front      step_chunk's component of the front (action chunks run inside the units)
    _pickling         what travels by value to a worker or actor (cloudpickle, file names kept)
    _setup            the front's construction: hellos, option checks, spaces, nest copies
    _exchange         the front's lock-step exchange: send a command to the units, collect
                      with the failure policy (restarts), the answers as parts, close
    _observations     the front's observation batch: slots, by-value observations, the batch
                      handed out
    _step_results     the front's step results: restarted envs, final observations, infos
    _front            the gymnasium VectorEnv contract over backends
    vector            SubprocVectorEnv: the process backend's public class
    proxy             remote(envs): attribute-style forwarding to any vector env's call()
    factory           make_vec (and the kwargs checks the SB3 face reuses)
    _sb3_ops          per-env operations the SB3 face runs in the workers (no SB3 import)
    sb3               the Stable-Baselines3 VecEnv (imports SB3; never imported from here)
    _ray, ray         the Ray backend (actors holding SubprocVectorEnvs) and RayVectorEnv
                      (import ray; never imported from here)

``import subvec`` never imports torch, Stable-Baselines3 or ray.
"""

from subvec import _requires  # noqa: F401  (first: says so plainly if gymnasium is too old)
from subvec.errors import (
    BrokenVectorEnvError,
    EnvError,
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
    "MissingMainGuardError",
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
