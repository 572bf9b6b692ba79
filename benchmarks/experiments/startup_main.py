"""Start-up of a CleanRL-like script: torch imported at the top, the env factory defined in the
script, the vector env built under the ``if __name__ == "__main__":`` guard.

Each worker's own memory (USS: pages no other process shares) and the constructor's wall time,
each run in a fresh interpreter (the first construction pays for starting the forkserver, as a
training script does; "again" is a second vector env built in the same script). ``async`` is
gymnasium's AsyncVectorEnv with its default context (fork on Linux); ``subvec-<ctx>`` is
SubprocVectorEnv with one worker per env. Run it from a directory without a ``subvec`` package
in it: the forkserver imports from its working directory first (Python 3.10-3.13 ignore the
parent's ``sys.path`` there).

    PYTHONPATH=. python benchmarks/experiments/startup_main.py --runs 5
    python benchmarks/experiments/startup_main.py --checkout before=/tmp/old --checkout after=.
    PYTHONPATH=. python benchmarks/experiments/startup_main.py --child subvec-forkserver 4

``--checkout label=path`` (repeatable) runs each configuration with ``PYTHONPATH=path``, the
checkouts interleaved within each round; every run waits (bounded) until other processes use
less than ``--quiet`` cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import psutil
import torch  # what a CleanRL script imports at the top: the workers must not pay for it

IMPLS = ("async", "subvec-forkserver", "subvec-spawn", "subvec-fork")


def make_env(env_id: str) -> Any:
    def thunk() -> gym.Env[Any, Any]:
        return gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))

    return thunk


def child(impl: str, n: int) -> dict[str, Any]:
    import subvec

    fns = [make_env("CartPole-v1") for _ in range(n)]
    started = time.perf_counter()
    if impl == "async":
        envs: Any = gym.vector.AsyncVectorEnv(fns)
        pids = [p.pid for p in envs.processes]
    else:
        envs = subvec.SubprocVectorEnv(fns, num_workers=n, context=impl.split("-", 1)[1])
        pids = envs.worker_pids
    built = time.perf_counter() - started
    envs.reset(seed=0)
    uss = [psutil.Process(pid).memory_full_info().uss / 2**20 for pid in pids]
    envs.close()
    # A second vector env in the same script: the forkserver (if any) is running by now.
    started = time.perf_counter()
    if impl == "async":
        envs = gym.vector.AsyncVectorEnv(fns)
    else:
        envs = subvec.SubprocVectorEnv(fns, num_workers=n, context=impl.split("-", 1)[1])
    again = time.perf_counter() - started
    envs.close()
    return {"impl": impl, "n": n, "start_s": built, "again_s": again, "uss_mb": uss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "N"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--checkout", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--quiet", type=float, default=0.3)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child[0], int(args.child[1]))), flush=True)
        return
    assert torch.__version__
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import bench_vector as bv  # the suite's quiet-machine wait

    checkouts = [c.split("=", 1) for c in args.checkout] or [["this", os.getcwd()]]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.runs):
        for impl in args.impls.split(","):
            for label, path in checkouts:
                if impl == "async" and label != checkouts[0][0]:
                    continue  # gymnasium's own: the same in every checkout
                bv.wait_for_quiet(args.quiet, 60.0)
                env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()))
                cmd = [sys.executable, __file__, "--child", impl, str(args.n)]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
                if out.returncode or not lines:
                    print(f"{label} {impl} failed:\n{out.stderr[-3000:]}", flush=True)
                    continue
                line = lines[-1]
                runs.setdefault((label, impl), []).append(json.loads(line[len("RESULT ") :]))
    for (label, impl), rs in runs.items():
        start = statistics.median(r["start_s"] for r in rs)
        again = statistics.median(r["again_s"] for r in rs)
        uss = statistics.median(statistics.median(r["uss_mb"]) for r in rs)
        starts = ", ".join(f"{r['start_s']:.2f}" for r in rs)
        agains = ", ".join(f"{r['again_s']:.2f}" for r in rs)
        usses = ", ".join(f"{statistics.median(r['uss_mb']):.1f}" for r in rs)
        print(
            f"{label:8s} {impl:18s} x{args.n}: start {start:.2f} s ({starts}); "
            f"again {again:.2f} s ({agains}); USS per worker {uss:.1f} MB ({usses})"
        )


if __name__ == "__main__":
    main()
