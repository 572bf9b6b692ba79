"""An env package that registers its envs when imported, as ``ale_py`` does; its env class lives
in a submodule that ``gym.make`` imports through the string entry point."""

from __future__ import annotations

import gymnasium as gym

gym.register("SubvecPkgEnv-v0", entry_point="tests.scripts.regpkg.envs:PkgEnv")
