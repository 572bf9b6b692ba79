"""Smoke test of benchmarks/bench_multiagent.py: it runs end to end, tiny, and writes what it
promises (no speed is checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import child_env

pytest.importorskip("pettingzoo")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
def test_quick_run_writes_the_table_and_raw_values(tmp_path: Path) -> None:
    env = child_env()
    script = ROOT / "benchmarks" / "bench_multiagent.py"
    cmd = [sys.executable, str(script), "--quick", "--out-dir", str(tmp_path)]
    bad = subprocess.run(
        [*cmd, "--impls", "serial,nosuch"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "unknown workload or implementation nosuch" in bad.stderr
    cmd += ["--workloads", "comings", "--impls", "serial,subvec,hand_dict"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(x) for x in (tmp_path / "multiagent.jsonl").read_text().splitlines()]
    assert lines[0]["facts"] and len(lines[0]["load_before"]) == 3
    rows = {(x["workload"], x["impl"]): x for x in lines[1:]}
    assert set(rows) == {("comings", "serial"), ("comings", "subvec"), ("comings", "hand_dict")}
    assert rows[("comings", "serial")]["x_serial"] == 1.0
    assert all(x["median"] > 0 for x in rows.values())
    table = (tmp_path / "multiagent.md").read_text()
    assert "| comings | subvec |" in table and "load average" in table
