"""Smoke test of benchmarks/bench_async.py (asynchronous stepping against lock-step and the
limit): its quick mode runs every workload and implementation end to end and writes every row.
It checks what the files hold, not any speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import child_env, load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_async.py"

#: every (workload, implementation) row the script promises
ROWS = [
    *[
        ("waits", impl)
        for impl in (
            "async_half",
            "async_quarter",
            "lockstep",
            "gym_async",
            "puffer",
            "puffer_w2",
            "limit",
        )
    ],
    *[("lognormal", impl) for impl in ("async_half", "lockstep", "gym_async", "limit")],
    ("policy", "async_half"),
    ("policy", "lockstep"),
]


def _load() -> ModuleType:
    return load_script("bench_async_under_test", SCRIPT)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(300)
def test_quick_mode_writes_every_row(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = child_env()
    cmd = [sys.executable, str(SCRIPT), "--quick", "--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]

    lines = [json.loads(line) for line in (tmp_path / "async.jsonl").read_text().splitlines()]
    facts, rows = lines[0]["facts"], lines[1:]
    assert facts["quick"] and facts["repeats"] == 1 and "puffer" in facts
    by_key = {(r["workload"], r["impl"]): r for r in rows}
    assert sorted(by_key) == sorted(ROWS)
    for key, row in by_key.items():
        if key[1].startswith("puffer") and row["skipped"]:
            continue  # no PufferLib venv here: the row says why
        assert row["errors"] == [], row
        assert row["steps_per_s"] > 0 and len(row["raw"]) == 1, row
    assert by_key[("waits", "limit")]["of_limit"] == pytest.approx(1.0)
    assert by_key[("waits", "lockstep")]["x_lockstep"] == pytest.approx(1.0)
    assert by_key[("waits", "async_quarter")]["batch_size"] == 1  # 4 envs in quick mode
    policy = by_key[("policy", "async_half")]
    assert policy["policy_share"] > 0 and policy["env_share"] > 0

    table = (tmp_path / "async.md").read_text()
    for heading in ("### Targets (waits)", "### waits:", "### lognormal:", "### policy:"):
        assert heading in table
    for label in (
        "| subvec recv/send, batch_size=2 |",
        "| subvec recv/send, batch_size=1 |",
        "| subvec step() (lock-step) |",
        "| gymnasium AsyncVectorEnv |",
        "| PufferLib Multiprocessing, 4 workers, batch_size=2 |",
        "| PufferLib Multiprocessing, 2 workers, batch_size=2 |",
        "| limit (4 free-running processes, no IPC) |",
    ):
        assert label in table


def _run(workload: str, impl: str, rep: int, rate: float) -> dict[str, object]:
    return {
        "workload": workload,
        "impl": impl,
        "num_envs": 16,
        "batch_size": 8,
        "repeat": rep,
        "steps_per_s": rate,
    }


def test_summary_pairs_ratios_by_repeat_and_judges_the_targets() -> None:
    suite = _load()
    runs = [
        _run("waits", "lockstep", 0, 1000.0),
        _run("waits", "lockstep", 1, 2000.0),
        _run("waits", "async_half", 0, 4000.0),
        _run("waits", "async_half", 1, 6000.0),
        _run("waits", "limit", 0, 5000.0),
        _run("waits", "limit", 1, 10000.0),
        {**_run("waits", "puffer", 0, 0.0), "skipped": "skipped: no venv"},
    ]
    del runs[-1]["steps_per_s"]
    rows = {r["impl"]: r for r in suite.summarize(runs)}
    half = rows["async_half"]
    assert half["steps_per_s"] == 5000.0 and half["all_steps_per_s"] == [4000, 6000]
    assert half["x_lockstep"] == pytest.approx(3.5)  # median of 4.0 and 3.0
    assert half["of_limit"] == pytest.approx(0.7)  # median of 0.8 and 0.6
    assert rows["puffer"]["runs"] == 0 and rows["puffer"]["skipped"] == "skipped: no venv"
    facts = {
        "nproc": 2,
        "usable_cpus": 2,
        "cpu_model": "x",
        "python": "3",
        "gymnasium": "1",
        "load_avg": [0.0, 0.0, 0.0],
        "repeats": 2,
        "duration_s": 1.0,
        "warmup_s": 0.1,
        "date": "d",
        "git": "g",
        "quick": False,
        "puffer": "skipped",
    }
    table = suite.markdown(facts, list(rows.values()))
    assert "3.5x lock-step, 70% of the limit | met |" in table
    assert "| skipped: no venv |" in table


@pytest.mark.slow  # 10-20 s: the benchmark's smoke run, kept out of the quick loop
@pytest.mark.timeout(300)
def test_the_batch_forming_benchmark_quick_mode_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "overlap.jsonl"
    script = ROOT / "benchmarks" / "bench_overlap.py"
    impls = "subvec,subvec_min1,limit"
    cmd = [
        sys.executable,
        str(script),
        "--quick",
        "--impls",
        impls,
        "--latencies",
        "2",
        "--sim-ratios",
        "1,4",
        "--out",
        str(out),
    ]
    env = child_env()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    facts, rows = lines[0]["facts"], lines[1:]
    assert facts["nproc"] >= 1 and "load_avg_before" in facts
    got = {(r["workload"], r["impl"]) for r in rows}
    for workload in ("dispatch", "fast_step_slow_reset"):
        for impl in impls.split(","):
            assert (workload, impl) in got
    for impl in ("lockstep", "stages1", "stages2"):
        assert ("stages_2ms", impl) in got and ("stages_2ms_sim4x", impl) in got
    advised = [r for r in rows if r["impl"] == "stages1"]
    assert len(advised) == 2
    assert all(1.0 <= r["overlap_bound"] <= 2.0 and r["suggests_stages"] in (0, 1) for r in advised)
    for row in rows:
        assert "error" not in row, row
        assert row["transitions_per_s"] > 0
    subvec_row = next(r for r in rows if r["impl"] == "subvec")
    assert 1 <= subvec_row["mean_batch"] <= 8
