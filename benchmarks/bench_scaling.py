"""What each worker costs the parent per lock-step step, as the pool grows.

N one-env workers whose envs sleep 2 ms a step (``time.sleep``: the cores stay free for the
parent). For each N and each vector env, in a fresh interpreter: reset, warm up, then step
``--steps`` times and report

- the parent's CPU time (``getrusage(RUSAGE_SELF)``, user + system, every thread of the parent)
  per step divided by N: what one worker costs the one process that serves them all;
- the wall time per step minus the 2 ms of the env: the overhead a step adds to its slowest env;
- the workers' CPU time (``/proc/<pid>/schedstat``, time on a CPU) per step divided by N: on
  fewer cores than workers, the wall overhead is mostly this, scheduled on the cores there are.

Vector envs: ``futex`` (subvec with the futex protocol, ``SUBVEC_WAKE=futex``), ``pipes``
(subvec with the pipes alone, ``SUBVEC_WAKE=pipes``) and ``async`` (gymnasium's
AsyncVectorEnv, shared memory), and ``floor``: N bare forked processes that each block on a
pipe, sleep 2 ms and write one byte back, no env, no vector env (not in the default set). It
is what one process per worker costs on this machine before any vector env's work: its wall
overhead is the wake-ups and sleeps of N processes scheduled on the cores there are. Rounds
interleave the configurations; the table gives medians.

    python benchmarks/bench_scaling.py --workers 8,32,64,128 --rounds 3 \\
        --json benchmarks/results/scaling.jsonl --plot docs/img/scaling.svg
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

SLEEP_S = 0.002
IMPLS = ("futex", "pipes", "async")
FLOOR = "floor"


class SleepEnv(gym.Env[np.ndarray, int]):
    """A 4-float observation, two actions, a step that sleeps ``SLEEP_S``."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        time.sleep(SLEEP_S)
        return np.zeros(4, np.float32), 1.0, False, False, {}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _on_cpu(pids: list[int]) -> float:
    """Seconds the processes ``pids`` have spent on a CPU (0 where schedstat is missing)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total * 1e-9


class _Floor:
    """N forked processes: each waits for a byte on its own pipe, sleeps, answers on a shared
    pipe. The parent's step writes N bytes and reads N."""

    def __init__(self, workers: int) -> None:
        self.n = workers
        self.done_r, done_w = os.pipe()
        self.cmd_w: list[int] = []
        self.pids: list[int] = []
        for _ in range(workers):
            cmd_r, cmd_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker
                os.close(self.done_r)
                while os.read(cmd_r, 1) == b"s":
                    time.sleep(SLEEP_S)
                    os.write(done_w, b"x")
                os._exit(0)
            os.close(cmd_r)
            self.cmd_w.append(cmd_w)
            self.pids.append(pid)
        os.close(done_w)

    def step(self, _actions: Any) -> None:
        for fd in self.cmd_w:
            os.write(fd, b"s")
        got = 0
        while got < self.n:
            got += len(os.read(self.done_r, self.n - got))

    def reset(self, seed: int | None = None) -> None:
        pass

    def close(self) -> None:
        for fd in self.cmd_w:
            os.write(fd, b"q")
            os.close(fd)
        for pid in self.pids:
            os.waitpid(pid, 0)
        os.close(self.done_r)


def measure(impl: str, workers: int, steps: int) -> dict[str, Any]:
    """One configuration, in this interpreter."""
    fns = [SleepEnv] * workers
    if impl == FLOOR:
        envs: Any = _Floor(workers)
        wake = "pipes"
        pids = envs.pids
    elif impl == "async":
        envs = gym.vector.AsyncVectorEnv(fns, shared_memory=True)
        wake = "pipes"
        pids = [p.pid for p in envs.processes]
    else:
        os.environ["SUBVEC_WAKE"] = impl
        import subvec

        envs = subvec.SubprocVectorEnv(fns, num_workers=workers)
        wake = envs.layout.wake
        pids = list(envs.worker_pids)
    try:
        envs.reset(seed=0)
        actions = np.zeros(workers, np.int64)
        for _ in range(max(20, steps // 10)):
            envs.step(actions)
        cpu, wall, children = _cpu(), time.perf_counter(), _on_cpu(pids)
        for _ in range(steps):
            envs.step(actions)
        cpu, wall = _cpu() - cpu, time.perf_counter() - wall
        children = _on_cpu(pids) - children
    finally:
        envs.close()
    return {
        "impl": impl,
        "wake": wake,
        "workers": workers,
        "steps": steps,
        "parent_us_per_worker_step": cpu / steps / workers * 1e6,
        "overhead_ms_per_step": (wall / steps - SLEEP_S) * 1e3,
        "worker_us_per_worker_step": children / steps / workers * 1e6,
    }


def _one(impl: str, workers: int, steps: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--one", f"{impl}:{workers}", "--steps", str(steps)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: medians per (workers, impl)."""
    by: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault((row["workers"], row["impl"]), []).append(row)
    impls = [i for i in (*IMPLS, FLOOR) if any(k[1] == i for k in by)]
    head = "| workers | " + " | ".join(f"{i} parent us/worker/step" for i in impls)
    head += " | " + " | ".join(f"{i} overhead ms/step" for i in impls)
    head += " | " + " | ".join(f"{i} worker us/worker/step" for i in impls) + " |"
    lines = [head, "|---:" * (1 + 3 * len(impls)) + "|"]

    def med(n: int, impl: str, key: str) -> float:
        got = [r[key] for r in by[(n, impl)] if key in r]
        return statistics.median(got) if got else math.nan

    for n in sorted({k[0] for k in by}):
        cpu = [med(n, i, "parent_us_per_worker_step") for i in impls]
        ovh = [med(n, i, "overhead_ms_per_step") for i in impls]
        own = [med(n, i, "worker_us_per_worker_step") for i in impls]
        cells = [f"{c:.2f}" for c in cpu] + [f"{o:.2f}" for o in ovh] + [f"{w:.1f}" for w in own]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Two panels as an SVG file (no plotting library needed): parent CPU per worker and
    step, and wall overhead per step, against the number of workers (log scale)."""
    colours = {"futex": "#1b9e77", "pipes": "#d95f02", "async": "#7570b3"}
    keys = (
        ("parent_us_per_worker_step", "parent CPU us / worker / step"),
        ("overhead_ms_per_step", "wall overhead ms / step"),
    )
    ns = sorted({r["workers"] for r in rows})
    width, height, pad = 360, 260, 50
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" height="{height + 30}"'
        ' font-family="sans-serif" font-size="11">'
    ]

    def med(impl: str, key: str, n: int) -> float | None:
        got = [r[key] for r in rows if r["impl"] == impl and r["workers"] == n]
        return statistics.median(got) if got else None

    for panel, (key, label) in enumerate(keys):
        x0 = panel * width
        top = max(v for i in IMPLS for n in ns if (v := med(i, key, n)) is not None) * 1.1

        def xy(n: int, v: float, x0: int = x0, top: float = top) -> tuple[float, float]:
            span = math.log(ns[-1] / ns[0]) or 1.0
            x = x0 + pad + (width - 2 * pad) * math.log(n / ns[0]) / span
            return x, height - pad + 20 - (height - 2 * pad) * v / top

        parts.append(f'<text x="{x0 + pad}" y="15">{label}</text>')
        left, bottom = x0 + pad, height - pad + 20
        parts.append(
            f'<line x1="{left}" y1="{bottom}" x2="{x0 + width - pad}" y2="{bottom}" '
            'stroke="black"/>'
        )
        parts.append(f'<line x1="{left}" y1="{bottom}" x2="{left}" y2="30" stroke="black"/>')
        for n in ns:
            x, _ = xy(n, 0.0)
            parts.append(f'<text x="{x - 8:.0f}" y="{bottom + 15}">{n}</text>')
        for k in range(5):
            v = top * k / 4
            _, y = xy(ns[0], v)
            parts.append(f'<text x="{left - 40}" y="{y + 4:.0f}">{v:.3g}</text>')
        parts.append(f'<text x="{x0 + width / 2 - 20}" y="{bottom + 30}">workers</text>')
        for i, impl in enumerate(IMPLS):
            points = [(n, v) for n in ns if (v := med(impl, key, n)) is not None]
            if not points:
                continue
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(n, v) for n, v in points))
            colour = colours[impl]
            parts.append(
                f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>'
            )
            parts.append(
                f'<text x="{x0 + width - pad - 40}" y="{40 + 14 * i}" fill="{colour}">{impl}</text>'
            )
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="8,32,64,128")
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"of {IMPLS}, or {FLOOR!r}")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="append every measurement to this JSON-lines file")
    parser.add_argument("--plot", help="write the plot here (SVG)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        impl, n = args.one.split(":")
        print(json.dumps(measure(impl, int(n), args.steps)))
        return
    rows = []
    for r in range(args.rounds):
        for n in [int(x) for x in args.workers.split(",")]:
            for impl in args.impls.split(","):
                row = _one(impl, n, args.steps)
                row["round"] = r
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(row) + "\n")
    print(table(rows))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
