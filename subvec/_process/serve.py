"""One command on an ``EnvSlab``: the dispatcher a worker process (``_process.worker``) and
the parent's own envs (``_process.local``) share, and the reply both make of a step's result.

A worker decodes the command's payload from its pipe and encodes the answer into a frame; the
parent's own envs take the payload record as the front built it and hand the answer back as
an object. What runs in between, and what a step's answer says, is written here once. (A Ray
actor hosts a whole vector env, not a slab: ``subvec._ray_actor`` answers through its calls.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from subvec._commands import Command, UnitReply
from subvec._process.chunks import ChunkViews, run_chunk
from subvec._process.starts import StartGate, reconfigure_slab
from subvec._slab import EnvSlab
from subvec._slab_records import ChunkResult, SlabResult

__all__ = ["PROCESS_COMMANDS", "run_command", "unit_reply"]

#: the commands of a unit itself, not of its envs: :func:`run_command` takes none of them
PROCESS_COMMANDS = (Command.ATTACH, Command.STATS, Command.CLOSE)


def run_command(
    slab: EnvSlab,
    command: Command,
    payload: Any,
    chunk_views: Callable[[Any], ChunkViews],
    gate: StartGate | None,
    build_retries: int,
) -> Any:
    """Run ``command`` with its decoded ``payload`` on ``slab``.

    Args:
        slab: the envs.
        command: any env command (not one of :data:`PROCESS_COMMANDS`).
        payload: the command's payload record (``subvec._commands``).
        chunk_views: the chunk block's views for an action chunk's ``payload.block``.
        gate: the start tokens a reconfigure's builds hold (None: none).
        build_retries: how many more times a reconfigure calls a factory that raised.

    Returns:
        The slab's answer: a :class:`SlabResult` (reset, step), a :class:`ChunkResult` (an
        action chunk), a list (call: one result per env called; snapshot: one per env), or
        None (set_attr, set_reset_options, restore, reconfigure).

    Raises:
        Exception: what the env (or a factory) raised; ``slab.current_env`` names it.
        ValueError: a command the slab does not take.
    """
    if command is Command.STEP_ENVS:
        if payload.is_chunk:
            return run_chunk(slab, payload, chunk_views(payload.block))
        return slab.step(payload.envs, payload.actions, payload.action_dtypes)
    if command is Command.RESET:
        return slab.reset(payload.seeds, payload.options, payload.mask, payload.stored)
    if command is Command.CALL:
        return slab.call(payload.name, payload.args, payload.kwargs, payload.envs, payload.function)
    if command is Command.SET_ATTR:
        return slab.set_attr(payload.name, payload.values, payload.envs)
    if command is Command.SET_RESET_OPTIONS:
        return slab.set_reset_options(payload.envs, payload.options)
    if command is Command.SNAPSHOT:
        return slab.snapshot()
    if command is Command.RESTORE:
        return slab.restore(payload.snapshots)
    if command is Command.RECONFIGURE:
        return reconfigure_slab(slab, payload, gate, build_retries, [])
    raise ValueError(f"an env slab takes no {command.name} command")


def unit_reply(result: SlabResult | ChunkResult, first_index: int) -> UnitReply | None:
    """What a step's (or a chunk's) ``result`` tells the parent beyond the block: the infos,
    the by-value observations and the envs that raised; None for a plain OK (every result is
    in the block).

    Args:
        result: the slab's answer to a reset, a step or a chunk.
        first_index: the slab's first env index (errors name envs of the whole vector env).
    """
    if result.is_empty():
        return None
    if isinstance(result, ChunkResult):
        errors = result.error_records(first_index, "step_chunk")
        return UnitReply(result.infos, result.obs, errors, result.sub_obs)
    return UnitReply(result.infos, result.obs, result.error_records(first_index))
