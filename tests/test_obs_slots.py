"""Observation slots: large batches are handed out as views of the block, never overwritten
while the caller holds anything of them (subvec._batch.ObsSlots)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

import subvec._process.block
from subvec import SubprocVectorEnv
from subvec._compat import AutoresetMode
from subvec._process.block import OBS_SLOT_MIN_BYTES, OBS_SLOTS
from tests.envs import ZooEnv
from tests.helpers import assert_same
from tests.oracle import sync_vector_env

# 6912 bytes an env: 4 envs make a batch above OBS_SLOT_MIN_BYTES
IMAGE = spaces.Box(0, 255, (48, 48, 3), np.uint8)


def _image_env() -> ZooEnv:
    return ZooEnv(IMAGE, max_steps=10**6, terminate_prob=0.1)


def _pair(num_envs: int = 4, **kwargs: object) -> tuple[SubprocVectorEnv, SyncVectorEnv]:
    assert num_envs * IMAGE.shape[0] * IMAGE.shape[1] * 3 >= OBS_SLOT_MIN_BYTES
    fns = [_image_env] * num_envs
    return SubprocVectorEnv(fns, num_workers=2, **kwargs), SyncVectorEnv(fns)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_held_batches_and_their_views_never_change() -> None:
    envs, oracle = _pair()
    try:
        got, _ = envs.reset(seed=1)
        want, _ = oracle.reset(seed=1)
        envs.action_space.seed(0)
        held: list[tuple[object, np.ndarray]] = []  # (what the caller kept, its value then)
        # A batch handed out in a slot is a view of that slot's root; a copied one owns its data.
        # (Ids, not the roots: a reference held here would keep a slot busy.)
        roots: set[int] = set()
        copied = False
        for t in range(40):
            actions = envs.action_space.sample()
            got = envs.step(actions)[0]
            want = oracle.step(actions)[0]
            assert_same(got, want, f"step {t}")
            if got.base is None:
                copied = True
            else:
                roots.add(id(got.base))
            if t == 5:
                held.append((got, want.copy()))  # the batch itself
            if t == 9:
                held.append((got[1, 10:20], want[1, 10:20].copy()))  # only a slice of it
            if t == 13:
                held.append((got.reshape(len(got), -1).view(np.int8), want.copy()))
            for i, (kept, value) in enumerate(held):
                assert np.array_equal(np.asarray(kept).view(np.uint8).ravel(), value.ravel()), (
                    f"held batch {i} changed at step {t}"
                )
        # The first steps went to slots; once the caller held them all, batches were copied.
        assert len(roots) == OBS_SLOTS and copied
        held.clear()
        got = envs.step(envs.action_space.sample())[0]
        assert id(got.base) in roots and got.flags.writeable  # let go of: in use again
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_a_held_batch_outlives_close() -> None:
    envs, oracle = _pair()
    envs.reset(seed=3)
    oracle.reset(seed=3)
    actions = envs.action_space.sample()
    got = envs.step(actions)[0]
    assert got.base is not None  # a view of a slot, not a copy
    envs.close()  # the segment is unlinked; the mapping lives on with the caller's view
    assert_same(got, oracle.step(actions)[0], "after close")
    oracle.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_slots_match_sync_with_partial_resets(mode: AutoresetMode) -> None:
    # DISABLED resets ended envs with a mask: the others keep their observations in the
    # slot the reset is written to.
    fns = [_image_env] * 5
    oracle = sync_vector_env(fns, autoreset_mode=mode)  # first: it may skip the test
    envs = SubprocVectorEnv(fns, num_workers=2, autoreset_mode=mode)
    try:
        assert envs.block_plan.obs_slots == OBS_SLOTS
        assert_same(envs.reset(seed=4), oracle.reset(seed=4), "reset")
        envs.action_space.seed(2)
        previous = None
        for t in range(60):
            actions = envs.action_space.sample()
            got, want = envs.step(actions), oracle.step(actions)
            assert_same(got, want, f"step {t}")
            if mode is AutoresetMode.DISABLED and (got[2] | got[3]).any():
                options = {"reset_mask": got[2] | got[3]}
                assert_same(envs.reset(options=options), oracle.reset(options=options), f"{t}")
            if previous is not None:
                assert_same(previous[0], previous[1], f"the batch before step {t}")
            previous = (got[0], want[0])
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_no_slots_for_copy_false_or_small_batches() -> None:
    envs = SubprocVectorEnv([_image_env] * 4, num_workers=2, copy=False)
    try:
        envs.reset(seed=0)
        first = envs.step(envs.action_space.sample())[0]
        assert envs.block_plan.obs_slots == 0
        assert first is envs.step(envs.action_space.sample())[0]  # the block's own view
    finally:
        del first
        envs.close()
    small = SubprocVectorEnv([lambda: ZooEnv()] * 4, num_workers=2)
    try:
        assert small.block_plan.obs_slots == 0
    finally:
        small.close()


@pytest.mark.timeout(60)
def test_no_slots_when_dev_shm_has_no_room_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = []

    def no_room(size: int) -> bool:
        sizes.append(size)
        return False

    monkeypatch.setattr(subvec._process.block, "has_free_space", no_room)
    envs = SubprocVectorEnv([_image_env] * 4, num_workers=2)
    try:
        layout = envs.block_plan.layout
        assert sizes and envs.block_plan.obs_slots == 0
        assert not any("slot" in region.name for region in layout.regions)
        assert layout.size < sizes[0]
        envs.reset(seed=0)
        first = envs.step(envs.action_space.sample())[0]
        assert first.base is None  # a copy of the block's batch
    finally:
        envs.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("act_space", [spaces.Text(3), spaces.Discrete(3)], ids=["pipe", "list"])
def test_actions_by_value_never_write_a_held_batch(act_space: spaces.Space[str]) -> None:
    # Actions that travel by value (a space the block cannot hold, or a list) take another
    # path to the workers than the block's; it too must point them at a free slot.
    fns = [lambda: ZooEnv(IMAGE, act_space, max_steps=10**6, terminate_prob=0.0)] * 4
    envs, oracle = SubprocVectorEnv(fns, num_workers=2), SyncVectorEnv(fns)
    try:
        held, _ = envs.reset(seed=1)
        want, _ = oracle.reset(seed=1)
        envs.action_space.seed(0)
        for t in range(6):
            actions = list(envs.action_space.sample())
            assert_same(envs.step(actions)[0], oracle.step(actions)[0], f"step {t}")
            assert np.array_equal(held, want), f"the reset's batch changed at step {t}"
    finally:
        envs.close()
        oracle.close()


CAMERAS = {"left": IMAGE, "right": IMAGE, "state": spaces.Box(-1.0, 1.0, (9,), np.float32)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", [False, True], ids=["in_block", "split_with_text"])
def test_dict_batches_are_slots_and_a_held_leaf_keeps_its_slot(text: bool) -> None:
    # Every leaf in the block has its slots; a slot is written again only when the caller
    # holds none of its leaves. With a Text leaf, only the fixed-size leaves are in slots.
    space = spaces.Dict({**CAMERAS, **({"instruction": spaces.Text(8)} if text else {})})
    fns = [lambda: ZooEnv(space, max_steps=10**6, terminate_prob=0.1)] * 4
    envs, oracle = SubprocVectorEnv(fns, num_workers=2), SyncVectorEnv(fns)
    try:
        assert envs.block_plan.obs_slots == OBS_SLOTS
        assert envs.block_plan.obs_split is text
        assert_same(envs.reset(seed=2), oracle.reset(seed=2), "reset")
        envs.action_space.seed(1)
        held: list[tuple[object, np.ndarray]] = []
        roots: set[int] = set()
        copied = False
        for t in range(12):
            actions = envs.action_space.sample()
            got = envs.step(actions)[0]
            want = oracle.step(actions)[0]
            assert_same(got, want, f"step {t}")
            bases = {key: got[key].base for key in CAMERAS}
            if any(base is None for base in bases.values()):
                assert all(base is None for base in bases.values())  # the whole batch copied
                copied = True
            else:
                roots.add(id(bases["left"]))
            del bases
            if t in (2, 4, 6):  # one leaf of each: each keeps its whole slot
                key = ("left", "right", "state")[t // 2 - 1]
                held.append((got[key], want[key].copy()))
            for i, (kept, value) in enumerate(held):
                assert np.array_equal(kept, value), f"held leaf {i} changed at step {t}"
        assert len(roots) == OBS_SLOTS and copied
        held.clear()
        got = envs.step(envs.action_space.sample())[0]
        assert id(got["left"].base) in roots  # let go of: in use again
    finally:
        envs.close()
        oracle.close()
