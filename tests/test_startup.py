"""How workers start: without re-running the user's script, with the script's env registrations,
with or without a main guard; and what ``import subvec`` says about a too old gymnasium.

Each test runs a script as a user would (``python script.py``) in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import child_env

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"


def _env(**extra: str) -> dict[str, str]:
    return child_env(**extra)


def _run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.fixture(scope="module", params=["forkserver", "spawn"])
def main_guard_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """``main_guard.py`` run once per start method: its report and who imported ``heavy``."""
    marker = tmp_path_factory.mktemp("heavy") / "pids"
    proc = _run("main_guard.py", request.param, SUBVEC_HEAVY_MARKER=str(marker))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    report["imported_heavy"] = [int(line) for line in marker.read_text().split()]
    report["stderr"] = proc.stderr
    return report


@pytest.mark.timeout(120)
def test_envs_registered_inside_the_main_guard_build_in_the_workers(
    main_guard_run: dict[str, Any],
) -> None:
    # Env 0's id has a callable entry point (the script's class), env 1's a "__main__:Class"
    # string, env 2's comes from a package that registers it on import; each start comes from
    # its registration, the 0.5 from a reset option of the script's own class.
    assert main_guard_run["obs"] == [10.5, 20.5, 30.5, 11.5, 21.5, 31.5]
    assert main_guard_run["info_class"], "an info of the script's class came back as another"
    assert "Overriding environment" not in main_guard_run["stderr"], main_guard_run["stderr"]


@pytest.mark.timeout(120)
def test_workers_do_not_run_the_users_script(main_guard_run: dict[str, Any]) -> None:
    workers = main_guard_run["workers"]
    assert len(workers) == 2 and main_guard_run["parent"] not in workers
    # Only the script's own process imported its heavy module; no worker ran the script.
    assert main_guard_run["imported_heavy"] == [main_guard_run["parent"]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["forkserver", "spawn", "fork"])
def test_script_without_main_guard_works(context: str) -> None:
    proc = _run("no_guard.py", context)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok (2, 4)"
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["forkserver", "spawn"])
def test_a_script_without_main_guard_works_through_the_sb3_face(context: str) -> None:
    pytest.importorskip("stable_baselines3")
    proc = _run("no_guard.py", context, "sb3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok (2, 4)"
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.timeout(120)
def test_building_envs_while_multiprocessing_reimports_the_script_names_both_fixes() -> None:
    # The script's own spawn child re-runs it, and so builds a vector env while multiprocessing
    # is still bootstrapping that child: subvec cannot start workers from there.
    proc = _run("spawns_own.py", "forkserver")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "child exit code 1"
    assert "subvec.errors.MissingMainGuardError" in proc.stderr, proc.stderr[-3000:]
    assert 'if __name__ == "__main__":' in proc.stderr
    assert 'context="fork"' in proc.stderr


@pytest.mark.timeout(60)
def test_import_with_gymnasium_older_than_0_29_1_says_what_is_needed(tmp_path: Path) -> None:
    fake = tmp_path / "gymnasium"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "0.28.1"\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    proc = subprocess.run(
        [sys.executable, "-c", "import subvec"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: subvec needs gymnasium >= 0.29.1"), proc.stderr
    assert "gymnasium 0.28.1 is installed" in last and 'pip install "gymnasium>=0.29.1"' in last


@pytest.mark.timeout(120)
@pytest.mark.parametrize("context", ["forkserver", "spawn", "fork"])
def test_worker_tracebacks_name_the_users_file_line_and_source(context: str) -> None:
    # The script's env class and lambda travel by value (cloudpickle); their errors must still
    # point into the script as they would in-process, not at "<dynamic-code>".
    proc = _run("user_errors.py", context)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    script = str(SCRIPTS / "user_errors.py")
    for what, error, tag, source in (
        ("step", "ValueError", "STEP-LINE", 'raise ValueError("the env\'s own step failed")'),
        ("build", "KeyError", "LAMBDA-LINE", '[BrokenStep, lambda: {}["no such key"]]'),
    ):
        kind, text = report[what]
        assert kind == error
        where = f'File "{script}", line {report["lines"][tag]}, in '
        assert where in text, text
        assert source in text.split(where, 1)[1].splitlines()[1], text
        assert "<dynamic-code>" not in text
