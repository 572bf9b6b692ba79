"""Batch forming against torchrl's AsyncEnvPool, on torchrl's own benchmark workloads.

The two workloads are torchrl's (pytorch/rl#4182, ``benchmarks/test_envs_benchmark.py``),
re-created here with its constants; the harvest loop is theirs too: ``recv`` with
``min_get=1``, ``max_get`` and a 1 ms deadline, then ``send`` of one action per returned env.

- ``dispatch``: 8 envs with free steps, 1024 transitions a round: the round time is the
  consumer's dispatch cost per transition (``recv`` -> action -> ``send``).
- ``fast_step_slow_reset``: 32 envs with 1 ms steps and a 200 ms reset every 200 steps, 2048
  transitions a round; resets happen in the workers (torchrl's ``step_and_maybe_reset``,
  subvec's autoreset). The envs can supply 32 x 200 / (200 x 1 ms + 200 ms) = 16,000
  transitions/s; ``limit`` measures what this machine supplies: 32 processes stepping their
  env in a loop with no IPC at all.

``stages`` (subvec alone): a policy stand-in that releases the CPU for L ms per forward pass
of the whole batch, in proportion to the rows it is given (a model that keeps its accelerator
busy), and returns an action chunk of K per env, over 4 envs, one per worker, whose step burns
L/(2K) ms of CPU: on 2 CPUs the 4 workers' chunks take L, as long as a forward pass.
``lockstep`` runs ``step_chunk(policy(obs))``: L + L per batch. ``stages1`` is the same through
``recv(env_ids=all)``/``send_chunk``; ``stages2`` splits the envs into ``env_groups(2)`` and
infers on one group (L/2) while the other group's 2 workers run their chunks on the 2 CPUs
(L/2): L per batch, the limit of 2x lock-step (verl's and RLinf's pipelined stages, with the
stages' workers simulating at once).

Implementations: ``subvec`` (one env per worker, as torchrl's pool runs), ``subvec_default``
(subvec's default layout), ``subvec_min1`` (``recv(min_envs=1)`` with no deadline: what is
ready at once), ``torchrl_shm`` and ``torchrl_queue`` (``AsyncEnvPool(backend="multiprocessing",
exchange=...)``), ``limit``. Each configuration runs in a fresh interpreter, interleaved over
the repeats; transitions/s are medians, and "of limit" is the median of per-repeat ratios.

    python benchmarks/bench_overlap.py --repeats 3
    python benchmarks/bench_overlap.py --quick
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

#: torchrl's constants (pytorch/rl#4182), kept as they are there
WORKLOADS: dict[str, dict[str, Any]] = {
    "dispatch": {
        "num_envs": 8,
        "transitions": 1024,
        "step_s": 0.0,
        "reset_s": 0.0,
        "max_steps": 10_000_000,
        "max_get": 8,
    },
    "fast_step_slow_reset": {
        "num_envs": 32,
        "transitions": 2048,
        "step_s": 1e-3,
        "reset_s": 0.2,
        "max_steps": 200,
        "max_get": 32,
    },
}
DEADLINE_S = 1e-3
IMPLS = ["subvec", "subvec_default", "subvec_min1", "torchrl_shm", "torchrl_queue", "limit"]
STAGE_IMPLS = ["lockstep", "stages1", "stages2"]
_RESULT = "RESULT "


# --- the envs ------------------------------------------------------------------------------


def _gym_env(step_s: float, reset_s: float, max_steps: int) -> Any:
    import gymnasium as gym
    import numpy as np

    class DelayedCounting(gym.Env[np.ndarray, int]):
        """torchrl's DelayedCountingEnv as a gymnasium env: a counter, latencies by sleep."""

        observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self) -> None:
            self.count = 0

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            super().reset(seed=seed)
            if reset_s:
                time.sleep(reset_s)
            self.count = 0
            return np.zeros(1, np.float32), {}

        def step(self, action: int) -> Any:
            if step_s:
                time.sleep(step_s)
            self.count += 1
            obs = np.full(1, self.count, np.float32)
            return obs, 1.0, False, self.count >= max_steps, {}

    return DelayedCounting()


def _torchrl_env(step_s: float, reset_s: float, max_steps: int) -> Any:
    from torchrl.testing.mocking_classes import CountingEnv

    class DelayedCountingEnv(CountingEnv):  # type: ignore[misc]
        """As torchrl's benchmark: CountingEnv with synchronous step and reset latencies."""

        def _step(self, tensordict: Any) -> Any:
            if step_s:
                time.sleep(step_s)
            return super()._step(tensordict)

        def _reset(self, tensordict: Any, **kwargs: Any) -> Any:
            if reset_s:
                time.sleep(reset_s)
            return super()._reset(tensordict, **kwargs)

    return DelayedCountingEnv(max_steps=max_steps)


def _busy_env(work_s: float) -> Any:
    import gymnasium as gym
    import numpy as np

    class Busy(gym.Env[np.ndarray, int]):
        """A step that burns ``work_s`` of CPU (a simulator on the CPU)."""

        observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            super().reset(seed=seed)
            return np.zeros(4, np.float32), {}

        def step(self, action: int) -> Any:
            # CPU time, not wall time: workers that share a CPU take longer, as a simulator does
            end = time.thread_time() + work_s
            while time.thread_time() < end:
                pass
            return np.zeros(4, np.float32), 1.0, False, False, {}

    return Busy()


# --- one configuration, in a fresh interpreter --------------------------------------------


def _run_stages(cfg: dict[str, Any]) -> dict[str, float]:
    import functools

    import numpy as np

    import subvec

    latency, chunk = cfg["latency_ms"] / 1e3, cfg["chunk"]
    # 4 workers' chunks of K sub-steps on 2 CPUs take ``sim_ratio`` times a forward pass of
    # every row (1: as long)
    fn = functools.partial(_busy_env, cfg.get("sim_ratio", 1.0) * latency / (2 * chunk))
    num_envs = 4
    impl, seconds = cfg["impl"], cfg["seconds"]

    def policy(obs: Any) -> Any:
        # a forward pass on an accelerator, its time in proportion to the rows: the CPU is free
        time.sleep(latency * len(obs) / num_envs)
        return np.zeros((len(obs), chunk), dtype=np.int64)  # an action chunk per env

    with subvec.SubprocVectorEnv([fn] * num_envs, envs_per_worker=1) as envs:
        groups = envs.env_groups(2 if impl == "stages2" else 1)
        obs, _ = envs.reset(seed=0)
        if impl == "lockstep":
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                obs, *_ = envs.step_chunk(policy(obs))
                steps += num_envs * chunk
            rate = steps / (time.perf_counter() - start)
        else:
            # The clock starts once the first chunks are sent and stops before the drain:
            # each counted chunk then has one policy call inside the window, as in lock-step
            # (the first policy calls and the chunks drained at the end are not counted).
            for group in groups:
                envs.send_chunk(policy(obs[group]), group)
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                for group in groups:
                    obs_g, *_ = envs.recv(env_ids=group)
                    steps += len(group) * chunk
                    envs.send_chunk(policy(obs_g), group)
            rate = steps / (time.perf_counter() - start)
            envs.drain()
        if impl == "lockstep":
            return {"transitions_per_s": rate}
        window = envs.async_stats()  # what a user's loop of these stages would read
        return {
            "transitions_per_s": rate,
            "consumer_waiting": window.consumer_waiting,
            "envs_waiting": window.envs_waiting,
            "overlap_bound": window.overlap_bound,
            "suggests_stages": float(window.advice.startswith("the envs and the policy")),
        }


def _run_subvec(cfg: dict[str, Any], w: dict[str, Any]) -> dict[str, float]:
    import functools

    import numpy as np

    import subvec

    fn = functools.partial(_gym_env, w["step_s"], w["reset_s"], w["max_steps"])
    layout = {} if cfg["impl"] == "subvec_default" else {"envs_per_worker": 1}
    n, max_get = w["num_envs"], w["max_get"]
    deadline = None if cfg["impl"] == "subvec_min1" else DEADLINE_S
    with subvec.SubprocVectorEnv([fn] * n, batch_size=max_get, **layout) as envs:
        envs.async_reset(seed=0)
        envs.recv(min_envs=n)
        envs.send(np.ones(n, dtype=np.int64), list(range(n)))

        def harvest(transitions: int) -> None:
            got = 0
            while got < transitions:
                *_, infos = envs.recv(min_envs=1, max_envs=max_get, deadline=deadline)
                ids = infos["env_id"]
                envs.send(np.ones(len(ids), dtype=np.int64), ids)
                got += len(ids)

        return _timed(harvest, w["transitions"], cfg["rounds"], envs.async_stats)


def _run_torchrl(cfg: dict[str, Any], w: dict[str, Any]) -> dict[str, float]:
    import functools

    import torch
    from tensordict import set_capture_non_tensor_stack
    from torchrl.envs import AsyncEnvPool

    fn = functools.partial(_torchrl_env, w["step_s"], w["reset_s"], w["max_steps"])
    n, max_get = w["num_envs"], w["max_get"]
    exchange = cfg["impl"].removeprefix("torchrl_")
    with set_capture_non_tensor_stack(False):
        pool = AsyncEnvPool([fn] * n, backend="multiprocessing", exchange=exchange)
        try:
            td = pool.reset()
            td["action"] = torch.ones(n, 1)
            pool.async_step_and_maybe_reset_send(td)
            timeouts = [0]

            def harvest(transitions: int) -> None:
                got = 0
                while got < transitions:
                    try:
                        _, td_next = pool.async_step_and_maybe_reset_recv(
                            min_get=1, max_get=max_get, timeout=DEADLINE_S
                        )
                    except TimeoutError:  # nothing within the deadline: nothing lost, again
                        timeouts[0] += 1
                        continue
                    k = td_next.shape[0]
                    td_next["action"] = torch.ones(k, 1)
                    pool.async_step_and_maybe_reset_send(td_next)
                    got += k

            result = _timed(harvest, w["transitions"], cfg["rounds"], None)
            result["timeouts"] = float(timeouts[0])
            return result
        finally:
            pool._maybe_shutdown()


def _limit_worker(w: dict[str, Any], seconds: float, out: Any) -> None:
    env = _gym_env(w["step_s"], w["reset_s"], w["max_steps"])
    env.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, term, trunc, _ = env.step(1)
        steps += 1
        if term or trunc:
            env.reset()
    out.put(steps / (time.perf_counter() - start))


def _run_limit(cfg: dict[str, Any], w: dict[str, Any]) -> dict[str, float]:
    seconds = cfg["limit_s"]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_limit_worker, args=(w, seconds, out)) for _ in range(w["num_envs"])
    ]
    for p in procs:
        p.start()
    rates = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    return {"transitions_per_s": sum(rates)}


def _timed(harvest: Any, transitions: int, rounds: int, stats: Any) -> dict[str, float]:
    harvest(transitions)  # a warm-up round, as torchrl's benchmark
    if stats is not None:
        stats(reset=True)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        harvest(transitions)
        times.append(time.perf_counter() - start)
    result = {"transitions_per_s": transitions / statistics.median(times)}
    if stats is not None:
        window = stats()
        result["mean_batch"] = window.mean_batch
        result["consumer_waiting"] = window.consumer_waiting
        result["envs_waiting"] = window.envs_waiting
    return result


def _child(cfg: dict[str, Any]) -> None:
    impl = cfg["impl"]
    if impl in STAGE_IMPLS:
        print(_RESULT + json.dumps(_run_stages(cfg)), flush=True)
        return
    w = WORKLOADS[cfg["workload"]]
    if impl.startswith("subvec"):
        result = _run_subvec(cfg, w)
    elif impl.startswith("torchrl"):
        result = _run_torchrl(cfg, w)
    else:
        result = _run_limit(cfg, w)
    print(_RESULT + json.dumps(result), flush=True)


# --- the driver ----------------------------------------------------------------------------


def _run(cfg: dict[str, Any]) -> dict[str, float] | str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, __file__, "--child", json.dumps(cfg)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return "timed out"
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT):
            result: dict[str, float] = json.loads(line[len(_RESULT) :])
            return result
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"exit {proc.returncode}: {tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per run")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--latencies", default="2,5,10", help="the stages' policy latencies, ms (empty: none)"
    )
    parser.add_argument("--chunk", type=int, default=4, help="the stages' action chunk, K")
    parser.add_argument(
        "--sim-ratios",
        default="1",
        help="the stages' chunk time over the policy's latency (comma-separated)",
    )
    parser.add_argument("--quick", action="store_true", help="one repeat of one round")
    parser.add_argument("--out", default=str(RESULTS / "overlap.jsonl"))
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.rounds = 1, 1
    impls = [i for i in args.impls.split(",") if i]
    if importlib.util.find_spec("torchrl") is None and any(i.startswith("torchrl") for i in impls):
        print(
            "torchrl is not installed: its rows are skipped (pip install torchrl)", file=sys.stderr
        )
        impls = [i for i in impls if not i.startswith("torchrl")]
    workloads = [w for w in args.workloads.split(",") if w]
    latencies = [float(v) for v in args.latencies.split(",") if v]
    ratios = [float(v) for v in args.sim_ratios.split(",") if v]
    stage_points = [(latency, ratio) for latency in latencies for ratio in ratios]
    stage_seconds = 0.5 if args.quick else 2.0
    facts = {
        "machine": platform.processor() or platform.machine(),
        "cpu": _cpu_model(),
        "nproc": os.cpu_count(),
        "load_avg_before": os.getloadavg(),
        "python": platform.python_version(),
        "versions": _versions(),
    }
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    errors: dict[tuple[str, str], str] = {}
    for rep in range(args.repeats):
        for workload in workloads:
            turn = rep % len(impls) if impls else 0
            order = impls[turn:] + impls[:turn]
            for impl in order:
                if impl == "torchrl_queue" and workload == "fast_step_slow_reset":
                    continue  # torchrl's own series leaves it out: it hangs at 32 workers
                cfg = {"workload": workload, "impl": impl, "rounds": args.rounds, "limit_s": 3.0}
                result = _run(cfg)
                label = f"{workload} {impl} r{rep}"
                if isinstance(result, str):
                    errors[(workload, impl)] = result
                    print(f"{label}: {result}", file=sys.stderr)
                else:
                    runs.setdefault((workload, impl), []).append(result)
                    print(f"{label}: {result['transitions_per_s']:,.0f}/s", file=sys.stderr)
        for latency, ratio in stage_points:
            for impl in STAGE_IMPLS[rep % 3 :] + STAGE_IMPLS[: rep % 3]:
                cfg = {
                    "impl": impl,
                    "latency_ms": latency,
                    "sim_ratio": ratio,
                    "chunk": args.chunk,
                    "seconds": stage_seconds,
                }
                result = _run(cfg)
                key = (_stage_name(latency, ratio), impl)
                if isinstance(result, str):
                    errors[key] = result
                else:
                    runs.setdefault(key, []).append(result)
                print(f"{key[0]} {impl} r{rep}: {result}", file=sys.stderr)
    facts["load_avg_after"] = os.getloadavg()
    stage_rows = []
    for latency, ratio in stage_points:
        name = _stage_name(latency, ratio)
        base = runs.get((name, "lockstep"), [])
        for impl in STAGE_IMPLS:
            results = runs.get((name, impl), [])
            if not results:
                if (name, impl) in errors:
                    stage_rows.append(
                        {"workload": name, "impl": impl, "error": errors[(name, impl)]}
                    )
                continue
            stage_rows.append(
                {
                    "workload": name,
                    "impl": impl,
                    "runs": results,
                    "transitions_per_s": statistics.median(r["transitions_per_s"] for r in results),
                    "x_lockstep": statistics.median(
                        r["transitions_per_s"] / b["transitions_per_s"]
                        for r, b in zip(results, base)
                    )
                    if base
                    else None,
                    **{
                        key: statistics.median(r[key] for r in results)
                        for key in ("overlap_bound", "suggests_stages")
                        if key in results[0]
                    },
                }
            )
    rows = []
    for workload in workloads:
        limits = runs.get((workload, "limit"), [])
        for impl in impls:
            results = runs.get((workload, impl), [])
            row: dict[str, Any] = {"workload": workload, "impl": impl, "runs": results}
            if results:
                rate = statistics.median(r["transitions_per_s"] for r in results)
                row["transitions_per_s"] = rate
                for key in ("mean_batch", "consumer_waiting", "envs_waiting", "timeouts"):
                    if key in results[0]:
                        row[key] = statistics.median(r[key] for r in results)
                pairs = list(zip(results, limits))
                if pairs:
                    row["of_limit"] = statistics.median(
                        r["transitions_per_s"] / lim["transitions_per_s"] for r, lim in pairs
                    )
            elif (workload, impl) in errors:
                row["error"] = errors[(workload, impl)]
            else:
                continue
            rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        f.write(json.dumps({"facts": facts}) + "\n")
        for row in rows + stage_rows:
            f.write(json.dumps(row) + "\n")
    print(_table(rows, facts))
    if stage_rows:
        print(
            "\n| policy latency | loop | transitions/s | x lock-step | async_stats: stages "
            "suggested, at most |\n|---|---|---:|---:|---|"
        )
        for row in stage_rows:
            if "error" in row:
                print(f"| {row['workload']} | {row['impl']} | failed: {row['error']} | | |")
                continue
            x = "-" if row["x_lockstep"] is None else f"{row['x_lockstep']:.2f}x"
            advice = ""
            if row["impl"] == "stages1" and "overlap_bound" in row:
                said = "yes" if row["suggests_stages"] >= 0.5 else "no"
                advice = f"{said}, {row['overlap_bound']:.2f}x"
            print(
                f"| {row['workload']} | {row['impl']} | {row['transitions_per_s']:,.0f} | {x} "
                f"| {advice} |"
            )
    return 1 if errors else 0


def _table(rows: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    lines = [
        f"{facts['cpu']}, {facts['nproc']} CPUs, load {facts['load_avg_before'][0]:.1f} before",
        "",
        "| workload | implementation | transitions/s | of limit | x torchrl shm | mean batch |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['workload']} | {row['impl']} | failed: {row['error']} | | | |")
            continue
        shm = next(
            (
                r
                for r in rows
                if r["workload"] == row["workload"] and r["impl"] == "torchrl_shm" and "runs" in r
            ),
            None,
        )
        vs = "-"
        if shm and shm.get("runs") and row.get("runs"):
            paired = zip(row["runs"], shm["runs"])
            ratio = statistics.median(
                a["transitions_per_s"] / b["transitions_per_s"] for a, b in paired
            )
            vs = f"{ratio:.2f}x"
        of = f"{row['of_limit']:.0%}" if "of_limit" in row else "-"
        batch = f"{row['mean_batch']:.1f}" if "mean_batch" in row else "-"
        rate = f"{row['transitions_per_s']:,.0f}"
        lines.append(f"| {row['workload']} | {row['impl']} | {rate} | {of} | {vs} | {batch} |")
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("subvec", "gymnasium", "numpy", "torch", "torchrl", "tensordict"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _stage_name(latency: float, ratio: float) -> str:
    """A stage configuration's name: the policy latency, and the chunk time if not as long."""
    return f"stages_{latency:g}ms" + ("" if ratio == 1 else f"_sim{ratio:g}x")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
