"""RayVectorEnv against SubprocVectorEnv and a one-actor-per-env layout: Ray's cost per step.

    python benchmarks/bench_ray.py                          # the measured run (about a minute)
    python benchmarks/bench_ray.py --quick --out-dir /tmp/x # a smoke run: 2 envs, seconds

``--quick`` (CartPole only, 2 envs) never writes to benchmarks/results: without ``--out-dir``
it writes to a new temporary directory.

Layouts, each stepping the same ``num_envs`` envs lock-step with random actions:

- ``subproc``: ``SubprocVectorEnv(num_workers=2)``, no Ray (the reference);
- ``ray_2_actors``: ``RayVectorEnv(num_actors=2, local_workers=1)``: two actors, each holding a
  SubprocVectorEnv of one worker over half the envs (subvec's layout: one Ray call per actor
  per step);
- ``ray_actor_per_env``: ``RayVectorEnv(envs_per_actor=1, local_workers=1)``: one actor per env
  (Tianshou's RayVectorEnv layout: one Ray call per env per step).

Workloads: ``CartPole-v1`` (a cheap env: ~10 us a step), ``sleep`` (each step sleeps
``--sleep-ms``: an env whose step time is spent waiting, as a simulator or a remote service)
and ``Pong`` (``ALE/Pong-v5``, when ale-py is installed; skipped with a note otherwise).

Per layout it reports the steady step time (median over ``--repeats`` timed windows of
``--seconds`` each, after a warm-up) and, for the Ray layouts, the overhead per step against
``subproc`` (their step time minus the reference's). All on one machine, so the numbers are
Ray's per-call cost and nothing of a network; the machine load (``/proc/loadavg``) is recorded
next to every number.

Outputs: ``<out-dir>/ray.jsonl`` (a facts line, then one line per (workload, layout)) and
``<out-dir>/ray.md`` (the table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback, before ray imports


@dataclasses.dataclass
class Args:
    num_envs: int = 8
    seconds: float = 2.0
    repeats: int = 3
    sleep_ms: float = 1.0
    quick: bool = False
    out_dir: str | None = None


class SleepEnv(gym.Env[np.ndarray, int]):
    """Each step sleeps ``seconds``: the env's time is spent waiting, not computing."""

    observation_space = gym.spaces.Box(0, 1, (4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, seconds: float = 0.001) -> None:
        self.seconds = seconds
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action: int):
        time.sleep(self.seconds)
        self.t += 1
        return np.full(4, self.t % 2, dtype=np.float32), 1.0, False, self.t >= 200, {}


def _workloads(args: Args) -> dict[str, Any]:
    out: dict[str, Any] = {"CartPole-v1": lambda: gym.make("CartPole-v1")}
    if args.quick:  # the smoke run: one workload
        return out
    out[f"sleep {args.sleep_ms:g} ms"] = _sleep_factory(args.sleep_ms / 1000)
    try:
        import ale_py

        gym.register_envs(ale_py)
        out["Pong"] = lambda: gym.make("ALE/Pong-v5")
    except ImportError:
        print("note: ale-py is not installed; the Pong workload is skipped")
    return out


def _sleep_factory(seconds: float) -> Any:
    def make() -> gym.Env[Any, Any]:
        return SleepEnv(seconds)

    return make


def _layouts(n: int) -> dict[str, Any]:
    from subvec import SubprocVectorEnv
    from subvec.ray import RayVectorEnv

    return {
        "subproc": lambda fns: SubprocVectorEnv(fns, num_workers=min(2, n)),
        "ray_2_actors": lambda fns: RayVectorEnv(fns, num_actors=min(2, n), local_workers=1),
        "ray_actor_per_env": lambda fns: RayVectorEnv(fns, envs_per_actor=1, local_workers=1),
    }


def _time_steps(envs: Any, seconds: float, repeats: int) -> list[float]:
    """Seconds per step of ``repeats`` windows of about ``seconds`` each."""
    envs.reset(seed=0)
    actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
    for _ in range(20):  # warm-up
        envs.step(actions)
    windows = []
    for _ in range(repeats):
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            envs.step(actions)
            steps += 1
        windows.append((time.perf_counter() - start) / steps)
    return windows


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ")[0]
    except OSError:
        return "?"


def run(args: Args) -> list[dict[str, Any]]:
    import cloudpickle
    import ray

    if __name__ != "__main__":
        # Loaded as a module (the smoke test): the workers cannot import it by its name, so
        # its factories and SleepEnv travel by value, as they do from a script.
        cloudpickle.register_pickle_by_value(sys.modules[__name__])

    started = False
    if not ray.is_initialized():
        # logical CPUs: the one-actor-per-env layout reserves one per env
        ray.init(
            num_cpus=max(4, args.num_envs),
            include_dashboard=False,
            object_store_memory=200 * 2**20,
            log_to_driver=False,
        )
        started = True
    rows: list[dict[str, Any]] = []
    try:
        for workload, factory in _workloads(args).items():
            fns = [factory] * args.num_envs
            reference = None
            for layout, make in _layouts(args.num_envs).items():
                envs = make(fns)
                try:
                    load_before = _load()
                    windows = _time_steps(envs, args.seconds, args.repeats)
                finally:
                    envs.close()
                step_s = statistics.median(windows)
                if layout == "subproc":
                    reference = step_s
                row = {
                    "workload": workload,
                    "layout": layout,
                    "num_envs": args.num_envs,
                    "step_ms": step_s * 1e3,
                    "windows_ms": [w * 1e3 for w in windows],
                    "ray_overhead_ms": None
                    if layout == "subproc" or reference is None
                    else ((step_s - reference) * 1e3),
                    "load_before": load_before,
                    "load_after": _load(),
                }
                rows.append(row)
                print(json.dumps(row))
    finally:
        if started:
            ray.shutdown()
    return rows


def write(rows: list[dict[str, Any]], args: Args, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    facts = {
        "facts": True,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "args": dataclasses.asdict(args),
        "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    with open(out_dir / "ray.jsonl", "w") as f:
        for line in [facts, *rows]:
            f.write(json.dumps(line) + "\n")
    lines = [
        f"# RayVectorEnv on one machine ({os.cpu_count()} CPUs), {args.num_envs} envs, lock-step",
        "",
        "Median of the timed windows; the load (`/proc/loadavg`, 1 min) before and after each",
        "row: numbers measured under load are labelled by it.",
        "",
        "| workload | layout | step (ms) | Ray overhead per step (ms) | load before/after |",
        "|---|---|---:|---:|---|",
    ]
    for r in rows:
        overhead = "" if r["ray_overhead_ms"] is None else f"{r['ray_overhead_ms']:.2f}"
        lines.append(
            f"| {r['workload']} | {r['layout']} | {r['step_ms']:.2f} | {overhead} | "
            f"{r['load_before']}/{r['load_after']} |"
        )
    (out_dir / "ray.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Args):
        name = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            parser.add_argument(name, action="store_true")
        else:
            kind = {"int": int, "float": float}.get(str(field.type), str)
            parser.add_argument(name, type=kind, default=field.default)
    args = Args(**vars(parser.parse_args(argv)))
    if args.quick:
        args.num_envs, args.seconds, args.repeats = 2, 0.2, 1
    if args.out_dir is not None:
        out_dir = Path(args.out_dir)
    elif args.quick:
        out_dir = Path(tempfile.mkdtemp(prefix="bench_ray_"))
    else:
        out_dir = Path(__file__).parent / "results"
    write(run(args), args, out_dir)
    print(f"wrote {out_dir / 'ray.jsonl'} and {out_dir / 'ray.md'}")
    return out_dir


if __name__ == "__main__":
    main()
