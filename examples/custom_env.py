"""Your own env in worker processes: three ways to hand it to subvec, and what errors look like.

The env below is defined in this script, the way most projects start. subvec sends env
factories to its workers with cloudpickle, so a class defined in ``__main__``, a lambda or a
closure all work, under every start method:

1. ``SubprocVectorEnv([lambda: GridWalk(size) for _ in range(n)])``: gymnasium's own pattern;
2. ``subvec.make_vec(GridWalk, n, seed=0, env_kwargs={...})``: the one-line factory;
3. ``gym.register("GridWalk-v0", ...)`` then ``subvec.make_vec("GridWalk-v0", n)``: the id is
   resolved here, so the workers need not run the registration themselves.

It ends with an env that raises mid-episode: the error surfaces in the parent with its own
type, the index of the env that raised, and the worker's traceback.

Run:  python examples/custom_env.py
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import subvec


class GridWalk(gym.Env[np.ndarray, int]):
    """Walk on a ``size`` x ``size`` grid from a random cell to the corner (size-1, size-1).

    Actions: 0 up, 1 down, 2 left, 3 right. Reward -1 per step, 0 on arrival (terminated).
    ``slip`` is the chance that the move goes in a random direction instead.
    """

    metadata = {"render_modes": ["ansi"]}
    moves = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])

    def __init__(self, size: int = 5, slip: float = 0.1, render_mode: str | None = None):
        self.size = size
        self.slip = slip
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0, size - 1, shape=(2,), dtype=np.int64)
        self.action_space = spaces.Discrete(4)
        self.pos = np.zeros(2, dtype=np.int64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.integers(0, self.size, size=2)
        return self.pos.copy(), {}

    def step(self, action: int):
        if self.np_random.random() < self.slip:
            action = int(self.np_random.integers(4))
        self.pos = np.clip(self.pos + self.moves[action], 0, self.size - 1)
        arrived = bool((self.pos == self.size - 1).all())
        return self.pos.copy(), 0.0 if arrived else -1.0, arrived, False, {}

    def render(self) -> str:
        rows = [["." for _ in range(self.size)] for _ in range(self.size)]
        rows[-1][-1] = "G"
        rows[self.pos[0]][self.pos[1]] = "@"
        return "\n".join("".join(r) for r in rows)

    def distance(self) -> int:
        """Steps left to the goal without slips (called through subvec.remote below)."""
        return int((self.size - 1 - self.pos).sum())


class Fragile(GridWalk):
    """Breaks on its 3rd step, to show what an env error looks like from the parent."""

    def step(self, action: int):
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps == 3:
            raise RuntimeError(f"sensor failure at {self.pos.tolist()}")
        return super().step(action)


def greedy(obs: np.ndarray, size: int) -> np.ndarray:
    """Move down while not on the last row, then right."""
    return np.where(obs[:, 0] < size - 1, 1, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--size", type=int, default=6)
    args = parser.parse_args()
    n, size = args.num_envs, args.size

    # 1. gymnasium's pattern: a list of factories (lambdas travel with cloudpickle).
    envs = subvec.SubprocVectorEnv([lambda: GridWalk(size) for _ in range(n)])
    obs, _ = envs.reset(seed=0)
    print(envs)
    print("distances to the goal:", subvec.remote(envs).distance())
    returns, steps = np.zeros(n), 0
    done = np.zeros(n, dtype=bool)
    while not done.all():
        obs, reward, terminated, truncated, _ = envs.step(greedy(obs, size))
        returns += np.where(done, 0.0, reward)
        done |= terminated | truncated
        steps += 1
    print(f"greedy walk: mean return {returns.mean():.1f} after {steps} vector steps")
    envs.close()

    # 2. The factory: a callable plus env_kwargs; seed=0 seeds the first reset.
    envs = subvec.make_vec(GridWalk, n, seed=0, env_kwargs={"size": size, "render_mode": "ansi"})
    envs.reset()
    print("env 0 after reset:\n" + envs.render()[0])
    envs.close()

    # 3. A registered id, resolved in this process; the workers build from the resolved spec.
    gym.register("GridWalk-v0", entry_point=GridWalk, max_episode_steps=50)
    envs = subvec.make_vec("GridWalk-v0", n, env_kwargs={"size": size, "slip": 0.5})
    envs.reset(seed=1)
    print("registered:", envs.spec.id if envs.spec else None, "slip", envs.get_attr("slip")[0])
    envs.close()

    # Errors: the env's own exception type, the env index, the worker's traceback.
    envs = subvec.SubprocVectorEnv([lambda: GridWalk(size), lambda: Fragile(size)])
    try:
        envs.reset(seed=0)
        for _ in range(5):
            envs.step(np.array([1, 1]))
    except RuntimeError as exc:
        assert isinstance(exc, subvec.EnvError)
        print(f"caught {type(exc).__name__} from env {exc.env_index}: {exc}")
    finally:
        envs.close()


if __name__ == "__main__":
    main()
