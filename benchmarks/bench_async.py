"""Asynchronous first-k-ready stepping (``send``/``recv``) against lock-step and the limit.

    python benchmarks/bench_async.py                       # the measured run (about 9 minutes)
    python benchmarks/bench_async.py --repeats 5           # more repeats
    python benchmarks/bench_async.py --quick --out-dir /tmp/x   # a smoke run: 4 envs, seconds

``--quick`` never writes to benchmarks/results: without ``--out-dir`` it writes to a new
temporary directory.

Three workloads, each with its implementations side by side in one run:

- ``waits`` (envs that wait rather than compute): 16 envs, one per worker. Each step sleeps
  1 ms; episodes are 50 steps, and every reset sleeps 50 ms (the first one too, before the
  timed window). Env ``i``'s first episode is ``i * 50 // 16`` steps shorter, so that the
  resets are spread evenly over the steps, as episodes of different lengths spread them in a
  real run (with every env resetting on the same step, lock-step would lose nothing).
  Implementations: subvec ``recv``/``send`` with ``batch_size`` 8 and 4, subvec lock-step
  ``step()``, gymnasium's ``AsyncVectorEnv``, PufferLib's ``Multiprocessing`` (its own
  ``recv``/``send``, batch_size 8, its defaults otherwise; with 16 workers of one env, as
  subvec's rows, and with 2 workers of 8 envs, one a core as PufferLib recommends; run in a
  second venv given by ``--peers-python``, skipped with a note where it does not run), and
  ``limit``: 16 processes, each stepping its own env in a loop with no IPC (the sum of their
  rates).
- ``lognormal`` (CPU-bound stragglers): 16 envs on 2 workers; each step busy-loops for a
  lognormal draw (median 200 us, sigma 0.5) of the thread's own CPU time (``time.thread_time``,
  so that a process that is descheduled does not count the wait as work); episodes of 500
  steps, cheap resets. subvec ``recv`` (batch_size 8) against lock-step, ``AsyncVectorEnv``
  (one process per env) and ``limit`` (2 processes of 8 envs each).
- ``policy`` (a policy in the loop): CartPole-v1 x 16 (subvec's default layout), a torch MLP
  4-64-64-2 (``torch.set_num_threads(1)``) samples every action. subvec ``recv`` in two
  halves (batch_size 8: the policy computes on one half while the other steps) against
  lock-step with the same policy; the loop times its calls, so the tables say where the time
  goes (in the policy, in ``recv``/``send`` or ``step``).

An env-step is one env's ``step`` call as a vector env makes it: in next-step autoreset (every
implementation's default), the call after an episode's last step resets the env, and counts
too; the limit counts its calls the same way.

How it measures: every configuration runs in a fresh interpreter (this script with
``--child``); each repeat runs every configuration once, the implementations of a workload
back to back in an order rotated per repeat; medians over the repeats are reported, with
every value kept; the ratios (to lock-step, to the limit) pair each run with the same
repeat's reference and take the median. Before each run the script waits (a few seconds at
most) for other processes to leave the cores, and records how many cores they used during the
run (``other CPU``).

Outputs: ``<out-dir>/<tag>.jsonl`` (a facts line, then one line per (workload,
implementation) with the medians and the raw runs) and ``<out-dir>/<tag>.md`` (the tables).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Args:
    quick: bool = False
    """a smoke run: 4 envs per workload, a fraction of a second per configuration, 1 repeat"""
    repeats: int = 3
    """how many times every configuration runs (medians are reported)"""
    duration: float = 3.0
    """seconds of timed stepping per configuration"""
    warmup: float = 0.5
    """seconds of untimed stepping before the timed window"""
    workloads: str = "waits,lognormal,policy"
    """comma-separated workloads to run"""
    peers_python: str = "/work/venv-peers/bin/python"
    """the interpreter of a venv with PufferLib (pufferlib.vector), for the puffer rows"""
    out_dir: str = str(ROOT / "benchmarks" / "results")
    """where the JSON lines and the markdown tables go"""
    tag: str = "async"
    """name of the output files"""
    quiet: float = 0.3
    """cores other processes may use before a run starts (the script waits for that)"""
    max_wait: float = 8.0
    """seconds to wait for the machine to be quiet before each run"""
    wait_budget: float = 180.0
    """total seconds of such waiting, after which runs start at once"""
    run_timeout: float = 180.0
    """seconds before one configuration's interpreter is killed and recorded as failed"""
    seed: int = 0
    child: str = ""
    """internal: run one configuration (JSON) and print its result"""


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action="store_true")
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            parser.add_argument(flag, type=kind, default=f.default)
    return Args(**vars(parser.parse_args(argv)))


# --- the envs ---------------------------------------------------------------------------------


class WaitEnv(gym.Env):
    """Waits rather than computes: each step sleeps ``step_s``, each reset ``reset_s``.
    Episodes are truncated after ``horizon`` steps; the first one starts ``offset`` steps in."""

    def __init__(
        self, offset: int = 0, step_s: float = 0.001, reset_s: float = 0.05, horizon: int = 50
    ) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_s, self.reset_s, self.horizon = step_s, reset_s, horizon
        self._offset = offset
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        time.sleep(self.reset_s)
        self._t, self._offset = self._offset, 0
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action: Any) -> Any:
        time.sleep(self.step_s)
        self._t += 1
        obs = np.full(4, self._t, dtype=np.float32)
        return obs, 1.0, False, self._t >= self.horizon, {}


class LognormalEnv(gym.Env):
    """CPU-bound with stragglers: each step burns a lognormal draw (median ``median_us``,
    ``sigma``) of the thread's CPU time; episodes of ``horizon`` steps, cheap resets."""

    def __init__(self, median_us: float = 200.0, sigma: float = 0.5, horizon: int = 500) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.median_s, self.sigma, self.horizon = median_us * 1e-6, sigma, horizon
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action: Any) -> Any:
        cost = self.median_s * float(np.exp(self.sigma * self.np_random.standard_normal()))
        end = time.thread_time() + cost
        while time.thread_time() < end:
            pass
        self._t += 1
        obs = np.full(4, self._t, dtype=np.float32)
        return obs, 1.0, False, self._t >= self.horizon, {}


def make_fns(workload: str, n: int) -> list[Any]:
    """One picklable factory per env (classes of this script travel by value)."""
    if workload == "waits":
        return [functools.partial(WaitEnv, offset=i * 50 // n) for i in range(n)]
    if workload == "lognormal":
        return [LognormalEnv for _ in range(n)]
    if workload == "policy":
        return [functools.partial(gym.make, "CartPole-v1") for _ in range(n)]
    raise SystemExit(f"unknown workload {workload!r}: waits, lognormal or policy")


# --- the plan ---------------------------------------------------------------------------------

#: workload -> (subvec layout keywords, implementations)
WORKLOADS: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {
    "waits": (
        {"envs_per_worker": 1},
        ("async_half", "async_quarter", "lockstep", "gym_async", "puffer", "puffer_w2", "limit"),
    ),
    "lognormal": ({"num_workers": 2}, ("async_half", "lockstep", "gym_async", "limit")),
    "policy": ({}, ("async_half", "lockstep")),
}
IMPL_LABELS = {
    "async_half": "subvec recv/send, batch_size={b}",
    "async_quarter": "subvec recv/send, batch_size={b}",
    "lockstep": "subvec step() (lock-step)",
    "gym_async": "gymnasium AsyncVectorEnv",
    "puffer": "PufferLib Multiprocessing, {w} workers, batch_size={b}",
    "puffer_w2": "PufferLib Multiprocessing, {w} workers, batch_size={b}",
    "limit": "limit ({w} free-running processes, no IPC)",
}


def batch_size_of(impl: str, n: int) -> int:
    if impl in ("async_half", "puffer", "puffer_w2"):
        return max(1, n // 2)
    if impl == "async_quarter":
        return max(1, n // 4)
    return n


# --- measuring (inside the child) -------------------------------------------------------------


class ForeignCpu:
    """Cores used by processes outside this process tree during a window (/proc/stat minus
    the tree's own CPU time): a run that competed with strangers says so."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float]:
        import psutil

        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / self.tick
        me = psutil.Process()
        ours = 0.0
        for proc in [me, *me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                ours += times.user + times.system
            except psutil.Error:
                pass
        return busy, ours, time.monotonic()

    def cores(self) -> float:
        busy0, ours0, t0 = self.start
        busy1, ours1, t1 = self._snapshot()
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (t1 - t0)


class Clock:
    """Rows and the time spent in the env calls and in the policy, over the timed window."""

    def __init__(self) -> None:
        self.rows = self.calls = 0
        self.env_s = self.policy_s = 0.0
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()

    def result(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.t0
        return {
            "steps_per_s": self.rows / elapsed,
            "rows": self.rows,
            "calls": self.calls,
            "elapsed_s": elapsed,
            "env_share": self.env_s / elapsed,
            "policy_share": self.policy_s / elapsed,
            "env_us_per_call": self.env_s / max(1, self.calls) * 1e6,
            "policy_us_per_call": self.policy_s / max(1, self.calls) * 1e6,
            "parent_cpu": (time.process_time() - self.cpu0) / elapsed,
        }


def make_policy(workload: str, seed: int) -> Any:
    """obs batch -> actions: the torch MLP for the policy workload, else zeros."""
    if workload != "policy":
        zeros = np.zeros(64, dtype=np.int64)
        return lambda obs: zeros[: len(obs)]
    import torch
    from torch import nn
    from torch.distributions.categorical import Categorical

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits = net(torch.as_tensor(obs, dtype=torch.float32))
            return Categorical(logits=logits).sample().numpy()

    return act


def loop_async(
    envs: Any, act: Any, warmup: float, duration: float, seed: int, puffer: bool = False
) -> dict[str, Any]:
    """recv the first ready, act on them, send their actions; count the rows."""
    envs.async_reset(seed)

    def cycle(clock: Clock | None) -> None:
        t0 = time.perf_counter()
        if puffer:
            obs, _, _, _, _, _, ids, _ = envs.recv()
        else:
            obs, _, _, _, infos = envs.recv()
            ids = infos["env_id"]
        t1 = time.perf_counter()
        actions = act(obs)
        t2 = time.perf_counter()
        if puffer:
            envs.send(np.asarray(actions, dtype=np.int32))
        else:
            envs.send(actions, ids)
        if clock is not None:
            t3 = time.perf_counter()
            clock.rows += len(ids)
            clock.calls += 1
            clock.env_s += (t1 - t0) + (t3 - t2)
            clock.policy_s += t2 - t1

    return _timed(cycle, warmup, duration)


def loop_lockstep(envs: Any, act: Any, warmup: float, duration: float, seed: int) -> dict[str, Any]:
    """step every env with the policy's actions for all of them."""
    obs, _ = envs.reset(seed=seed)
    n = envs.num_envs

    def cycle(clock: Clock | None) -> None:
        nonlocal obs
        t0 = time.perf_counter()
        actions = act(obs)
        t1 = time.perf_counter()
        obs, _, _, _, _ = envs.step(actions)
        if clock is not None:
            t2 = time.perf_counter()
            clock.rows += n
            clock.calls += 1
            clock.env_s += t2 - t1
            clock.policy_s += t1 - t0

    return _timed(cycle, warmup, duration)


def _timed(cycle: Any, warmup: float, duration: float) -> dict[str, Any]:
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        cycle(None)
    foreign = ForeignCpu()
    clock = Clock()
    deadline = clock.t0 + duration
    while time.perf_counter() < deadline:
        cycle(clock)
    result = clock.result()
    result["foreign_cpu"] = foreign.cores()
    return result


def build(cfg: dict[str, Any], fns: list[Any]) -> Any:
    impl, n = cfg["impl"], cfg["num_envs"]
    if impl == "gym_async":
        return gym.vector.AsyncVectorEnv(fns)
    if impl.startswith("puffer"):
        import pufferlib.emulation
        import pufferlib.vector

        creators = [
            functools.partial(pufferlib.emulation.GymnasiumPufferEnv, env_creator=f) for f in fns
        ]
        # puffer: one process per env, as subvec's rows (PufferLib refuses more workers than
        # cores unless overwork is set); puffer_w2: one per core, its recommended layout.
        return pufferlib.vector.make(
            creators,
            env_args=[[] for _ in fns],
            env_kwargs=[{} for _ in fns],
            backend=pufferlib.vector.Multiprocessing,
            num_envs=n,
            num_workers=cfg["workers"],
            batch_size=batch_size_of(impl, n),
            overwork=True,
        )
    import subvec

    kwargs: dict[str, Any] = dict(cfg["layout"])
    if impl.startswith("async"):
        kwargs["batch_size"] = batch_size_of(impl, n)
    return subvec.SubprocVectorEnv(fns, **kwargs)


def run_vector(cfg: dict[str, Any]) -> dict[str, Any]:
    fns = make_fns(cfg["workload"], cfg["num_envs"])
    act = make_policy(cfg["workload"], cfg["seed"])
    start = time.perf_counter()
    envs = build(cfg, fns)
    startup = time.perf_counter() - start
    impl = cfg["impl"]
    try:
        if impl in ("async_half", "async_quarter", "puffer", "puffer_w2"):
            puffer = impl.startswith("puffer")
            result = loop_async(envs, act, cfg["warmup"], cfg["duration"], cfg["seed"], puffer)
        else:
            result = loop_lockstep(envs, act, cfg["warmup"], cfg["duration"], cfg["seed"])
        if impl.startswith("async"):
            envs.drain()
        workers = getattr(envs, "num_workers", None) or cfg["num_envs"]
    finally:
        envs.close()
    result.update(startup_s=startup, num_workers=workers)
    return result


def _limit_proc(
    fns: list[Any], seed: int, warmup: float, duration: float, barrier: Any, out: Any
) -> None:
    """One process of the limit: its envs stepped in a loop (reset on the call after an
    episode's end, as next-step autoreset does), no IPC while timed."""
    envs = [f() for f in fns]
    for j, env in enumerate(envs):
        env.reset(seed=seed + j)
    done = [False] * len(envs)

    def cycle(clock: Clock | None) -> None:
        for j, env in enumerate(envs):
            if done[j]:
                env.reset()
                done[j] = False
            else:
                _, _, terminated, truncated, _ = env.step(0)
                done[j] = terminated or truncated
        if clock is not None:
            clock.rows += len(envs)

    barrier.wait()
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        cycle(None)
    clock = Clock()
    while time.perf_counter() < clock.t0 + duration:
        cycle(clock)
    out.put(clock.result())


def run_limit(cfg: dict[str, Any]) -> dict[str, Any]:
    import multiprocessing

    n = cfg["num_envs"]
    fns = make_fns(cfg["workload"], n)
    width = cfg["limit_procs"]
    shares = [fns[w * n // width : (w + 1) * n // width] for w in range(width)]
    ctx = multiprocessing.get_context("fork")  # a fresh interpreter: fork is safe and cheap
    barrier = ctx.Barrier(width + 1)
    out = ctx.SimpleQueue()
    procs = [
        ctx.Process(
            target=_limit_proc,
            args=(share, cfg["seed"] + 1000 * w, cfg["warmup"], cfg["duration"], barrier, out),
        )
        for w, share in enumerate(shares)
    ]
    start = time.perf_counter()
    for proc in procs:
        proc.start()
    barrier.wait(timeout=cfg["timeout"])
    startup = time.perf_counter() - start
    foreign = ForeignCpu()
    parts = [out.get() for _ in procs]
    foreign_cpu = foreign.cores()
    for proc in procs:
        proc.join()
    return {
        "steps_per_s": sum(p["steps_per_s"] for p in parts),
        "rows": sum(p["rows"] for p in parts),
        "elapsed_s": max(p["elapsed_s"] for p in parts),
        "startup_s": startup,
        "num_workers": width,
        "foreign_cpu": foreign_cpu,
    }


def child_main(cfg: dict[str, Any]) -> None:
    load = os.getloadavg()[0]
    result = run_limit(cfg) if cfg["impl"] == "limit" else run_vector(cfg)
    result.update(load_1m=load)
    print("RESULT " + json.dumps(result), flush=True)


# --- the sweep --------------------------------------------------------------------------------


def busy_cores(window: float = 0.5) -> float:
    """Cores busy machine-wide over a short window (/proc/stat)."""

    def snap() -> tuple[int, int]:
        f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(f[:8]) - f[3] - f[4], sum(f[:8])

    b0, t0 = snap()
    time.sleep(window)
    b1, t1 = snap()
    cpus = os.cpu_count() or 1
    return (b1 - b0) / max(1, t1 - t0) * cpus


def wait_for_quiet(quiet: float, max_wait: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < max_wait and busy_cores() > quiet:
        pass
    return time.monotonic() - start


def peers_note(python: str) -> str | None:
    """None if ``python`` can import pufferlib.vector (with this checkout on the path), else
    why the PufferLib rows are skipped."""
    if not python or not Path(python).exists():
        return f"skipped: no interpreter at {python!r} (--peers-python: a venv with PufferLib)"
    probe = subprocess.run(
        [python, "-c", "import pufferlib.vector, pufferlib.emulation"],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    if probe.returncode != 0:
        return "skipped: pufferlib.vector does not import: " + probe.stderr.strip()[-300:]
    return None


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run_child(cfg: dict[str, Any], python: str, timeout: float) -> dict[str, Any]:
    cmd = [python, str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def machine_facts(args: Args, repeats: int, duration: float, warmup: float) -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    except OSError:
        head = ""
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "gymnasium": gym.__version__,
        "load_avg": [round(v, 2) for v in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "git": head,
        "repeats": repeats,
        "duration_s": duration,
        "warmup_s": warmup,
        "quick": args.quick,
    }


def sweep(args: Args) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    quick = args.quick
    n = 4 if quick else 16
    repeats = 1 if quick else args.repeats
    duration = 0.2 if quick else args.duration
    warmup = 0.05 if quick else args.warmup
    names = [w for w in args.workloads.split(",") if w]
    for name in names:
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}: {', '.join(WORKLOADS)}")
    puffer_skip = peers_note(args.peers_python) if "waits" in names else None
    if puffer_skip:
        print(f"PufferLib: {puffer_skip}", flush=True)
    facts = machine_facts(args, repeats, duration, warmup)
    facts["puffer"] = puffer_skip or f"run with {args.peers_python}"
    runs: list[dict[str, Any]] = []
    total = repeats * sum(len(WORKLOADS[w][1]) for w in names)
    begin = time.monotonic()
    waited_total = 0.0
    for rep in range(repeats):
        for name in names:
            layout, impls = WORKLOADS[name]
            shift = rep % len(impls)
            for impl in impls[shift:] + impls[:shift]:
                cfg = {
                    "workload": name,
                    "impl": impl,
                    "num_envs": n,
                    "layout": layout,
                    "batch_size": batch_size_of(impl, n),
                    "duration": duration,
                    "warmup": warmup,
                    "seed": args.seed + rep,
                    "timeout": args.run_timeout,
                    "limit_procs": n if name == "waits" else 2,
                    "workers": 2 if impl == "puffer_w2" else n,
                }
                if impl.startswith("puffer") and puffer_skip:
                    result: dict[str, Any] = {"skipped": puffer_skip}
                else:
                    patient = not quick and waited_total < args.wait_budget
                    waited = wait_for_quiet(args.quiet, args.max_wait) if patient else 0.0
                    waited_total += waited
                    python = args.peers_python if impl.startswith("puffer") else sys.executable
                    result = run_child(cfg, python, args.run_timeout)
                    result["waited_s"] = waited
                run = {"workload": name, "impl": impl, "num_envs": n, "repeat": rep, **result}
                run["batch_size"] = cfg["batch_size"]
                if impl.startswith("puffer") or impl == "limit":
                    run.setdefault(
                        "num_workers", cfg["limit_procs" if impl == "limit" else "workers"]
                    )
                runs.append(run)
                rate = run.get("steps_per_s")
                shown = f"{rate:10,.0f} env-steps/s" if rate else run.get("error", "skipped")
                other = run.get("foreign_cpu")
                print(
                    f"[{len(runs)}/{total} {time.monotonic() - begin:5.0f} s] {name:>9} "
                    f"{impl:<13} {shown}" + (f"  (other CPU {other:.2f})" if other else ""),
                    flush=True,
                )
    facts["wall_min"] = round((time.monotonic() - begin) / 60, 1)
    facts["waited_min"] = round(waited_total / 60, 1)
    return facts, summarize(runs)


# --- summary and tables -----------------------------------------------------------------------

FIELDS = (
    "steps_per_s",
    "env_share",
    "policy_share",
    "env_us_per_call",
    "policy_us_per_call",
    "parent_cpu",
    "startup_s",
    "num_workers",
    "foreign_cpu",
    "load_1m",
)


def _median(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per (workload, impl), paired ratios to lock-step and to the limit."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["workload"], run["impl"]), []).append(run)
    rows = []
    for (workload, impl), group in groups.items():
        ok = [r for r in group if "steps_per_s" in r]
        row: dict[str, Any] = {
            "workload": workload,
            "impl": impl,
            "num_envs": group[0]["num_envs"],
            "batch_size": group[0]["batch_size"],
            "runs": len(ok),
            "errors": [r["error"] for r in group if "error" in r],
            "skipped": next((r["skipped"] for r in group if "skipped" in r), None),
        }
        for key in FIELDS:
            row[key] = _median([r.get(key) for r in ok])
        if row["num_workers"] is None:  # skipped or failed: the planned count
            row["num_workers"] = group[0].get("num_workers")
        row["all_steps_per_s"] = [round(r["steps_per_s"]) for r in ok]
        row["repeats"] = [r["repeat"] for r in ok]
        row["raw"] = group
        rows.append(row)
    by_key = {(r["workload"], r["impl"]): r for r in rows}

    def ratio(row: dict[str, Any], reference: str) -> float | None:
        ref = by_key.get((row["workload"], reference))
        if ref is None or not row["runs"] or not ref["runs"]:
            return None
        theirs = dict(zip(ref["repeats"], ref["all_steps_per_s"]))
        paired = [
            v / theirs[rep]
            for rep, v in zip(row["repeats"], row["all_steps_per_s"])
            if theirs.get(rep)
        ]
        return statistics.median(paired) if paired else None

    for row in rows:
        row["x_lockstep"] = ratio(row, "lockstep")
        row["of_limit"] = ratio(row, "limit")
    return rows


#: the project's targets for the waits workload: (impl, min x lock-step, min share of limit)
TARGETS = (("async_half", 3.0, 0.70), ("async_quarter", 3.0, 0.70))


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def label(row: dict[str, Any]) -> str:
    text = IMPL_LABELS.get(row["impl"], row["impl"])
    return text.format(b=row["batch_size"], w=_fmt(row["num_workers"], ".0f"))


def markdown(facts: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    out = [
        f"Machine: {facts['nproc']} CPUs ({facts['usable_cpus']} usable), {facts['cpu_model']}, "
        f"Python {facts['python']}, gymnasium {facts['gymnasium']}, load average at start "
        + ", ".join(f"{v:.2f}" for v in facts["load_avg"])
        + f"; {facts['repeats']} repeats of {facts['duration_s']:g} s after "
        f"{facts['warmup_s']:g} s of warm-up, medians; {facts['date']}, commit {facts['git']}; "
        f"the run took {facts.get('wall_min', '?')} min, {facts.get('waited_min', 0)} of them "
        f"waiting for other processes to leave the cores. PufferLib: {facts['puffer']}.",
        "",
    ]
    by_key = {(r["workload"], r["impl"]): r for r in rows}
    if ("waits", "lockstep") in by_key:
        out += ["### Targets (waits)", ""]
        out += ["| implementation | wanted | measured | |", "|---|---|---|---|"]
        for impl, x_min, share_min in TARGETS:
            r = by_key.get(("waits", impl))
            if r is None or r["x_lockstep"] is None or r["of_limit"] is None:
                continue
            met = r["x_lockstep"] >= x_min and r["of_limit"] >= share_min
            out.append(
                f"| {label(r)} | >= {x_min:g}x lock-step, >= {share_min:.0%} of the limit | "
                f"{r['x_lockstep']:.1f}x lock-step, {r['of_limit']:.0%} of the limit | "
                f"{'met' if met else 'MISSED'} |"
            )
        out.append("")
    titles = {
        "waits": "waits: {n} envs, one per worker, 1 ms steps, 50 ms resets every 50 steps",
        "lognormal": "lognormal: {n} envs on 2 workers, CPU-bound steps (median 200 us, sigma 0.5)",
        "policy": "policy: CartPole-v1 x {n}, a torch MLP picks every action",
    }
    for workload in dict.fromkeys(r["workload"] for r in rows):
        sub = [r for r in rows if r["workload"] == workload]
        title = titles.get(workload, workload).format(n=sub[0]["num_envs"])
        out += [f"### {title}", ""]
        out.append(
            "| implementation | env-steps/s | x lock-step | of limit | per repeat | workers | "
            "other CPU |"
        )
        out.append("|---|---:|---:|---:|---|---:|---:|")
        for r in sub:
            if r["skipped"]:
                out.append(f"| {label(r)} | {r['skipped']} | | | | | |")
                continue
            if not r["runs"]:
                out.append(f"| {label(r)} | failed: {r['errors'][0]} | | | | | |")
                continue
            out.append(
                f"| {label(r)} | {_fmt(r['steps_per_s'], ',.0f')} | "
                f"{_fmt(r['x_lockstep'], '.2f')}x | {_fmt(r['of_limit'], '.0%')} | "
                + ", ".join(f"{v:,}" for v in r["all_steps_per_s"])
                + f" | {_fmt(r['num_workers'], '.0f')} | {_fmt(r['foreign_cpu'], '.2f')} |"
            )
        out.append("")
        if workload == "policy":
            out += [
                "Where the parent's time goes (medians; a call is one step() in lock-step, one "
                "recv() and its send() in async):",
                "",
                "| implementation | in the policy | in recv/send or step | policy us/call | "
                "env us/call |",
                "|---|---:|---:|---:|---:|",
            ]
            for r in sub:
                if not r["runs"]:
                    continue
                out.append(
                    f"| {label(r)} | {_fmt(r['policy_share'], '.0%')} | "
                    f"{_fmt(r['env_share'], '.0%')} | {_fmt(r['policy_us_per_call'], '.0f')} | "
                    f"{_fmt(r['env_us_per_call'], '.0f')} |"
                )
            out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    out_dir = Path(args.out_dir)
    if args.quick and out_dir == Path(Args.out_dir):  # a smoke run never overwrites results
        out_dir = Path(tempfile.mkdtemp(prefix="bench_async_"))
    facts, rows = sweep(args)
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / f"{args.tag}.jsonl"
    with jsonl.open("w") as f:
        f.write(json.dumps({"facts": facts}) + "\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")
    md = out_dir / f"{args.tag}.md"
    md.write_text(markdown(facts, rows))
    print(md.read_text())
    print(f"wrote {jsonl} and {md}")


if __name__ == "__main__":
    main()
