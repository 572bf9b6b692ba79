"""Actions as torch tensors: a CPU tensor batch goes through the shared block in the action
space's dtype, so the envs get exactly what a numpy batch of that dtype gives them; a tensor on
another device is refused before anything is sent."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from subvec import SubprocVectorEnv
from tests.envs import ZooEnv
from tests.helpers import assert_same

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NUM_ENVS = 4
SPACES = {
    "box_f32": spaces.Box(-1.0, 1.0, (3,), np.float32),
    "discrete": spaces.Discrete(5),
    "multibinary": spaces.MultiBinary(4),
    "dict": spaces.Dict(
        {"arm": spaces.Box(-1.0, 1.0, (7,), np.float32), "gripper": spaces.Discrete(2)}
    ),
}


def _envs(act_space: spaces.Space[Any], **kwargs: Any) -> SubprocVectorEnv:
    fns = [lambda: ZooEnv(act_space=act_space, max_steps=10**6, terminate_prob=0.0)] * NUM_ENVS
    envs = SubprocVectorEnv(fns, num_workers=2, **kwargs)
    envs.reset(seed=0)
    return envs


def _as_tensor(actions: Any, dtype: Any = None) -> Any:
    if isinstance(actions, dict):
        return {key: _as_tensor(value, dtype) for key, value in actions.items()}
    # MultiBinary's int8 as torch's bool (what a Bernoulli policy returns)
    tensor = torch.from_numpy(actions.astype(bool) if actions.dtype == np.int8 else actions)
    return tensor if dtype is None else tensor.to(dtype)


def _received(envs: SubprocVectorEnv) -> tuple[Any, ...]:
    return envs.get_attr("last_action")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(SPACES))
def test_tensor_actions_give_exactly_what_numpy_actions_give(name: str) -> None:
    act_space = SPACES[name]
    envs = _envs(act_space)
    try:
        act_space_batch = envs.action_space
        act_space_batch.seed(4)
        for t in range(3):
            actions = act_space_batch.sample()
            envs.step(actions)
            want = _received(envs)
            envs.step(_as_tensor(actions))
            assert_same(_received(envs), want, f"{name} step {t}")
            envs.send(_as_tensor(actions), list(range(NUM_ENVS)))  # asynchronous stepping
            envs.recv(min_envs=NUM_ENVS)
            assert_same(_received(envs), want, f"{name} send {t}")
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_a_tensor_reaches_the_envs_in_the_spaces_dtype() -> None:
    # A numpy float64 batch reaches the envs as float64 (SyncVectorEnv hands on the caller's
    # dtype); a tensor, whatever its dtype, as the space declares: float32 numpy values.
    box = SPACES["box_f32"]
    envs = _envs(box)
    try:
        actions = np.linspace(-1, 1, NUM_ENVS * 3).reshape(NUM_ENVS, 3)
        envs.step(torch.tensor(actions, dtype=torch.float64, requires_grad=True))
        got = _received(envs)
        assert all(type(a) is np.ndarray and a.dtype == np.float32 for a in got)
        envs.step(actions.astype(np.float32))
        assert_same(got, _received(envs))
        envs.step(torch.tensor(actions, dtype=torch.bfloat16))
        assert all(a.dtype == np.float32 for a in _received(envs))
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_tensors_off_the_cpu_and_uncastable_tensors_are_refused() -> None:
    # The meta device stands in for CUDA here (no GPU): any device but the CPU is refused.
    envs = _envs(SPACES["dict"])
    try:
        off_cpu = {
            "arm": torch.zeros((NUM_ENVS, 7), device="meta"),
            "gripper": torch.zeros(NUM_ENVS, dtype=torch.int64),
        }
        with pytest.raises(ValueError, match=r"actions\['arm'\].*device meta.*\.cpu\(\)"):
            envs.step(off_cpu)
        with pytest.raises(ValueError, match=r"actions\['arm'\].*device meta"):
            envs.step({**off_cpu, "gripper": [0] * NUM_ENVS})  # a list: the batch goes by value
        with pytest.raises(ValueError, match=r"device meta.*\.cpu\(\)"):
            envs.send(torch.zeros((1, 7), device="meta"), [0])  # any leaf layout: refused
        floats = {"arm": torch.zeros((NUM_ENVS, 7)), "gripper": torch.zeros(NUM_ENVS)}
        with pytest.raises(TypeError, match=r"actions\['gripper'\].*torch.float32.*int64"):
            envs.step(floats)
        # nothing was sent: the vector env steps on
        envs.step(_as_tensor(envs.action_space.sample()))
    finally:
        envs.close()
