"""RayVectorEnv across two Ray nodes on this machine (``ray.cluster_utils.Cluster``, loopback).

``strict_spread`` must put the actors on different nodes, and the results must still be
SyncVectorEnv's. RayVectorEnv connects to the cluster itself (``address=``), so it owns that
connection and drops it at close, leaving the cluster up.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import gymnasium as gym
import pytest

# Loopback only: without it Ray binds the machine's interface address (read when ray imports).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.placement_group import placement_group_table  # noqa: E402

from subvec._compat import AutoresetMode  # noqa: E402
from subvec.ray import RayVectorEnv  # noqa: E402
from tests.oracle import DEFAULT_MODE  # noqa: E402
from tests.test_chunks import run_against_oracle  # noqa: E402
from tests.test_conformance import _zoo_fns, run_side_by_side  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(90)]

_NODE = {"num_cpus": 1, "object_store_memory": 100 * 2**20}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    two = Cluster(initialize_head=True, head_node_args={**_NODE, "include_dashboard": False})
    try:
        two.add_node(**_NODE)
        two.wait_for_nodes()
        yield two
    finally:
        if ray.is_initialized():
            ray.shutdown()
        two.shutdown()


@pytest.mark.slow  # several seconds: out of the quick loop, in CI's slow leg
def test_strict_spread_puts_actors_on_different_nodes_and_matches_sync(cluster: Cluster) -> None:
    assert not ray.is_initialized()
    make = functools.partial(
        RayVectorEnv, address=cluster.address, placement="strict_spread", start_timeout=60
    )
    envs = run_side_by_side(_zoo_fns("dict_nest", 4), AutoresetMode.SAME_STEP, 20, make=make)
    records = envs.placement
    assert envs.num_actors == 2  # one per alive node by default
    assert len({r.node_id for r in records}) == 2
    assert [r.env_indices for r in records] == [(0, 1), (2, 3)]
    assert all(r.ip == "127.0.0.1" for r in records)
    # the connection was RayVectorEnv's: dropped at close; the cluster is still up
    assert not ray.is_initialized()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        actors = ray._private.state.actors().values()
        assert all(a["State"] == "DEAD" for a in actors)
        assert all(g["state"] == "REMOVED" for g in placement_group_table().values())
    finally:
        ray.shutdown()


def test_chunks_across_two_nodes_match_sync_per_env(cluster: Cluster) -> None:
    fns = [lambda: gym.make("CartPole-v1")] * 4
    make = functools.partial(
        RayVectorEnv, address=cluster.address, placement="strict_spread", start_timeout=60
    )
    with make(fns, autoreset_mode=DEFAULT_MODE) as envs:
        assert len({r.node_id for r in envs.placement}) == 2
        inside = run_against_oracle(envs, fns, DEFAULT_MODE, [3, 8, 8, 8, 8])
    assert inside >= 1
