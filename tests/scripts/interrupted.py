"""Driven by tests/test_failures.py: Ctrl-C (SIGINT to the whole process group, as a terminal
sends it) during a long env step, then the next calls and close(). Run as
``python interrupted.py STEP_SECONDS wait|stop``: ``stop`` presses Ctrl-C again while the next
call waits. Prints a JSON report."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import warnings

import numpy as np
import psutil

import subvec
from tests.envs import ZooEnv

step_seconds, then = float(sys.argv[1]), sys.argv[2]
report: dict[str, object] = {}
notices: list[tuple[float, str]] = []
clock = [time.monotonic()]


def ctrl_c(after: float) -> None:
    threading.Timer(after, os.killpg, (os.getpgid(0), signal.SIGINT)).start()


def notice(message: object, *args: object, **kwargs: object) -> None:
    notices.append((time.monotonic() - clock[0], str(message)))


warnings.simplefilter("always")
warnings.showwarning = notice  # type: ignore[assignment]

fns = [lambda: ZooEnv(max_steps=10**6, terminate_prob=0.0, step_seconds=step_seconds)] * 2
envs = subvec.SubprocVectorEnv(fns, num_workers=2)
envs.reset(seed=0)
workers = list(envs.worker_pids)

clock[0] = time.monotonic()
ctrl_c(0.5)
try:
    envs.step(np.array([0, 0]))
    report["step"] = "returned"
except KeyboardInterrupt:
    report["step"] = "interrupted"
report["step_s"] = time.monotonic() - clock[0]

clock[0] = time.monotonic()
if then == "stop":
    ctrl_c(2.0)
try:
    envs.set_attr("marker", "after")
    report["next"] = "returned"
    report["next_s"] = time.monotonic() - clock[0]
    report["marker"] = list(envs.get_attr("marker"))
    report["t_before_step"] = list(envs.get_attr("t"))
    envs.step(np.array([1, 1]))
    report["t_after_step"] = list(envs.get_attr("t"))
except KeyboardInterrupt:
    report["next"] = "interrupted"
    report["next_s"] = time.monotonic() - clock[0]
report["notices"] = notices

clock[0] = time.monotonic()
envs.close()
report["close_s"] = time.monotonic() - clock[0]
report["left"] = [pid for pid in workers if psutil.pid_exists(pid)]
print(json.dumps(report), flush=True)
