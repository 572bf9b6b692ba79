"""What differs between the gymnasium and Python versions subvec supports, as a user meets it:
the autoreset modes on gymnasium 1.0 (which has no ``AutoresetMode``); Text spaces, whose
default charset samples by the process's hash seed before gymnasium 1.4; Python 3.12's
warning about forking a multi-threaded process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from subvec import SubprocVectorEnv
from subvec._compat import (
    GYM_029,
    GYM_VERSION,
    NAMES_AUTORESET_MODE,
    AutoresetMode,
    _add_info_with_final_obs,
    gym_version,
)
from tests.envs import ZooEnv
from tests.helpers import assert_same, child_env
from tests.oracle import require_oracle, sync_vector_env

ROOT = Path(__file__).resolve().parent.parent


def _run(code_or_script: list[str], hash_seed: str) -> subprocess.CompletedProcess[str]:
    env = child_env(PYTHONHASHSEED=hash_seed)
    proc = subprocess.run(
        [sys.executable, *code_or_script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _python(code_or_script: list[str], hash_seed: str) -> str:
    return _run(code_or_script, hash_seed).stdout.strip().splitlines()[-1]


def test_gym_version_reads_releases_and_pre_releases() -> None:
    assert gym_version("1.0.0") == (1, 0, 0)
    assert gym_version("0.29.1") == (0, 29, 1)
    assert gym_version("1.1.0a1") == (1, 1, 0)
    assert gym_version("2") == (2, 0, 0)
    with pytest.raises(ImportError, match="cannot read"):
        gym_version("unknown")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["NextStep", "same_step", "DISABLED", AutoresetMode.SAME_STEP])
def test_every_autoreset_mode_by_value_name_or_member(mode: object) -> None:
    # gymnasium 1.0 has no AutoresetMode: subvec's own enum has 1.1's members and values, so
    # the same spellings work on every gymnasium
    # (gymnasium 0.29 has the same step's mode only: tests/test_gym029.py refuses the others)
    want = AutoresetMode({"same_step": "SameStep", "DISABLED": "Disabled"}.get(str(mode), mode))
    if GYM_029 and want is not AutoresetMode.SAME_STEP:
        pytest.skip("gymnasium 0.29 has SAME_STEP only")
    fns = [lambda: ZooEnv(max_steps=2, terminate_prob=0.0)] * 2
    with SubprocVectorEnv(fns, num_workers=1, autoreset_mode=mode) as envs:  # type: ignore[arg-type]
        assert envs.autoreset_mode is want
        envs.reset(seed=0)
        actions = np.zeros(2, np.int64)
        envs.step(actions)
        _, _, _, truncations, infos = envs.step(actions)
        assert truncations.all()
        if envs.autoreset_mode is AutoresetMode.SAME_STEP:
            assert infos["_final_observation" if GYM_029 else "_final_obs"].all()


@pytest.mark.timeout(60)
def test_the_default_text_charset_follows_the_hash_seed_before_gymnasium_1_4() -> None:
    # Why the suite's Text spaces name their charset (tests/envs.py): the same seed, two
    # hash seeds, two strings before gymnasium 1.4 (which sorts the charset), one from 1.4 on
    code = [
        "-c",
        "from gymnasium import spaces; s = spaces.Text(8); s.seed(0); print(s.sample())",
    ]
    first, second = (_python(code, hash_seed) for hash_seed in ("1", "2"))
    assert (first != second) is (GYM_VERSION < (1, 4, 0)), (first, second)


@pytest.mark.timeout(120)
def test_text_observations_match_sync_on_every_gymnasium_with_the_hash_seed_set() -> None:
    # subvec's workers inherit the parent's environment: with PYTHONHASHSEED set they order a
    # frozenset charset as the parent does, so a seeded Text space samples the same strings
    report = json.loads(_python([str(ROOT / "tests" / "scripts" / "text_samples.py")], "7"))
    assert report["forkserver"] == report["sync"]
    assert report["spawn"] == report["sync"]
    assert all(len(set(step)) == 2 for step in report["sync"]), "each env its own string"


FORK_SCRIPT = """
import os, signal, time
import numpy as np
from subvec import SubprocVectorEnv
from tests.envs import make_zoo

envs = SubprocVectorEnv([make_zoo("box_f32")] * 4, num_workers=2, context="fork",
                        on_worker_failure="restart")
envs.reset(seed=0)
os.kill(envs.worker_pids[1], signal.SIGKILL)
deadline = time.monotonic() + 30
while not envs.restarts and time.monotonic() < deadline:
    envs.step(np.zeros(4, np.int64))
assert envs.restarts, "the killed worker was not replaced"
envs.step(np.zeros(4, np.int64))
envs.close()
print("ok")
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python < 3.12 does not warn on fork")
def test_subvec_forks_its_workers_from_a_single_threaded_parent() -> None:
    # Python 3.12+ warns (DeprecationWarning) when a multi-threaded process forks. The suite
    # ignores that warning (pyproject.toml) because pytest's faulthandler watchdog is a thread
    # of every test process; here, in an interpreter without it and with every such warning
    # shown (os.fork cannot raise it: an error there is dropped), subvec's parent starts its
    # forked workers and a replacement without a thread
    proc = _run(["-W", "always::DeprecationWarning", "-c", FORK_SCRIPT], "0")
    assert proc.stdout.strip() == "ok"
    assert "multi-threaded, use of fork()" not in proc.stderr, proc.stderr[-3000:]


def test_the_merge_for_gymnasium_1_0_is_gymnasium_1_1s() -> None:
    # On gymnasium 1.0, subvec merges infos with its own copy of 1.1's _add_info (1.0's
    # splits a dict final_obs up): held here to 1.1+'s own, where one is installed
    if not NAMES_AUTORESET_MODE:
        pytest.skip("gymnasium 1.0 has no 1.1 _add_info to compare with")
    from gymnasium.vector.vector_env import VectorEnv

    class Rows:
        num_envs = 3
        _add_info = VectorEnv._add_info  # 1.1's recurses through self

    events = [
        (0, {"n": 1, "x": 0.5, "flag": True, "name": "a", "arr": np.arange(2.0)}),
        (2, {"final_obs": {"pos": np.ones(2), "t": "text"}, "final_info": {"n": 4}}),
        (1, {"nested": {"deep": {"k": np.int16(3)}}, "n": 7}),
        (2, {"final_obs": {"pos": np.zeros(2), "t": "other"}, "x": 1.5}),
    ]
    ours: dict[str, object] = {}
    theirs: dict[str, object] = {}
    for env_index, info in events:
        ours = _add_info_with_final_obs(Rows(), ours, info, env_index)
        theirs = Rows()._add_info(theirs, info, env_index)
    assert list(ours) == list(theirs)
    assert_same(ours, theirs, "infos")
    assert isinstance(ours["final_obs"], np.ndarray) and ours["final_obs"].dtype == object


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "mask",
    [
        [True, True, True],
        np.ones(2, np.bool_),
        np.ones((1, 3), np.bool_),
        np.ones(3, np.int8),
        np.zeros(3, np.bool_),
    ],
    ids=["list", "short", "2d", "int8", "none_true"],
)
def test_a_bad_reset_mask_fails_as_the_installed_sync_vector_env_fails(mask: object) -> None:
    # gymnasium 1.4 raises TypeError/ValueError, 1.1-1.3 assert with other words: subvec's
    # error is the installed gymnasium's, type and message
    require_oracle(AutoresetMode.DISABLED)
    fns = [lambda: ZooEnv(max_steps=10**6, terminate_prob=0.0)] * 3
    oracle = sync_vector_env(fns, autoreset_mode=AutoresetMode.DISABLED)
    with SubprocVectorEnv(fns, num_workers=2, autoreset_mode="Disabled") as envs:
        envs.reset(seed=0)
        oracle.reset(seed=0)
        with pytest.raises(Exception) as want:
            oracle.reset(options={"reset_mask": mask})
        with pytest.raises(want.type) as got:
            envs.reset(options={"reset_mask": mask})
        assert str(got.value) == str(want.value)
        envs.reset(options={"reset_mask": np.ones(3, np.bool_)})  # still usable
    oracle.close()
