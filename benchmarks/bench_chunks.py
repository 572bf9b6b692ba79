"""Action chunks: env-steps/s of ``step_chunk`` at K = 1, 4, 8, 16 against ``step()``.

    python benchmarks/bench_chunks.py                 # the measured run (a few minutes)
    python benchmarks/bench_chunks.py --quick --out-dir /tmp/x   # a smoke run: seconds
    python benchmarks/bench_chunks.py --ray           # also Ray: 2 actors, CartPole x 8

How it measures (as benchmarks/bench_vector.py does, whose workloads and limit it reuses):

- every configuration (workload x how x K) runs in a fresh interpreter (this script with
  ``--child``); the repeats walk every configuration in an order rotated per repeat, and the
  medians over the repeats are quoted (every value is kept in the JSON lines);
- ``step`` is ``SubprocVectorEnv.step`` with the defaults; ``chunk K`` is ``step_chunk`` with
  chunks of K actions (``(num_envs, K)``), counting ``num_envs * K`` env steps per call;
- actions are sampled before timing (16 batches, cycled), and a warm-up precedes the window;
- before each run it waits (up to ``--max-wait`` seconds) until other processes use less than
  ``--quiet`` cores, and records the cores they used just before (``busy_before``);
- ``limit`` is bench_vector's: ``min(num_envs, usable CPUs)`` processes stepping their share of
  the envs in a tight loop with no IPC, the sum of their rates; ``lock-step limit K`` the same
  processes waiting for each other (a spin on shared memory) every K steps of their share: a
  synchronous vector env with a free parent and free signalling, chunks of K;
- the shares in the table (of the limit, of the lock-step limit at the same K, x ``step()``)
  are medians of the per-repeat ratios: each repeat runs every configuration seconds apart;
- Ray (``--ray``): ``RayVectorEnv(num_actors=2, local_workers=1)`` over CartPole x 8 on a local
  Ray, the time per env step of ``step()`` and of ``step_chunk`` at K = 8.

Workloads: ``cartpole`` x 16 and, when ale-py is installed, ``pong`` x 8 (skipped with a note
otherwise).

Outputs: ``<out-dir>/chunks.jsonl`` (a facts line, then one line per configuration) and
``<out-dir>/chunks.md`` (the table).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHUNKS = (1, 4, 8, 16)


@dataclasses.dataclass
class Args:
    duration: float = 2.0
    warmup: float = 0.4
    repeats: int = 3
    ray: bool = False
    quick: bool = False
    quiet: float = 0.15  # cores others may use before a run (it waits up to max_wait)
    max_wait: float = 20.0
    out_dir: str | None = None
    child: str = ""


def _suite() -> Any:
    """benchmarks/bench_vector.py as a module: its workloads and its limit."""
    name = "bench_vector_for_chunks"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "bench_vector.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    import cloudpickle

    # its env factories reach the workers by value: they cannot import this module by name
    cloudpickle.register_pickle_by_value(module)
    return module


def _presample_chunks(space: Any, num_envs: int, chunk: int, count: int = 16) -> list[Any]:
    import gymnasium as gym

    batched = gym.vector.utils.batch_space(gym.vector.utils.batch_space(space, chunk), num_envs)
    batched.seed(0)
    return [batched.sample() for _ in range(count)]


def _timed(call: Any, batches: list[Any], warmup: float, duration: float) -> tuple[int, float]:
    """Calls of ``call`` over ``batches`` (cycled) for ``duration`` seconds after a warm-up:
    (calls, seconds)."""
    end = time.perf_counter() + warmup
    i = 0
    while time.perf_counter() < end or i < 3:
        call(batches[i % len(batches)])
        i += 1
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + duration
    t = t0
    while t < deadline:
        call(batches[n % len(batches)])
        n += 1
        t = time.perf_counter()
    return n, t - t0


def run_vector(cfg: dict[str, Any]) -> dict[str, Any]:
    """One ``step`` or ``chunk K`` configuration: env-steps/s."""
    suite = _suite()
    n, chunk = cfg["num_envs"], cfg["chunk"]
    fns = [suite.make_factory(cfg["spec"]) for _ in range(n)]
    if cfg["backend"] == "ray":
        from subvec.ray import RayVectorEnv

        envs: Any = RayVectorEnv(fns, num_actors=2, local_workers=1)
    else:
        from subvec import SubprocVectorEnv

        envs = SubprocVectorEnv(fns)
    try:
        envs.reset(seed=0)
        single = envs.single_action_space
        if chunk == 0:  # step()
            batches = [b[:, 0] for b in _presample_chunks(single, n, 1)]
            calls, seconds = _timed(envs.step, batches, cfg["warmup"], cfg["duration"])
            per_call = n
        else:
            batches = _presample_chunks(single, n, chunk)
            calls, seconds = _timed(envs.step_chunk, batches, cfg["warmup"], cfg["duration"])
            per_call = n * chunk
        workers = getattr(envs, "num_workers", None)
    finally:
        envs.close()
    rate = calls * per_call / seconds
    return {"steps_per_s": rate, "us_per_env_step": 1e6 / rate, "num_workers": workers}


def run_limit(cfg: dict[str, Any]) -> dict[str, Any]:
    suite = _suite()
    sync = cfg["how"].startswith("lock-step")
    impl = {"impl": "limit_sync", "sync_every": cfg["chunk"]} if sync else {"impl": "limit"}
    result = suite.run_limit({**cfg, **impl, "seed": 0, "timeout": 120})
    return {"steps_per_s": result["steps_per_s"], "us_per_env_step": 1e6 / result["steps_per_s"]}


def child_main(cfg: dict[str, Any]) -> None:
    if cfg["how"] == "limit" or cfg["how"].startswith("lock-step"):
        result = run_limit(cfg)
    else:
        if cfg["backend"] == "ray":
            import ray

            ray.init(address="local", include_dashboard=False, num_cpus=os.cpu_count())
        result = run_vector(cfg)
    result["load_1m"] = os.getloadavg()[0]
    print("RESULT " + json.dumps(result), flush=True)


def run_child(cfg: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def configs(args: Args) -> list[dict[str, Any]]:
    suite = _suite()
    out: list[dict[str, Any]] = []
    workloads = [("cartpole", 16)]
    chunks: tuple[int, ...] = CHUNKS
    if args.quick:
        workloads, chunks = [("cartpole", 4)], (1, 4)
    elif importlib.util.find_spec("ale_py") is not None:
        workloads.append(("pong", 8))
    else:
        print("note: ale-py is not installed; the Pong x 8 workload is skipped")
    timing = {"warmup": args.warmup, "duration": args.duration}
    for workload, n in workloads:
        spec = suite.workload_spec(workload, 1.0)
        base = {"workload": workload, "num_envs": n, "spec": spec, "backend": "subproc", **timing}
        out.append({**base, "how": "limit", "chunk": 1})
        out += [{**base, "how": f"lock-step limit {k}", "chunk": k} for k in chunks]
        out.append({**base, "how": "step", "chunk": 0})
        out += [{**base, "how": f"chunk {k}", "chunk": k} for k in chunks]
    if args.ray:
        spec = suite.workload_spec("cartpole", 1.0)
        base = {"workload": "cartpole", "num_envs": 8, "spec": spec, "backend": "ray", **timing}
        out.append({**base, "how": "step", "chunk": 0})
        out.append({**base, "how": "chunk 8", "chunk": 8})
    return out


def _paired(runs: list[float], against: list[float] | None, form: str) -> str:
    """The median of the per-repeat ratios of ``runs`` to ``against`` (each repeat's
    configurations ran seconds apart), formatted with ``form``; "" without ``against``."""
    if not against:
        return ""
    return format(statistics.median(a / b for a, b in zip(runs, against)), form)


def table(rows: list[dict[str, Any]]) -> str:
    """The results as a markdown table: each share is the median of the per-repeat ratios
    to the same repeat's limit, lock-step limit at the same K, or ``step()``."""
    lines = [
        "| backend | workload | envs | how | env-steps/s | us per env step | of limit "
        "| of lock-step limit | x step() |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    runs = {(r["backend"], r["workload"], r["how"]): r["runs"] for r in rows}
    for r in rows:
        workload, how = r["workload"], r["how"]
        own = ("subproc", workload)
        of_limit = of_sync = x_step = ""
        # step() is a chunk of one sub-step: both are held against the lock-step limit at K
        sync_k = 1 if how == "step" else r["chunk"] if how.startswith("chunk") else None
        if r["backend"] == "subproc":
            of_limit = _paired(r["runs"], runs.get((*own, "limit")), ".0%")
            if sync_k:
                limit_k = runs.get((*own, f"lock-step limit {sync_k}"))
                of_sync = _paired(r["runs"], limit_k, ".0%")
        if sync_k:
            x_step = _paired(r["runs"], runs.get((r["backend"], workload, "step")), ".2f")
        lines.append(
            f"| {r['backend']} | {workload} | {r['num_envs']} | {how} | "
            f"{r['steps_per_s']:,.0f} | {r['us_per_env_step']:.2f} | {of_limit} | {of_sync} "
            f"| {x_step} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            parser.add_argument(flag, action="store_true")
        else:
            kind = {"float": float, "int": int}.get(str(field.type), str)
            parser.add_argument(flag, type=kind, default=field.default)
    args = Args(**vars(parser.parse_args(argv)))
    if args.child:
        child_main(json.loads(args.child))
        return
    if args.quick:
        args.duration, args.warmup, args.repeats = 0.3, 0.1, 1
    default = tempfile.mkdtemp() if args.quick else ROOT / "benchmarks" / "results"
    out_dir = Path(args.out_dir or default)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = configs(args)
    runs: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(plan))}
    for repeat in range(args.repeats):
        order = list(range(len(plan)))
        order = order[repeat % len(order) :] + order[: repeat % len(order)]
        for i in order:
            # the machine may be shared: wait (a bounded while) for the others to go quiet
            waited = 0.0 if args.quick else _suite().wait_for_quiet(args.quiet, args.max_wait)
            busy = _suite().machine_busy(0.2)
            result = run_child(plan[i])
            result["waited_s"], result["busy_before"] = waited, busy
            if "error" in result:
                raise SystemExit(f"{plan[i]['how']} {plan[i]['workload']}: {result['error']}")
            runs[i].append(result)
            print(
                f"  {plan[i]['backend']} {plan[i]['workload']} {plan[i]['how']}: "
                f"{result['steps_per_s']:,.0f} env-steps/s",
                flush=True,
            )
    rows = []
    for i, cfg in enumerate(plan):
        rate = statistics.median(r["steps_per_s"] for r in runs[i])
        rows.append(
            {
                **{k: cfg[k] for k in ("backend", "workload", "num_envs", "how", "chunk")},
                "steps_per_s": rate,
                "us_per_env_step": 1e6 / rate,
                "runs": [r["steps_per_s"] for r in runs[i]],
                "load_1m": [r["load_1m"] for r in runs[i]],
                "busy_before": [r["busy_before"] for r in runs[i]],
            }
        )
    # the machine (its CPU model: hosts of one VM type differ) and the run
    facts = {**_suite().machine_facts(None), "repeats": args.repeats, "duration_s": args.duration}
    with open(out_dir / "chunks.jsonl", "w") as f:
        f.write(json.dumps({"facts": facts}) + "\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")
    text = table(rows)
    (out_dir / "chunks.md").write_text(text + "\n")
    print(text)
    print(f"wrote {out_dir / 'chunks.jsonl'} and {out_dir / 'chunks.md'}")


if __name__ == "__main__":
    main()
