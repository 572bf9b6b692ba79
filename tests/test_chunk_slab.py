"""Action chunks in-process: ``EnvSlab.step_chunk`` and the chunk batch's checks.

The oracle is, per env, a one-env SyncVectorEnv stepped with exactly the ``step()`` calls the
chunk stands for (tests/chunks.py); the chunk's infos are merged with ``merge_chunk_infos``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from subvec._chunk_actions import ChunkBatch, chunk_actions, chunk_reader
from subvec._compat import DEFAULT_INFO_FORMAT, AutoresetMode
from subvec._front.merge import merge_chunk_infos
from subvec._process.chunks import scalar_rows
from subvec._slab import EnvSlab
from subvec._slab_records import ChunkArrays, SlabArrays
from subvec._spaces import row_reader
from tests.chunks import Oracle, check_chunk, sample_chunks
from tests.envs import CrashEnv, ZooEnv

MODES = list(AutoresetMode)
BOX_ACT = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
OBS = spaces.Box(0, 9, shape=(2, 3), dtype=np.float32)


def _cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def _zoo() -> gym.Env[Any, Any]:
    return ZooEnv(OBS, BOX_ACT, max_steps=6, terminate_prob=0.1)


ENVS = {"cartpole_discrete": _cartpole, "zoo_box": _zoo}


class ChunkHarness:
    """A slab over fresh envs, its step arrays, and what its chunks wrote."""

    def __init__(self, fns: list[Any], mode: AutoresetMode, *, sub_writer: bool = True) -> None:
        self.n = len(fns)
        self.slab = EnvSlab([fn() for fn in fns], 0, mode)
        self.last: dict[int, Any] = {}
        self.sub: dict[tuple[int, int], Any] = {}
        self.sub_writer = sub_writer
        self.arrays = SlabArrays(
            rewards=np.zeros(self.n),
            terminations=np.zeros(self.n, dtype=np.bool_),
            truncations=np.zeros(self.n, dtype=np.bool_),
            write_obs=self._write,
            read_action=lambda i: self.actions[i],
        )
        self.actions: Any = None
        self.slab.bind(self.arrays)
        self.space = self.slab.envs[0].action_space

    def _write(self, obs: Any, i: int) -> None:
        self.last[i] = np.array(obs)

    def _write_sub(self, obs: Any, i: int, k: int) -> None:
        self.sub[i, k] = np.array(obs)

    def chunk(self, actions: Any, stop_on_done: bool, all_obs: bool) -> tuple[Any, ...]:
        batch = chunk_actions(self.space, actions, self.n)
        k = batch.chunk
        out = ChunkArrays(
            rewards=np.full((self.n, k), np.nan),
            terminations=np.ones((self.n, k), dtype=np.bool_),
            truncations=np.ones((self.n, k), dtype=np.bool_),
            steps=np.zeros(self.n, dtype=np.int64),
            write_sub_obs=self._write_sub if self.sub_writer else None,
        )
        self.last.clear()
        self.sub.clear()
        # As a unit runs it: a Discrete env's actions read a row at a time
        result = self.slab.step_chunk(
            out,
            chunk_reader(self.space, batch),
            k,
            stop_on_done=stop_on_done,
            all_obs=all_obs,
            env_actions=scalar_rows(self.space, list(batch.leaves)),
        )
        if all_obs:
            if not self.sub_writer:
                assert result.sub_obs is not None
                for i, executed in result.sub_obs:
                    for j in range(k):
                        self.sub[i, j] = executed[min(j, len(executed) - 1)]
            obs = np.stack([np.stack([self.sub[i, j] for j in range(k)]) for i in range(self.n)])
        else:
            obs = np.stack([self.last[i] for i in range(self.n)])
        # the installed gymnasium's own layout, as its SyncVectorEnv (the oracle) gives
        infos = merge_chunk_infos(DEFAULT_INFO_FORMAT, result.infos, self.n, k, out.steps)
        return obs, out.rewards, out.terminations, out.truncations, infos


def _ends_inside(expected: list[Any], chunk: int) -> int:
    """Episode ends at a sub-step before a chunk's last."""
    return sum(
        1
        for e in expected
        for k in range(min(e.steps, chunk - 1))
        if e.terminations[k] or e.truncations[k]
    )


@pytest.mark.parametrize("env", list(ENVS))
@pytest.mark.parametrize("chunk", [1, 3, 8])
@pytest.mark.parametrize("stop_on_done", [False, True], ids=["run_on", "stop"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_chunk_is_the_step_calls_it_stands_for(
    mode: AutoresetMode, stop_on_done: bool, chunk: int, env: str
) -> None:
    fns = [ENVS[env]] * 3
    h = ChunkHarness(fns, mode)
    oracle = Oracle(fns, mode)
    h.slab.reset([10, 11, 12], None)
    oracle.reset(10)
    inside = 0
    for t in range(48 // chunk + 2):
        actions = sample_chunks(h.space, 3, chunk, seed=t)
        all_obs = t % 2 == 1
        got = h.chunk(actions, stop_on_done, all_obs)
        expected = oracle.chunk(actions, chunk, stop_on_done)
        check_chunk(expected, chunk, *got, all_obs=all_obs, where=f"chunk {t}")
        inside += _ends_inside(expected, chunk)
        if mode is AutoresetMode.DISABLED:
            last = [e.steps - 1 for e in expected]
            ended = got[2][range(3), last] | got[3][range(3), last]
            h.slab.reset([None] * 3, None, mask=list(ended))
            oracle.reset_envs(ended)
    if chunk > 1 and env == "cartpole_discrete":
        assert inside >= 1, "no episode ended inside a chunk"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_all_obs_by_value_repeat_the_last_observation(mode: AutoresetMode) -> None:
    fns = [_zoo, _zoo]
    h = ChunkHarness(fns, mode, sub_writer=False)
    oracle = Oracle(fns, mode)
    h.slab.reset([0, 1], None)
    oracle.reset(0)
    for t in range(6):
        actions = sample_chunks(h.space, 2, 5, seed=t)
        got = h.chunk(actions, True, True)
        check_chunk(oracle.chunk(actions, 5, True), 5, *got, all_obs=True, where=f"chunk {t}")
        if mode is AutoresetMode.DISABLED:  # stopped at its end: the only flag of the row
            ended = got[2].any(axis=1) | got[3].any(axis=1)
            h.slab.reset([None] * 2, None, mask=list(ended))
            oracle.reset_envs(ended)


def test_steps_and_chunks_interleave_on_one_trajectory() -> None:
    mode = AutoresetMode.NEXT_STEP
    fns = [_cartpole] * 2
    h = ChunkHarness(fns, mode)
    oracle = Oracle(fns, mode)
    h.slab.reset([5, 6], None)
    oracle.reset(5)
    rng = np.random.default_rng(0)
    for t in range(30):
        if t % 3 == 0:
            actions = rng.integers(0, 2, size=2)
            h.actions = actions
            h.slab.step()
            want = oracle.step(actions)
            for i in range(2):
                np.testing.assert_array_equal(h.last[i], want[i][0][0])
                assert h.arrays.rewards[i] == want[i][1][0]
        else:
            actions = rng.integers(0, 2, size=(2, 4))
            got = h.chunk(actions, t % 2 == 0, False)
            check_chunk(oracle.chunk(actions, 4, t % 2 == 0), 4, *got, where=f"chunk {t}")


def test_next_step_reset_step_inside_a_chunk_reads_no_action() -> None:
    """An env that ended at sub-step 0 has its reset at sub-step 1: that action is never read."""
    h = ChunkHarness([lambda: ZooEnv(OBS, BOX_ACT, max_steps=1)], AutoresetMode.NEXT_STEP)
    h.slab.reset([0], None)
    read: list[tuple[int, int]] = []
    out = ChunkArrays(
        rewards=np.zeros((1, 3)),
        terminations=np.zeros((1, 3), dtype=np.bool_),
        truncations=np.zeros((1, 3), dtype=np.bool_),
        steps=np.zeros(1, dtype=np.int64),
    )

    def reader(i: int, k: int) -> Any:
        read.append((i, k))
        return np.zeros(2, dtype=np.float32)

    h.slab.step_chunk(out, reader, 3)
    assert read == [(0, 0), (0, 2)]
    assert out.truncations.tolist() == [[True, False, True]] and out.steps.tolist() == [3]
    assert h.slab.needs_reset == [True]


def test_an_env_error_mid_chunk_stops_that_env_and_the_others_run_their_chunk() -> None:
    """The env that raises stops at that sub-step (its count says how many it completed, its
    rows from there read 0 and False) and is reported with a note naming the sub-step; the
    envs after it still run their chunk, as the others step in ``step()``."""
    fns = [lambda: ZooEnv(OBS, BOX_ACT, max_steps=50, terminate_prob=0.0)] * 3
    fns[1] = lambda: CrashEnv(
        "raise", at_step=3, obs_space=OBS, act_space=BOX_ACT, max_steps=50, terminate_prob=0.0
    )
    slab = EnvSlab([fn() for fn in fns], 0, AutoresetMode.NEXT_STEP)
    written: dict[int, Any] = {}
    slab.bind(
        SlabArrays(
            np.zeros(3),
            np.zeros(3, dtype=np.bool_),
            np.zeros(3, dtype=np.bool_),
            write_obs=lambda obs, i: written.__setitem__(i, obs),
        )
    )
    slab.reset([0, 1, 2], None)
    written.clear()
    out = _chunk_out(3, 5)
    actions = np.zeros((3, 5, 2), dtype=np.float32)
    result = slab.step_chunk(out, lambda i, k: actions[i, k], 5)
    assert result.errors is not None and [i for i, _ in result.errors] == [1]
    error = result.errors[0][1]
    assert isinstance(error, KeyError)
    assert "raised at sub-step 2 of an action chunk of 5" in "".join(error.__notes__)
    assert out.steps.tolist() == [5, 2, 5] and result.executed == 12
    assert out.rewards[1, 2:].tolist() == [0.0] * 3 and not out.truncations[1, 2:].any()
    assert sorted(written) == [0, 2]  # the env that raised has no last observation
    assert [e.t for e in slab.envs] == [5, 3, 5]
    records = result.error_records(10, "step_chunk")
    assert records is not None and records[0][1].env_index == 11
    assert records[0][1].command == "step_chunk" and result.errors is None
    # the slab goes on: the next chunk runs every env (the crashed env misbehaves once)
    again = slab.step_chunk(_chunk_out(3, 2), lambda i, k: actions[i, k], 2)
    assert again.errors is None and again.executed == 6


def test_same_step_final_obs_is_a_snapshot() -> None:
    """An env that returns one buffer it mutates: the final observation is the one at the
    episode's end, not the reset's."""

    class OneBuffer(ZooEnv):
        def __init__(self) -> None:
            super().__init__(OBS, BOX_ACT, max_steps=2, terminate_prob=0.0)
            self.buffer = np.zeros((2, 3), dtype=np.float32)

        def _obs(self) -> Any:
            self.buffer[:] = self.t
            return self.buffer

    h = ChunkHarness([OneBuffer], AutoresetMode.SAME_STEP)
    h.slab.reset([0], None)
    out = ChunkArrays(
        rewards=np.zeros((1, 4)),
        terminations=np.zeros((1, 4), dtype=np.bool_),
        truncations=np.zeros((1, 4), dtype=np.bool_),
        steps=np.zeros(1, dtype=np.int64),
    )
    batch = chunk_actions(h.space, np.zeros((1, 4, 2), dtype=np.float32), 1)
    result = h.slab.step_chunk(out, chunk_reader(h.space, batch), 4)
    finals = [(k, info["final_obs"]) for _, k, info in result.infos if "final_obs" in info]
    # episodes of 2 steps end at sub-steps 1 and 3, each seen at t = 2, not at the reset's 0
    assert [k for k, _ in finals] == [1, 3] and out.truncations.tolist() == [[0, 1, 0, 1]]
    assert all(obs[0, 0] == 2.0 and obs is not h.slab.envs[0].buffer for _, obs in finals)


class ScriptedEnv(gym.Env[np.ndarray, Any]):
    """Returns the scripted ``(reward, terminated, truncated)`` of each step and keeps the
    actions it was handed."""

    observation_space = spaces.Box(0, 1, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, script: list[tuple[Any, Any, Any]]) -> None:
        self.script = script
        self.t = 0
        self.actions: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action: Any) -> Any:
        self.actions.append(action)
        reward, terminated, truncated = self.script[self.t % len(self.script)]
        self.t += 1
        return np.zeros(2, dtype=np.float32), reward, terminated, truncated, {}


def _chunk_out(n: int, k: int) -> ChunkArrays:
    return ChunkArrays(
        rewards=np.full((n, k), 7.0),
        terminations=np.ones((n, k), dtype=np.bool_),
        truncations=np.ones((n, k), dtype=np.bool_),
        steps=np.zeros(n, dtype=np.int64),
    )


def test_rewards_and_flags_are_stored_as_a_step_stores_them() -> None:
    """Values numpy converts (None, a string, numpy scalars, ints, a truthy string) land
    as ``EnvSlab.step`` puts them in its arrays; one numpy cannot store names the reward."""
    script = [
        (None, False, np.False_),
        ("0.5", 0, "x"),
        (np.float32(0.25), np.True_, False),
        (3, False, 1),
    ]
    stepped = EnvSlab([ScriptedEnv(script)], 0, AutoresetMode.SAME_STEP)
    rows = SlabArrays(np.zeros(1), np.zeros(1, dtype=np.bool_), np.zeros(1, dtype=np.bool_))
    stepped.bind(rows)
    want = []
    for _ in script:
        stepped.step(actions=[np.int64(0)])
        want.append((rows.rewards[0], rows.terminations[0], rows.truncations[0]))
    chunked = EnvSlab([ScriptedEnv(script)], 0, AutoresetMode.SAME_STEP)
    chunked.bind(SlabArrays(np.zeros(1), np.zeros(1, dtype=np.bool_), np.zeros(1, np.bool_)))
    out = _chunk_out(1, 4)
    actions = np.zeros((1, 4), dtype=np.int64)
    chunked.step_chunk(out, lambda i, k: actions[i, k], 4)
    got = list(zip(out.rewards[0], out.terminations[0], out.truncations[0]))
    assert repr(got) == repr(want)  # (nan == nan is False)
    assert np.isnan(out.rewards[0, 0]) and out.rewards[0, 1] == 0.5

    bad = EnvSlab([ScriptedEnv([(np.ones(2), False, False)])], 0, AutoresetMode.NEXT_STEP)
    bad.bind(SlabArrays(np.zeros(1), np.zeros(1, dtype=np.bool_), np.zeros(1, np.bool_)))
    failed = bad.step_chunk(_chunk_out(1, 2), lambda i, k: actions[i, k], 2).errors
    assert failed is not None and isinstance(failed[0][1], ValueError)
    assert "step returned reward as an array of shape (2,)" in str(failed[0][1])
    assert "raised at sub-step 0" in "".join(failed[0][1].__notes__)


def test_chunk_arrays_that_are_not_contiguous_are_refused() -> None:
    """The sub-step loop stores through flat views of the rows: strided rows (which a flat
    view would copy, losing the stores) are refused before any env steps."""
    slab = EnvSlab([ScriptedEnv([(np.ones(2), False, False)])], 0, AutoresetMode.NEXT_STEP)
    slab.bind(SlabArrays(np.zeros(1), np.zeros(1, dtype=np.bool_), np.zeros(1, np.bool_)))
    out = _chunk_out(1, 4)
    strided = ChunkArrays(
        out.rewards[:, ::2], out.terminations[:, ::2], out.truncations[:, ::2], out.steps
    )
    with pytest.raises(ValueError, match="C-contiguous"):
        slab.step_chunk(strided, lambda i, k: 0, 2)
    assert out.steps[0] == 0


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_discrete_actions_reach_the_env_as_step_hands_them(dtype: Any) -> None:
    """The row a unit reads a Discrete env's chunk from hands over what ``step()`` would:
    a numpy scalar of the batch's dtype, the same value."""
    script = [(1.0, False, False)]
    actions = np.arange(2 * 5, dtype=dtype).reshape(2, 5) % 3
    chunked = EnvSlab([ScriptedEnv(script) for _ in range(2)], 0, AutoresetMode.NEXT_STEP)
    chunked.bind(SlabArrays(np.zeros(2), np.zeros(2, dtype=np.bool_), np.zeros(2, np.bool_)))
    space = chunked.envs[0].action_space
    rows = scalar_rows(space, [actions])
    assert rows is not None
    chunked.step_chunk(
        _chunk_out(2, 5), chunk_reader(space, ChunkBatch(5, (actions,))), 5, env_actions=rows
    )
    stepped = EnvSlab([ScriptedEnv(script) for _ in range(2)], 0, AutoresetMode.NEXT_STEP)
    batch = np.zeros(2, dtype=dtype)
    stepped.bind(
        SlabArrays(
            np.zeros(2),
            np.zeros(2, dtype=np.bool_),
            np.zeros(2, np.bool_),
            read_action=row_reader(space, batch),
        )
    )
    for k in range(5):
        batch[:] = actions[:, k]
        stepped.step()
    for a, b in zip(chunked.envs, stepped.envs):
        assert [(type(x), x) for x in a.actions] == [(type(x), x) for x in b.actions]
        assert type(a.actions[0]) is np.dtype(dtype).type


def test_scalar_rows_only_for_one_scalar_leaf() -> None:
    assert scalar_rows(BOX_ACT, [np.zeros((2, 4, 2), np.float32)]) is None
    assert scalar_rows(DICT_ACT, [np.zeros((2, 4, 3)), np.zeros((2, 4), np.int64)]) is None
    assert scalar_rows(spaces.Dict({"a": spaces.Discrete(2)}), [np.zeros((2, 4))]) is None
    assert scalar_rows(None, [np.zeros((2, 4), np.int64)]) is None


# --- the chunk batch's checks -------------------------------------------------------------

DICT_ACT = spaces.Dict({"arm": spaces.Box(-1, 1, (3,), np.float32), "grip": spaces.Discrete(2)})


def test_chunk_actions_keep_dtype_and_read_as_step_hands_them() -> None:
    batch = chunk_actions(spaces.Discrete(3), np.array([[0, 1], [2, 1]], dtype=np.int32), 2)
    assert batch.chunk == 2 and batch.leaves[0].dtype == np.int32
    read = chunk_reader(spaces.Discrete(3), batch)
    assert read(1, 0) == 2 and type(read(1, 0)) is np.int32
    actions = {"arm": np.arange(24, dtype=np.float64).reshape(2, 4, 3), "grip": [[0, 1, 0, 1]] * 2}
    batch = chunk_actions(DICT_ACT, actions, 2)
    read = chunk_reader(DICT_ACT, batch)
    got = read(1, 2)
    assert set(got) == {"arm", "grip"} and got["arm"].dtype == np.float64
    np.testing.assert_array_equal(got["arm"], actions["arm"][1, 2])
    got["arm"][:] = -1  # a private copy
    assert actions["arm"][1, 2, 0] == 18.0
    rows = batch.rows(1, 2)
    assert isinstance(rows, ChunkBatch) and rows.leaves[0].shape == (1, 4, 3)


@pytest.mark.parametrize(
    ("space", "actions", "error", "message"),
    [
        (BOX_ACT, np.zeros((3, 4, 2), np.float32), ValueError, r"shape \(2, K, 2\).*\(3, 4, 2\)"),
        (BOX_ACT, np.zeros((2, 2), np.float32), ValueError, r"one action per env.*\[:, None\]"),
        (BOX_ACT, np.zeros((2, 0, 2), np.float32), ValueError, "K >= 1, got K = 0"),
        (BOX_ACT, np.zeros((2, 4, 3), np.float32), ValueError, r"\(2, K, 2\).*\(2, 4, 3\)"),
        (BOX_ACT, np.zeros((2, 4, 2), np.complex64), TypeError, "complex64 cannot be cast"),
        (spaces.Discrete(3), np.zeros((2, 4)), TypeError, "float64 cannot be cast.*int64"),
        (spaces.Discrete(3), np.zeros(2, np.int64), ValueError, r"\(2, K\).*got shape \(2,\)"),
        (
            DICT_ACT,
            {"arm": np.zeros((2, 4, 3), np.float32), "grip": np.zeros((2, 3), np.int64)},
            ValueError,
            r"\['grip'\]: expected K = 4 .*\(2, 4\)",
        ),
        (DICT_ACT, {"arm": np.zeros((2, 4, 3), np.float32)}, ValueError, "missing key 'grip'"),
        (spaces.Text(4), ["ab", "cd"], TypeError, "fixed-size action space"),
    ],
    ids=[
        "env_count",
        "no_chunk_axis",
        "empty_chunk",
        "leaf_shape",
        "complex",
        "float_for_discrete",
        "discrete_no_chunk_axis",
        "leaves_disagree",
        "missing_key",
        "text",
    ],
)
def test_chunk_actions_refuse_bad_batches(
    space: spaces.Space[Any], actions: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        chunk_actions(space, actions, 2)


def test_chunk_actions_take_a_cpu_tensor_in_the_space_dtype() -> None:
    torch = pytest.importorskip("torch")
    batch = chunk_actions(BOX_ACT, torch.zeros((2, 3, 2), dtype=torch.float64), 2)
    assert batch.leaves[0].dtype == np.float32 and batch.chunk == 3
