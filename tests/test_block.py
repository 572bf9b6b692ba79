"""The block's schema, the mergers and the parent's own envs, in-process (no workers)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from subvec._backend import PLAIN
from subvec._commands import (
    CallPayload,
    Command,
    ResetPayload,
    SetAttrPayload,
    Status,
    StepEnvsPayload,
    UnitReply,
    rebuild_remote_error,
)
from subvec._compat import DEFAULT_INFO_FORMAT, AutoresetMode
from subvec._front.merge import make_merger
from subvec._process.block import (
    OBS_SLOTS,
    bind_batch,
    bind_obs_slots,
    bind_rows,
    plan_block,
    slot_writers,
)
from subvec._process.local import LocalShare
from subvec._process.shm import SharedBlock
from subvec._slab import EnvSlab
from tests.envs import CrashEnv, ZooEnv
from tests.helpers import assert_same

BOX = spaces.Box(0, 1, (3,), np.float32)
IMAGE = spaces.Box(0, 255, (48, 48, 3), np.uint8)
NEST = spaces.Dict({"a": spaces.Discrete(4), "b": spaces.Tuple((BOX, spaces.MultiBinary(2)))})


def _names(plan: Any) -> set[str]:
    return {region.name for region in plan.layout.regions}


def _plan(obs: spaces.Space[Any], **kw: Any) -> Any:
    args = {"shared_memory": True, "same_step": False, "slots": True, "info_block": True}
    return plan_block(4, 2, obs, spaces.Discrete(3), **{**args, **kw})


def test_plan_block_holds_what_the_options_ask_for() -> None:
    plain = _plan(BOX, slots=False, info_block=False)
    assert _names(plain) == {"rewards", "terminations", "truncations", "act0", "obs0"}
    assert plain.obs_shared and plain.act_shared and not plain.final_obs
    nest = _plan(NEST, same_step=True)
    assert {"obs0", "obs1", "obs2"} <= _names(nest)  # one region per leaf
    assert not nest.final_obs and nest.obs_slots == 0  # nests keep the single batch
    assert _plan(BOX, same_step=True).final_obs
    assert _plan(BOX).obs_slots == 0  # too small to be worth slots
    image = _plan(IMAGE)
    assert image.obs_slots == OBS_SLOTS and "obs_slot" in _names(image)
    assert "info_values" in _names(image)
    pipes = _plan(spaces.Text(5), shared_memory=True)
    assert not pipes.obs_shared and "obs0" not in _names(pipes)
    assert not _plan(BOX, shared_memory=False).obs_shared
    assert not plan_block(
        4,
        0,
        BOX,
        spaces.Discrete(3),
        shared_memory=True,
        same_step=False,
        slots=False,
        info_block=True,
    ).info_block  # no worker: nowhere to write block infos from


@pytest.fixture
def image_block() -> Any:
    plan = _plan(IMAGE, same_step=True)
    block = SharedBlock.create(plan.layout)
    yield plan, block
    block.close()


def test_both_sides_bind_the_same_rows(image_block: Any) -> None:
    plan, block = image_block
    spec = plan.attach_spec(block.name, 4, IMAGE, spaces.Discrete(3))
    batch = bind_batch(block.views, plan, spec)
    batch.store_actions(np.array([0, 1, 2, 1]))
    envs = [ZooEnv(IMAGE, max_steps=10**6, terminate_prob=0.0) for _ in range(2)]
    slab = EnvSlab(envs, 2, AutoresetMode.SAME_STEP)  # a worker's envs 2..3
    slab.bind(bind_rows(block.views, spec, 2, 4))
    slab.reset([5, 6], None)
    oracle = SyncVectorEnv([lambda: ZooEnv(IMAGE, max_steps=10**6, terminate_prob=0.0)] * 2)
    want, _ = oracle.reset(seed=[5, 6])
    assert_same(batch.observations[2:], want, "rows 2..3")
    slab.step()
    assert [env.last_action for env in envs] == [2, 1]  # its own rows of the actions
    want = oracle.step(np.array([2, 1]))
    assert_same(batch.observations[2:], want[0], "stepped rows")
    assert_same(batch.rewards[2:], want[1], "rewards")
    oracle.close()
    slab.arrays = None


def test_obs_slots_pick_a_batch_the_caller_does_not_hold(image_block: Any) -> None:
    plan, block = image_block
    spec = plan.attach_spec(block.name, 4, IMAGE, spaces.Discrete(3))
    writers, cell = slot_writers(block.views, spec, 0, 4)  # a worker's side
    assert len(writers) == OBS_SLOTS + 1 and cell is not None
    del writers  # (they hold their slots' rows: the parent never has them)
    slots = bind_obs_slots(block.views, plan.obs_slots, IMAGE)
    held = []
    for expected in range(1, OBS_SLOTS + 1):
        assert slots.pick() == expected and cell[0] == expected
        held.append(slots.batches[expected].view())  # the caller keeps a view
    assert slots.pick() == 0  # all held: write slot 0, copied out
    del held[1]
    assert slots.pick() == 2
    del held, cell, slots


def _events(*per_env: dict[str, Any]) -> list[tuple[int, Any]]:
    return [(0, UnitReply([(i, info) for i, info in enumerate(per_env) if info], None))]


def test_mergers_match_gymnasium() -> None:
    oracle = SyncVectorEnv([lambda: ZooEnv()] * 3)
    infos = [{"a": 1, "nested": {"x": np.float32(2)}}, {}, {"a": 3, "s": "txt"}]
    want: dict[str, Any] = {}
    for i, info in enumerate(infos):
        want = oracle._add_info(want, info, i)
    # the installed gymnasium's own merge: 0.29's is the legacy format's (no recursion)
    merger = make_merger(DEFAULT_INFO_FORMAT, 3)
    assert_same(merger.merge(_events(*infos), []), want, DEFAULT_INFO_FORMAT)
    assert merger.merge([], []) == {}
    listed = make_merger("list", 3).merge(_events(*infos), [1])
    assert listed == [infos[0], {"worker_restarted": True}, infos[2]]
    legacy = make_merger("legacy", 3).merge(_events(*infos), [])
    assert legacy["a"].tolist() == [1, 0, 3] and legacy["_a"].tolist() == [True, False, True]
    assert legacy["nested"][0] == {"x": np.float32(2)}  # no recursion in 0.29's layout
    oracle.close()


def test_local_share_runs_commands_inside_collect(image_block: Any) -> None:
    plan, block = image_block
    spec = plan.attach_spec(block.name, 4, IMAGE, spaces.Discrete(3))
    fns = [lambda: ZooEnv(IMAGE), lambda: CrashEnv("raise", at_step=1, obs_space=IMAGE)]
    local = LocalShare(fns, 2, index=1, autoreset_mode=AutoresetMode.NEXT_STEP)
    local.bind(block.views, spec)
    assert local.units == (local,) and local.inline and "envs 2..3" in local.describe()
    local.send(Command.RESET, ResetPayload([1, 2], None, None))
    assert local.collect(None, "resetting") is not None  # reset infos
    local.send(Command.CALL, CallPayload("get_t", (5,), {}))
    got = local.collect(None, "calling")
    assert got is not None and got.outcomes[1] == (Status.OK_PAYLOAD, [5, 5])
    local.send(Command.SET_ATTR, per_unit=lambda u: SetAttrPayload("marker", ["x", "y"]))
    assert local.collect(None, "setting") is None  # a plain OK
    assert local.slab.envs[1].get_wrapper_attr("marker") == "y"
    local.send(Command.STEP_ENVS, StepEnvsPayload(None, None))  # a lock-step step
    got = local.collect(None, "stepping")
    assert got is not None
    status, reply = got.outcomes[1]
    # the env that raised is reported on its own (as a worker's), the other one stepped
    assert status is Status.OK_PAYLOAD and [local for local, _ in reply.errors] == [1]
    ((_, record),) = reply.errors
    error = rebuild_remote_error(record, local.pid)
    assert isinstance(error, KeyError) and error.env_index == 3
    assert local.slab.envs[0].get_wrapper_attr("t") == 1
    assert local.collect(None, "nothing sent") is None
    assert local.collect_ready([local], 1, 0.0, "nothing sent").outcomes == {}
    assert PLAIN == (Status.OK, None)
    assert local.close(1.0, False) is None
