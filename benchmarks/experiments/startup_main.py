"""Start-up of a CleanRL-like script: torch imported at the top, the env factory defined in the
script, the vector env built under the ``if __name__ == "__main__":`` guard.

Each worker's own memory (USS: pages no other process shares) and the constructor's wall time,
each run in a fresh interpreter (the first construction pays for starting the forkserver, as a
training script does). ``async`` is gymnasium's AsyncVectorEnv with its default context (fork
on Linux); ``subvec-<ctx>`` is SubprocVectorEnv with one worker per env.

    PYTHONPATH=. python benchmarks/experiments/startup_main.py --runs 5
    PYTHONPATH=. python benchmarks/experiments/startup_main.py --child subvec-forkserver 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
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
    modules = "torch" in sys.modules
    envs.close()
    return {"impl": impl, "n": n, "start_s": built, "uss_mb": uss, "torch_in_parent": modules}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "N"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--impls", default=",".join(IMPLS))
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child[0], int(args.child[1]))), flush=True)
        return
    assert torch.__version__
    for impl in args.impls.split(","):
        runs = []
        for _ in range(args.runs):
            cmd = [sys.executable, __file__, "--child", impl, str(args.n)]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
            line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
            runs.append(json.loads(line[len("RESULT ") :]))
        start = statistics.median(r["start_s"] for r in runs)
        uss = statistics.median(statistics.median(r["uss_mb"]) for r in runs)
        starts = ", ".join(f"{r['start_s']:.2f}" for r in runs)
        print(
            f"{impl:18s} x{args.n}: start {start:.2f} s (runs: {starts}); "
            f"USS per worker {uss:.1f} MB"
        )


if __name__ == "__main__":
    main()
