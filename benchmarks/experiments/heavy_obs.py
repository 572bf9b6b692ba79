"""Camera-and-instruction observations: two checkouts, with and without the Text leaf, numpy
and torch actions, in interleaved rounds with the limit measured in every round.

Each round runs the limit of ``libero<work>`` (bench_vector.py's LIBERO-like env: two
224x224x3 uint8 cameras, a 9-float state, a ``Text(64)`` instruction), then, each in a fresh
interpreter with that checkout first on ``sys.path``: every checkout on ``libero<work>`` with
numpy and with torch actions, and every checkout on ``libero<work>_notext``. It prints the
median env-steps/s and share of the limit of each, and the ratios the design asks about.

    python benchmarks/experiments/heavy_obs.py --rounds 5 base=/path/to/old new=.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_checkouts import run_child


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", help="label=path")
    parser.add_argument("--work", default="1ms", help="work per env step: 1ms, 100us, ...")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    workload = f"libero{args.work}"
    base = {"n": args.num_envs, "seconds": args.seconds, "kwargs": {}, "split": None}
    runs = []
    for item in args.checkouts:
        label, _, path = item.partition("=")
        runs += [
            (f"{label} numpy", path, {"workload": workload}),
            (f"{label} torch", path, {"workload": workload, "torch": True}),
            (f"{label} no text", path, {"workload": f"{workload}_notext"}),
        ]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    shares: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for r in range(args.rounds):
        limit = run_child({**base, "workload": workload, "what": "limit"}, None)
        order = runs[r % len(runs) :] + runs[: r % len(runs)]
        for name, path, spec in order:
            rate = run_child({**base, **spec, "what": "vector"}, path)
            rates[name].append(rate)
            shares[name].append(rate / limit)
        print(f"round {r + 1}: limit {limit:,.0f} steps/s", flush=True)
    print(f"{workload} x {args.num_envs}, {args.rounds} rounds (medians)")
    median = {name: statistics.median(rates[name]) for name in rates}
    for name in rates:
        each = ", ".join(f"{s:.0%}" for s in shares[name])
        print(
            f"  {name:20s} {median[name]:10,.0f} steps/s, "
            f"{statistics.median(shares[name]):.0%} of the limit (rounds: {each})"
        )
    labels = [item.partition("=")[0] for item in args.checkouts]
    for label in labels:
        text = median[f"{label} numpy"] / median[f"{label} no text"]
        torch = median[f"{label} torch"] / median[f"{label} numpy"]
        print(f"  {label}: with the Text leaf {text:.0%} of without; torch {torch:.0%} of numpy")
    for label in labels[1:]:
        gain = median[f"{label} numpy"] / median[f"{labels[0]} numpy"]
        print(f"  {label} numpy / {labels[0]} numpy: {gain:.2f}x")


if __name__ == "__main__":
    main()
