"""Recycling: workers replaced between episodes (``recycle_every``, ``worker_max_rss``).

The envs report the pid of the process that made each observation (tests/envs.py
``EpisodeEnv``), so every row says which worker made it: an episode must come whole from one
process, and the process may change only between two episodes.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import numpy as np
import pytest

from subvec import BrokenVectorEnvError, SubprocVectorEnv
from subvec._compat import AutoresetMode
from tests.envs import BuildOnce, EpisodeEnv
from tests.helpers import gone
from tests.oracle import DEFAULT_MODE, require_offered

pytestmark = pytest.mark.timeout(60)

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def _fns(lengths: list[int], **kw: Any) -> list[Any]:
    return [functools.partial(EpisodeEnv, length, **kw) for length in lengths]


def _row(obs: np.ndarray) -> tuple[int, int, float]:
    return int(obs[0]), int(obs[1]), float(obs[2])


def _info(infos: Any, key: str, i: int) -> Any:
    """``key`` of env ``i`` in any info format (legacy names the final observation its way)."""
    if isinstance(infos, list):
        return infos[i][key]
    if key == "final_obs" and "final_observation" in infos:
        return infos["final_observation"][i]
    return infos[key][i]


def play(envs: SubprocVectorEnv, steps: int, seed: int | None = 0) -> list[list[dict[str, Any]]]:
    """Step ``envs`` ``steps`` times, checking the autoreset contract of its mode row by row;
    per env, its episodes: ``{"rows": [(pid, t, first), ...], "end": "terminated" |
    "restarted" | None}`` (None: still running)."""
    mode = envs.autoreset_mode
    n = envs.num_envs
    obs, infos = envs.reset(seed=seed)
    episodes: list[list[dict[str, Any]]] = [
        [{"rows": [_row(obs[i])], "end": None}] for i in range(n)
    ]
    for i in range(n):
        assert _info(infos, "reset_pid", i) == obs[i][0]
    ended = np.zeros(n, dtype=bool)
    for _ in range(steps):
        obs, rewards, terms, truncs, infos = envs.step(np.zeros(n, dtype=np.int64))
        if isinstance(infos, list):
            restarted = np.array([bool(d.get("worker_restarted")) for d in infos])
        else:
            restarted = infos.get("worker_restarted", np.zeros(n, dtype=bool))
        for i in range(n):
            current = episodes[i][-1]
            row = _row(obs[i])
            if restarted[i]:
                assert truncs[i] and not terms[i] and rewards[i] == 0.0
                current["end"] = "restarted"
                episodes[i].append({"rows": [row], "end": None})
                assert row[1] == 0
                continue
            assert not truncs[i], f"env {i} truncated: nothing may cut an episode short"
            if mode is AutoresetMode.NEXT_STEP and ended[i]:
                # the step after the end is the reset step: reward 0, no flags, its infos
                assert rewards[i] == 0.0 and not terms[i]
                assert row[1] == 0 and _info(infos, "reset_pid", i) == row[0]
                episodes[i].append({"rows": [row], "end": None})
                continue
            if mode is AutoresetMode.SAME_STEP and terms[i]:
                current["rows"].append(_row(_info(infos, "final_obs", i)))
                current["end"] = "terminated"
                assert row[1] == 0 and _info(infos, "reset_pid", i) == row[0]
                episodes[i].append({"rows": [row], "end": None})
                continue
            current["rows"].append(row)
            if terms[i]:
                current["end"] = "terminated"
        # a restarted env's row is its replacement's reset already (see docs/reliability.md)
        ended = (terms | truncs) & ~restarted
        if mode is AutoresetMode.DISABLED and ended.any():
            obs, infos = envs.reset(options={"reset_mask": ended.copy()})
            for i in np.flatnonzero(ended):
                row = _row(obs[i])
                assert row[1] == 0 and _info(infos, "reset_pid", i) == row[0]
                episodes[i].append({"rows": [row], "end": None})
            ended[:] = False
    return episodes


def check_whole(episodes: list[dict[str, Any]], length: int) -> None:
    """Each episode from one process, its steps 0..length in order."""
    for k, episode in enumerate(episodes):
        pids = {pid for pid, _, _ in episode["rows"]}
        assert len(pids) == 1, f"episode {k} spans processes {pids}"
        ts = [t for _, t, _ in episode["rows"]]
        assert ts == list(range(len(ts))), f"episode {k} steps {ts}"
        if episode["end"] == "terminated":
            assert ts[-1] == length


def episode_pids(episodes: list[dict[str, Any]]) -> list[int]:
    return [episode["rows"][0][0] for episode in episodes]


@pytest.mark.parametrize(
    ("mode", "options"),
    [(mode, {}) for mode in MODES]
    + [
        (AutoresetMode.NEXT_STEP, {"shared_memory": False}),
        (AutoresetMode.SAME_STEP, {"shared_memory": False}),
        (AutoresetMode.NEXT_STEP, {"info_format": "list"}),
        (AutoresetMode.SAME_STEP, {"info_format": "list"}),
        (AutoresetMode.SAME_STEP, {"info_format": "legacy"}),
        (AutoresetMode.NEXT_STEP, {"context": "spawn"}),
    ],
    ids=lambda v: v.value if isinstance(v, AutoresetMode) else "-".join(map(str, v.values())),
)
def test_recycle_every_replaces_workers_exactly_between_episodes(
    mode: AutoresetMode, options: dict[str, Any]
) -> None:
    require_offered(mode, options.get("info_format"))
    lengths = [3, 4]
    with SubprocVectorEnv(_fns(lengths), autoreset_mode=mode, recycle_every=2, **options) as envs:
        assert envs.num_workers == 2  # one env per worker by default when recycling
        first_pids = envs.worker_pids
        per_env = play(envs, steps=30)
        final_pids = envs.worker_pids
        recycles = list(envs.recycles)
        assert envs.restarts == []
    expected = 0
    for i, (episodes, length) in enumerate(zip(per_env, lengths)):
        check_whole(episodes, length)
        pids = episode_pids(episodes)
        assert pids[0] == first_pids[i]
        assert pids[-1] == final_pids[i]
        done = [e for e in episodes if e["end"] == "terminated"]
        assert len(done) >= 4, "the run is too short to recycle twice"
        # two episodes per process, then a new process
        for k in range(1, len(pids)):
            if k % 2:
                assert pids[k] == pids[k - 1], f"env {i}: recycled after {k} episodes"
            else:
                assert pids[k] != pids[k - 1], f"env {i}: not recycled after episode {k}"
        assert len(set(pids)) == len(pids[::2])
        expected += len(pids[::2]) - 1
        mine = [r for r in recycles if r.env_indices == (i,)]
        assert [r.worker for r in mine] == [i] * (len(pids[::2]) - 1)
        assert all("recycled after 2 episodes" in r.reason for r in mine)
    assert len(recycles) == expected


def test_rebuilt_envs_are_seeded_deterministically() -> None:
    def run() -> list[list[tuple[int, float]]]:
        with SubprocVectorEnv(_fns([2, 2]), recycle_every=1) as envs:
            episodes = play(envs, steps=12, seed=5)
        return [[(e["rows"][0][1], e["rows"][0][2]) for e in per] for per in episodes]

    first, second = run(), run()
    assert first == second
    # env i's k-th rebuild resets with SeedSequence([5 + i, k]).generate_state(1)[0]
    for i, starts in enumerate(first):
        for k, (_, drawn) in enumerate(starts[1:], start=1):
            seed = int(np.random.SeedSequence([5 + i, k]).generate_state(1)[0])
            probe = EpisodeEnv()
            probe.reset(seed=seed)
            assert drawn == probe.first
    assert first[0][1] != first[0][2]


def test_worker_max_rss_recycles_a_leaking_worker() -> None:
    leak = 16 * 2**20  # per step
    limit = 160 * 2**20
    with SubprocVectorEnv(_fns([3], leak_bytes=leak), worker_max_rss=limit) as envs:
        per_env = play(envs, steps=40)
        recycles = list(envs.recycles)
        rss = envs.stats()[0].rss
    episodes = per_env[0]
    check_whole(episodes, 3)
    pids = episode_pids(episodes)
    assert recycles, "the leak never crossed worker_max_rss"
    assert all("worker_max_rss" in r.reason for r in recycles)
    assert len(set(pids)) == len(recycles) + 1
    # 48 MiB leaked per episode: a worker over 160 MiB is replaced within 4 episodes
    runs = [len(list(group)) for group in _runs(pids)]
    assert max(runs[:-1]) <= 4
    assert rss is not None and rss < limit + 3 * leak


def _runs(values: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1].append(v)
        else:
            out.append([v])
    return out


def test_recycling_after_a_crash_restart_counts_from_the_new_process(tmp_path: Any) -> None:
    marker = str(tmp_path / "crashed")
    fns = _fns([3], crash_marker=marker)
    with SubprocVectorEnv(fns, recycle_every=2, on_worker_failure="restart", timeout=20) as envs:
        per_env = play(envs, steps=30)
        restarts, recycles = list(envs.restarts), list(envs.recycles)
        stats = envs.stats()
    episodes = per_env[0]
    assert [e["end"] for e in episodes[:1]] == ["restarted"]
    check_whole(episodes[1:], 3)
    assert len(restarts) == 1 and "died" in restarts[0].reason
    pids = episode_pids(episodes)
    # the crashed process made one cut episode; the replacement's count starts at zero
    assert pids[0] != pids[1]
    after = pids[1:]
    for k in range(1, len(after)):
        assert (after[k] == after[k - 1]) == bool(k % 2)
    assert len(recycles) == len(after[::2]) - 1 >= 2
    assert stats[0].restarts == 1 and stats[0].recycles == len(recycles)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"recycle_every": 0}, ValueError, "recycle_every must be at least 1"),
        ({"recycle_every": -3}, ValueError, "recycle_every must be at least 1"),
        ({"recycle_every": 1.5}, TypeError, "recycle_every must be a positive int"),
        ({"recycle_every": "2"}, TypeError, "recycle_every must be a positive int"),
        ({"recycle_every": True}, TypeError, "recycle_every must be a positive int"),
        ({"worker_max_rss": 0}, ValueError, "worker_max_rss must be at least 1"),
        ({"worker_max_rss": 1e9}, TypeError, "worker_max_rss must be a positive int"),
        ({"recycle_every": 2, "envs_per_worker": 2}, ValueError, "envs_per_worker=1"),
        ({"recycle_every": 2, "num_workers": 1}, ValueError, "num_workers=1 for 2 envs"),
        ({"worker_max_rss": 2**30, "parent_envs": 1}, ValueError, "parent_envs=0"),
    ],
)
def test_bad_recycling_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SubprocVectorEnv(_fns([3, 3]), **kwargs)


def test_asynchronous_stepping_is_refused_with_recycling() -> None:
    with SubprocVectorEnv(_fns([3]), recycle_every=2) as envs:
        with pytest.raises(ValueError, match="asynchronous stepping is not available"):
            envs.async_reset(seed=0)
        envs.reset(seed=0)  # still usable in lock-step
        envs.step(np.zeros(1, dtype=np.int64))


def test_a_replacement_that_cannot_be_built_breaks_the_vector_env(tmp_path: Any) -> None:
    factory = BuildOnce(str(tmp_path / "built"), "raise", functools.partial(EpisodeEnv, 2))
    with SubprocVectorEnv([factory], recycle_every=1) as envs:
        envs.reset(seed=0)
        actions = np.zeros(1, dtype=np.int64)
        envs.step(actions)
        if DEFAULT_MODE is AutoresetMode.SAME_STEP:  # gymnasium 0.29: reset in the ending step
            with pytest.raises(ValueError, match="cannot be built again"):
                envs.step(actions)  # the episode ends; the replacement's factory raises
        else:
            _, _, terms, _, _ = envs.step(actions)
            assert terms[0]  # the episode ended whole; the worker is due
            with pytest.raises(ValueError, match="cannot be built again"):
                envs.step(actions)  # the reset step: the replacement's factory raises
        with pytest.raises(BrokenVectorEnvError, match="recycling worker 0"):
            envs.step(actions)
        [record] = envs.recycles
        assert record.reason.startswith(
            "recycled after 1 episodes; its replacement failed: ValueError: this env cannot "
            "be built again [raised in env 0"
        )


def test_a_dropped_recycling_env_is_freed_at_once_and_reaps_its_workers() -> None:
    envs = SubprocVectorEnv(_fns([2, 2]), recycle_every=1)
    play(envs, 6)
    assert envs.recycles  # the recycling hooks ran
    pids = list(envs.worker_pids)
    collected = weakref.ref(envs)
    del envs
    # No reference cycle through the recycler's hooks into the front: freed by its
    # reference count, its workers reaped at once.
    assert collected() is None
    assert all(gone(pid) for pid in pids if pid is not None)
