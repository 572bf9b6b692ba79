"""The asynchronous engine's held results (``_front.held.HeldResults``) on their own: answers
written into plain numpy batch and chunk arrays as a unit would, held, then handed out, with
no process. What the backends cannot show directly: a plain chunk answer stays in its rows
(nothing copied when it is held) and survives the arrays being written for a chunk of another
K once it is released or materialised; a batch reads the rows and writes each copied result
over its own, whatever the rows hold by then."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gymnasium import spaces

from subvec._batch import BatchViews, PlainChunkStore
from subvec._commands import Status, UnitReply
from subvec._front.async_chunks import ChunkWork
from subvec._front.ended import EndedEnvs
from subvec._front.held import EnvResult, HeldResults, InRows
from subvec._front.observations import ObservationBatch

N = 4
OBS = spaces.Box(-10.0, 10.0, (2,), np.float32)
PLAIN = (Status.OK, None)


def _held(tracked: bool = False) -> tuple[HeldResults, BatchViews, EndedEnvs]:
    observations = np.zeros((N, 2), np.float32)
    batch = BatchViews(
        rewards=np.zeros(N),
        terminations=np.zeros(N, np.bool_),
        truncations=np.zeros(N, np.bool_),
        store_actions=None,
        store_action_rows=None,
        read_action=None,
        observations=observations,
        final_obs_rows=None,
        info_block=None,
        obs_slots=None,
    )
    ended = EndedEnvs(N, tracked)
    held = HeldResults(
        batch=batch,
        final_in_block=False,
        obs=ObservationBatch(batch, OBS, N, copy=True),
        ended=ended,
        space=OBS,
        info_format="gymnasium",
    )
    return held, batch, ended


def _answer(work: ChunkWork, observations: np.ndarray, envs: list[int], base: float) -> None:
    """Write a unit's chunk answer for ``envs`` into the arrays, as a unit would: every
    sub-step's reward ``base + 10 * env + k``, the last sub-step ended for env 1."""
    rewards, terms, truncs, _ = work.views.batch(work.chunk)
    for env in envs:
        rewards[env] = base + 10 * env + np.arange(work.chunk)
        terms[env] = False
        truncs[env] = False
        work.views.steps[env] = work.chunk
        observations[env] = base + env
    if 1 in envs:
        terms[1, work.chunk - 1] = True


def _work(store: PlainChunkStore, k: int, ids: list[int]) -> ChunkWork:
    views = store.block_for(k, False)
    return ChunkWork(k, False, False, views, ids, None)


UNIT = SimpleNamespace(index=0, lo=0, hi=N, pid=None, describe=lambda: "worker 0")


def test_a_plain_chunk_answer_is_held_in_its_rows_and_gathered_from_them() -> None:
    held, batch, ended = _held(tracked=True)
    observations = batch.observations
    store = PlainChunkStore(N)
    work = _work(store, 3, [0, 1, 2, 3])
    _answer(work, observations, [0, 1, 2, 3], 100.0)
    held.hold(UNIT, [0, 1, 2, 3], False, work, PLAIN)  # type: ignore[arg-type]
    assert all(type(h) is InRows for h in held.ready.values())
    assert ended.ids() == [1]  # its last sub-step terminated: read from the rows at once
    obs, rewards, terms, truncs, infos = held.take([2, 1], np.array([2, 1]))
    np.testing.assert_array_equal(rewards, [[120, 121, 122], [110, 111, 112]])
    np.testing.assert_array_equal(obs, [[102, 102], [101, 101]])
    assert terms.tolist() == [[False, False, False], [False, False, True]]
    assert not truncs.any() and infos["chunk_steps"].tolist() == [3, 3]
    assert infos["env_id"].tolist() == [2, 1]
    assert sorted(held.ready) == [0, 3]  # the others stay held


@pytest.mark.parametrize("next_k", [5, 16], ids=["reshaped", "replaced"])
def test_a_held_chunk_is_copied_out_before_arrays_of_another_k(next_k: int) -> None:
    held, batch, _ = _held()
    observations = batch.observations
    store = PlainChunkStore(N)
    first = _work(store, 3, [0, 1])
    _answer(first, observations, [0, 1], 100.0)
    held.hold(UNIT, [0, 1], False, first, PLAIN)  # type: ignore[arg-type]
    held.take([0], np.array([0]))
    held.release_chunk_rows((3, False))  # the same shape: nothing to copy
    assert type(held.ready[1]) is InRows
    held.release_chunk_rows((next_k, False))
    assert type(held.ready[1]) is EnvResult
    # env 0's chunk of the other K: in the same buffer, its rows cover env 1's old ones
    second = _work(store, next_k, [0])
    _answer(second, observations, [0], 500.0)
    _, rewards, _, _, infos = held.take([1], np.array([1]))
    np.testing.assert_array_equal(rewards, [[110, 111, 112]])
    assert infos["chunk_steps"].tolist() == [3]


def test_materialised_and_in_rows_chunks_batch_together() -> None:
    held, batch, _ = _held()
    observations = batch.observations
    store = PlainChunkStore(N)
    work = _work(store, 2, [0, 1, 2])
    _answer(work, observations, [0, 1, 2], 0.0)
    held.hold(UNIT, [0, 1, 2], False, work, PLAIN)  # type: ignore[arg-type]
    held.materialise([1])  # as before a restart rewrites its unit's rows
    assert type(held.ready[1]) is EnvResult and type(held.ready[0]) is InRows
    observations[1] = -1.0  # what the restart would write: the copy is kept
    obs, rewards, _, _, _ = held.take([0, 1, 2], np.array([0, 1, 2]))
    np.testing.assert_array_equal(rewards, [[0, 1], [10, 11], [20, 21]])
    np.testing.assert_array_equal(obs[:, 0], [0, 1, 2])


def test_a_step_batch_reads_the_rows_and_writes_the_copies_over_theirs() -> None:
    held, batch, _ = _held()
    rewards, observations = batch.rewards, batch.observations
    rewards[:] = np.arange(N) + 0.5
    observations[:] = np.arange(N)[:, None]
    held.hold(UNIT, [0, 1], False, None, PLAIN)  # type: ignore[arg-type]
    said = UnitReply([(2, {"a": 7.0})], None)
    held.hold(UNIT, [2], False, None, (Status.OK_PAYLOAD, said))  # type: ignore[arg-type]
    held.hold(UNIT, [3], True, None, PLAIN)  # type: ignore[arg-type]
    assert [type(held.ready[e]) for e in range(N)] == [InRows, InRows, EnvResult, InRows]
    rewards[2], observations[2] = -1.0, -1.0  # a later write to env 2's rows: its copy stands
    obs, got, terms, truncs, infos = held.take([3, 2, 0], np.array([3, 2, 0]))
    assert got.tolist() == [0.0, 2.5, 0.5]  # env 3's is a reset's: no reward
    assert obs[:, 0].tolist() == [3.0, 2.0, 0.0]
    assert not terms.any() and not truncs.any()
    assert infos["a"].tolist() == [0.0, 7.0, 0.0] and infos["_a"].tolist() == [False, True, False]
    assert infos["env_id"].tolist() == [3, 2, 0]
    assert sorted(held.ready) == [1]
