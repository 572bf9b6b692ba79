"""What ``import subvec`` says about an old gymnasium, in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(60)
def test_import_with_gymnasium_older_than_1_0_says_what_is_needed(tmp_path: Path) -> None:
    fake = tmp_path / "gymnasium"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "0.29.1"\n')
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
    assert last.startswith("ImportError: subvec needs gymnasium >= 1.0"), proc.stderr
    assert "0.29.1" in last and 'info_format="legacy"' in last
