"""Conformance: every backend against gymnasium's SyncVectorEnv, the oracle.

Same seeds must give byte-identical observations, rewards, terminations, truncations and infos
for every autoreset mode, info format, worker layout, start method, backend and observation
space.

``test_matches_sync`` is the axis: every vectoriser (tests/vectorisers.py) x every space of the
zoo x every autoreset mode with each info format it allows. The default run takes a subset
(``default_cases``): each vectoriser in every mode and format, each space in every mode; the
rest of the product is marked slow (``python -m pytest -m slow``; ``-m "slow or not slow"``
runs it all). The Ray entry's cases are the same product, run by tests/test_ray.py.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Collection
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from subvec import SubprocVectorEnv
from subvec._compat import DEFAULT_INFO_FORMAT, GYM_029, NAMES_AUTORESET_MODE, AutoresetMode
from subvec._infos import InfoBlockReader, merge_columns
from tests.envs import (
    LooseDtypeEnv,
    ScalarInfoEnv,
    SilentEnv,
    SteadyInfoEnv,
    ZooEnv,
    make_zoo,
    space_zoo,
)
from tests.helpers import assert_same
from tests.oracle import require_offered, sync_vector_env
from tests.vectorisers import NEEDS_RAY, PROCESS, SLOW_TO_START, VECTORISERS

STEPS = 40
#: The info formats each mode can return (legacy is gymnasium 0.29's, which reset in the step).
#: On gymnasium 0.29 the same step's is the only mode, and 1.x's infos do not exist.
FORMATS = (
    {AutoresetMode.SAME_STEP: ("legacy", "list")}
    if GYM_029
    else {
        AutoresetMode.NEXT_STEP: ("gymnasium", "list"),
        AutoresetMode.SAME_STEP: ("gymnasium", "list", "legacy"),
        AutoresetMode.DISABLED: ("gymnasium", "list"),
    }
)
MODES = list(FORMATS)
EVERY_FORMAT = {f for formats in FORMATS.values() for f in formats}
SPACES = list(space_zoo())


class _Logged(gym.Wrapper[Any, Any, Any, Any]):
    """Appends what its env's reset and step return to ``log``: the list and legacy formats'
    oracle rebuilds each env's info from it, as gymnasium 0.29 and the list format define it."""

    def __init__(self, env: gym.Env[Any, Any], log: list[tuple[str, Any, dict[str, Any]]]):
        super().__init__(env)
        self.log = log

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        # a copy: gymnasium 0.29's SyncVectorEnv adds its final_* keys to the reset's info
        self.log.append(("reset", obs, dict(info)))
        return obs, info

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.log.append(("step", obs, info))
        return obs, reward, terminated, truncated, info


def _logged(fn: Any, log: list[Any]) -> gym.Env[Any, Any]:
    return _Logged(fn(), log)


def _expected_infos(logs: list[list[Any]], info_format: str) -> Any:
    """What one reset or step must report in ``info_format``, from what each env returned.

    list: one dict per env, the env's own info; an env that ended and was reset in the same
    step reports ``final_obs`` and ``final_info`` followed by its reset info. legacy: gymnasium
    0.29's SyncVectorEnv: the reset info plus ``final_observation`` and ``final_info``, merged
    into arrays without recursion (numbers typed, anything else in object arrays, ``None`` for
    the envs without the key), each key with its boolean ``_key`` mask.
    """
    per_env = []
    for log in logs:
        if len(log) == 2:  # SAME_STEP: the step that ended, then the reset
            (_, final_obs, final_info), (_, _, info) = log
            if info_format == "list":
                per_env.append({"final_obs": final_obs, "final_info": final_info, **info})
            else:
                per_env.append({**info, "final_observation": final_obs, "final_info": final_info})
        else:
            per_env.append(dict(log[0][2]) if log else {})  # {}: not reset by a masked reset
        log.clear()
    if info_format == "list":
        return per_env
    num_envs = len(per_env)
    infos: dict[str, Any] = {}
    for i, info in enumerate(per_env):
        for key, value in info.items():
            if key not in infos:
                kind = type(value)
                if kind in (int, float, bool) or issubclass(kind, np.number):
                    infos[key] = np.zeros(num_envs, dtype=kind)
                else:
                    infos[key] = np.full(num_envs, None, dtype=object)
                infos[f"_{key}"] = np.zeros(num_envs, dtype=np.bool_)
            infos[key][i] = value
            infos[f"_{key}"][i] = True
    return infos


def run_side_by_side(
    fns: list[Any],
    mode: AutoresetMode,
    steps: int = STEPS,
    *,
    make: Callable[..., Any] = SubprocVectorEnv,
    info_format: str = DEFAULT_INFO_FORMAT,
    **kwargs: Any,
) -> Any:
    """Step both implementations with the same actions; assert every result is identical.

    ``make(fns, **kwargs)`` builds the vector env under test; with ``info_format`` "list" or
    "legacy" its infos are compared with those the oracle's envs returned, in that format.
    """
    require_offered(mode, info_format)
    assert info_format in FORMATS[mode], (info_format, mode)
    logs: list[list[Any]] = [[] for _ in fns]
    if info_format == "gymnasium" or (GYM_029 and info_format == "legacy"):
        # gymnasium 0.29's own SyncVectorEnv is the legacy format's oracle there
        oracle = sync_vector_env(fns, autoreset_mode=mode)
    else:
        logged = [functools.partial(_logged, fn, log) for fn, log in zip(fns, logs)]
        oracle = sync_vector_env(logged, autoreset_mode=mode)
        kwargs["info_format"] = info_format
    if info_format != "legacy":  # legacy implies SAME_STEP: the metadata must say so
        kwargs["autoreset_mode"] = mode

    def expected(result: tuple[Any, ...]) -> tuple[Any, ...]:
        if info_format == "gymnasium" or (GYM_029 and info_format == "legacy"):
            return result
        return (*result[:-1], _expected_infos(logs, info_format))

    envs = make(fns, **kwargs)
    try:
        assert envs.single_observation_space == oracle.single_observation_space
        assert envs.observation_space == oracle.observation_space
        assert envs.action_space == oracle.action_space
        assert envs.metadata == oracle.metadata
        assert_same(envs.reset(seed=123), expected(oracle.reset(seed=123)), "reset")
        envs.action_space.seed(7)
        for t in range(steps):
            actions = envs.action_space.sample()
            got = envs.step(actions)
            want = expected(oracle.step(actions))
            assert_same(got, want, f"step {t}")
            if mode is AutoresetMode.DISABLED and (got[2] | got[3]).any():
                mask = got[2] | got[3]
                options = {"reset_mask": mask, "level": 1}
                snapshot = dict(options)
                got_reset = envs.reset(options=options)
                assert options.keys() == snapshot.keys(), "caller's options were mutated"
                want_reset = expected(oracle.reset(options=dict(options)))
                assert_same(got_reset, want_reset, f"reset at {t}")
        return envs
    finally:
        envs.close()
        oracle.close()


# --- the conformance axis: vectorisers x spaces x autoreset modes and info formats ---------


def _flavour_id(flavour: tuple[AutoresetMode, str]) -> str:
    mode, info_format = flavour
    return mode.value if info_format == "gymnasium" else f"{mode.value}+{info_format}"


Case = tuple[str, str, tuple[AutoresetMode, str]]

#: Ray's default cases: every mode and format, on the spaces that take their own way through
#: an actor (the rest of the product is slow: each case starts two actors).
RAY_DEFAULT: list[Case] = [
    ("ray", "box_f32", (AutoresetMode.NEXT_STEP, "gymnasium")),
    ("ray", "box_f32", (AutoresetMode.SAME_STEP, "gymnasium")),
    ("ray", "dict_nest", (AutoresetMode.NEXT_STEP, "list")),
    ("ray", "tuple_nest", (AutoresetMode.SAME_STEP, "legacy")),
    # observations by value, and masked resets that leave a whole actor alone
    ("ray", "text", (AutoresetMode.DISABLED, "list")),
    # split in each actor's vector env (cameras in its block), by value to the driver
    ("ray", "cameras_text", (AutoresetMode.SAME_STEP, "gymnasium")),
]
if GYM_029:  # the same spaces, in the one mode and the two formats gymnasium 0.29 has
    RAY_DEFAULT = list(
        dict.fromkeys(
            (name, space, (AutoresetMode.SAME_STEP, ("legacy", "list")[k % 2]))
            for k, (name, space, _) in enumerate(RAY_DEFAULT)
        )
    )


#: the spaces of the vectorisers slow to start, one case each, the modes taking turns
SLOW_SPACES = ["tuple_nest", "dict_nest", "text"]


def _default_cases() -> list[Case]:
    """The subset of the product that the default run takes (the rest is marked slow).

    The process backend: every space with every mode, its vectorisers taking turns over the
    spaces (each then runs every mode on several spaces); each vectoriser's first lap over the
    spaces takes a mode's rarest format (legacy, or list), the second lap alternates
    gymnasium's own and list. The vectorisers that are slow to start get one case per mode, in
    turn with each format. The camera-and-instruction nest runs under every other vectoriser.
    In-process: every space in every mode, the formats taking turns (milliseconds a case).
    Ray: :data:`RAY_DEFAULT`.
    """
    cheap = [name for name in PROCESS if name not in SLOW_TO_START]
    cases = []
    for j, mode in enumerate(MODES):
        others = [f for f in FORMATS[mode] if f != "gymnasium"]
        for k, space in enumerate(SPACES):
            lap, pos = divmod(k, len(cheap))
            second = "gymnasium" if pos % 2 == 0 and "gymnasium" in FORMATS[mode] else others[0]
            info_format = others[-1] if lap == 0 else second
            cases.append((cheap[(k + 3 * j) % len(cheap)], space, (mode, info_format)))
    slow_formats = ["legacy", "list"] if GYM_029 else ["gymnasium", "legacy", "list"]
    for name in sorted(SLOW_TO_START):
        for mode, space, info_format in zip(
            itertools.cycle(MODES), SLOW_SPACES, itertools.cycle(slow_formats)
        ):
            cases.append((name, space, (mode, info_format)))
    # the split nest (cameras in the block, the instruction by pipe) under every layout
    flavours = [(mode, f) for mode in MODES for f in FORMATS[mode]]
    for k, name in enumerate(cheap):
        case = (name, "cameras_text", flavours[k % len(flavours)])
        if case not in cases:
            cases.append(case)
    # what the list and legacy formats' own tests checked before the axis existed
    for info_format in ("list", "legacy"):
        case = ("workers", "box_f32", (AutoresetMode.SAME_STEP, info_format))
        if case not in cases:
            cases.append(case)
    for mode in MODES:
        for k, space in enumerate(SPACES):
            formats = FORMATS[mode]
            cases.append(("in_process", space, (mode, formats[k % len(formats)])))
    return cases + RAY_DEFAULT


def _all_cases() -> list[Case]:
    flavours = [(mode, info_format) for mode in MODES for info_format in FORMATS[mode]]
    return [(v, s, f) for v in VECTORISERS for s in SPACES for f in flavours]


def _marks(case: Case) -> list[pytest.MarkDecorator]:
    return [] if case in DEFAULT_CASES else [pytest.mark.slow]


def axis_params(names: Collection[str]) -> list[Any]:
    """The axis' cases of the vectorisers ``names``, as parameters of ``(vectoriser,
    space_name, flavour)``; those outside the default run are marked slow."""
    return [
        pytest.param(*case, id=f"{case[0]}-{case[1]}-{_flavour_id(case[2])}", marks=_marks(case))
        for case in _all_cases()
        if case[0] in names
    ]


DEFAULT_CASES = _default_cases()
CASES = axis_params(set(VECTORISERS) - NEEDS_RAY)


def _zoo_fns(space_name: str, num_envs: int = 5) -> list[Any]:
    # A closure and lambdas around it: cloudpickle must carry both under every start method.
    factory = make_zoo(space_name)
    return [factory if i % 2 == 0 else (lambda: factory()) for i in range(num_envs)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("vectoriser", "space_name", "flavour"), CASES, indirect=["vectoriser"])
def test_matches_sync(
    vectoriser: Callable[..., Any], space_name: str, flavour: tuple[AutoresetMode, str]
) -> None:
    mode, info_format = flavour
    run_side_by_side(_zoo_fns(space_name), mode, make=vectoriser, info_format=info_format)


def test_default_cases_cover_every_vectoriser_space_and_mode() -> None:
    every = set(_all_cases())
    assert set(DEFAULT_CASES) <= every and len(set(DEFAULT_CASES)) == len(DEFAULT_CASES)
    assert len(CASES) + len(axis_params(NEEDS_RAY)) == len(every)
    by_vectoriser: dict[str, list[tuple[str, AutoresetMode, str]]] = {v: [] for v in VECTORISERS}
    for name, space, (mode, info_format) in DEFAULT_CASES:
        by_vectoriser[name].append((space, mode, info_format))
    for name, cases in by_vectoriser.items():
        assert {mode for _, mode, _ in cases} == set(MODES), name
        assert len({space for space, _, _ in cases}) >= 2, name
        assert {f for _, _, f in cases} == EVERY_FORMAT, name
    for name in SLOW_TO_START:
        assert len(by_vectoriser[name]) == len(SLOW_SPACES), name
    # in-process: the whole contract's every space in every mode, by default
    in_process = {(space, mode) for space, mode, _ in by_vectoriser["in_process"]}
    assert in_process == {(space, mode) for space in SPACES for mode in MODES}
    covered = {(space, mode) for _, space, (mode, _) in DEFAULT_CASES}
    assert covered == {(space, mode) for space in SPACES for mode in MODES}
    flavours = {flavour for _, _, flavour in DEFAULT_CASES}
    assert flavours == {(mode, f) for mode in MODES for f in FORMATS[mode]}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "act_space",
    [
        spaces.Box(-1, 1, shape=(2,), dtype=np.float32),
        spaces.MultiDiscrete([3, 2]),
        spaces.Dict({"move": spaces.Discrete(4), "force": spaces.Box(0, 1, (2,))}),
        spaces.Text(max_length=3),
    ],
    ids=["box", "multidiscrete", "dict", "text_by_pipe"],
)
def test_action_spaces_reach_the_env_unchanged(act_space: spaces.Space[Any]) -> None:
    fns = [make_zoo("box_f64", act_space) for _ in range(3)]
    oracle = SyncVectorEnv(fns)
    with_actions = SubprocVectorEnv(fns, num_workers=2)
    try:
        with_actions.reset(seed=1)
        oracle.reset(seed=1)
        with_actions.action_space.seed(3)
        for _ in range(5):
            actions = with_actions.action_space.sample()
            with_actions.step(actions)
            oracle.step(actions)
            assert_same(
                with_actions.get_attr("last_action"),
                tuple(env.unwrapped.last_action for env in oracle.envs),
            )
    finally:
        with_actions.close()
        oracle.close()


@pytest.mark.timeout(60)
def test_cartpole_matches_sync_for_hundreds_of_steps() -> None:
    import gymnasium as gym

    fns = [lambda: gym.make("CartPole-v1") for _ in range(8)]
    if AutoresetMode.NEXT_STEP in FORMATS:  # not on gymnasium 0.29
        run_side_by_side(fns, AutoresetMode.NEXT_STEP, steps=300)
    run_side_by_side(fns, AutoresetMode.SAME_STEP, steps=300, num_workers=3)


@pytest.mark.timeout(60)
@pytest.mark.skipif(GYM_029, reason="gymnasium 0.29 has no observation_mode")
def test_observation_mode_different_matches_sync() -> None:
    def factory(high: float):
        return lambda: make_zoo("box_f64")()

    import gymnasium as gym

    fns = [
        lambda: gym.make("Pendulum-v1", g=9.81),
        lambda: gym.make("Pendulum-v1", g=1.62),
        lambda: gym.make("Pendulum-v1", g=3.0),
    ]
    envs = run_side_by_side(fns, AutoresetMode.NEXT_STEP, observation_mode="different")
    assert envs.closed
    # Past Pendulum's 200-step time limit: SAME_STEP final observations from the block
    run_side_by_side(fns, AutoresetMode.SAME_STEP, steps=210, observation_mode="different")


@pytest.mark.timeout(60)
def test_legacy_info_format_is_gymnasium_029_layout() -> None:
    # No infos at all, so the final events are rebuilt from the flags (SAME_STEP); spelled out
    # by hand here, and by the oracle of run_side_by_side in the conformance axis.
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    fns = [lambda: SilentEnv(box, terminate_prob=0.2) for _ in range(4)]
    oracle = sync_vector_env(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    envs = SubprocVectorEnv(fns, info_format="legacy", num_workers=2)
    try:
        # gymnasium 1.0 names no autoreset mode in its vector envs' metadata
        assert envs.metadata.get("autoreset_mode") is (
            AutoresetMode.SAME_STEP if NAMES_AUTORESET_MODE else None
        )
        envs.reset(seed=5)
        oracle.reset(seed=5)
        envs.action_space.seed(0)
        seen_final = False
        for _ in range(30):
            actions = envs.action_space.sample()
            obs, _, term, trunc, infos = envs.step(actions)
            want_obs, _, _, _, want = oracle.step(actions)
            assert_same(obs, want_obs)
            done = term | trunc
            if done.any():
                seen_final = True
                assert infos["final_observation"].dtype == object
                assert list(infos["_final_observation"]) == list(done)
                for i in range(4):
                    if done[i]:
                        final = want["final_observation" if GYM_029 else "final_obs"]
                        assert_same(infos["final_observation"][i], final[i])
                        assert isinstance(infos["final_info"][i], dict)
                    else:
                        assert infos["final_observation"][i] is None
                        assert infos["final_info"][i] is None
            else:
                assert "final_observation" not in infos
        assert seen_final
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("info_format", ["list", "legacy"])
def test_steady_infos_from_the_block_in_list_and_legacy_formats(
    info_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The oracle: the same vector env with the block's info regions left out, whose infos
    # travel as pickled events (each format's own conformance tests check those).
    fns = [lambda: SteadyInfoEnv(terminate_prob=0.05, max_steps=10**6) for _ in range(5)]
    kwargs: dict[str, Any] = {"info_format": info_format, "num_workers": 2}
    envs = SubprocVectorEnv(fns, **kwargs)
    monkeypatch.setattr("subvec.vector._BLOCK_INFO_FORMATS", ())
    oracle = SubprocVectorEnv(fns, **kwargs)
    try:
        assert envs.block_plan.info_block and not oracle.block_plan.info_block
        assert_same(envs.reset(seed=9), oracle.reset(seed=9), "reset")
        envs.action_space.seed(3)
        flagged = 0
        for t in range(60):
            actions = envs.action_space.sample()
            got = envs.step(actions)
            flagged += envs._exchange.info_block.flagged()
            assert_same(got, oracle.step(actions), f"step {t}")  # types and key order too
        assert flagged >= 30
    finally:
        envs.close()
        oracle.close()


class CastingEnv(ZooEnv):
    """Returns observations in another dtype than its space's, as real envs often do."""

    def __init__(self, dtype: Any) -> None:
        super().__init__(spaces.Box(-5, 5, shape=(3,), dtype=np.float32))
        self.out_dtype = dtype

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return obs.astype(self.out_dtype) * 1.1, info

    def step(self, action: Any):
        obs, *rest = super().step(action)
        return (obs.astype(self.out_dtype) * 1.1, *rest)


@pytest.mark.timeout(60)
def test_observation_dtype_is_cast_exactly_as_sync_casts() -> None:
    fns = [lambda: CastingEnv(np.float64), lambda: CastingEnv(np.int64)] * 2
    run_side_by_side(fns, MODES[0], num_workers=2)  # NEXT_STEP; on gymnasium 0.29 SAME_STEP


@pytest.mark.timeout(60)
def test_impossible_observation_cast_fails_like_sync() -> None:
    class ComplexObs(CastingEnv):
        def __init__(self) -> None:
            super().__init__(np.complex128)

    with pytest.raises(TypeError):
        SyncVectorEnv([ComplexObs]).reset(seed=0)
    envs = SubprocVectorEnv([ComplexObs, ComplexObs], num_workers=2)
    try:
        with pytest.raises(TypeError, match=r"env 0: observation of dtype complex128"):
            envs.reset(seed=0)
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_parent_envs_serve_calls_and_attributes() -> None:
    envs = SubprocVectorEnv([make_zoo("box_f32")] * 4, parent_envs=2)
    try:
        assert envs.num_workers == 1  # the default leaves the parent a CPU of its own
        assert envs.spin_us > 0  # one worker + the parent fit on two CPUs: busy-poll
        envs.reset(seed=3)
        envs.step(np.array([0, 1, 2, 0]))
        assert envs.call("get_t", plus=1) == (2, 2, 2, 2)
        envs.set_attr("marker", ["a", "b", "c", "d"])
        assert envs.get_attr("marker") == ("a", "b", "c", "d")
        assert len(envs.worker_pids) == 1
    finally:
        envs.close()


def _final_obs_fns(kind: str) -> list[Any]:
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)

    def fn(i: int) -> Any:
        if kind == "silent" or i < 4:
            return lambda: SilentEnv(box, terminate_prob=0.2)
        if i == 6:
            return lambda: LooseDtypeEnv(box, terminate_prob=0.2, quiet=True)
        return lambda: ZooEnv(box, terminate_prob=0.2, quiet=i != 5)

    return [fn(i) for i in range(8)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kind", "info_format"),
    [
        *[
            (kind, f)
            for kind in ("silent", "mixed")
            for f in ("gymnasium", "list")
            if f in FORMATS[AutoresetMode.SAME_STEP]
        ],
        ("silent", "legacy"),
        ("mixed", "legacy"),  # env 6's float64 obs travels by value
    ],
)
@pytest.mark.parametrize("layout", ["workers", "parent_envs"])
def test_same_step_final_observations_kept_in_the_block_match_sync(
    kind: str, layout: str, info_format: str
) -> None:
    # SAME_STEP: an ended env's final observation stays in the block and, when its final info
    # is empty, the worker sends no event for it: envs 0-3 (worker 0) have no infos at all,
    # so their ends travel as plain OKs. In "mixed", env 4 sends reset infos that must follow
    # the rebuilt final event, env 5 step infos, and env 6's float64 observations do not fit
    # the float32 block and travel by value.
    kwargs: dict[str, Any] = {"num_workers": 2}
    if layout == "parent_envs":
        kwargs = {"num_workers": 1, "parent_envs": 4}
    fns = _final_obs_fns(kind)
    envs = run_side_by_side(fns, AutoresetMode.SAME_STEP, 80, info_format=info_format, **kwargs)
    assert envs.block_plan.final_obs


@pytest.mark.timeout(60)
@pytest.mark.skipif(GYM_029, reason="its oracle is 1.x's final_obs (the axis covers 0.29's)")
def test_same_step_final_observations_in_the_list_format() -> None:
    same_step = AutoresetMode.SAME_STEP
    fns = _final_obs_fns("mixed")
    oracle = sync_vector_env(fns, autoreset_mode=same_step)  # first: it may skip the test
    envs = SubprocVectorEnv(fns, autoreset_mode=same_step, info_format="list", num_workers=2)
    try:
        envs.reset(seed=5)
        oracle.reset(seed=5)
        envs.action_space.seed(1)
        ended = 0
        for t in range(80):
            actions = envs.action_space.sample()
            got, want = envs.step(actions), oracle.step(actions)
            assert_same(got[:4], want[:4], f"step {t}")
            for i, info in enumerate(got[4]):
                assert ("final_obs" in info) == bool(got[2][i] or got[3][i]), (t, i)
                if "final_obs" in info:
                    ended += 1
                    assert list(info)[:2] == ["final_obs", "final_info"]
                    assert_same(info["final_obs"], want[4]["final_obs"][i], f"{t} {i}")
                    assert (info["final_info"] == {}) == (i != 5)
                    assert ("reset_count" in info) == (i >= 4)
        assert ended > 20
    finally:
        envs.close()
        oracle.close()


@pytest.mark.timeout(60)
@pytest.mark.skipif(GYM_029, reason="columns are the path of 1.x's infos")
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_ragged_scalar_infos_travel_as_columns_and_match_sync(
    mode: AutoresetMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key only some envs report: not for the block, so the workers send these infos as
    # columns (subvec._infos); the parent merges them per key.
    merged = []

    def counting(parts: Any, num_envs: int) -> Any:
        result = merge_columns(parts, num_envs)
        merged.append(result is not None)
        return result

    monkeypatch.setattr("subvec._front.merge.merge_columns", counting)
    fns = [
        lambda: SteadyInfoEnv(terminate_prob=0.01, max_steps=10**6, ragged=True) for _ in range(5)
    ]
    run_side_by_side(fns, mode, steps=100, num_workers=2)
    assert sum(merged) >= 80, "the columns were not used"  # steps with an episode end: events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("parent_envs", [0, 1], ids=["workers", "parent_envs"])
def test_steady_scalar_infos_stay_in_the_block_and_match_sync(
    mode: AutoresetMode, parent_envs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same keys from every env every step: each worker leaves them in the block under a
    # schema and answers a plain OK; the parent merges them from there (subvec._infos).
    from_block = []

    def counting(name: str) -> Any:
        method = getattr(InfoBlockReader, name)

        def wrapper(self: Any, *args: Any) -> Any:
            result = method(self, *args)
            from_block.append(result is not None)
            return result

        return wrapper

    for name in ("merged", "columns"):
        monkeypatch.setattr(InfoBlockReader, name, counting(name))
    fns = [lambda: SteadyInfoEnv(terminate_prob=0.01, max_steps=10**6) for _ in range(5)]
    run_side_by_side(fns, mode, steps=100, num_workers=2, parent_envs=parent_envs)
    assert sum(from_block) >= 80, "the block was not used"  # steps with an episode end: events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_scalar_infos_take_the_columnar_path_and_match_sync(mode: AutoresetMode) -> None:
    # Scalar-only infos are merged a column at a time (subvec._infos); keys that
    # come and go and a key that changes type must still give SyncVectorEnv's exact arrays.
    fns = [lambda: ScalarInfoEnv(terminate_prob=0.02) for _ in range(5)]
    run_side_by_side(fns, mode, steps=300, num_workers=2)
