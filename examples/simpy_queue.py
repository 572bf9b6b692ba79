"""A discrete-event simulation as a gymnasium env: staffing a service queue, built on simpy.

Customers arrive at a service desk (a Poisson stream whose rate rises towards midday and falls
again); each is served by one of the open counters for an exponential time. Every step the
agent decides how many counters to staff for the next ``interval`` simulated minutes, and the
step runs the simpy event loop up to that time (``sim.run(until=now + interval)``): steps
advance *simulated* time, however many events happen in between. The reward is minus the cost
of that interval: staff minutes plus customers' waiting minutes.

Many such simulations run at once through subvec, each in a worker process with its own seed
(env i gets ``seed + i``, so their random streams are independent), and a rule of thumb is
compared with random staffing over a simulated day.

Run:  python examples/simpy_queue.py --num-envs 16
Needs simpy (``pip install "subvec[examples]"``).
"""

from __future__ import annotations

import argparse
import math
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import simpy
from gymnasium import spaces

import subvec


class ServiceQueueEnv(gym.Env[np.ndarray, int]):
    """Staff ``1..max_counters`` counters each interval; minimise staff + waiting cost.

    Observation (float32): queue length, busy counters, open counters, arrivals in the last
    interval, and the time of day as (sin, cos). Action ``a`` opens ``a + 1`` counters; a
    counter that closes finishes the customer it is serving. The episode is one working day
    and ends by truncation at closing time.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        max_counters: int = 10,
        interval: float = 10.0,
        day_minutes: float = 480.0,
        base_rate: float = 1.0,
        mean_service: float = 4.0,
        staff_cost: float = 1.0,
        wait_cost: float = 1.0,
    ) -> None:
        self.max_counters = max_counters
        self.interval = interval
        self.day_minutes = day_minutes
        self.base_rate = base_rate  # customers per minute at opening and closing
        self.mean_service = mean_service  # minutes
        self.staff_cost = staff_cost  # per counter-minute
        self.wait_cost = wait_cost  # per customer-minute in the queue
        self.action_space = spaces.Discrete(max_counters)
        self.observation_space = spaces.Box(0.0, np.inf, shape=(6,), dtype=np.float32)
        self.sim = simpy.Environment()

    # --- the simulation -----------------------------------------------------------------------

    def rate(self, t: float) -> float:
        """Arrivals per minute at minute ``t``: 1.6 times the base rate at midday."""
        return self.base_rate * (1.0 + 0.6 * math.sin(math.pi * t / self.day_minutes))

    def _arrivals(self) -> Generator[simpy.Event, Any, None]:
        # A non-homogeneous Poisson stream by thinning a homogeneous one at the peak rate.
        peak = self.base_rate * 1.6
        while True:
            yield self.sim.timeout(self.np_random.exponential(1.0 / peak))
            if self.np_random.random() < self.rate(self.sim.now) / peak:
                self._account()
                self.queue.append(self.sim.now)
                self.arrived += 1
                self._dispatch()

    def _dispatch(self) -> None:
        """Start serving waiting customers while an open counter is free."""
        while self.queue and self.busy < self.open:
            self._account()
            arrived_at = self.queue.popleft()
            self.waits.append(self.sim.now - arrived_at)
            self.busy += 1
            self.sim.process(self._serve())

    def _serve(self) -> Generator[simpy.Event, Any, None]:
        yield self.sim.timeout(self.np_random.exponential(self.mean_service))
        self.busy -= 1
        self.served += 1
        self._dispatch()

    def _account(self) -> None:
        """Integrate the queue length over time (customer-minutes of waiting)."""
        now = self.sim.now
        self.queue_minutes += len(self.queue) * (now - self.last_change)
        self.last_change = now

    # --- gymnasium API ------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.sim = simpy.Environment()
        self.queue: deque[float] = deque()
        self.waits: list[float] = []
        self.busy = 0
        self.open = 1
        self.arrived = self.served = 0
        self.queue_minutes = 0.0
        self.last_change = 0.0
        self.day_cost = 0.0
        self.sim.process(self._arrivals())
        return self._obs(arrivals=0), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.open = int(action) + 1
        self._dispatch()
        arrived_before, waiting_before = self.arrived, self.queue_minutes
        end = min(self.sim.now + self.interval, self.day_minutes)
        self.sim.run(until=end)  # every arrival and service in the interval happens here
        self._account()
        waited = self.queue_minutes - waiting_before
        cost = self.staff_cost * self.open * self.interval + self.wait_cost * waited
        self.day_cost += cost
        truncated = self.sim.now >= self.day_minutes
        info = {"queue": len(self.queue), "open": self.open, "cost": cost}
        return self._obs(self.arrived - arrived_before), -cost / 100.0, False, truncated, info

    def _obs(self, arrivals: int) -> np.ndarray:
        phase = 2 * math.pi * self.sim.now / self.day_minutes
        return np.array(
            [len(self.queue), self.busy, self.open, arrivals, math.sin(phase), math.cos(phase)],
            dtype=np.float32,
        )

    def day_summary(self) -> dict[str, float]:
        """What a manager would read at closing time (called through subvec.remote)."""
        waits = self.waits or [0.0]
        return {
            "cost": self.day_cost,
            "served": float(self.served),
            "mean_wait": float(np.mean(waits)),
            "p95_wait": float(np.percentile(waits, 95)),
        }


# --- policies ---------------------------------------------------------------------------------


def rule_of_thumb(env: ServiceQueueEnv) -> Callable[[np.ndarray], np.ndarray]:
    """Open enough counters for the arrivals just seen, plus the queue that built up."""

    def act(obs: np.ndarray) -> np.ndarray:
        queue, arrivals = obs[:, 0], obs[:, 3]
        load = arrivals / env.interval * env.mean_service  # counters the arrivals keep busy
        wanted = np.ceil(load + queue / env.interval * env.mean_service / 2) + 1
        return np.clip(wanted - 1, 0, env.max_counters - 1).astype(np.int64)

    return act


@dataclass
class Args:
    num_envs: int = 16
    num_workers: int = 0  # 0: subvec's default, one per usable CPU
    hours: float = 8.0
    seed: int = 0


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in vars(Args()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    return Args(**vars(parser.parse_args()))


def run_day(
    envs: subvec.SubprocVectorEnv, policy: Callable[[np.ndarray], np.ndarray], seed: int
) -> None:
    # The same seeds for every policy: each is judged on the same customers' arrival streams.
    obs, _ = envs.reset(seed=seed)  # env i gets seed + i: independent streams
    done = np.zeros(envs.num_envs, dtype=bool)
    while not done.all():
        obs, _, terminated, truncated, _ = envs.step(policy(obs))
        done |= terminated | truncated


def main() -> None:
    args = parse_args()
    env_kwargs = {"day_minutes": args.hours * 60.0}
    model = ServiceQueueEnv(**env_kwargs)  # for the policy's constants; never stepped

    envs = subvec.make_vec(
        ServiceQueueEnv,
        args.num_envs,
        seed=args.seed,  # seeds the first reset (env i: seed + i) and the action spaces
        env_kwargs=env_kwargs,
        num_workers=args.num_workers or None,
    )
    print(envs)
    policies = {
        "rule of thumb": rule_of_thumb(model),
        "random staffing": lambda obs: envs.action_space.sample(),
    }
    try:
        for name, policy in policies.items():
            run_day(envs, policy, args.seed)
            days = subvec.remote(envs).day_summary()  # one dict per env, from the workers
            cost = np.array([d["cost"] for d in days])
            wait = np.array([d["mean_wait"] for d in days])
            served = np.array([d["served"] for d in days])
            print(
                f"{name:16s} day cost {cost.mean():8.0f} (+/- {cost.std():5.0f}), "
                f"mean wait {wait.mean():5.1f} min, served {served.mean():6.0f} "
                f"customers per day, over {envs.num_envs} independent days"
            )
    finally:
        envs.close()


if __name__ == "__main__":
    main()
