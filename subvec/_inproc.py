"""InProcessVectorEnv: the front over the parent's own envs only, every env local.

No worker process, no pipe and no shared segment: one :class:`~subvec._process.local.LocalShare`
holds every env, and the batch arrays are the block's layout (``_process.block.plan_block``) in this
process's own memory, so the envs step into their rows exactly as ``parent_envs`` do. What
runs here is the whole gymnasium contract of the front (``_front.front``: lock-step and
asynchronous stepping, masked resets, calls, the info formats, the autoreset modes), which is
what the conformance axis holds to SyncVectorEnv in milliseconds per case (tests/vectorisers.py).

Not exported: for one process, gymnasium's own SyncVectorEnv is the tool; this backend exists
so that the contract is tested apart from any transport (docs/decisions/0027).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from gymnasium import Env

from subvec._compat import DEFAULT_INFO_FORMAT, AutoresetMode
from subvec._front.front import VectorFront
from subvec._front.setup import Hello, ObservationMode, TimeoutArg
from subvec._process.block import bind_batch, plan_block
from subvec._process.chunks import SharedChunkStore
from subvec._process.local import LocalShare
from subvec._process.shm import BlockLayout, layout_views
from subvec._process.starts import check_build_retries

__all__ = ["InProcessVectorEnv"]


def _own_memory(layout: BlockLayout) -> tuple[str | None, dict[str, np.ndarray]]:
    """A chunk block of ``layout`` in this process's memory (no segment: no name)."""
    return None, {r.name: np.zeros(r.shape, dtype=r.dtype) for r in layout.regions}


class InProcessVectorEnv(VectorFront):
    """Run ``len(env_fns)`` envs in this process, one after the other, through the front.

    Args:
        env_fns: callables that build the envs (called here, in env order).
        copy: return fresh observation arrays; ``False`` returns views valid until the next
            call.
        observation_mode: ``"same"``, ``"different"`` or ``(observation_space, single_space)``.
        autoreset_mode: as SubprocVectorEnv's (None: NEXT_STEP, or SAME_STEP with
            ``info_format="legacy"``).
        info_format: ``"gymnasium"``, ``"list"`` or ``"legacy"``, as SubprocVectorEnv's.
        batch_size: how many envs ``recv()`` returns by default (asynchronous stepping).
        timeout: default timeout of every ``*_wait`` (kept for the common signature: envs in
            this process answer when their call returns).
        freeze, build_retries: as SubprocVectorEnv's.

    Raises:
        ValueError, TypeError: a bad option value.
        EnvError: an env factory raised (its type kept, naming the env).
    """

    def __init__(
        self,
        env_fns: Iterable[Callable[[], Env[Any, Any]]],
        copy: bool = True,
        *,
        observation_mode: ObservationMode = "same",
        autoreset_mode: str | AutoresetMode | None = None,
        info_format: str = DEFAULT_INFO_FORMAT,
        batch_size: int | None = None,
        timeout: TimeoutArg = None,
        freeze: bool = False,
        build_retries: int = 0,
    ) -> None:
        super().__init__()
        self._configure(
            env_fns,
            autoreset_mode,
            info_format,
            copy=copy,
            timeout=timeout,
            on_worker_failure="raise",  # nothing here can die or hang apart from the caller
            max_restarts=0,
            batch_size=batch_size,
            observation_mode=observation_mode,
            freeze=freeze,
        )
        local = LocalShare(
            self.env_fns, 0, 0, self.autoreset_mode, self.freeze, check_build_retries(build_retries)
        )
        self._local: LocalShare | None = local
        try:
            self._take_hellos([Hello.of_envs(local.envs)])
            obs_space, act_space = self.single_observation_space, self.single_action_space
            plan = plan_block(
                self.num_envs,
                0,
                obs_space,
                act_space,
                shared_memory=True,
                same_step=self.autoreset_mode is AutoresetMode.SAME_STEP,
                slots=False,  # slots hand out views the workers write next; here a copy is as cheap
                info_block=False,  # the info block is a worker's way to skip pickling infos
            )
            # numpy's allocation, not a bytearray's: the regions' alignment holds in memory too
            views = layout_views(np.zeros(plan.layout.size, dtype=np.uint8), plan.layout)
            spec = plan.attach_spec("", self.num_envs, obs_space, act_space)
            local.bind(views, spec)
            self._start([local], bind_batch(views, plan, spec), plan.final_obs)
            # Action chunks' arrays in this process's memory too, handed to the envs' unit
            self._start_chunks(
                SharedChunkStore(
                    self.num_envs,
                    obs_space if self._obs_shared else None,
                    act_space,
                    _own_memory,
                    adopt=local.adopt_chunks,
                )
            )
        except BaseException:
            local.close(0.0, True)
            self._local = None
            raise

    def _released(self) -> None:
        self._local = None

    def __repr__(self) -> str:
        spec = f"{self.spec.id}, " if self.spec is not None else ""
        state = "closed" if self.closed else self._state.value
        return (
            f"InProcessVectorEnv({spec}num_envs={self.num_envs}, "
            f"autoreset_mode={self.autoreset_mode.value}, {state})"
        )
