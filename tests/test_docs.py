"""The quick starts in the README and the docs run as written, each in a fresh interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import child_env

ROOT = Path(__file__).resolve().parent.parent

#: (page, which python block): the blocks a newcomer copies whole
QUICK_STARTS = [
    ("README.md", 0),
    ("docs/sb3.md", 0),
    pytest.param("docs/ray.md", 0, marks=[pytest.mark.slow, pytest.mark.ray]),
]


def python_blocks(page: Path) -> list[str]:
    """The page's fenced ``python`` code blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```$", page.read_text(), flags=re.S | re.M)


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("page", "index"), QUICK_STARTS)
def test_a_quick_start_runs_as_written(page: str, index: int) -> None:
    code = python_blocks(ROOT / page)[index]
    for module in re.findall(r"^(?:from|import) (\w+)", code, flags=re.M):
        pytest.importorskip(module)
    env = child_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env
    )
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"{page} block {index}: {took:.1f} s")  # what the docs promise: under a minute
