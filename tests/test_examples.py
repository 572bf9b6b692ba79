"""Smoke tests: every example runs to the end with tiny settings, as a user would run it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import child_env

ROOT = Path(__file__).resolve().parent.parent

# (script, tiny arguments, modules it needs, a line its output must contain)
EXAMPLES = [
    (
        "sb3_ppo.py",
        ["--total-timesteps", "256", "--n-envs", "2", "--eval-episodes", "2"],
        ["stable_baselines3"],
        "mean return before=",
    ),
    (
        "cleanrl_ppo.py",
        ["--total-timesteps", "512", "--num-envs", "2", "--num-steps", "128"],
        ["torch"],
        "episodic_return=",
    ),
    (
        "async_ppo.py",
        ["--total-timesteps", "4096", "--num-envs", "4", "--recv-batch", "2", "--num-steps", "256"],
        ["torch"],
        "mean_return_last_20=",
    ),
    (
        "multiagent_sb3.py",
        [
            "--total-timesteps",
            "768",
            "--num-vec-envs",
            "2",
            "--n-steps",
            "16",
            "--eval-episodes",
            "2",
        ],
        ["stable_baselines3", "pettingzoo", "mpe2"],
        "mean return per agent before=",
    ),
    (
        "multiagent_sb3.py",
        [
            *("--env", "pistonball", "--total-timesteps", "384", "--num-vec-envs", "2"),
            *("--n-steps", "8", "--max-cycles", "12", "--eval-episodes", "2"),
        ],
        ["stable_baselines3", "pettingzoo", "pymunk", "supersuit"],
        "mean return per agent before=",
    ),
    ("simpy_queue.py", ["--num-envs", "3", "--hours", "1"], ["simpy"], "rule of thumb"),
    ("custom_env.py", ["--num-envs", "3", "--size", "4"], [], "caught RuntimeError from env 1"),
    ("gpu_placement.py", ["--workers", "6"], [], "worker 5: node 0, cpus 0-15, gpu 1"),
    (
        "action_chunks.py",
        ["--num-envs", "3", "--chunk", "4", "--chunks", "5", "--image", "32"],
        [],
        "same rewards from the same seeds",
    ),
    (
        "pipelined_chunks.py",
        ["--num-envs", "4", "--chunk", "4", "--chunks", "3", "--sim-ms", "0.1"],
        [],
        "same rewards from the same seeds",
    ),
    (
        "vla_rollout.py",
        ["--num-envs", "2", "--group", "1", "--rollouts", "3", "--max-steps", "16", "--size", "64"],
        ["mujoco"],
        "0 blank frames",
    ),
]


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("script", "args", "needs", "expect"),
    EXAMPLES,
    ids=[e[0].removesuffix(".py") for e in EXAMPLES],
)
def test_example_runs(script: str, args: list[str], needs: list[str], expect: str) -> None:
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{script} needs {', '.join(missing)}")
    env = child_env()  # the examples import this checkout's subvec, installed or not
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    assert expect in result.stdout, result.stdout
