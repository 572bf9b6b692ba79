"""Env factories for the SB3 and factory tests.

Kept apart from the test modules on purpose: workers import this module to unpickle the
factories, and it must not pull Stable-Baselines3 or torch into them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tests.envs import ZooEnv

#: A flat Dict observation space as SB3's MultiInputPolicy takes it (no nesting).
DICT_SPACE = spaces.Dict(
    {
        "pos": spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
        "grid": spaces.Box(0, 9, shape=(2, 2), dtype=np.uint8),
        "flag": spaces.Discrete(2),
    }
)
#: Dict of Boxes only, as VecNormalize and VecFrameStack take it.
BOX_DICT_SPACE = spaces.Dict(
    {
        "pos": spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
        "vel": spaces.Box(-5.0, 5.0, shape=(2,), dtype=np.float64),
    }
)
#: What SB3 calls an image: uint8, channels last, bounds 0..255.
IMAGE_SPACE = spaces.Box(0, 255, shape=(12, 10, 3), dtype=np.uint8)


def dict_env(max_steps: int = 9) -> gym.Env[Any, Any]:
    return ZooEnv(DICT_SPACE, spaces.Discrete(3), max_steps=max_steps)


def box_dict_env(max_steps: int = 9) -> gym.Env[Any, Any]:
    return ZooEnv(BOX_DICT_SPACE, spaces.Discrete(3), max_steps=max_steps)


def image_env(render_mode: str | None = None) -> gym.Env[Any, Any]:
    return ZooEnv(IMAGE_SPACE, spaces.Discrete(3), max_steps=11, render_mode=render_mode)


def big_image_env() -> gym.Env[Any, Any]:
    """Frames large enough (6912 bytes) that a few envs' batch comes from observation slots."""
    return ZooEnv(spaces.Box(0, 255, (48, 48, 3), np.uint8), spaces.Discrete(3), max_steps=11)


def box_env(max_steps: int = 8) -> gym.Env[Any, Any]:
    """Box observations and continuous actions (for SAC)."""
    return ZooEnv(
        spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
        spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
        max_steps=max_steps,
    )


def zoo_env(max_steps: int = 7, render_mode: str | None = None) -> gym.Env[Any, Any]:
    return ZooEnv(max_steps=max_steps, render_mode=render_mode)


class FrozenEnv(ZooEnv):
    """Refuses attributes it did not set itself (as a frozen or ``__slots__`` class would)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_subvec"):
            raise AttributeError(f"{type(self).__name__} takes no new attribute {name!r}")
        super().__setattr__(name, value)


class Marker(gym.Wrapper[Any, Any, Any, Any]):
    """A wrapper the tests look for with ``env_is_wrapped``."""


def marked_zoo() -> gym.Env[Any, Any]:
    return Marker(ZooEnv())


#: An action space of every fixed-size kind, for the per-env dict actions of SB3's VecEnvs.
DICT_ACTION_SPACE = spaces.Dict(
    {
        "move": spaces.Discrete(3),
        "fire": spaces.MultiBinary(2),
        "force": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
    }
)


def action_env(act_space: spaces.Space[Any], max_steps: int = 9) -> gym.Env[Any, Any]:
    """Box observations and any action space; the env keeps its last action (``last_action``)."""
    return ZooEnv(
        spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32), act_space, max_steps=max_steps
    )


class MultiBinaryTarget(ZooEnv):
    """MultiBinary(4) actions rewarded for matching the observation's signs: a task PPO and A2C
    can learn, and whose reward reads the action as SB3 hands it (float32 zeros and ones)."""

    def __init__(self, max_steps: int = 16) -> None:
        super().__init__(
            spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32),
            spaces.MultiBinary(4),
            max_steps=max_steps,
            terminate_prob=0.0,
        )
        self._target = np.zeros(4, dtype=np.float32)

    def _obs(self) -> Any:
        obs = super()._obs()
        self._target = (obs > 0).astype(np.float32)
        return obs

    def step(self, action: Any):
        self.t += 1
        self.last_action = action
        reward = float(np.mean(np.asarray(action) == self._target))
        return self._obs(), reward, False, self.t >= self.max_steps, {}


def multibinary_env() -> gym.Env[Any, Any]:
    return MultiBinaryTarget()


def dict_action_env() -> gym.Env[Any, Any]:
    return action_env(DICT_ACTION_SPACE)
