"""``subvec bench``: subvec next to gymnasium's AsyncVectorEnv and next to the machine's limit.

    subvec bench                                # CartPole-v1, 16 envs, 2 s per run, 3 repeats
    subvec bench --env-id Acrobot-v1 --num-envs 8 --duration 1
    subvec tune CartPole-v1 -n 16                # a few layouts of subvec; the best one

Each configuration runs in a fresh interpreter (``python -m subvec._bench --child JSON``) so
that none inherits another's processes or caches; the configurations are interleaved, the whole
set is repeated and medians are printed. The limit is ``W = min(num_envs, usable CPUs)``
processes each stepping its share of the envs in a tight loop with no IPC: what a perfect
vector env could reach here. The full suite with more workloads and peers is
``benchmarks/bench_vector.py``; ``docs/benchmarks.md`` explains both.

``subvec tune`` runs subvec alone, in a few layouts (envs per worker, spinning on or off),
each in a fresh interpreter as above, and prints them with the fastest first.

Only the standard library is imported at module level: the CLI imports this module to register
the sub-command, and numpy/gymnasium load only in the child interpreters.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from subvec._process.topology import usable_cpus

__all__ = ["IMPLEMENTATIONS", "add_cli_parser", "run_bench", "run_tune", "tune_layouts"]

#: name -> label of the implementations the command compares
IMPLEMENTATIONS = {
    "subvec": "subvec.SubprocVectorEnv",
    "async": "gymnasium AsyncVectorEnv",
    "sync": "gymnasium SyncVectorEnv",
    "limit": "limit (no IPC)",
}
DEFAULT_IMPLS = ("subvec", "async", "limit")
_RESULT = "SUBVEC-BENCH-RESULT "


# --- the child interpreter ---------------------------------------------------------------------


def _make_env(env_id: str) -> Any:
    import gymnasium as gym

    if env_id.startswith("ALE/"):  # ale-py registers its ids on import (gymnasium >= 1.0)
        import ale_py

        gym.register_envs(ale_py)
    return gym.make(env_id)


def _presample(single_space: Any, num_envs: int, seed: int, count: int = 64) -> list[Any]:
    from gymnasium.vector.utils import batch_space

    space = batch_space(single_space, num_envs)
    space.seed(seed)
    return [space.sample() for _ in range(count)]


def _timed(
    step: Callable[[Any], Any], actions: Sequence[Any], warmup: float, duration: float
) -> dict[str, float]:
    """Step through ``warmup`` seconds untimed, then ``duration`` seconds timing every call."""
    k = len(actions)
    i = 0
    end = time.perf_counter() + warmup
    while i < 3 or time.perf_counter() < end:
        step(actions[i % k])
        i += 1
    latencies: list[float] = []
    start = now = time.perf_counter()
    deadline = start + duration
    while now < deadline:
        before = now
        step(actions[len(latencies) % k])
        now = time.perf_counter()
        latencies.append(now - before)
    latencies.sort()
    return {
        "calls": float(len(latencies)),
        "elapsed": now - start,
        "p50_ms": 1e3 * latencies[len(latencies) // 2],
        "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def _limit_process(
    env_id: str, count: int, seed: int, warmup: float, duration: float, barrier: Any, out: Any
) -> None:
    envs = [_make_env(env_id) for _ in range(count)]
    for j, env in enumerate(envs):
        env.reset(seed=seed + j)
    actions = _presample(envs[0].action_space, count, seed)

    def step(batch: Any) -> None:
        for j, env in enumerate(envs):
            _, _, terminated, truncated, _ = env.step(batch[j])
            if terminated or truncated:
                env.reset()

    barrier.wait()
    out.put(_timed(step, actions, warmup, duration))
    for env in envs:
        env.close()


def _run_limit(cfg: dict[str, Any]) -> dict[str, float]:
    import multiprocessing

    n = int(cfg["num_envs"])
    # The limit uses as many CPUs as subvec's defaults may (a CPU quota counts, see usable_cpus).
    width = min(n, usable_cpus())
    shares = [n // width + (1 if w < n % width else 0) for w in range(width)]
    # This interpreter is fresh and single-threaded, so fork is safe and the cheapest start.
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(width + 1)
    out = ctx.SimpleQueue()
    start = time.perf_counter()
    procs = [
        ctx.Process(
            target=_limit_process,
            args=(
                cfg["env_id"],
                share,
                cfg["seed"] + 1000 * w,
                cfg["warmup"],
                cfg["duration"],
                barrier,
                out,
            ),
            daemon=True,
        )
        for w, share in enumerate(shares)
    ]
    for proc in procs:
        proc.start()
    barrier.wait()
    startup = time.perf_counter() - start
    parts = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    return {
        "steps_per_s": sum(p["calls"] * s / p["elapsed"] for p, s in zip(parts, shares)),
        # the ideal vector step: every process finishes its share at the same time
        "p50_ms": max(p["p50_ms"] for p in parts),
        "p99_ms": max(p["p99_ms"] for p in parts),
        "startup_s": startup,
        "workers": float(width),
    }


def _run_vector(cfg: dict[str, Any]) -> dict[str, float]:
    import gymnasium as gym

    n = int(cfg["num_envs"])
    fns = [functools.partial(_make_env, cfg["env_id"]) for _ in range(n)]
    start = time.perf_counter()
    envs: Any
    if cfg["impl"] == "subvec":
        from subvec import SubprocVectorEnv

        envs = SubprocVectorEnv(fns, **cfg.get("options", {}))
        workers = envs.num_workers
    elif cfg["impl"] == "async":
        envs = gym.vector.AsyncVectorEnv(fns)
        workers = n
    else:
        envs = gym.vector.SyncVectorEnv(fns)
        workers = 0
    try:
        envs.reset(seed=cfg["seed"])
        startup = time.perf_counter() - start
        actions = _presample(envs.single_action_space, n, cfg["seed"])
        timing = _timed(envs.step, actions, cfg["warmup"], cfg["duration"])
    finally:
        envs.close()
    return {
        "steps_per_s": timing["calls"] * n / timing["elapsed"],
        "p50_ms": timing["p50_ms"],
        "p99_ms": timing["p99_ms"],
        "startup_s": startup,
        "workers": float(workers),
    }


def _child(cfg: dict[str, Any]) -> None:
    result = _run_limit(cfg) if cfg["impl"] == "limit" else _run_vector(cfg)
    print(_RESULT + json.dumps(result), flush=True)


# --- the parent: schedule, progress, table -----------------------------------------------------


class _Progress:
    """One status line, redrawn in place on a terminal and printed line by line elsewhere."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.done = 0
        self.stream = stream
        self.tty = stream.isatty()
        self.start = time.monotonic()

    def show(self, text: str) -> None:
        width = 24
        filled = width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (width - filled)
        line = f"[{bar}] {self.done}/{self.total} {text}"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _run_child(cfg: dict[str, Any], timeout: float) -> dict[str, float] | str:
    cmd = [sys.executable, "-m", "subvec._bench", "--child", json.dumps(cfg)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT):
            result: dict[str, float] = json.loads(line[len(_RESULT) :])
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
    return f"exit {proc.returncode}: {' '.join(tail)}"


def run_bench(
    env_id: str = "CartPole-v1",
    num_envs: Sequence[int] = (16,),
    impls: Sequence[str] = DEFAULT_IMPLS,
    duration: float = 2.0,
    warmup: float = 0.5,
    repeats: int = 3,
    seed: int = 0,
    progress: TextIO | None = None,
) -> list[dict[str, Any]]:
    """Run every (num_envs, implementation) ``repeats`` times, interleaved; one row per pair
    with the medians, the ratio to AsyncVectorEnv and the ratio to the limit."""
    unknown = [i for i in impls if i not in IMPLEMENTATIONS]
    if unknown:
        raise ValueError(
            f"unknown implementation(s) {unknown}; choose from {list(IMPLEMENTATIONS)}"
        )
    if repeats < 1 or duration <= 0 or any(n < 1 for n in num_envs):
        raise ValueError("repeats and num_envs must be >= 1 and duration > 0")
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    errors: dict[tuple[int, str], str] = {}
    bar = _Progress(repeats * len(num_envs) * len(impls), progress or sys.stderr)
    timeout = 120.0 + 4 * (duration + warmup)
    for rep in range(repeats):
        for n in num_envs:
            # rotate the order every repeat so that no implementation always goes first
            order = list(impls[rep % len(impls) :]) + list(impls[: rep % len(impls)])
            for impl in order:
                bar.show(f"{IMPLEMENTATIONS[impl]}, {n} envs ...")
                cfg = {
                    "env_id": env_id,
                    "num_envs": n,
                    "impl": impl,
                    "duration": duration,
                    "warmup": warmup,
                    "seed": seed + rep,
                }
                result = _run_child(cfg, timeout)
                bar.done += 1
                if isinstance(result, str):
                    errors[(n, impl)] = result
                    bar.show(f"{IMPLEMENTATIONS[impl]}, {n} envs: failed ({result})")
                else:
                    runs.setdefault((n, impl), []).append(result)
                    bar.show(
                        f"{IMPLEMENTATIONS[impl]}, {n} envs: {result['steps_per_s']:,.0f} steps/s"
                    )
    bar.close()
    rows: list[dict[str, Any]] = []
    for n in num_envs:
        medians: dict[str, dict[str, float]] = {}
        for impl in impls:
            results = runs.get((n, impl), [])
            if results:
                medians[impl] = _summary(results)
        peer = medians.get("async", {}).get("steps_per_s")
        limit = medians.get("limit", {}).get("steps_per_s")
        for impl in impls:
            row: dict[str, Any] = {
                "env_id": env_id,
                "num_envs": n,
                "impl": impl,
                "runs": len(runs.get((n, impl), [])),
            }
            if impl in medians:
                row.update(medians[impl])
                rate = medians[impl]["steps_per_s"]
                row["x_async"] = rate / peer if peer else None
                row["of_limit"] = rate / limit if limit else None
            else:
                row["error"] = errors.get((n, impl), "no result")
            rows.append(row)
    return rows


def _summary(results: Sequence[dict[str, float]]) -> dict[str, float]:
    """The medians of a configuration's runs, and ``spread``: how far apart its runs' rates
    lie, (max - min) / median (0 for a single run)."""
    summary = {k: statistics.median(r[k] for r in results) for k in results[0]}
    rates = [r["steps_per_s"] for r in results]
    summary["spread"] = (max(rates) - min(rates)) / summary["steps_per_s"]
    return summary


#: above this 1-minute load average per usable CPU before a run, other work shares the CPUs
BUSY_LOAD_PER_CPU = 0.5
#: above this spread between a configuration's repeats, its median is not to be trusted
SCATTERED_SPREAD = 0.2


def reliability_warnings(
    rows: Sequence[dict[str, Any]], load_before: float, cpus: int, label: str = "impl"
) -> list[str]:
    """What says the figures of a ``subvec bench`` or ``subvec tune`` run are unreliable.

    Args:
        rows: the run's rows (``run_bench`` or ``run_tune``).
        load_before: the 1-minute load average read before the first run.
        cpus: the CPUs the runs could use.
        label: how a row is named in a warning: ``"impl"`` (bench) or ``"options"`` (tune).

    Returns:
        One sentence per problem, each saying how to get stable figures; empty when none.
    """
    warnings = []
    if load_before > BUSY_LOAD_PER_CPU * cpus:
        warnings.append(
            f"the load average was {load_before:.2f} on {cpus} usable CPU(s) before the run: "
            "other processes (or an earlier run, still in the 1-minute average) share the "
            "CPUs, so every figure may read low and subvec's most of all. For stable figures, "
            "stop other jobs, wait until `uptime` shows a load under "
            f"{BUSY_LOAD_PER_CPU * cpus:g}, and rerun."
        )
    scattered = [r for r in rows if r.get("spread", 0.0) > SCATTERED_SPREAD]
    if scattered:
        names = ", ".join(
            IMPLEMENTATIONS.get(r["impl"], r["impl"])
            if label == "impl"
            else _layout_text(r["options"])
            for r in scattered
        )
        worst = max(r["spread"] for r in scattered)
        warnings.append(
            f"repeats differed by up to {worst:.0%} of their median ({names}): the machine's "
            "speed moved during the run. Rerun with more repeats (--repeats 5) on a quiet "
            "machine, and compare ratios within one run rather than rates across runs."
        )
    return warnings


def tune_layouts(num_envs: int, cpus: int) -> list[dict[str, Any]]:
    """The layouts ``subvec tune`` tries: one env per worker, the default's share (one worker
    per CPU), all envs in one worker, and the powers of two between that leave at most two
    workers per CPU; each with the default spin and with spinning off."""
    shares = {1, -(-num_envs // max(1, cpus)), num_envs}
    k = 2
    while k < num_envs:
        if -(-num_envs // k) <= 2 * cpus:  # more workers than that only adds switching
            shares.add(k)
        k *= 2
    layouts = []
    for share in sorted(shares):
        for spin in (None, 0):
            layouts.append({"envs_per_worker": share, "spin_us": spin})
    return layouts


def run_tune(
    env_id: str,
    num_envs: int,
    duration: float = 1.0,
    warmup: float = 0.3,
    repeats: int = 1,
    seed: int = 0,
    layouts: Sequence[dict[str, Any]] | None = None,
    progress: TextIO | None = None,
) -> list[dict[str, Any]]:
    """Time subvec on ``env_id`` x ``num_envs`` in each layout (``tune_layouts`` by default),
    each run in a fresh interpreter, interleaved over ``repeats``; rows with the medians,
    fastest first (failed layouts last, with their error)."""
    if repeats < 1 or duration <= 0 or num_envs < 1:
        raise ValueError("repeats and num_envs must be >= 1 and duration > 0")
    layouts = list(layouts or tune_layouts(num_envs, usable_cpus()))
    runs: dict[int, list[dict[str, float]]] = {}
    errors: dict[int, str] = {}
    bar = _Progress(repeats * len(layouts), progress or sys.stderr)
    timeout = 120.0 + 4 * (duration + warmup)
    for rep in range(repeats):
        for j, options in enumerate(layouts):
            text = _layout_text(options)
            bar.show(f"{text} ...")
            cfg = {
                "env_id": env_id,
                "num_envs": num_envs,
                "impl": "subvec",
                "duration": duration,
                "warmup": warmup,
                "seed": seed + rep,
                "options": options,
            }
            result = _run_child(cfg, timeout)
            bar.done += 1
            if isinstance(result, str):
                errors[j] = result
                bar.show(f"{text}: failed ({result})")
            else:
                runs.setdefault(j, []).append(result)
                bar.show(f"{text}: {result['steps_per_s']:,.0f} steps/s")
    bar.close()
    rows: list[dict[str, Any]] = []
    for j, options in enumerate(layouts):
        row: dict[str, Any] = {"env_id": env_id, "num_envs": num_envs, "options": options}
        results = runs.get(j, [])
        if results:
            row.update(_summary(results))
        else:
            row["error"] = errors.get(j, "no result")
        rows.append(row)
    rows.sort(key=lambda r: -r.get("steps_per_s", -1.0))
    return rows


def _layout_text(options: dict[str, Any]) -> str:
    spin = options.get("spin_us")
    return (
        f"envs_per_worker={options.get('envs_per_worker')}, "
        f"spin_us={'default' if spin is None else spin}"
    )


def format_tune(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of ``run_tune`` rows and a line naming the best."""
    lines = [
        "| envs per worker | workers | spin_us | env-steps/s | p50 ms | p99 ms | startup s |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        spin = r["options"].get("spin_us")
        spin_text = "default" if spin is None else f"{spin:g}"
        epw = r["options"].get("envs_per_worker")
        if "error" in r:
            lines.append(f"| {epw} | - | {spin_text} | failed: {r['error']} | | | |")
            continue
        lines.append(
            f"| {epw} | {r['workers']:.0f} | {spin_text} | {r['steps_per_s']:,.0f} "
            f"| {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['startup_s']:.2f} |"
        )
    best = next((r for r in rows if "error" not in r), None)
    if best is None:
        lines.append("\nno layout ran")
    else:
        # an option left at None is the default: the call names only what to set
        options = "".join(f", {k}={v!r}" for k, v in best["options"].items() if v is not None)
        spin = " (the default spin)" if best["options"].get("spin_us") is None else ""
        lines.append(
            f"\nbest: SubprocVectorEnv(...{options}){spin}: {best['steps_per_s']:,.0f} env-steps/s"
        )
    return "\n".join(lines)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of ``run_bench`` rows."""

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        "| implementation | envs | workers | env-steps/s | vs Async | of limit | p50 ms "
        "| p99 ms | startup s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {IMPLEMENTATIONS[r['impl']]} | {r['num_envs']} | - | failed: "
                f"{r['error']} | | | | | |"
            )
            continue
        lines.append(
            f"| {IMPLEMENTATIONS[r['impl']]} | {r['num_envs']} | {r['workers']:.0f} "
            f"| {r['steps_per_s']:,.0f} | {fmt(r.get('x_async'), '.1f')}x "
            f"| {fmt(r.get('of_limit'), '.0%')} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} "
            f"| {r['startup_s']:.2f} |"
        )
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 8,16, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_cli_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``bench`` sub-command."""
    parser = subparsers.add_parser(
        "bench",
        help="time subvec next to AsyncVectorEnv and the machine's limit",
        description="Step the same envs with subvec, gymnasium's AsyncVectorEnv and the limit "
        "(independent processes with no IPC), each in a fresh interpreter, interleaved and "
        "repeated; print the medians as a table.",
    )
    parser.add_argument(
        "--env-id", default="CartPole-v1", help="gymnasium id (default: %(default)s)"
    )
    parser.add_argument(
        "--num-envs",
        type=_int_list,
        default=[16],
        metavar="N[,N...]",
        help="number of envs, or a list to sweep (default: 16)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="timed seconds per run (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="untimed seconds before each run (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each configuration; medians are shown (default: %(default)s)",
    )
    parser.add_argument(
        "--impls",
        default=",".join(DEFAULT_IMPLS),
        help=f"comma-separated, from {', '.join(IMPLEMENTATIONS)} (default: %(default)s)",
    )
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="also write the rows as JSON lines to PATH"
    )
    parser.set_defaults(func=_cli_bench)

    tune = subparsers.add_parser(
        "tune",
        help="try a few layouts of subvec on an env and print the fastest",
        description="Step ENV_ID x N with subvec in a few layouts (envs per worker, spinning "
        "on or off), each briefly in a fresh interpreter; print a table, fastest first, and "
        "the best layout with its measured rate.",
    )
    tune.add_argument("env_id", metavar="ENV_ID", help="gymnasium id, e.g. CartPole-v1")
    tune.add_argument("-n", "--num-envs", type=int, default=16, help="envs (default: 16)")
    tune.add_argument(
        "--duration",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="timed seconds per layout (default: %(default)s)",
    )
    tune.add_argument(
        "--warmup",
        type=float,
        default=0.3,
        metavar="SECONDS",
        help="untimed seconds before each (default: %(default)s)",
    )
    tune.add_argument(
        "--repeats", type=int, default=1, help="runs of each layout (default: %(default)s)"
    )
    tune.set_defaults(func=_cli_tune)


def _print_warnings(warnings: Sequence[str]) -> None:
    for text in warnings:
        print(f"\nwarning: {text}")


def _cli_tune(args: argparse.Namespace) -> int:
    load_before = os.getloadavg()[0]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(
        f"{args.env_id} x {args.num_envs}: {os.cpu_count()} CPUs ({usable_cpus()} usable), "
        f"load average {load}; {args.repeats} x {args.duration:g} s per layout"
    )
    try:
        rows = run_tune(args.env_id, args.num_envs, args.duration, args.warmup, args.repeats)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_tune(rows))
    _print_warnings(reliability_warnings(rows, load_before, usable_cpus(), label="options"))
    return 0 if any("error" not in r for r in rows) else 1


def _cli_bench(args: argparse.Namespace) -> int:
    impls = [i for i in args.impls.split(",") if i]
    cpus = usable_cpus()
    load_before = os.getloadavg()[0]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(
        f"{args.env_id}: {os.cpu_count()} CPUs ({cpus} usable), load average {load}; "
        f"{args.repeats} x {args.duration:g} s per configuration, medians"
    )
    try:
        rows = run_bench(
            args.env_id, args.num_envs, impls, args.duration, args.warmup, args.repeats
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(rows))
    _print_warnings(reliability_warnings(rows, load_before, cpus))
    if args.json:
        with open(args.json, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
    else:
        sys.exit("usage: python -m subvec._bench --child JSON (use `subvec bench` instead)")
