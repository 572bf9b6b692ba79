"""Driven by tests/test_failures.py: start a vector env, report its workers, then misbehave.

Usage: python lifecycle.py CONTEXT MODE
  MODE idle      : print pids, then sleep (the test SIGKILLs us)
  MODE midstep   : print pids, then step an env that sleeps inside step (we get SIGKILLed)
  MODE native    : as midstep, the env sleeping in native code that holds the GIL
  MODE noclose   : step a few times and exit without close()
  MODE interrupt : step in a loop; on KeyboardInterrupt close() and report
"""

from __future__ import annotations

import json
import sys
import time

from subvec import SubprocVectorEnv
from tests.envs import crash_fns


def main() -> None:
    context, mode = sys.argv[1], sys.argv[2]
    how = {"midstep": "hang", "native": "native_hang"}.get(mode, "")
    fns = crash_fns(4, 3, how, seconds=60)
    envs = SubprocVectorEnv(fns, num_workers=2, context=context)
    envs.reset(seed=0)
    block = envs._pool.resources.block
    report = {"pids": [r.pid for r in envs.placement], "segment": block.name if block else None}
    print(json.dumps(report), flush=True)
    actions = envs.action_space.sample()
    if mode == "idle":
        time.sleep(600)
    elif mode in ("midstep", "native"):
        envs.step_async(actions)
        print("stepping", flush=True)
        envs.step_wait()
    elif mode == "noclose":
        for _ in range(5):
            envs.step(actions)
        print("exiting without close", flush=True)
    elif mode == "interrupt":
        try:
            print("looping", flush=True)
            while True:
                envs.step(actions)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        envs.close()
        print("closed", flush=True)


if __name__ == "__main__":
    main()
