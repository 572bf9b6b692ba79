"""subvec's default layout on a busy machine: next to every layout ``subvec tune`` tries and to
gymnasium's SyncVectorEnv and AsyncVectorEnv, while CPU-bound processes run beside it.

A load is started once per block and runs through every configuration of the block; the
configurations take turns in interleaved rounds, each in a fresh interpreter. Loads:
``none``, ``busy1``/``busy2`` (one or two Python busy loops, a stand-in learner), ``torch``
(a torch matmul loop with torch's default threads).

    python benchmarks/experiments/contended.py --load busy1 --workload cartpole --num-envs 16
    python benchmarks/experiments/contended.py --load none busy1 busy2 torch --rounds 3

Prints, per load and workload, each configuration's median env-steps/s and its share of the
best ``tune`` layout's, and ``envs.layout`` as the default chose it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUSY = "while True: pass"
TORCH = "import torch\na = torch.randn(384, 384)\nwhile True:\n    a = torch.tanh(a @ a)\n"


def start_load(load: str) -> list[subprocess.Popen[bytes]]:
    """The processes of ``load``, started and given a moment to reach their loop."""
    codes = {"none": [], "busy1": [BUSY], "busy2": [BUSY, BUSY], "torch": [TORCH]}[load]
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in codes]
    time.sleep(1.5 if load == "torch" else 0.3)
    return procs


def child(cfg: dict[str, Any]) -> None:
    """Run one configuration and print ``RESULT {json}``."""
    sys.path.insert(0, str(HERE))
    from ab_checkouts import factory, timed_rate

    make = factory(cfg["workload"])
    fns = [make] * cfg["num_envs"]
    layout = ""
    if cfg["impl"] == "subvec":
        import subvec

        envs: Any = subvec.SubprocVectorEnv(fns, **cfg["options"])
        plan = envs.layout
        layout = (
            f"{envs.num_workers}w spin={envs.spin_us:g} partner={plan.partner} "
            f"busy={plan.busy_cpus} planned={plan.planned_cpus}"
        )
    else:
        import gymnasium as gym

        cls = gym.vector.SyncVectorEnv if cfg["impl"] == "sync" else gym.vector.AsyncVectorEnv
        envs = cls(fns)
    try:
        envs.reset(seed=0)
        actions = [envs.action_space.sample() for _ in range(64)]
        rate = timed_rate(envs.step, actions, cfg["num_envs"], cfg["seconds"])
    finally:
        envs.close()
    print("RESULT " + json.dumps({"rate": rate, "layout": layout}), flush=True)


def configurations(num_envs: int, cpus: int) -> list[tuple[str, dict[str, Any]]]:
    from subvec._bench import tune_layouts

    out: list[tuple[str, dict[str, Any]]] = [("default", {"impl": "subvec", "options": {}})]
    for options in tune_layouts(num_envs, cpus):
        spin = "default" if options["spin_us"] is None else options["spin_us"]
        name = f"epw={options['envs_per_worker']} spin={spin}"
        out.append((name, {"impl": "subvec", "options": options}))
    out += [("sync", {"impl": "sync"}), ("async", {"impl": "async"})]
    return out


def block(load: str, workload: str, num_envs: int, rounds: int, seconds: float) -> None:
    from subvec._process.topology import usable_cpus

    configs = configurations(num_envs, usable_cpus())
    rates: dict[str, list[float]] = {name: [] for name, _ in configs}
    layouts: dict[str, str] = {}
    procs = start_load(load)
    try:
        for r in range(rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for name, cfg in order:
                cfg = {**cfg, "workload": workload, "num_envs": num_envs, "seconds": seconds}
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(cfg)],
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                if not lines:
                    raise RuntimeError(f"{name}: {proc.stderr[-2000:]}")
                result = json.loads(lines[-1][len("RESULT ") :])
                rates[name].append(result["rate"])
                layouts[name] = result["layout"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    medians = {name: statistics.median(v) for name, v in rates.items()}
    best_name = max((n for n in medians if n.startswith("epw=")), key=medians.__getitem__)
    best = medians[best_name]
    print(f"\n## load={load} workload={workload} x{num_envs} ({rounds} rounds of {seconds} s)")
    print("| configuration | env-steps/s | of best tune | rounds |")
    print("|---|---:|---:|---|")
    for name, _ in configs:
        extra = f" ({layouts[name]})" if name == "default" else ""
        rounds_text = " ".join(f"{v:.0f}" for v in rates[name])
        share = medians[name] / best
        print(f"| {name}{extra} | {medians[name]:,.0f} | {share:.2f} | {rounds_text} |")
    print(f"best tune layout: {best_name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--load", nargs="+", default=["none", "busy1", "busy2", "torch"])
    parser.add_argument("--workload", nargs="+", default=["cartpole", "busy100", "pong"])
    parser.add_argument("--num-envs", type=int, nargs="+", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=1.5)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    defaults = {"cartpole": 16, "busy100": 8, "pong": 8}
    for load in args.load:
        for i, workload in enumerate(args.workload):
            n = args.num_envs[i] if args.num_envs else defaults.get(workload, 8)
            block(load, workload, n, args.rounds, args.seconds)


if __name__ == "__main__":
    main()
