"""Checks of what robot-learning rollouts ask of a vector env, written once and bound to each
backend by tests/test_vla.py (process, in-process) and tests/test_ray.py (Ray).

Each ``check_*`` takes ``make(env_fns, **kwargs) -> VectorEnv``, which must put four envs on two
units of two envs each (in-process: one unit). The timeout checks need units that can hang
apart from the parent (process and Ray only).
"""

from __future__ import annotations

import functools
import os
import time
import types
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from subvec import PerEnv, WorkerTimeoutError
from subvec._compat import NAMES_AUTORESET_MODE, AutoresetMode
from tests.envs import ZooEnv
from tests.oracle import require_offered

Make = Callable[..., Any]

ACTIONS = np.zeros(4, dtype=np.int64)


class ArmedEnv(ZooEnv):
    """An endless env with the hooks the checks drive: an initial state set per env (as
    LIBERO's ``set_init_state``), and a reset or step armed to sleep (a render that hangs)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(max_steps=10**6, terminate_prob=0.0, quiet=True, **kw)
        self.init_state: Any = None
        self.settle: int = 0
        #: ``{"reset": seconds, "step": seconds}``: the next such call sleeps that long
        self.armed: dict[str, float] = {}

    def set_init_state(self, state: Any, settle: int = 0) -> tuple[Any, int]:
        self.init_state, self.settle = state, settle
        return state, settle

    def arm(self, where: str, seconds: float) -> None:
        self.armed[where] = seconds

    def _sleep_if_armed(self, where: str) -> None:
        seconds = self.armed.pop(where, 0.0)
        if seconds:
            time.sleep(seconds)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._sleep_if_armed("reset")
        return super().reset(seed=seed, options=options)

    def step(self, action: Any):
        self._sleep_if_armed("step")
        return super().step(action)


class NoMetadataEnv(ArmedEnv):
    """robosuite's ``GymWrapper`` (and LIBERO's envs through it): ``metadata = None``."""

    metadata = None  # type: ignore[assignment]


class ReadOnlyMetadataEnv(ArmedEnv):
    """Metadata as a read-only mapping (not a dict)."""

    metadata = types.MappingProxyType({"render_fps": 12})  # type: ignore[assignment]


class ListMetadataEnv(ArmedEnv):
    """Metadata that is no mapping at all."""

    metadata = ["not", "a", "mapping"]  # type: ignore[assignment]


armed = functools.partial(ArmedEnv)


# --- metadata ---------------------------------------------------------------------------------


def check_metadata_none_and_non_dict(make: Make) -> None:
    """An env whose metadata is None (robosuite) or no mapping builds, reads as ``{}`` plus the
    autoreset mode, and steps; a read-only mapping is copied into a dict."""
    for cls, expected in (
        (NoMetadataEnv, {}),
        (ListMetadataEnv, {}),
        (ReadOnlyMetadataEnv, {"render_fps": 12}),
    ):
        with make([cls] * 4) as envs:
            assert type(envs.metadata) is dict
            # gymnasium 1.0's vector envs name no autoreset mode in their metadata (_compat)
            mode = envs.metadata.pop("autoreset_mode", None)
            assert isinstance(mode, AutoresetMode) if NAMES_AUTORESET_MODE else mode is None
            assert envs.metadata == expected, (cls.__name__, envs.metadata)
            if mode is not None:
                envs.metadata["autoreset_mode"] = mode
            # gymnasium's vector wrappers read the metadata: they work over it
            # (gymnasium 0.29's wrappers serve vector envs and single envs alike)
            wrappers = getattr(gym.wrappers, "vector", gym.wrappers)
            wrapped = wrappers.RecordEpisodeStatistics(envs)
            wrapped.reset(seed=0)
            wrapped.step(ACTIONS)
            assert envs.get_attr("t") == (1, 1, 1, 1)


# --- per-env call arguments -------------------------------------------------------------------


def check_per_env_call_arguments(make: Make) -> None:
    """A PerEnv argument gives the j-th env called its j-th value, positional or keyword, with
    or without env_ids (in any order), next to arguments every env shares; a length that is
    not the number of envs called is refused before anything is sent."""
    with make([armed] * 4) as envs:
        envs.reset(seed=0)
        states = [np.full(2, i, dtype=np.float32) for i in range(4)]
        got = envs.call("set_init_state", PerEnv(states), settle=3)
        for i, (state, settle) in enumerate(got):
            np.testing.assert_array_equal(state, states[i])
            assert settle == 3
        np.testing.assert_array_equal(np.stack(envs.get_attr("init_state")), np.stack(states))
        # env_ids out of order, across both units, a keyword PerEnv
        ids = [3, 0, 2]
        got = envs.call(
            "set_init_state", PerEnv(["a", "b", "c"]), env_ids=ids, settle=PerEnv([7, 8, 9])
        )
        assert got == (("a", 7), ("b", 8), ("c", 9))
        kept = envs.get_attr("init_state")
        assert (kept[0], kept[2], kept[3]) == ("b", "c", "a")
        np.testing.assert_array_equal(kept[1], states[1])  # env 1 was not called
        assert envs.get_attr("settle") == (8, 3, 9, 7)
        # GRPO groups: two init states, each repeated over a group of two envs
        group = [s for s in ("s0", "s1") for _ in range(2)]
        envs.call("set_init_state", PerEnv(group))
        assert envs.get_attr("init_state") == ("s0", "s0", "s1", "s1")
        with pytest.raises(
            ValueError, match=r"PerEnv argument 0 has 3 values, expected one per env called \(4\)"
        ):
            envs.call("set_init_state", PerEnv([1, 2, 3]))
        with pytest.raises(ValueError, match=r"keyword 'settle' has 1 values, expected .* \(2\)"):
            envs.call("set_init_state", 0, env_ids=[1, 2], settle=PerEnv([1]))
        # nothing was sent, and the vector env is still usable
        assert envs.get_attr("init_state") == ("s0", "s0", "s1", "s1")
        envs.step(ACTIONS)
        assert envs.get_attr("t") == (1, 1, 1, 1)
    with pytest.raises(TypeError, match="sequence of one value per env"):
        PerEnv(5)  # type: ignore[arg-type]


# --- per-command timeouts ---------------------------------------------------------------------


def check_timeouts_per_command(make: Make) -> None:
    """``timeout={"reset": ..., "step": ..., "call": ...}``: a reset slower than the step's
    bound but within the reset's succeeds, as does a chunk whose K sub-steps take longer than
    one step's bound but less than K of them; a call is bounded by its own."""
    bounds = {"reset": 30.0, "step": 0.8, "call": 30.0}
    with make([armed] * 4, timeout=bounds) as envs:
        assert envs.timeouts.reset == 30.0 and envs.timeouts.step == 0.8
        envs.reset(seed=0)
        envs.call("arm", "reset", 2.0, env_ids=[1])
        envs.reset(seed=1)  # 2 s > the step's 0.8 s: bounded by the reset's 30 s
        envs.step(ACTIONS)
        # each sub-step of env 2 sleeps 0.4 s: 5 of them (2 s) within 5 x 0.8 s
        envs.call("arm", "step", 0.4, env_ids=[2])
        envs.set_attr("step_seconds", [0.4], env_ids=[2])
        out = envs.step_chunk(np.zeros((4, 5), dtype=np.int64))
        assert list(out[4]["chunk_steps"]) == [5, 5, 5, 5]
        envs.set_attr("step_seconds", [0.0], env_ids=[2])
        assert envs.get_attr("t") == (6, 6, 6, 6)


def check_hung_reset_step_and_chunk(make: Make, policy: str) -> None:
    """A reset, a step and a chunk that hang past their own bounds raise WorkerTimeoutError
    naming the unit's envs (``"raise"``), or have that unit replaced and its envs reported
    truncated with ``worker_restarted`` (``"restart"``); the other unit carries on."""
    bounds = {"reset": 3.0, "step": 1.0}
    restart = policy == "restart"
    kwargs: dict[str, Any] = {"timeout": bounds, "on_worker_failure": policy}
    with make([armed] * 4, **kwargs) as envs:
        envs.reset(seed=0)
        # a hung reset
        envs.call("arm", "reset", 60.0, env_ids=[3])
        start = time.monotonic()
        if restart:
            _, infos = envs.reset(seed=1)
            assert list(infos["_worker_restarted"]) == [False, False, True, True]
        else:
            with pytest.raises(WorkerTimeoutError) as info:
                envs.reset(seed=1)
            assert info.value.env_indices == (2, 3)
            assert "3" in str(info.value) or "within" in str(info.value)
        assert time.monotonic() - start < 3.0 + 15.0  # bounded by the reset's 3 s, not 60
        if not restart:
            envs.close(terminate=True)
            return
        # a hung step
        envs.call("arm", "step", 60.0, env_ids=[0])
        _, _, _, trunc, infos = envs.step(ACTIONS)
        assert list(trunc) == [True, True, False, False]
        assert list(infos["_worker_restarted"]) == [True, True, False, False]
        # a hung chunk: K = 4 sub-steps of 1 s each at most; env 1 hangs at its first
        envs.call("arm", "step", 60.0, env_ids=[1])
        start = time.monotonic()
        out = envs.step_chunk(np.zeros((4, 4), dtype=np.int64))
        assert time.monotonic() - start < 4.0 + 15.0
        trunc = out[3]
        assert trunc[0].any() and trunc[1].any() and not trunc[2:].any()
        assert len(envs.restarts) == 3
        envs.step(ACTIONS)


def check_hung_step_and_chunk_raise(make: Make) -> None:
    """Under ``"raise"``: a hung step and a hung chunk raise WorkerTimeoutError within their
    bounds (the chunk's K times the step's), naming the unit's envs."""
    for chunk in (None, 4):
        with make([armed] * 4, timeout={"reset": 30.0, "step": 1.0}) as envs:
            envs.reset(seed=0)
            envs.call("arm", "step", 60.0, env_ids=[2])
            start = time.monotonic()
            with pytest.raises(WorkerTimeoutError) as info:
                if chunk is None:
                    envs.step(ACTIONS)
                else:
                    envs.step_chunk(np.zeros((4, chunk), dtype=np.int64))
            took = time.monotonic() - start
            assert info.value.env_indices == (2, 3)
            bound = 1.0 if chunk is None else 4.0
            assert bound * 0.9 <= took < bound + 15.0, took
            envs.close(terminate=True)


def check_sb3_env_method_per_env(**kwargs: Any) -> None:
    """The SB3 face's ``env_method`` with indices (repeats included) hands each index its own
    value of a PerEnv argument; without indices, env i gets value i."""
    pytest.importorskip("stable_baselines3")
    from subvec.sb3 import SubprocVecEnv

    envs = SubprocVecEnv([armed] * 4, **kwargs)
    try:
        envs.reset()
        got = envs.env_method("set_init_state", PerEnv(["x", "y", "z"]), indices=[2, 0, 2])
        assert got == [("x", 0), ("y", 0), ("z", 0)]
        assert envs.get_attr("init_state") == ["y", None, "z", None]  # the last call wins
        got = envs.env_method("set_init_state", 1, settle=PerEnv([10, 11, 12, 13]))
        assert got == [(1, 10), (1, 11), (1, 12), (1, 13)]
        with pytest.raises(ValueError, match="2 values, expected one per env called"):
            envs.env_method("set_init_state", PerEnv([1, 2]), indices=[0])
    finally:
        envs.close()


# --- freeze -----------------------------------------------------------------------------------


def ending(max_steps: int) -> gym.Env[Any, Any]:
    """Episodes that end at random (terminated) or after ``max_steps`` (truncated)."""
    return ZooEnv(max_steps=max_steps, terminate_prob=0.2, quiet=True)


#: four envs whose episodes end at different steps
ENDING = [functools.partial(ending, m) for m in (3, 5, 7, 9)]


class FreezeOracle:
    """Single envs stepped by hand as freeze says: once an episode ended, the env is not
    stepped again until reset; its steps report its final observation, reward 0, flags False,
    frozen True."""

    def __init__(self, env_fns: list[Any], seed: int) -> None:
        self.envs = [fn() for fn in env_fns]
        self.obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
        self.frozen = [False] * len(self.envs)
        self.ended = [False] * len(self.envs)
        #: each real episode's length, in the order they ended
        self.lengths: list[int] = []
        self.t = [0] * len(self.envs)

    def step(self, i: int, action: Any) -> tuple[Any, float, bool, bool, bool]:
        if self.ended[i]:
            self.frozen[i] = True
            return self.obs[i], 0.0, False, False, True
        obs, reward, term, trunc, _ = self.envs[i].step(action)
        self.t[i] += 1
        self.obs[i] = obs
        if term or trunc:
            self.ended[i] = True
            self.lengths.append(self.t[i])
        return obs, float(reward), bool(term), bool(trunc), False

    def reset(self, i: int) -> Any:
        self.obs[i] = self.envs[i].reset()[0]
        self.ended[i] = self.frozen[i] = False
        self.t[i] = 0
        return self.obs[i]


def _frozen_mask(infos: dict[str, Any], n: int) -> np.ndarray:
    if "frozen" not in infos:
        return np.zeros(n, dtype=bool)
    return np.asarray(infos["frozen"], dtype=bool) & np.asarray(infos["_frozen"], dtype=bool)


def check_freeze_step_and_masked_reset(make: Make) -> None:
    """freeze: ``step`` against single envs stepped by hand; a frozen env's ``t`` stops (it is
    not stepped); a masked reset unfreezes exactly the masked envs; metadata keeps the real
    AutoresetMode (DISABLED)."""
    require_offered(AutoresetMode.DISABLED)  # what freezing means: not on gymnasium 0.29
    ref = FreezeOracle(ENDING, seed=3)
    with make(ENDING, freeze=True) as envs:
        assert envs.autoreset_mode is AutoresetMode.DISABLED
        if NAMES_AUTORESET_MODE:
            assert envs.metadata["autoreset_mode"] is AutoresetMode.DISABLED
        assert envs.freeze
        obs, _ = envs.reset(seed=3)
        np.testing.assert_array_equal(obs, np.stack(ref.obs))
        for t in range(14):
            if t == 10:  # unfreeze envs 0 and 2 (ended by now), keep 1 and 3 as they are
                mask = np.array([True, False, True, False])
                assert all(ref.ended[i] for i in (0, 2))
                obs, _ = envs.reset(options={"reset_mask": mask})
                for i in (0, 2):
                    np.testing.assert_array_equal(obs[i], ref.reset(i))
            actions = np.array([(t + i) % 3 for i in range(4)])
            obs, rew, term, trunc, infos = envs.step(actions)
            want = [ref.step(i, actions[i]) for i in range(4)]
            for i, (o, r, te, tr, fr) in enumerate(want):
                np.testing.assert_array_equal(obs[i], o, err_msg=f"step {t} env {i}")
                assert (rew[i], term[i], trunc[i]) == (r, te, tr), (t, i)
                assert _frozen_mask(infos, 4)[i] == fr, (t, i, infos)
        assert list(envs.get_attr("t")) == ref.t  # frozen envs were not stepped
    for mode in ("NextStep", "SameStep"):  # those reset ended envs themselves
        with pytest.raises(ValueError, match=r"freeze=True .* needs autoreset_mode=DISABLED"):
            make(ENDING, freeze=True, autoreset_mode=mode)


def check_freeze_chunks(make: Make) -> None:
    """freeze with ``step_chunk``: an env that ends mid-chunk stops there (its end flagged at
    that sub-step), a frozen env runs no sub-step (``chunk_steps`` 0, rewards 0, flags False,
    its final observation, ``frozen`` at sub-step 0); ``all_obs`` repeats it over the chunk."""
    require_offered(AutoresetMode.DISABLED)  # what freezing means: not on gymnasium 0.29
    K = 3
    ref = FreezeOracle(ENDING, seed=5)
    with make(ENDING, freeze=True) as envs:
        envs.reset(seed=5)
        for c in range(5):
            all_obs = c % 2 == 1
            actions = np.array([[(c + k + i) % 3 for k in range(K)] for i in range(4)])
            obs, rew, term, trunc, infos = envs.step_chunk(actions, all_obs=all_obs)
            for i in range(4):
                frozen_at_start = ref.ended[i]
                steps = 0
                last = ref.obs[i]
                for k in range(K):
                    if ref.ended[i] and not frozen_at_start:  # stopped at its end
                        assert (rew[i, k], term[i, k], trunc[i, k]) == (0.0, False, False)
                        if all_obs:
                            np.testing.assert_array_equal(obs[i, k], last)
                        continue
                    o, r, te, tr, fr = ref.step(i, actions[i, k])
                    if fr:
                        assert (rew[i, k], term[i, k], trunc[i, k]) == (0.0, False, False)
                    else:
                        steps += 1
                        assert (rew[i, k], term[i, k], trunc[i, k]) == (r, te, tr), (c, i, k)
                    last = o
                    if all_obs:
                        np.testing.assert_array_equal(obs[i, k], o)
                assert infos["chunk_steps"][i] == steps, (c, i)
                frozen = infos.get("frozen")
                assert bool(frozen is not None and infos["_frozen"][i, 0]) == frozen_at_start
                if not all_obs:
                    np.testing.assert_array_equal(obs[i], last)
        assert list(envs.get_attr("t")) == ref.t


def check_freeze_send_recv(make: Make) -> None:
    """freeze with ``send``/``recv``: each env's results are those of its single env stepped by
    hand, a frozen env's named in ``infos["frozen"]``."""
    require_offered(AutoresetMode.DISABLED)  # what freezing means: not on gymnasium 0.29
    ref = FreezeOracle(ENDING, seed=7)
    with make(ENDING, freeze=True) as envs:
        envs.reset(seed=7)
        for t in range(12):
            ids = [0, 1, 2, 3] if t % 2 == 0 else [3, 1]
            actions = np.array([(t + i) % 3 for i in ids])
            envs.send(actions, ids)
            obs, rew, term, trunc, infos = envs.recv(min_envs=len(ids))
            envs.drain()
            got = {int(e): j for j, e in enumerate(infos["env_id"])}
            assert sorted(got) == sorted(ids)
            frozen = _frozen_mask(infos, len(ids))
            for i, a in zip(ids, actions):
                o, r, te, tr, fr = ref.step(i, a)
                j = got[i]
                np.testing.assert_array_equal(obs[j], o)
                assert (rew[j], term[j], trunc[j], frozen[j]) == (r, te, tr, fr), (t, i)
        assert list(envs.get_attr("t")) == ref.t


def check_freeze_under_gymnasium_wrappers(make: Make) -> None:
    """RecordEpisodeStatistics over freeze counts each episode once, with its true length and
    return; NormalizeReward leaves a frozen env's reward at 0."""
    require_offered(AutoresetMode.DISABLED)  # what freezing means: not on gymnasium 0.29
    ref = FreezeOracle(ENDING, seed=11)
    returns: list[float] = []
    running = [0.0] * 4
    with make(ENDING, freeze=True) as envs:
        stats = gym.wrappers.vector.RecordEpisodeStatistics(envs, buffer_length=100)
        wrapped = gym.wrappers.vector.NormalizeReward(stats)
        wrapped.reset(seed=11)
        for t in range(20):
            if t == 12:
                mask = np.array(ref.ended)
                wrapped.reset(options={"reset_mask": mask})
                for i in np.flatnonzero(mask):
                    ref.reset(int(i))
            actions = np.array([(t * 7 + i) % 3 for i in range(4)])
            _, rew, _, _, _ = wrapped.step(actions)
            for i in range(4):
                _, r, te, tr, fr = ref.step(i, actions[i])
                if fr:
                    assert rew[i] == 0.0
                running[i] += r
                if te or tr:
                    returns.append(running[i])
                    running[i] = 0.0
        assert stats.episode_count == len(ref.lengths) >= 6
        assert sorted(stats.length_queue) == sorted(ref.lengths)
        np.testing.assert_allclose(sorted(stats.return_queue), sorted(returns))


# --- reconfigure ------------------------------------------------------------------------------


class TaskEnv(ArmedEnv):
    """An env of a task (LIBERO's ``OffScreenRenderEnv(**task)``); ``built_by`` names the
    process that built it."""

    def __init__(self, task: str = "A", obs_shape: tuple[int, ...] = (3,)) -> None:
        super().__init__(obs_space=gym.spaces.Box(0, 1, obs_shape))
        self.task = task
        self.built_by = os.getpid()


def task(name: str, obs_shape: tuple[int, ...] = (3,)) -> Any:
    return functools.partial(TaskEnv, name, obs_shape)


def raising_env() -> gym.Env[Any, Any]:
    raise OSError("the task's assets are missing")


class FlakyFactory:
    """Raises on its first call in each process (a render context that fails to start once),
    then builds ``task``."""

    def __init__(self, name: str, tries_dir: str) -> None:
        self.name, self.tries_dir = name, tries_dir

    def __call__(self) -> gym.Env[Any, Any]:
        mark = os.path.join(self.tries_dir, f"tried-{os.getpid()}-{id(self)}")
        if not os.path.exists(mark):
            open(mark, "w").close()
            raise RuntimeError("EGL context failed to start")
        return TaskEnv(self.name)


def dying_env() -> gym.Env[Any, Any]:
    os._exit(7)


def check_reconfigure_all_and_some(make: Make, unit_pids: Callable[[Any], list[int]]) -> None:
    """Every env, then some envs, swapped inside the live units (no new process): the new
    envs are the new factories', built in the units' processes; the others keep their
    episodes; the next reset starts the new envs' episodes, with the seeds as for any env."""
    with make([task("A")] * 4) as envs:
        envs.reset(seed=0)
        envs.step(ACTIONS)
        pids = unit_pids(envs)
        envs.reconfigure([task("B")] * 4)
        assert unit_pids(envs) == pids
        assert envs.get_attr("task") == ("B",) * 4
        assert envs.get_attr("t") == (0, 0, 0, 0)  # new envs: no step taken
        obs, _ = envs.reset(seed=5)
        ref = [TaskEnv("B") for _ in range(4)]
        np.testing.assert_array_equal(
            obs, np.stack([r.reset(seed=5 + i)[0] for i, r in enumerate(ref)])
        )
        envs.step(ACTIONS)
        envs.step(ACTIONS)
        # some envs, out of order: the others carry on where they were
        envs.reconfigure([task("C"), task("D")], env_ids=[3, 1])
        assert unit_pids(envs) == pids
        assert envs.get_attr("task") == ("B", "D", "B", "C")
        assert envs.get_attr("t") == (2, 0, 2, 0)
        assert envs.env_fns[3].args == ("C", (3,))
        mask = np.array([False, True, False, True])
        envs.reset(seed=9, options={"reset_mask": mask})
        envs.step(ACTIONS)
        assert envs.get_attr("t") == (3, 1, 3, 1)
        with pytest.raises(ValueError, match="2 env factories for 1 envs"):
            envs.reconfigure([task("E")] * 2, env_ids=[0])


def check_reconfigure_refused_keeps_the_old_envs(make: Make, tries_dir: str) -> None:
    """A space mismatch and a factory that raises are errors naming the env; every unit drops
    its new envs and the old ones carry on. With ``build_retries`` a factory that fails once
    is tried again in the same unit."""
    with make([task("A")] * 4) as envs:
        envs.reset(seed=0)
        envs.step(ACTIONS)
        mismatch = r"new env has observation_space Box\(0.0, 1.0, \(5,\), .* is Box\(.*\(3,\)"
        with pytest.raises(ValueError, match=mismatch) as mismatched:
            envs.reconfigure([task("B"), task("B"), task("B", (5,)), task("B")])
        assert mismatched.value.env_index == 2  # type: ignore[attr-defined]
        assert envs.get_attr("task") == ("A",) * 4 and envs.get_attr("t") == (1, 1, 1, 1)
        with pytest.raises(OSError, match="assets are missing") as info:
            envs.reconfigure([task("B"), raising_env], env_ids=[0, 3])
        assert info.value.env_index == 3
        assert envs.get_attr("task") == ("A",) * 4
        envs.step(ACTIONS)
        assert envs.get_attr("t") == (2, 2, 2, 2)
        with pytest.raises(RuntimeError, match="EGL context failed"):
            envs.reconfigure([FlakyFactory("B", tries_dir)], env_ids=[1])
        assert envs.get_attr("task") == ("A",) * 4
    with make([task("A")] * 4, build_retries=1) as envs:
        envs.reset(seed=0)
        envs.reconfigure([FlakyFactory("B", tries_dir)] * 4)
        assert envs.get_attr("task") == ("B",) * 4


def check_reconfigure_waits_for_a_reset(make: Make) -> None:
    """The new envs start no episode: DISABLED refuses to step them until they are reset;
    NEXT_STEP's next step resets them (reward 0, flags False)."""
    require_offered(AutoresetMode.DISABLED)
    with make([task("A")] * 4, autoreset_mode="Disabled") as envs:
        envs.reset(seed=0)
        envs.reconfigure([task("B")], env_ids=[2])
        with pytest.raises(ValueError, match=r"envs \[2\] terminated or truncated"):
            envs.step(ACTIONS)
        envs.reset(options={"reset_mask": np.array([False, False, True, False])})
        envs.step(ACTIONS)
        assert envs.get_attr("t") == (1, 1, 1, 1)
    with make([task("A")] * 4) as envs:
        envs.reset(seed=0)
        envs.reconfigure([task("B")], env_ids=[0])
        _, rew, term, trunc, infos = envs.step(ACTIONS)
        assert rew[0] == 0.0 and not term[0] and not trunc[0]
        assert infos["_reset_count"][0]  # its reset's info
        assert envs.get_attr("t") == (0, 1, 1, 1)


def check_reconfigure_with_a_unit_dying(make: Make, policy: str) -> None:
    """A unit dies while building its new envs: ``"raise"`` breaks the vector env and
    ``reset()`` rebuilds that unit with its old envs; ``"restart"`` replaces it at once;
    either way the error names the unit's envs and the other unit keeps its old envs."""
    from subvec import BrokenVectorEnvError, WorkerDiedError

    with make([task("A")] * 4, on_worker_failure=policy) as envs:
        envs.reset(seed=0)
        with pytest.raises(WorkerDiedError) as info:
            envs.reconfigure([task("B"), task("B"), dying_env, task("B")])
        assert 2 in info.value.env_indices
        if policy == "raise":
            with pytest.raises(BrokenVectorEnvError):
                envs.step(ACTIONS)
        envs.reset(seed=1)
        assert envs.get_attr("task") == ("A",) * 4
        envs.step(ACTIONS)
        envs.reconfigure([task("C")] * 4)  # usable again
        assert envs.get_attr("task") == ("C",) * 4


# --- suspend / resume -------------------------------------------------------------------------


class StatefulEnv(ZooEnv):
    """Random episode ends, with the state hook: everything its future depends on."""

    def __init__(self, max_steps: int = 6) -> None:
        super().__init__(max_steps=max_steps, terminate_prob=0.2, quiet=True)

    def get_state(self) -> dict[str, Any]:
        return {"t": self.t, "rng": self.np_random.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self.t = state["t"]
        self.np_random.bit_generator.state = state["rng"]


class FailWhileMarked:
    """Raises while ``path`` exists (a simulator that cannot start for now), else builds."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> gym.Env[Any, Any]:
        if os.path.exists(self.path):
            raise RuntimeError("the simulator cannot start now")
        return StatefulEnv()


STATEFUL = [functools.partial(StatefulEnv, m) for m in (4, 5, 6, 7)]


def _run(envs: Any, steps: range, chunk: bool = False) -> list[Any]:
    out = []
    for t in steps:
        if chunk:
            out.append(
                envs.step_chunk(np.array([[(t + i + k) % 3 for k in range(2)] for i in range(4)]))
            )
        else:
            out.append(envs.step(np.array([(t + i) % 3 for i in range(4)])))
    return out


def check_suspend_resume_continues_with_the_state_hook(
    make: Make, unit_pids: Callable[[Any], list[int]], **kwargs: Any
) -> None:
    """With ``get_state``/``set_state``, episodes continue byte for byte across
    suspend/resume (every autoreset mode's record of an ended env included), against the same
    vector env never suspended; the units' processes end and new ones start."""
    from tests.helpers import assert_same

    require_offered(
        AutoresetMode.DISABLED if kwargs.get("freeze") else kwargs.get("autoreset_mode")
    )
    with make(STATEFUL, **kwargs) as reference:
        reference.reset(seed=1)
        want = _run(reference, range(0, 14))
        want += _run(reference, range(14, 18), chunk=True)
    with make(STATEFUL, **kwargs) as envs:
        envs.reset(seed=1)
        got: list[Any] = []
        for lo in range(0, 14, 3):
            got += _run(envs, range(lo, min(lo + 3, 14)))
            pids = unit_pids(envs)
            envs.suspend()
            assert envs.suspended
            with pytest.raises(RuntimeError, match="suspended: resume"):
                envs.step(ACTIONS)
            for pid in pids:
                if pid != os.getpid():
                    assert _gone(pid), f"process {pid} outlived suspend()"
            envs.resume()
            assert not envs.suspended
            new = unit_pids(envs)
            assert all(a != b for a, b in zip(pids, new) if a != os.getpid())
        got += _run(envs, range(14, 18), chunk=True)
        assert_same(got, want, "the steps across suspend/resume")


def check_suspend_resume_without_the_hook_resets(make: Make) -> None:
    """Without the hook, resume resets every env (its stored options, no seed): new episodes
    (t back to 0), the reset's options seen; close() from suspended leaves nothing."""
    with make([armed] * 4) as envs:
        envs.reset(seed=0)
        envs.set_reset_options({"level": 2})
        envs.step(ACTIONS)
        envs.suspend()
        envs.resume()
        assert envs.get_attr("t") == (0, 0, 0, 0)
        envs.step(ACTIONS)
        assert envs.get_attr("t") == (1, 1, 1, 1)
        assert envs.reset_options == ({"level": 2},) * 4
        _, infos = envs.reset(seed=3)
        assert list(infos["options_seen"][0]) == ["level"]
        envs.suspend()
    with pytest.raises(RuntimeError, match="not suspended"), make([armed] * 4) as envs:
        envs.resume()


def check_resume_that_fails_stays_suspended(make: Make, mark: str) -> None:
    """A unit that cannot start at resume: the error is raised, the vector env stays
    suspended (nothing left running), and a later resume works."""
    with make([FailWhileMarked(mark)] * 4) as reference:  # never suspended
        reference.reset(seed=0)
        reference.step(ACTIONS)
        reference.step(ACTIONS)
        want = reference.get_attr("t")
    with make([FailWhileMarked(mark)] * 4) as envs:
        envs.reset(seed=0)
        envs.step(ACTIONS)
        envs.suspend()
        open(mark, "w").close()
        with pytest.raises(RuntimeError, match="cannot start now"):
            envs.resume()
        assert envs.suspended
        os.remove(mark)
        envs.resume()
        envs.step(ACTIONS)
        assert envs.get_attr("t") == want


def _gone(pid: int, bound: float = 10.0) -> bool:
    import psutil

    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
