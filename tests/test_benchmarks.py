"""Smoke tests of the benchmark suite (benchmarks/bench_vector.py) and of ``subvec bench``.

Both run tiny: a fraction of a second per configuration. They check that the tools run end to
end and write what they promise, not any speed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from subvec import _bench, cli
from tests.helpers import child_env, load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_vector.py"


def _env() -> dict[str, str]:
    return child_env()


def _load_suite() -> ModuleType:
    return load_script("bench_vector_under_test", SCRIPT)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(240)
def test_suite_quick_mode_writes_results(tmp_path: Path) -> None:
    out, img = tmp_path / "results", tmp_path / "img"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--out-dir", str(out), "--img-dir", str(img)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=220, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]

    lines = [json.loads(line) for line in (out / "quick.jsonl").read_text().splitlines()]
    facts, rows = lines[0]["facts"], lines[1:]
    assert facts["nproc"] >= 1 and facts["usable_cpus"] >= 1 and "load_avg" in facts
    got = {(r["workload"], r["impl"]) for r in rows}
    for workload in ("cartpole", "busy100us"):
        for impl in ("subvec", "sync", "async_shm", "limit"):
            assert (workload, impl) in got
    for row in rows:
        assert row["errors"] == [], row
        assert row["steps_per_s"] > 0 and row["p99_us"] >= row["p50_us"] > 0
        assert row["of_limit"] > 0
    limit = next(r for r in rows if r["impl"] == "limit")
    assert limit["of_limit"] == pytest.approx(1.0)
    subvec_row = next(r for r in rows if r["impl"] == "subvec")
    assert subvec_row["worker_uss_mb"] > 0 and subvec_row["num_workers"] >= 1

    table = (out / "quick.md").read_text()
    assert "### cartpole" in table and "| subvec |" in table
    raw = (out / "raw" / "quick-runs.jsonl").read_text().splitlines()
    assert len(raw) == len(rows)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (img / "quick-cartpole.png").stat().st_size > 1000
        assert (img / "quick-busy100us.png").stat().st_size > 1000


def _row(impl: str, n: int, rate: float, workload: str = "w") -> dict[str, Any]:
    return {"workload": workload, "impl": impl, "num_envs": n, "steps_per_s": rate}


def test_summary_takes_medians_and_ratios() -> None:
    suite = _load_suite()
    runs = [
        _row("subvec", 8, 100.0),
        _row("subvec", 8, 300.0),
        _row("subvec", 8, 200.0),
        _row("async_shm", 8, 50.0),
        _row("limit", 8, 400.0),
        {**_row("sync", 8, 0.0), "error": "exit 1: boom"},
    ]
    rows = {r["impl"]: r for r in suite.summarize(runs)}
    assert rows["subvec"]["steps_per_s"] == 200.0
    assert rows["subvec"]["all_steps_per_s"] == [100, 300, 200]
    assert rows["subvec"]["x_async"] == pytest.approx(4.0)
    assert rows["subvec"]["of_limit"] == pytest.approx(0.5)
    assert rows["sync"]["steps_per_s"] is None and rows["sync"]["errors"] == ["exit 1: boom"]
    table = suite.markdown({}, list(rows.values()))
    assert "200 (50%)" in table and "1 failed" in table


def test_workload_names() -> None:
    suite = _load_suite()
    spec = suite.workload_spec("busy250us_84x84x3", iters_per_us=10.0)
    assert spec["kind"] == "busy" and spec["iters"] == 2500 and spec["obs_shape"] == [84, 84, 3]
    assert suite.workload_spec("busy1ms", iters_per_us=2.0)["iters"] == 2000
    assert suite.workload_spec("pong", 1.0)["module"] == "ale_py"
    with pytest.raises(SystemExit, match="unknown workload"):
        suite.workload_spec("nope", 1.0)
    env = suite.make_factory(suite.workload_spec("busy10us_2x3", 1.0))()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 3) and env.observation_space.contains(obs)
    obs, _, terminated, _, info = env.step(1)
    assert env.observation_space.contains(obs) and not terminated and info == {}
    spec = suite.workload_spec("libero1ms", iters_per_us=2.0)
    assert spec == {"kind": "libero", "cost_us": 1000, "iters": 2000, "text": True}
    assert suite.workload_spec("libero5us_notext", 2.0)["text"] is False
    env = suite.make_factory(suite.workload_spec("libero10us", 1.0))()
    obs, _ = env.reset(seed=0)
    assert obs["agentview_image"].shape == (224, 224, 3) and obs["state"].shape == (9,)
    assert env.observation_space.contains(obs) and obs["instruction"] in env.INSTRUCTIONS
    obs, *_ = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs)
    assert "instruction" not in suite.make_factory({**spec, "text": False})().observation_space


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(90)
def test_the_libero_workload_runs_with_torch_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])  # the child imports this checkout
    suite = _load_suite()
    assert "subvec_torch" in suite.ALL_IMPLS and "subvec_torch" in suite.STYLES
    spec = suite.workload_spec("libero10us", 1.0)
    cfg = {"impl": "subvec_torch", "num_envs": 2, "spec": spec, "seed": 0}
    result = suite.run_child({**cfg, "warmup": 0.05, "duration": 0.1}, timeout=80)
    assert "error" not in result, result
    assert result["steps_per_s"] > 0 and result["vec_steps"] > 0


def test_peers_are_registered_and_skip_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _load_suite()
    assert "experiments" not in SCRIPT.read_text()  # the suite imports no experiment
    for impl in ("puffer_mp", "puffer_mp_w1", "envpool", "envpool_cpus"):
        assert impl in suite.ALL_IMPLS and impl in suite.IMPL_LABELS and impl in suite.STYLES
    quick = {w: impls.split(",") for w, (_, impls) in suite.PLANS["quick"].items()}
    assert {"puffer_mp", "envpool"} <= set(quick["cartpole"])
    cartpole, pong = suite.workload_spec("cartpole", 1.0), suite.workload_spec("pong", 1.0)
    busy = suite.workload_spec("busy100us", 1.0)

    monkeypatch.setattr(suite, "_installed", lambda module: False)
    assert "pufferlib is not installed" in suite.available("cartpole", "puffer_mp", cartpole)
    assert suite.available("cartpole", "envpool", cartpole) == "envpool is not installed"
    assert suite.available("cartpole", "subvec", cartpole) is None
    # only EnvPool itself is needed: its Pong-v5 is its own, ale-py's is not used
    monkeypatch.setattr(suite, "_installed", lambda module: module != "ale_py")
    assert suite.available("pong", "envpool", pong) is None
    assert suite.available("pong", "puffer_mp", pong) == "ale_py is not installed"
    assert suite.available("busy100us", "envpool", busy) == "EnvPool has no equivalent of busy100us"
    assert suite.available("busy100us", "puffer_mp_w1", busy) is None

    # one worker per core, lowered to a divisor of num_envs
    assert [suite.puffer_workers(n, 2) for n in (1, 2, 7, 16)] == [1, 2, 1, 2]
    assert suite.puffer_workers(6, 4) == 3
    rows = [{**_row("envpool", 8, 10.0, "pong"), "runs": 1, "errors": []}]
    for key in suite.FIELDS:
        rows[0].setdefault(key, None)
    suite.add_ratios(rows)
    assert "is not ALE/Pong-v5" in suite.markdown({}, rows)


def test_simpy_env_follows_the_api() -> None:
    pytest.importorskip("simpy")
    from gymnasium.utils.env_checker import check_env

    suite = _load_suite()
    env = suite.QueueEnv(horizon=5)
    check_env(env, skip_render_check=True)
    env.reset(seed=1)
    for t in range(5):
        obs, reward, _, truncated, _ = env.step(t % 2)
        assert env.observation_space.contains(obs) and reward <= 0
    assert truncated


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
def test_cli_bench_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "subvec",
        "bench",
        "--num-envs",
        "2",
        "--duration",
        "0.2",
        "--warmup",
        "0.05",
        "--repeats",
        "1",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=110, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CartPole-v1" in proc.stdout
    for label in ("subvec.SubprocVectorEnv", "gymnasium AsyncVectorEnv", "limit (no IPC)"):
        assert label in proc.stdout
    assert "3/3" in proc.stderr  # the progress display
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["impl"] for r in rows] == ["subvec", "async", "limit"]
    assert all(r["steps_per_s"] > 0 for r in rows)
    assert rows[1]["x_async"] == pytest.approx(1.0) and rows[2]["of_limit"] == pytest.approx(1.0)


def test_cli_bench_rejects_bad_arguments() -> None:
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--num-envs", "0"])
    args = parser.parse_args(["bench", "--num-envs", "4,8", "--env-id", "Acrobot-v1"])
    assert args.num_envs == [4, 8] and args.env_id == "Acrobot-v1"
    with pytest.raises(ValueError, match="unknown implementation"):
        _bench.run_bench(impls=["nope"])


def test_format_table_shows_failures() -> None:
    rows = [
        {
            "impl": "subvec",
            "num_envs": 4,
            "workers": 2.0,
            "steps_per_s": 1234.0,
            "x_async": 2.0,
            "of_limit": 0.5,
            "p50_ms": 0.1,
            "p99_ms": 0.2,
            "startup_s": 0.3,
        },
        {"impl": "async", "num_envs": 4, "error": "exit 1: boom"},
    ]
    table = _bench.format_table(rows)
    assert "| subvec.SubprocVectorEnv | 4 | 2 | 1,234 | 2.0x | 50% |" in table
    assert "failed: exit 1: boom" in table


def test_the_best_layout_line_names_only_what_to_set() -> None:
    row = {"workers": 2.0, "steps_per_s": 5000.0, "p50_ms": 0.1, "p99_ms": 0.2, "startup_s": 0.3}
    default_spin = {**row, "options": {"envs_per_worker": 4, "spin_us": None}}
    spin_off = {**row, "options": {"envs_per_worker": 2, "spin_us": 0}}
    best = _bench.format_tune([default_spin, spin_off]).splitlines()[-1]
    assert (
        best
        == "best: SubprocVectorEnv(..., envs_per_worker=4) (the default spin): 5,000 env-steps/s"
    )
    best = _bench.format_tune([spin_off]).splitlines()[-1]
    assert best == "best: SubprocVectorEnv(..., envs_per_worker=2, spin_us=0): 5,000 env-steps/s"


def test_a_busy_machine_or_scattered_repeats_are_warned_of() -> None:
    settled = {"impl": "subvec", "steps_per_s": 100.0, "spread": 0.05}
    scattered = {"impl": "async", "steps_per_s": 100.0, "spread": 0.4}
    assert _bench.reliability_warnings([settled], load_before=0.2, cpus=2) == []
    (busy,) = _bench.reliability_warnings([settled], load_before=3.0, cpus=2)
    assert "3.00 on 2 usable CPU(s)" in busy and "under 1" in busy
    (spread,) = _bench.reliability_warnings([settled, scattered], load_before=0.2, cpus=2)
    assert "40%" in spread and "gymnasium AsyncVectorEnv" in spread and "--repeats" in spread
    layout = {"options": {"envs_per_worker": 4, "spin_us": None}, "spread": 0.3}
    (spread,) = _bench.reliability_warnings([layout], 0.0, 2, label="options")
    assert "envs_per_worker=4, spin_us=default" in spread


def test_runs_spread_is_the_range_over_the_median() -> None:
    runs = [{"steps_per_s": r, "p50_ms": 1.0} for r in (90.0, 100.0, 120.0)]
    summary = _bench._summary(runs)
    assert summary["steps_per_s"] == 100.0 and summary["spread"] == pytest.approx(0.3)
    assert _bench._summary(runs[:1])["spread"] == 0.0


def test_import_subvec_leaves_the_bench_out() -> None:
    code = (
        "import sys, subvec; "
        "bad = [m for m in ('subvec._bench', 'subvec.cli', 'matplotlib', 'torch') "
        "if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(), timeout=60)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
def test_chunk_benchmark_quick_mode_writes_results(tmp_path: Path) -> None:
    script = ROOT / "benchmarks" / "bench_chunks.py"
    cmd = [sys.executable, str(script), "--quick", "--out-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=110, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in (tmp_path / "chunks.jsonl").read_text().splitlines()]
    rows = lines[1:]
    assert {r["how"] for r in rows} == {
        "limit",
        "lock-step limit 1",
        "lock-step limit 4",
        "step",
        "chunk 1",
        "chunk 4",
    }
    assert all(r["steps_per_s"] > 0 for r in rows)
    table = (tmp_path / "chunks.md").read_text()
    # chunks of 4 are shown against the lock-step limit at K = 4 (a share in its column)
    row = next(line for line in table.splitlines() if "| chunk 4 |" in line)
    assert row.split("|")[8].strip().endswith("%")
