"""EnvSlab in-process: k envs stepped in order into given arrays, no processes or pipes.

The oracle is SyncVectorEnv: the slab's rows and its info events, merged in order with
gymnasium's own ``_add_info``, must give what SyncVectorEnv gives for the same envs.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from subvec._compat import GYM_029, AutoresetMode
from subvec._front.merge import _legacy_events
from subvec._slab import EnvSlab
from subvec._slab_records import FinalObsInBlock, SlabArrays, final_obs_store
from tests.envs import LooseDtypeEnv, OptionsEnv, ZooEnv
from tests.helpers import assert_same
from tests.oracle import sync_vector_env

BOX = spaces.Box(0, 9, shape=(2, 3), dtype=np.float32)
MODES = list(AutoresetMode)


class Harness:
    """A slab over fresh envs with its arrays, the observations it wrote and its actions."""

    def __init__(
        self,
        fns: list[Any],
        mode: AutoresetMode,
        first_index: int = 0,
        *,
        by_value: bool = False,
        final_rows: np.ndarray | None = None,
    ) -> None:
        k = len(fns)
        self.slab = EnvSlab([fn() for fn in fns], first_index, mode)
        self.written: dict[int, Any] = {}
        self.actions: Any = None
        self.arrays = SlabArrays(
            rewards=np.zeros(k),
            terminations=np.zeros(k, dtype=np.bool_),
            truncations=np.zeros(k, dtype=np.bool_),
            write_obs=None if by_value else self._write,
            read_action=None if by_value else (lambda i: self.actions[i]),
            store_final_obs=None if final_rows is None else final_obs_store(final_rows),
        )
        self.slab.bind(self.arrays)

    def _write(self, obs: Any, i: int) -> None:
        self.written[i] = obs

    def step(self, actions: Any) -> Any:
        self.written.clear()
        self.actions = actions
        return self.slab.step()

    def obs(self, dtype: Any = None) -> np.ndarray:
        """The rows written, stacked (cast to ``dtype`` as SyncVectorEnv casts into its batch)."""
        rows = np.stack([self.written[i] for i in range(len(self.slab.envs))])
        return rows if dtype is None else rows.astype(dtype)

    def flags(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.arrays.rewards, self.arrays.terminations, self.arrays.truncations


def _merge(oracle: SyncVectorEnv, events: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    infos: dict[str, Any] = {}
    if GYM_029:  # 0.29's same-step record: the ended episode's under final_observation
        events = _legacy_events(events, 0)
    for i, info in events:
        infos = oracle._add_info(infos, info, i)
    return infos


def _zoo(**kw: Any) -> Any:
    return lambda: ZooEnv(BOX, **kw)


# --- reset --------------------------------------------------------------------------------


def test_reset_gives_each_env_its_seed_and_matches_sync() -> None:
    fns = [_zoo(), _zoo(), _zoo()]
    h = Harness(fns, AutoresetMode.NEXT_STEP)
    oracle = SyncVectorEnv(fns)
    h.arrays.terminations[:] = True  # left over from an earlier episode
    h.slab.needs_reset[:] = [True] * 3
    result = h.slab.reset([11, 12, 13], None)
    want_obs, want_infos = oracle.reset(seed=[11, 12, 13])
    assert_same(h.obs(), want_obs)
    assert [i for i, _ in result.infos] == [0, 1, 2]
    assert_same(_merge(oracle, result.infos), want_infos)
    assert not h.arrays.terminations.any() and not h.arrays.truncations.any()
    assert h.slab.needs_reset == [False] * 3
    assert result.obs is None  # observations went to write_obs
    # another seed, another observation: the seeds reached the envs
    h.slab.reset([99, 12, 13], None)
    assert h.written[0].tobytes() != want_obs[0].tobytes()
    assert h.written[1].tobytes() == want_obs[1].tobytes()


def test_reset_with_a_mask_touches_only_the_masked_envs() -> None:
    h = Harness([_zoo(), _zoo(), _zoo()], AutoresetMode.DISABLED)
    h.slab.reset([1, 2, 3], None)
    h.written.clear()
    h.arrays.terminations[:] = True
    h.arrays.truncations[1] = True
    h.slab.needs_reset[:] = [True] * 3
    result = h.slab.reset([5, 6, 7], {"level": 2}, mask=[True, False, True])
    assert sorted(h.written) == [0, 2]
    assert list(h.arrays.terminations) == [False, True, False]
    assert list(h.arrays.truncations) == [False, True, False]
    assert h.slab.needs_reset == [False, True, False]
    assert [i for i, _ in result.infos] == [0, 2]
    assert all(info["options_seen"] == ["level"] for _, info in result.infos)
    fresh = ZooEnv(BOX)
    assert_same(h.written[2], fresh.reset(seed=7)[0])


def test_reset_without_infos_sends_no_event() -> None:
    class Silent(ZooEnv):
        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            return super().reset(seed=seed, options=options)[0], {}

    h = Harness([lambda: Silent(BOX)] * 2, AutoresetMode.NEXT_STEP)
    assert h.slab.reset([0, 1], None).is_empty()


# --- step ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_step_matches_sync_per_env(mode: AutoresetMode) -> None:
    fns = [_zoo(), _zoo(quiet=True), _zoo(terminate_prob=0.4), _zoo()]
    h = Harness(fns, mode)
    oracle = sync_vector_env(fns, autoreset_mode=mode)
    h.slab.reset([3, 4, 5, 6], None)
    oracle.reset(seed=[3, 4, 5, 6])
    oracle.action_space.seed(0)
    ended = 0
    for t in range(40):
        actions = oracle.action_space.sample()
        result = h.step(actions)
        obs, rewards, terms, truncs, infos = oracle.step(actions)
        assert_same(h.obs(), obs, f"obs {t}")
        assert_same(h.flags(), (rewards, terms, truncs), f"flags {t}")
        assert_same(_merge(oracle, result.infos), infos, f"infos {t}")
        done = terms | truncs
        ended += int(done.sum())
        if mode is AutoresetMode.DISABLED and done.any():
            h.written.clear()
            reset = h.slab.reset([None] * 4, None, mask=list(done))
            _, want = oracle.reset(options={"reset_mask": done})
            assert sorted(h.written) == np.flatnonzero(done).tolist()
            assert_same(_merge(oracle, reset.infos), want, f"reset {t}")
        if mode is AutoresetMode.NEXT_STEP:
            assert h.slab.needs_reset == list(done)
    assert ended >= 5


def test_next_step_resets_an_ended_env_instead_of_stepping_it() -> None:
    h = Harness([_zoo(max_steps=1)], AutoresetMode.NEXT_STEP)
    h.slab.reset([0], None)
    h.step(np.array([1]))
    env = h.slab.envs[0]
    assert h.arrays.truncations[0] and env.last_action == 1 and h.slab.needs_reset == [True]
    result = h.step(np.array([2]))
    assert env.last_action == 1, "the ended env was stepped"
    assert env.t == 0 and h.arrays.rewards[0] == 0.0 and not h.arrays.truncations[0]
    assert [list(info) for _, info in result.infos] == [["reset_count"]]


def test_observations_and_actions_by_value() -> None:
    text = spaces.Text(max_length=4)
    fns = [lambda: ZooEnv(text), lambda: ZooEnv(text)]
    h = Harness(fns, AutoresetMode.SAME_STEP, by_value=True)
    oracle = sync_vector_env(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    reset = h.slab.reset([1, 2], None)
    want, _ = oracle.reset(seed=[1, 2])
    assert reset.obs == [(0, want[0]), (1, want[1])]
    for _ in range(10):
        result = h.slab.step(actions=[2, 0])
        obs, *_ = oracle.step(np.array([2, 0]))
        assert result.obs == [(0, obs[0]), (1, obs[1])]
    assert [env.last_action for env in h.slab.envs] == [2, 0]


def test_same_step_final_observations_in_rows() -> None:
    # env 0: no infos, its final observation fits the rows: no event at all;
    # env 1: step infos: a stand-in event with its final info;
    # env 2: float64 observations for a float32 space: the event carries its own array.
    fns = [_zoo(quiet=True, terminate_prob=0.3), _zoo(terminate_prob=0.3)]
    fns.append(lambda: LooseDtypeEnv(BOX, terminate_prob=0.3))
    rows = np.full((3, *BOX.shape), -1.0, dtype=np.float32)
    h = Harness(fns, AutoresetMode.SAME_STEP, final_rows=rows)
    oracle = sync_vector_env(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    h.slab.reset([7, 8, 9], None)
    oracle.reset(seed=[7, 8, 9])
    oracle.action_space.seed(1)
    seen = set()
    for t in range(60):
        rows[:] = -1.0
        actions = oracle.action_space.sample()
        result = h.step(actions)
        obs, _, terms, truncs, infos = oracle.step(actions)
        assert_same(h.obs(BOX.dtype), obs, f"obs {t}")
        ended = np.flatnonzero(terms | truncs).tolist()
        finals = {i: info for i, info in result.infos if "final_obs" in info}
        assert set(finals) == {i for i in ended if i != 0}, t  # env 0: implied by its flags
        for i in ended:
            seen.add(i)
            if i == 2:
                assert type(finals[i]["final_obs"]) is np.ndarray
                assert (rows[i] == -1.0).all(), "a by-value observation was also stored"
            elif i == 1:
                assert finals[i]["final_obs"] is FinalObsInBlock and finals[i]["final_info"]
        # what the reader rebuilds from them is SyncVectorEnv's infos
        assert_same(_merge(oracle, _read_back(result.infos, ended, rows)), infos, f"infos {t}")
    assert seen == {0, 1, 2}


def _read_back(
    events: list[tuple[int, dict[str, Any]]], ended: list[int], rows: np.ndarray
) -> list[tuple[int, dict[str, Any]]]:
    """The reader's side of FinalObsInBlock: a stand-in's observation comes from its row, and
    an ended env without a final event gets ``{"final_obs": its row, "final_info": {}}`` after
    the events of the envs before it and before its own."""
    implied = sorted(set(ended) - {i for i, info in events if "final_obs" in info})
    out: list[tuple[int, dict[str, Any]]] = []
    for i, info in events:
        while implied and implied[0] <= i:
            j = implied.pop(0)
            out.append((j, {"final_obs": rows[j].copy(), "final_info": {}}))
        if info.get("final_obs") is FinalObsInBlock:
            info = {**info, "final_obs": rows[i].copy()}
        out.append((i, info))
    out += [(j, {"final_obs": rows[j].copy(), "final_info": {}}) for j in implied]
    return out


def test_final_obs_store_takes_only_an_exact_array() -> None:
    rows = np.zeros((2, 3), dtype=np.float32)
    store = final_obs_store(rows)
    assert store(np.arange(3, dtype=np.float32), 1)
    assert rows[1].tolist() == [0.0, 1.0, 2.0] and rows[0].tolist() == [0.0] * 3

    class Sub(np.ndarray):
        pass

    for refused in (
        np.ones(3, dtype=np.float64),
        np.ones(4, dtype=np.float32),
        np.ones((1, 3), dtype=np.float32),
        np.ones(3, dtype=np.float32).view(Sub),
        [1.0, 1.0, 1.0],
    ):
        assert not store(refused, 0), refused
    assert rows[0].tolist() == [0.0] * 3


# --- call, set_attr, close and which env raised -------------------------------------------


def test_call_and_set_attr_reach_each_env_through_its_wrappers() -> None:
    fns = [lambda: gym.wrappers.TimeLimit(ZooEnv(BOX), 50) for _ in range(3)]
    h = Harness(fns, AutoresetMode.NEXT_STEP, first_index=4)
    h.slab.reset([0, 1, 2], None)
    h.step(np.array([0, 1, 2]))
    if GYM_029:  # 0.29's wrappers forward an env's attribute with a warning, as there
        with pytest.warns(UserWarning, match="to get variables from other wrappers"):
            assert h.slab.call("get_t", (), {"plus": 10}) == [11, 11, 11]
        return
    assert h.slab.call("get_t", (), {"plus": 10}) == [11, 11, 11]
    assert h.slab.call("marker", (), {}) == ["default"] * 3
    h.slab.set_attr("marker", ["a", "b", "c"])
    assert [env.unwrapped.marker for env in h.slab.envs] == ["a", "b", "c"]
    assert h.slab.call("marker", (), {}) == ["a", "b", "c"]
    assert h.slab.call("_max_episode_steps", (), {}) == [50] * 3  # the wrapper's own


class Faulty(ZooEnv):
    """Env ``name``; raises in ``where`` (reset, step, call, set_attr or close) when ``bad``."""

    def __init__(self, name: int, bad: bool, where: str) -> None:
        super().__init__(BOX, terminate_prob=0.0, max_steps=10**6)
        self.name, self.bad, self.where, self.closed_ = name, bad, where, False
        self._armed = False

    def _maybe(self, where: str) -> None:
        if self.bad and self.where == where:
            raise KeyError(f"{where} failed in env {self.name}")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self._armed:
            self._maybe("reset")
        self._armed = True
        return super().reset(seed=seed, options=options)

    def step(self, action: Any):
        self._maybe("step")
        return super().step(action)

    def poke(self) -> int:
        self._maybe("call")
        return 1

    @property
    def knob(self) -> int:
        return 0

    @knob.setter
    def knob(self, value: int) -> None:
        self._maybe("set_attr")

    def close(self) -> None:
        self.closed_ = True
        self._maybe("close")


@pytest.mark.parametrize("where", ["reset", "call", "set_attr"])
def test_current_env_names_the_env_that_raised(where: str) -> None:
    fns = [lambda i=i: Faulty(i, i == 2, where) for i in range(4)]
    h = Harness(fns, AutoresetMode.NEXT_STEP, first_index=10)
    h.slab.reset([0, 1, 2, 3], None)
    assert h.slab.current_env == 13
    run = {
        "reset": lambda: h.slab.reset([None] * 4, None),
        "call": lambda: h.slab.call("poke", (), {}),
        "set_attr": lambda: h.slab.set_attr("knob", [1, 2, 3, 4]),
    }[where]
    with pytest.raises(KeyError, match=f"{where} failed in env 2"):
        run()
    assert h.slab.current_env == 12
    assert h.slab.call("poke" if where != "call" else "t", (), {}) is not None
    assert h.slab.current_env == 13  # moves on with the next command


@pytest.mark.parametrize("envs", [None, [1, 2, 3]], ids=["every-env", "some-envs"])
def test_a_step_reports_each_env_that_raised_and_steps_the_others(envs: Any) -> None:
    fns = [lambda i=i: Faulty(i, i in (1, 2), "step") for i in range(4)]
    h = Harness(fns, AutoresetMode.NEXT_STEP, first_index=10)
    h.slab.reset([0, 1, 2, 3], None)
    h.actions = np.zeros(4, dtype=np.int64)
    h.written.clear()
    result = h.slab.step(envs)
    assert result.errors is not None
    assert [(i, type(e), str(e)) for i, e in result.errors] == [
        (1, KeyError, "'step failed in env 1'"),
        (2, KeyError, "'step failed in env 2'"),
    ]
    stepped = [0, 3] if envs is None else [3]
    assert [env.t for env in h.slab.envs] == [int(i in stepped) for i in range(4)]
    assert sorted(h.written) == stepped  # only their observations were written


def test_an_env_whose_same_step_reset_raised_is_reported_with_its_index() -> None:
    class ResetFails(ZooEnv):
        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            if seed is None:
                raise ValueError("autoreset failed")
            return super().reset(seed=seed, options=options)

    fns = [_zoo(terminate_prob=0.0, max_steps=10**6), lambda: ResetFails(BOX, max_steps=1)]
    h = Harness(fns, AutoresetMode.SAME_STEP, first_index=5)
    h.slab.reset([0, 1], None)
    result = h.step(np.zeros(2, dtype=np.int64))
    assert result.errors is not None
    ((local, error),) = result.errors
    assert local == 1 and isinstance(error, ValueError) and "autoreset failed" in str(error)


def test_close_closes_every_env_and_reraises_the_first_error() -> None:
    fns = [lambda i=i: Faulty(i, i in (1, 2), "close") for i in range(4)]
    h = Harness(fns, AutoresetMode.SAME_STEP)
    with pytest.raises(KeyError, match="close failed in env 1"):
        h.slab.close()
    assert [env.closed_ for env in h.slab.envs] == [True] * 4


def test_close_without_errors_closes_every_env() -> None:
    h = Harness([lambda: Faulty(0, False, "close")] * 3, AutoresetMode.NEXT_STEP)
    h.slab.close()
    assert [env.closed_ for env in h.slab.envs] == [True] * 3


def test_close_names_the_env_whose_close_raised() -> None:
    fns = [lambda i=i: Faulty(i, i == 1, "close") for i in range(3)]
    h = Harness(fns, AutoresetMode.NEXT_STEP, first_index=20)
    with pytest.raises(KeyError):
        h.slab.close()
    assert h.slab.current_env == 21


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_stored_reset_options_reach_every_reset_that_names_none(mode: AutoresetMode) -> None:
    h = Harness([lambda: OptionsEnv(length=1)] * 3, mode)
    slab = h.slab
    slab.reset([None] * 3, [{"level": 1}, None, {}])
    assert [int(o[0]) for o in h.obs()] == [1, -1, -1]
    slab.set_reset_options([2, 0], [{"level": 5}, {"level": 4}])
    slab.reset([None] * 3, None)  # none named: the stored ones
    assert [int(o[0]) for o in h.obs()] == [4, -1, 5]
    slab.reset([None] * 3, {"level": 7}, mask=[True, False, True])  # named: those win
    assert [e.last_options for e in slab.envs] == [{"level": 7}, None, {"level": 7}]
    if mode is AutoresetMode.DISABLED:
        return  # no autoreset: the caller's masked resets (above) are the resets
    h.step(np.zeros(3, dtype=np.int64))  # every episode ends (length 1)
    if mode is AutoresetMode.NEXT_STEP:
        h.step(np.zeros(3, dtype=np.int64))  # reset instead of stepped
    assert [int(o[0]) for o in h.obs()] == [4, -1, 5]
    # A replacement's stored options arrive with its first reset and stay.
    fresh = Harness([lambda: OptionsEnv(length=1)] * 2, mode)
    fresh.slab.reset([None, None], None, stored=[None, {"level": 3}])
    assert [int(o[0]) for o in fresh.obs()] == [-1, 3]
    assert fresh.slab.reset_options == [None, {"level": 3}]
