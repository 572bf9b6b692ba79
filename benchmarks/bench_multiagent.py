"""Agents as rows: agent-steps/s of PettingZoo parallel envs, vectorised five ways.

    python benchmarks/bench_multiagent.py                    # the measured run (a few minutes)
    python benchmarks/bench_multiagent.py --quick --out-dir /tmp/x   # a smoke run, seconds

``--quick`` never writes to benchmarks/results: without ``--out-dir`` it writes to a new
temporary directory.

Workloads (4 ParallelEnvs each, random actions drawn before the timed window):

- ``simple_spread``: MPE2's ``simple_spread_v3`` (3 agents, 18 floats each, 25 cycles);
- ``pistonball``: PettingZoo's ``pistonball_v6`` with its defaults (20 agents, a 457x120x3
  uint8 image each: 3.3 MB of observations per env per step);
- ``comings``: the tests' env of 8 agents (tests/ma_envs.py), agents leaving at random (2% a
  step), 50 steps an episode, per-agent infos every third step.

Implementations, each stepping the rows ``i * A + j`` and handing them out as arrays:

- ``serial``: a plain loop over the ParallelEnvs in this process, its dicts stacked into rows
  (the reference every ratio is taken against);
- ``subvec``: ``subvec.multiagent.MultiAgentVectorEnv``, 2 workers;
- ``supersuit_0`` / ``supersuit_2``: SuperSuit 3.11's ``concat_vec_envs_v1`` over
  ``pettingzoo_env_to_vec_env_v1`` with ``num_cpus=0`` (in-process) and ``num_cpus=2``
  (``black_death_v3`` first for ``comings``, which SuperSuit refuses otherwise);
- ``pufferlib``: PufferLib 3's ``PettingZooPufferEnv`` under ``pufferlib.vector.Multiprocessing``
  with 2 workers (pufferlib-core 3.0.23, installed with ``--no-deps``; skipped with a note if
  missing);
- ``hand_dict``: the workaround without a multi-agent vectoriser: each ParallelEnv wrapped by
  hand as a gymnasium env with Dict observations and actions keyed by agent, the per-agent
  rewards and flags in its infos (with the agents' own infos, as subvec carries them), run
  through ``subvec.SubprocVectorEnv`` (2 workers), and the rows stacked in the parent.

How it measures: every configuration runs in a fresh interpreter (this script with
``--child``), 0.5 s of warm-up then ``--duration`` seconds timed; each repeat runs every
configuration once, in an order rotated per repeat; the ratio to ``serial`` pairs each run
with the same repeat's serial run, and the medians are reported with every value kept. The
load average before and after is recorded: on a shared machine only ratios measured in the
same run count.

Outputs: ``<out-dir>/multiagent.jsonl`` (a facts line, then one line per (workload,
implementation)) and ``<out-dir>/multiagent.md`` (the table).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("simple_spread", "pistonball", "comings")
IMPLS = ("serial", "subvec", "supersuit_0", "supersuit_2", "pufferlib", "hand_dict")
NEEDS = {
    "supersuit_0": "supersuit",
    "supersuit_2": "supersuit",
    "pufferlib": "pufferlib",
    "simple_spread": "mpe2",
    "pistonball": "pymunk",
}


def make_par_env(workload: str) -> Any:
    if workload == "simple_spread":
        from mpe2 import simple_spread_v3

        return simple_spread_v3.parallel_env(max_cycles=25, continuous_actions=False)
    if workload == "pistonball":
        import pettingzoo

        return pettingzoo.make("parallel", "butterfly/pistonball-v6")
    sys.path.insert(0, str(ROOT))
    from tests.ma_envs import Comings

    # agents leave and do not come back: SuperSuit's black_death_v3 handles no more
    return Comings(max_steps=50, leave_p=0.02, return_p=0.0, late=0)


class HandStacked(gym.Env):  # type: ignore[misc]
    """The hand-made workaround: a ParallelEnv as a gymnasium env, Dict spaces keyed by agent,
    departed agents' observations zeroed, per-agent rewards and flags in the infos."""

    def __init__(self, workload: str) -> None:
        self.par = make_par_env(workload)
        self.agents = list(self.par.possible_agents)
        self.observation_space = spaces.Dict(
            {a: self.par.observation_space(a) for a in self.agents}
        )
        self.action_space = spaces.Dict({a: self.par.action_space(a) for a in self.agents})

    def _full(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {
            a: obs[a] if a in obs else np.zeros_like(self.observation_space[a].low)
            for a in self.agents
        }

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        obs, _ = self.par.reset(seed=seed)
        return self._full(obs), {}

    def step(self, action: dict[str, Any]) -> Any:
        acts = {a: action[a] for a in self.par.agents}
        obs, rew, term, trunc, infos = self.par.step(acts)
        done = not self.par.agents
        info: dict[str, Any] = {a: dict(i) for a, i in infos.items() if i}  # what agents said
        info |= {
            "rewards": np.array([rew.get(a, 0.0) for a in self.agents]),
            "terms": np.array([term.get(a, False) for a in self.agents]),
            "truncs": np.array([trunc.get(a, False) for a in self.agents]),
        }
        return self._full(obs), 0.0, done, False, info

    def close(self) -> None:
        self.par.close()


def build(workload: str, impl: str, n: int) -> tuple[Any, Any, int, Any]:
    """(stepper, action space, rows, close): ``stepper(actions)`` steps every row once."""
    par = make_par_env(workload)
    agents = list(par.possible_agents)
    a = len(agents)
    act_space = par.action_space(agents[0])
    rows = n * a
    if impl == "serial":
        envs = [make_par_env(workload) for _ in range(n)]
        for i, env in enumerate(envs):
            env.reset(seed=i)
        shape = par.observation_space(agents[0]).shape
        dtype = par.observation_space(agents[0]).dtype
        out = np.zeros((rows, *shape), dtype)

        def step(actions: np.ndarray) -> Any:
            for i, env in enumerate(envs):
                if not env.agents:
                    obs, _ = env.reset()
                else:
                    acts = {ag: actions[i * a + agents.index(ag)] for ag in env.agents}
                    obs, *_ = env.step(acts)
                for j, ag in enumerate(agents):
                    out[i * a + j] = obs.get(ag, 0)
            return out.copy()

        return step, act_space, rows, lambda: None
    if impl == "subvec":
        from subvec.multiagent import MultiAgentVectorEnv

        envs = MultiAgentVectorEnv([lambda: make_par_env(workload)] * n, num_workers=2)
        envs.reset(seed=0)
        return (lambda actions: envs.step(actions)), act_space, rows, envs.close
    if impl.startswith("supersuit"):
        import supersuit as ss

        env = make_par_env(workload)
        if workload == "comings":
            env = ss.black_death_v3(env)
        vec = ss.pettingzoo_env_to_vec_env_v1(env)
        cpus = int(impl.rsplit("_", 1)[1])
        envs = ss.concat_vec_envs_v1(vec, n, num_cpus=cpus, base_class="gymnasium")
        envs.reset(seed=0)
        return (lambda actions: envs.step(actions)), act_space, rows, envs.close
    if impl == "pufferlib":
        import pufferlib.emulation as em
        import pufferlib.vector as pv

        def creator(buf: Any = None, seed: int = 0) -> Any:
            return em.PettingZooPufferEnv(env=make_par_env(workload), buf=buf, seed=seed)

        envs = pv.make(creator, backend=pv.Multiprocessing, num_envs=n, num_workers=2)
        envs.reset(seed=0)
        return (lambda actions: envs.step(actions)), act_space, rows, envs.close
    if impl == "hand_dict":
        import subvec

        envs = subvec.SubprocVectorEnv([lambda: HandStacked(workload)] * n, num_workers=2)
        envs.reset(seed=0)

        def step_dict(actions: np.ndarray) -> Any:
            per_agent = actions.reshape(n, a, *actions.shape[1:])
            obs, _, _, _, infos = envs.step({ag: per_agent[:, j] for j, ag in enumerate(agents)})
            rows_obs = np.stack([obs[ag] for ag in agents], axis=1).reshape(rows, -1)
            # an env's reset step (NEXT_STEP autoreset) has no rewards: zeros there
            rewards = np.zeros(rows)
            if "rewards" in infos:
                mask = np.repeat(infos["_rewards"], a)
                rewards[mask] = infos["rewards"][infos["_rewards"]].reshape(-1)
            return rows_obs, rewards

        return step_dict, act_space, rows, envs.close
    raise ValueError(impl)


def child(workload: str, impl: str, n: int, duration: float) -> dict[str, Any]:
    step, space, rows, close = build(workload, impl, n)
    space.seed(0)
    pool = [np.stack([space.sample() for _ in range(rows)]) for _ in range(64)]
    deadline = time.perf_counter() + 0.5
    k = 0
    while time.perf_counter() < deadline:
        step(pool[k % 64])
        k += 1
    steps = 0
    start = time.perf_counter()
    end = start + duration
    while True:
        step(pool[steps % 64])
        steps += 1
        now = time.perf_counter()
        if now >= end:
            break
    close()
    return {"agent_steps_per_s": steps * rows / (now - start), "steps": steps, "rows": rows}


def run_child(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str] | None:
    """Run one configuration in its own session; on a timeout, kill the whole session (a
    peer's worker processes too), and return None."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def available(name: str) -> bool:
    need = NEEDS.get(name)
    return need is None or importlib.util.find_spec(need) is not None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "IMPL"))
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out-dir", type=Path)
    args = p.parse_args(argv)
    if args.child:
        result = child(*args.child, args.num_envs, args.duration)
        print(json.dumps(result), flush=True)
        os._exit(0)  # the workers were closed; skip the interpreter's slow teardown
    if args.quick:
        args.duration, args.repeats = 0.3, 1
        args.out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="bench_multiagent_"))
    out_dir = args.out_dir or ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    workloads = [w for w in args.workloads.split(",") if w]
    impls = [i for i in args.impls.split(",") if i]
    unknown = [x for x in workloads if x not in WORKLOADS] + [x for x in impls if x not in IMPLS]
    if unknown:
        raise SystemExit(
            f"unknown workload or implementation {', '.join(unknown)}: the workloads are "
            f"{', '.join(WORKLOADS)}, the implementations {', '.join(IMPLS)}"
        )
    skipped = {x for x in (*workloads, *impls) if not available(x)}
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    facts = {
        "facts": True,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "num_envs": args.num_envs,
        "duration": args.duration,
        "repeats": args.repeats,
        "load_before": os.getloadavg(),
        "skipped": sorted(skipped),
    }
    runs: dict[tuple[str, str], list[float]] = {}
    configs = [(w, i) for w in workloads for i in impls if w not in skipped and i not in skipped]
    for r in range(args.repeats):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for w, i in order:
            cmd = [sys.executable, __file__, "--child", w, i, "--num-envs", str(args.num_envs)]
            cmd += ["--duration", str(args.duration)]
            res = run_child(cmd, env)
            if res is None:
                print(f"{w} {i}: timed out", file=sys.stderr)
                runs.setdefault((w, i), []).append(float("nan"))
                continue
            if res.returncode != 0:
                print(f"{w} {i}: failed\n{res.stderr[-2000:]}", file=sys.stderr)
                runs.setdefault((w, i), []).append(float("nan"))
                continue
            value = json.loads(res.stdout.strip().splitlines()[-1])["agent_steps_per_s"]
            runs.setdefault((w, i), []).append(value)
            print(f"repeat {r} {w:14s} {i:12s} {value:10.0f} agent-steps/s", flush=True)
    facts["load_after"] = os.getloadavg()
    lines = [facts]
    table = [
        f"4 ParallelEnvs each, 2 workers where there are workers; {args.repeats} repeats of "
        f"{args.duration} s; load average before {facts['load_before'][0]:.2f}, after "
        f"{facts['load_after'][0]:.2f} on {facts['cpus']} CPUs.",
        "",
        "| workload | implementation | agent-steps/s (median) | x serial (median of paired) "
        "| x SuperSuit's best | runs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for w in workloads:
        serial = runs.get((w, "serial"), [])
        best_ss = [
            max(a, b)
            for a, b in zip(runs.get((w, "supersuit_0"), []), runs.get((w, "supersuit_2"), []))
        ]
        for i in impls:
            vals = runs.get((w, i))
            if not vals:
                continue
            ratio = [v / s for v, s in zip(vals, serial)] if serial else []
            vs_ss = [v / s for v, s in zip(vals, best_ss)] if best_ss else []
            row = {
                "workload": w,
                "impl": i,
                "median": statistics.median(vals),
                "x_serial": statistics.median(ratio) if ratio else None,
                "x_supersuit_best": statistics.median(vs_ss) if vs_ss else None,
                "runs": vals,
            }
            lines.append(row)
            fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
            table.append(
                f"| {w} | {i} | {row['median']:.0f} | {fmt(row['x_serial'])} | "
                f"{fmt(row['x_supersuit_best'])} | {', '.join(f'{v:.0f}' for v in vals)} |"
            )
    if skipped:
        table += ["", f"Skipped (not installed): {', '.join(sorted(skipped))}."]
    (out_dir / "multiagent.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (out_dir / "multiagent.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
