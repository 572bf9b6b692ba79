"""A stand-in for what a training script imports at the top (torch, tensorboard): importing it
appends this process's pid to the file named by ``SUBVEC_HEAVY_MARKER``, so a test can tell
which processes imported it."""

from __future__ import annotations

import os

_marker = os.environ.get("SUBVEC_HEAVY_MARKER")
if _marker:
    with open(_marker, "a") as f:
        f.write(f"{os.getpid()}\n")
