"""Tests for subvec._process.topology: cpulist parsing, sysfs discovery, planning, pinning, CLI."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from subvec import cli
from subvec._process.topology import (
    Placement,
    PlacementReport,
    Topology,
    apply_placement,
    cpu_quota,
    discover,
    format_cpulist,
    parse_cpulist,
    plan_placement,
    usable_cpus,
)
from tests.helpers import child_env

HAVE_CPUS_0_1 = {0, 1} <= os.sched_getaffinity(0)
needs_cpus_0_1 = pytest.mark.skipif(not HAVE_CPUS_0_1, reason="needs CPUs 0 and 1 allowed")
WIDE = range(64)  # an "allowed" set covering every CPU of the fake trees


def make_sysfs(
    root: Path,
    nodes: dict[int, str],
    *,
    online: str | None = None,
    siblings: dict[int, str] | None = None,
    core_ids: dict[int, int] | None = None,
) -> Path:
    """Write a fake ``<root>/devices/system/{node,cpu}`` tree and return ``root``."""
    node_dir = root / "devices" / "system" / "node"
    node_dir.mkdir(parents=True)
    # Files the real directory also holds, which discovery must skip.
    (node_dir / "online").write_text(format_cpulist(nodes) + "\n")
    (node_dir / "has_cpu").write_text("0\n")
    for node, cpulist in nodes.items():
        (node_dir / f"node{node}").mkdir()
        (node_dir / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    cpu_dir = root / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    if online is not None:
        (cpu_dir / "online").write_text(online + "\n")
    for cpu, text in (siblings or {}).items():
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True, exist_ok=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    for cpu, core in (core_ids or {}).items():
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True, exist_ok=True)
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "physical_package_id").write_text("0\n")
    return root


# ---------------------------------------------------------------------------- cpulist strings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-3,8-11,15", (0, 1, 2, 3, 8, 9, 10, 11, 15)),
        ("0-3,8-11,15\n", (0, 1, 2, 3, 8, 9, 10, 11, 15)),
        ("", ()),
        ("\n", ()),
        ("   \n", ()),
        (" 7 ", (7,)),
        ("5,1,1,0-1", (0, 1, 5)),
        ("2-2", (2,)),
        ("0 - 1, 4", (0, 1, 4)),
    ],
)
def test_parse_cpulist(text: str, expected: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "3-1", "0-", "-1", "1,,2", "0-3:2", "1.5"])
def test_parse_cpulist_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="malformed cpulist"):
        parse_cpulist(text)


@pytest.mark.parametrize("text", ["0-3,8-11,15", "0", "0,2,4", "1-2,5-6", ""])
def test_format_cpulist_round_trips(text: str) -> None:
    assert format_cpulist(parse_cpulist(text)) == text


# ---------------------------------------------------------------------------- discovery


def test_discover_two_nodes(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, online="0-7")
    topo = discover(root, allowed=WIDE)
    assert topo.nodes == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert topo.online == tuple(range(8))
    assert topo.allowed == tuple(WIDE)
    assert topo.cpus == tuple(range(8))
    assert "sysfs" in topo.source


def test_discover_four_nodes_interleaved_cpus(tmp_path: Path) -> None:
    # Interleaved numbering, as on many two-socket Intel boxes with SMT.
    nodes = {0: "0-3,16-19", 1: "4-7,20-23", 2: "8-11,24-27", 3: "12-15,28-31"}
    topo = discover(make_sysfs(tmp_path, nodes, online="0-31"), allowed=WIDE)
    assert list(topo.nodes) == [0, 1, 2, 3]
    assert topo.nodes[2] == (8, 9, 10, 11, 24, 25, 26, 27)
    plan = plan_placement(topo, 6)
    assert plan is not None
    assert [p.node for p in plan] == [0, 1, 2, 3, 0, 1]
    assert [p.cpus for p in plan] == [topo.nodes[node] for node in (0, 1, 2, 3, 0, 1)]


def test_discover_sorts_nodes_numerically(tmp_path: Path) -> None:
    topo = discover(make_sysfs(tmp_path, {10: "2", 2: "1", 0: "0"}), allowed=WIDE)
    assert list(topo.nodes) == [0, 2, 10]


def test_discover_drops_offline_cpus(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, online="0-2,5,7")
    topo = discover(root, allowed=WIDE)
    assert topo.nodes == {0: (0, 1, 2), 1: (5, 7)}


def test_discover_drops_memory_only_and_offline_nodes(tmp_path: Path) -> None:
    # node 2: memory only (CXL / HBM style: empty cpulist); node 3: all its CPUs offline.
    root = make_sysfs(tmp_path, {0: "0-1", 1: "2-3", 2: "", 3: "4-5"}, online="0-3")
    topo = discover(root, allowed=WIDE)
    assert topo.nodes == {0: (0, 1), 1: (2, 3)}


def test_discover_restricted_allowed_set(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, online="0-7")
    topo = discover(root, allowed={1, 4, 5})
    assert topo.nodes == {0: (1,), 1: (4, 5)}
    assert topo.allowed == (1, 4, 5)
    # A cgroup that keeps one node only: "auto" sees a single node and places nothing.
    only_node1 = {4, 5, 6}
    assert discover(root, allowed=only_node1).nodes == {1: (4, 5, 6)}
    assert plan_placement("auto", 4, sysfs_root=root, allowed=only_node1) is None


def test_discover_defaults_to_process_affinity(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: "0-63"})
    topo = discover(root)
    mine = tuple(sorted(os.sched_getaffinity(0)))
    assert topo.allowed == mine
    assert topo.cpus == tuple(cpu for cpu in mine if cpu < 64)


def test_discover_without_sysfs_gives_one_node(tmp_path: Path) -> None:
    topo = discover(tmp_path / "missing", allowed={3, 1, 2})
    assert topo.nodes == {0: (1, 2, 3)}
    assert topo.online is None
    assert topo.source.startswith("fallback")


def test_discover_without_node_dir_uses_online(tmp_path: Path) -> None:
    cpu_dir = tmp_path / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text("0-1\n")
    topo = discover(tmp_path, allowed={0, 1, 2, 3})
    assert topo.nodes == {0: (0, 1)}
    assert topo.source.startswith("fallback")


def test_discover_no_usable_cpu_is_an_error(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: "0-3"}, online="0-3")
    with pytest.raises(ValueError, match="no usable CPU"):
        discover(root, allowed={8, 9})


def test_discover_malformed_cpulist(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: "0-3", 1: "garbage"})
    with pytest.raises(ValueError, match="malformed cpulist 'garbage"):
        discover(root, allowed=WIDE)


def test_discover_real_sysfs() -> None:
    topo = discover()
    assert topo.nodes
    assert set(topo.cpus) <= os.sched_getaffinity(0)


# ---------------------------------------------------------------------------- planning


@pytest.fixture
def two_nodes(tmp_path: Path) -> Path:
    return make_sysfs(tmp_path, {0: "0-3", 1: "4-7"}, online="0-7")


def test_plan_auto_round_robin_over_nodes(two_nodes: Path) -> None:
    plan = plan_placement("auto", 5, sysfs_root=two_nodes, allowed=WIDE)
    node0, node1 = (0, 1, 2, 3), (4, 5, 6, 7)
    assert plan == [
        Placement(0, 0, node0),
        Placement(1, 1, node1),
        Placement(2, 0, node0),
        Placement(3, 1, node1),
        Placement(4, 0, node0),
    ]


def test_plan_auto_single_node_places_nothing(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: "0-7"})
    assert plan_placement("auto", 4, sysfs_root=root, allowed=WIDE) is None
    assert plan_placement("auto", 4, "core", sysfs_root=root, allowed=WIDE) is None


def test_plan_true_forces_single_node(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: "0-7"})
    plan = plan_placement(True, 2, sysfs_root=root, allowed=WIDE)
    assert plan == [Placement(0, 0, tuple(range(8))), Placement(1, 0, tuple(range(8)))]


@pytest.mark.parametrize("numa", [None, False])
def test_plan_disabled(numa: bool | None, two_nodes: Path) -> None:
    assert plan_placement(numa, 4, sysfs_root=two_nodes, allowed=WIDE) is None


def test_plan_core_spreads_physical_cores_first(tmp_path: Path) -> None:
    # Two nodes of 4 cores x 2 threads; siblings are n and n + 8.
    siblings = {cpu: f"{cpu % 8},{cpu % 8 + 8}" for cpu in range(16)}
    root = make_sysfs(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15"}, siblings=siblings)
    topo = discover(root, allowed=WIDE)
    plan = plan_placement(topo, 10, "core")
    assert plan is not None
    assert [p.node for p in plan] == [0, 1] * 5
    node0 = [p.cpus for p in plan if p.node == 0]
    node1 = [p.cpus for p in plan if p.node == 1]
    assert node0 == [(0,), (1,), (2,), (3,), (8,)]
    assert node1 == [(4,), (5,), (6,), (7,), (12,)]


def test_plan_core_adjacent_siblings(tmp_path: Path) -> None:
    # Siblings numbered next to each other (0,1), (2,3), ...: spread takes even CPUs first.
    siblings = {cpu: f"{cpu - cpu % 2}-{cpu - cpu % 2 + 1}" for cpu in range(8)}
    topo = discover(make_sysfs(tmp_path, {0: "0-7"}, siblings=siblings), allowed=WIDE)
    plan = plan_placement(topo, 6, "core")
    assert plan is not None
    assert [p.cpus for p in plan] == [(0,), (2,), (4,), (6,), (1,), (3,)]


def test_plan_core_falls_back_to_core_id(tmp_path: Path) -> None:
    core_ids = {0: 0, 1: 0, 2: 1, 3: 1}
    topo = discover(make_sysfs(tmp_path, {0: "0-3"}, core_ids=core_ids), allowed=WIDE)
    assert topo.cores == {0: 0, 1: 0, 2: 2, 3: 2}
    plan = plan_placement(topo, 4, "core")
    assert plan is not None
    assert [p.cpus for p in plan] == [(0,), (2,), (1,), (3,)]


def test_plan_core_without_topology_files_uses_cpu_ids(tmp_path: Path) -> None:
    topo = discover(make_sysfs(tmp_path, {0: "0-3"}), allowed=WIDE)
    assert topo.cores == {}
    plan = plan_placement(topo, 3, "core")
    assert plan is not None
    assert [p.cpus for p in plan] == [(0,), (1,), (2,)]


def test_plan_core_downgrades_when_workers_outnumber_cpus(tmp_path: Path) -> None:
    topo = discover(make_sysfs(tmp_path, {0: "0-1", 1: "2-4"}), allowed=WIDE)
    # 5 workers: node 0 gets 3 (> 2 CPUs) and is downgraded; node 1 gets 2 (<= 3 CPUs).
    with pytest.warns(UserWarning, match=r"more workers than CPUs on node 0 \(3 workers, 2 CPUs"):
        plan = plan_placement(topo, 5, "core")
    assert plan == [
        Placement(0, 0, (0, 1)),
        Placement(1, 1, (2,)),
        Placement(2, 0, (0, 1)),
        Placement(3, 1, (3,)),
        Placement(4, 0, (0, 1)),
    ]


def test_plan_explicit_dict() -> None:
    plan = plan_placement({0: [0], 1: [1]}, 3, allowed={0, 1})
    assert plan == [Placement(0, 0, (0,)), Placement(1, 1, (1,)), Placement(2, 0, (0,))]
    # Lists are normalised (sorted, deduplicated) and a dict is placed even with one node.
    assert plan_placement({3: [1, 0, 1]}, 1, allowed={0, 1}) == [Placement(0, 3, (0, 1))]


@needs_cpus_0_1
def test_plan_explicit_dict_checks_real_affinity() -> None:
    assert plan_placement({0: [0], 1: [1]}, 2) == [Placement(0, 0, (0,)), Placement(1, 1, (1,))]
    with pytest.raises(ValueError, match="not in the allowed set"):
        plan_placement({0: [0], 1: [max(os.sched_getaffinity(0)) + 1]}, 2)


def test_plan_explicit_topology_object() -> None:
    topo = Topology(nodes={1: (5, 4), 0: (2,)}, allowed=(2, 4, 5))
    assert topo.nodes == {0: (2,), 1: (4, 5)}  # normalised
    assert plan_placement(topo, 2, "core") == [Placement(0, 0, (2,)), Placement(1, 1, (4,))]


@pytest.mark.parametrize(
    ("mapping", "error", "match"),
    [
        ({0: [0], 1: []}, ValueError, "node 1 has an empty CPU list"),
        ({0: [0, 9]}, ValueError, r"node 0: CPUs 9 are not in the allowed set 0-3"),
        ({0: [0, 1], 1: [1, 2]}, ValueError, "CPU 1 is listed under both node 0 and 1"),
        ({0: [-1]}, ValueError, "non-negative ints"),
        ({0: ["1"]}, ValueError, "non-negative ints"),
        ({-1: [0]}, ValueError, "node ids must be non-negative ints"),
        ({"a": [0]}, ValueError, "node ids must be non-negative ints"),
        ({0: "0-1"}, TypeError, "must be an iterable of CPU ids"),
        ({0: 3}, TypeError, "must be an iterable of CPU ids"),
        ({}, ValueError, "at least one node"),
    ],
)
def test_plan_explicit_dict_errors(mapping: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        plan_placement(mapping, 2, allowed=range(4))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"numa": "auto", "num_workers": 2, "pin": "socket"}, ValueError, "unknown pin mode"),
        ({"numa": None, "num_workers": 2, "pin": "cores"}, ValueError, "unknown pin mode"),
        ({"numa": "yes", "num_workers": 2}, ValueError, "unknown numa value 'yes'"),
        ({"numa": 2, "num_workers": 2}, TypeError, "numa must be"),
        ({"numa": [0, 1], "num_workers": 2}, TypeError, "numa must be"),
        ({"numa": "auto", "num_workers": 0}, ValueError, "num_workers must be >= 1"),
        ({"numa": "auto", "num_workers": 2.0}, TypeError, "num_workers must be an int"),
        ({"numa": "auto", "num_workers": True}, TypeError, "num_workers must be an int"),
    ],
)
def test_plan_bad_arguments(
    kwargs: dict[str, object], error: type[Exception], match: str, two_nodes: Path
) -> None:
    with pytest.raises(error, match=match):
        plan_placement(sysfs_root=two_nodes, allowed=WIDE, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- applying


def _child_apply(placement: Placement, conn: Connection) -> None:
    """Start a thread, apply the placement, start another, report every thread's affinity."""
    stop = threading.Event()
    before = threading.Thread(target=stop.wait, name="before")
    before.start()
    try:
        report = apply_placement(placement)
        after = threading.Thread(target=stop.wait, name="after")
        after.start()
        threads = {
            int(tid): tuple(sorted(os.sched_getaffinity(int(tid))))
            for tid in os.listdir("/proc/self/task")
        }
        conn.send((report, threads, before.native_id, after.native_id))
        stop.set()
        after.join()
    finally:
        stop.set()
        before.join()
        conn.close()


def _run_children(placements: list[Placement]) -> list[tuple[object, ...]]:
    ctx = multiprocessing.get_context("spawn")
    started = []
    try:
        for placement in placements:
            parent_conn, child_conn = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child_apply, args=(placement, child_conn))
            proc.start()
            child_conn.close()
            started.append((proc, parent_conn))
        results = []
        for proc, conn in started:
            assert conn.poll(30), f"child {proc.pid} sent nothing"
            results.append((proc.pid, *conn.recv()))
            proc.join(30)
            assert proc.exitcode == 0
        return results
    finally:
        for proc, conn in started:
            conn.close()
            if proc.is_alive():
                proc.kill()
            proc.join(10)
            assert not proc.is_alive()


@needs_cpus_0_1
@pytest.mark.timeout(60)
@pytest.mark.parametrize("cpus", [(0,), (1,), (0, 1)])
def test_apply_placement_pins_every_thread(cpus: tuple[int, ...]) -> None:
    [(pid, report, threads, before_tid, after_tid)] = _run_children([Placement(0, 0, cpus)])
    assert isinstance(report, PlacementReport)
    assert report.pid == pid
    assert report.node == 0
    assert report.cpus == cpus
    assert report.preferred_node in (0, None)  # best effort: None without a usable libnuma
    assert isinstance(threads, dict)
    assert {before_tid, after_tid, pid} <= set(threads)
    assert all(affinity == cpus for affinity in threads.values()), threads


@needs_cpus_0_1
@pytest.mark.timeout(60)
def test_plan_then_apply_round_robin() -> None:
    plan = plan_placement({0: [0], 1: [1]}, 3)
    assert plan is not None
    results = _run_children(plan)
    for placement, (pid, report, threads, *_) in zip(plan, results, strict=True):
        assert isinstance(report, PlacementReport)
        assert isinstance(threads, dict)
        assert (report.pid, report.node, report.cpus) == (pid, placement.node, placement.cpus)
        assert set(threads.values()) == {placement.cpus}
    assert multiprocessing.active_children() == []


def test_apply_placement_none_changes_nothing() -> None:
    mine = tuple(sorted(os.sched_getaffinity(0)))
    assert apply_placement(None) == PlacementReport(os.getpid(), None, mine)
    report = apply_placement(Placement(0, None, None))
    assert report == PlacementReport(os.getpid(), None, mine)
    assert tuple(sorted(os.sched_getaffinity(0))) == mine


def test_apply_placement_errors() -> None:
    mine = os.sched_getaffinity(0)
    try:
        with pytest.raises(ValueError, match="worker 2: empty CPU set"):
            apply_placement(Placement(2, 0, ()))
        # The kernel refuses a CPU that does not exist; the first call fails, nothing is pinned.
        with pytest.raises(OSError, match="worker 3: cannot pin to CPUs 4096"):
            apply_placement(Placement(3, 0, (4096,)))
    finally:
        os.sched_setaffinity(0, mine)
    assert os.sched_getaffinity(0) == mine


# ---------------------------------------------------------------------------- CPU quota


def make_cgroup(root: Path, proc_lines: list[str], files: dict[str, str]) -> tuple[Path, Path]:
    """A fake cgroup mount under ``root/fs`` (``files``: relative path -> content) and a fake
    ``/proc/self/cgroup``; returns both paths."""
    mount = root / "fs"
    mount.mkdir()
    for rel, text in files.items():
        (mount / rel).parent.mkdir(parents=True, exist_ok=True)
        (mount / rel).write_text(text)
    proc = root / "proc_cgroup"
    proc.write_text("".join(line + "\n" for line in proc_lines))
    return mount, proc


@pytest.mark.parametrize(
    ("proc_lines", "files", "expected"),
    [
        # v2: the tightest limit on the way up wins ("max" is no limit)
        (
            ["0::/jobs/train"],
            {"jobs/cpu.max": "300000 100000\n", "jobs/train/cpu.max": "max 100000\n"},
            3.0,
        ),
        (
            ["0::/a/b"],
            {"a/cpu.max": "400000 100000\n", "a/b/cpu.max": "150000 100000\n"},
            1.5,
        ),
        # v2 in a container: the host's path is not under the mount, the mount is the cgroup
        (["0::/kubepods/pod7/c1"], {"cpu.max": "200000 100000\n"}, 2.0),
        # v1 with the cpu controller (co-mounted with cpuacct); -1 is no limit
        (
            ["5:cpu,cpuacct:/docker/abc", "3:memory:/docker/abc"],
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            },
            0.5,
        ),
        (
            ["5:cpu,cpuacct:/"],
            {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            None,
        ),
        # no limit, a malformed file, no cpu controller at all: no quota
        (["0::/"], {"cpu.max": "max 100000\n"}, None),
        (["0::/"], {"cpu.max": "lots\n"}, None),
        (["0::/"], {"cpu.max": "100000 0\n"}, None),
        (["4:memory:/x"], {"x/cpu.max": "100000 100000\n"}, None),
        ([], {}, None),
    ],
)
def test_cpu_quota_from_a_fake_cgroup_tree(
    tmp_path: Path, proc_lines: list[str], files: dict[str, str], expected: float | None
) -> None:
    mount, proc = make_cgroup(tmp_path, proc_lines, files)
    assert cpu_quota(mount, proc) == expected


def test_cpu_quota_without_proc_file(tmp_path: Path) -> None:
    assert cpu_quota(tmp_path, tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("quota", "expected"),
    [(None, "all"), (0.5, 1), (1.5, 1), (1.0, 1), (1e6, "all")],
)
def test_usable_cpus_rounds_a_quota_down(
    quota: float | None, expected: int | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("subvec._process.topology.cpu_quota", lambda: quota)
    mine = len(os.sched_getaffinity(0))
    assert usable_cpus() == (mine if expected == "all" else min(mine, int(expected)))


# ---------------------------------------------------------------------------- CLI


def test_cli_topology_fake_sysfs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_sysfs(tmp_path, {0: "0-3", 1: "4-7", 2: ""}, online="0-7")
    argv = ["topology", "--workers", "3", "--sysfs-root", str(root), "--allowed", "0-7"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "allowed: 0-7 (8 CPUs)" in out
    assert "quota:   " in out and "usable:  " in out
    assert "nodes:   2" in out
    assert "node 0: 0-3 (4 CPUs, 4 cores)" in out
    assert "node 1: 4-7" in out
    assert "node 2" not in out
    assert "worker 0: node 0, cpus 0-3" in out
    assert "worker 1: node 1, cpus 4-7" in out
    assert "worker 2: node 0, cpus 0-3" in out


def test_cli_topology_shows_the_quota(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("subvec._process.topology.cpu_quota", lambda: 1.5)
    assert cli.main(["topology"]) == 0
    out = capsys.readouterr().out
    assert "quota:   1.5 CPUs (cgroup CPU bandwidth limit)" in out
    assert "usable:  1 CPUs" in out
    # The default plan is what SubprocVectorEnv would start under that quota: one worker.
    assert "plan for 1 workers" in out and out.count("  worker ") == 1


def test_cli_topology_real_affinity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Without --allowed the fake tree is cut down to this process's CPUs, like a real run.
    root = make_sysfs(tmp_path, {0: "0-1023"})
    assert cli.main(["topology", "--workers", "3", "--sysfs-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert 'numa="auto": no placement on a single node' in out
    assert out.count("worker ") == 3


def test_cli_topology_core_downgrade_is_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_sysfs(tmp_path, {0: "0-1"})
    argv = ["topology", "--workers", "3", "--pin", "core", "--sysfs-root", str(root)]
    assert cli.main([*argv, "--allowed", "0-1"]) == 0  # no warning escapes (filterwarnings=error)
    assert "note: pin='core' needs one CPU per worker" in capsys.readouterr().out


def test_cli_topology_bad_workers(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["topology", "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_python_m_subvec_topology() -> None:
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-m", "subvec", "topology", "--workers", "4"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "plan for 4 workers (pin=node):" in done.stdout
