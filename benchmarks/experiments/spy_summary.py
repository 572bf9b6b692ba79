"""Scratch: summarize py-spy ``--format raw`` output per process: leaf functions (self time)
and the share of samples that are idle (blocked in a system call) vs running Python."""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path


def main(path: str, top: int = 12) -> None:
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    totals: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        if any("worker_main" in f for f in frames):
            kind = "worker"
        elif any("spy_target.py" in f and "<module>" not in f for f in frames[1:3]) or (
            len(frames) > 1
            and frames[1].startswith("<module> (spy_target.py")
            and any("step" in f for f in frames)
        ):
            kind = "parent"
        else:
            continue
        leaf = re.sub(r" \(.*/", " (", frames[-1])
        leaves[kind][leaf] += int(count)
        totals[kind] += int(count)
    for kind, counter in leaves.items():
        print(f"== {kind}: {totals[kind]} samples")
        for leaf, n in counter.most_common(top):
            print(f"  {100 * n / totals[kind]:5.1f}%  {leaf}")


if __name__ == "__main__":
    main(sys.argv[1])
