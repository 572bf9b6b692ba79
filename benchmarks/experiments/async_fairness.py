"""How alike first-ready stepping serves identical envs, checkouts side by side.

    python benchmarks/experiments/async_fairness.py --rounds 3 base=/tmp/base new=.

Each trial: ``SubprocVectorEnv(8 x CartPole-v1, batch_size=3)``, ``async_reset(seed=trial)``,
then ``--recvs`` times ``recv()`` and ``send(zeros, ids)``; the score is the least-served env's
turns over the most-served env's. A round runs every checkout once (``--trials`` trials each,
in a fresh interpreter with that checkout first on ``PYTHONPATH``) and prints the median
score of each. Decision 0029.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, sys
import gymnasium as gym, numpy as np, subvec
trials, recvs, num_envs, batch_size = map(int, sys.argv[1:5])
scores = []
for seed in range(trials):
    envs = subvec.SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs,
                                   batch_size=batch_size)
    envs.async_reset(seed=seed)
    counts = np.zeros(num_envs)
    for _ in range(recvs):
        ids = envs.recv()[4]["env_id"]
        counts[ids] += 1
        envs.send(np.zeros(len(ids), dtype=np.int64), ids)
    envs.drain()
    envs.close()
    scores.append(float(counts.min() / counts.max()))
print(json.dumps(scores))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="+", help="label=path of a checkout of subvec")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--recvs", type=int, default=300)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=3)
    args = parser.parse_args()
    checkouts = [c.split("=", 1) for c in args.checkouts]
    for r in range(args.rounds):
        for label, path in checkouts:
            root = os.path.abspath(path)
            env = dict(os.environ, PYTHONPATH=root)
            sizes = [args.trials, args.recvs, args.num_envs, args.batch_size]
            out = subprocess.run(
                [sys.executable, "-c", CHILD, *map(str, sizes)],
                env=env,
                cwd=root,  # ``-c`` puts the working directory first on sys.path
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            scores = json.loads(out.strip().splitlines()[-1])
            print(
                f"round {r + 1} {label}: median min/max {statistics.median(scores):.2f} "
                f"(trials: {' '.join(f'{s:.2f}' for s in scores)})",
                flush=True,
            )


if __name__ == "__main__":
    main()
