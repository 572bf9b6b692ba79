"""GPUs: discovery on fake driver/sysfs trees and a fake nvidia-smi, planning workers next to
their GPU, the EGL lookup, and what each worker process sees (with a fake two-node topology
mapped onto this machine's CPUs 0 and 1)."""

from __future__ import annotations

import functools
import os
import signal
import stat
from pathlib import Path

import numpy as np
import pytest

from subvec import SubprocVectorEnv, cli
from subvec._process.environ import worker_environment
from subvec._process.gpus import (
    Gpu,
    GpuTopology,
    discover_gpus,
    egl_index,
    normalise_bus_id,
    parse_visible,
    resolve_gpus,
)
from subvec._process.topology import Placement, Topology, plan_placement
from tests.start_envs import StartRecorder

HAVE_CPUS_0_1 = {0, 1} <= os.sched_getaffinity(0)
needs_cpus_0_1 = pytest.mark.skipif(not HAVE_CPUS_0_1, reason="needs CPUs 0 and 1 allowed")
TWO_NODES = {0: [0], 1: [1]}

#: A two-socket server with four GPUs, two per socket (bus id -> node, uuid). The driver lists
#: them in directory order, not bus order: discovery must sort them.
FOUR_GPUS = {
    "0000:86:00.0": (1, "GPU-cccc0000-0000-0000-0000-000000000002"),
    "0000:1b:00.0": (0, "GPU-aaaa0000-0000-0000-0000-000000000000"),
    "0000:af:00.0": (1, "GPU-dddd0000-0000-0000-0000-000000000003"),
    "0000:3b:00.0": (0, "GPU-bbbb0000-0000-0000-0000-000000000001"),
}


def make_gpu_tree(root: Path, gpus: dict[str, tuple[int, str]], *, driver: bool = True) -> Path:
    """Write ``<root>/proc/driver/nvidia/gpus/<bus>/information`` (unless ``driver`` is False)
    and ``<root>/sys/bus/pci/devices/<bus>/numa_node``; return ``root``."""
    for bus, (node, uuid) in gpus.items():
        if driver:
            info = root / "proc" / "driver" / "nvidia" / "gpus" / bus
            info.mkdir(parents=True)
            (info / "information").write_text(
                "Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\n"
                f"GPU UUID: \t {uuid}\nBus Type: \t PCIe\n"
                f"Bus Location: \t {bus}\nDevice Minor: \t 3\nGPU Excluded:\t No\n"
            )
        pci = root / "sys" / "bus" / "pci" / "devices" / bus
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{node}\n")
    return root


def fake_discovery(root: Path, visible: str | None = None) -> GpuTopology:
    return discover_gpus(root / "proc", root / "sys", visible, smi=None, from_environment=False)


# ---------------------------------------------------------------------------- discovery


def test_discovery_reads_the_driver_and_sysfs_in_bus_order(tmp_path: Path) -> None:
    found = fake_discovery(make_gpu_tree(tmp_path, FOUR_GPUS))
    assert "NVIDIA driver" in found.source
    assert [g.bus_id for g in found.gpus] == [
        "0000:1b:00.0",
        "0000:3b:00.0",
        "0000:86:00.0",
        "0000:af:00.0",
    ]
    assert [g.index for g in found.gpus] == [0, 1, 2, 3]
    assert [g.node for g in found.gpus] == [0, 0, 1, 1]
    assert [g.visible_id for g in found.gpus] == ["0", "1", "2", "3"]
    assert found.gpus[2].uuid == FOUR_GPUS["0000:86:00.0"][1]


@pytest.mark.parametrize(
    ("visible", "buses", "ids"),
    [
        ("2,0", ["0000:86:00.0", "0000:1b:00.0"], ["2", "0"]),
        ("GPU-dddd,1", ["0000:af:00.0", "0000:3b:00.0"], ["GPU-dddd", "1"]),
        ("3,9,1", ["0000:af:00.0"], ["3"]),  # CUDA stops at the first entry naming no GPU
        ("1,-1,2", ["0000:3b:00.0"], ["1"]),
        ("", [], []),
        ("-1", [], []),
    ],
)
def test_discovery_honours_cuda_visible_devices(
    tmp_path: Path, visible: str, buses: list[str], ids: list[str]
) -> None:
    found = fake_discovery(make_gpu_tree(tmp_path, FOUR_GPUS), visible)
    assert [g.bus_id for g in found.gpus] == buses
    assert [g.index for g in found.gpus] == list(range(len(buses)))  # CUDA ordinals
    assert [g.visible_id for g in found.gpus] == ids


def test_discovery_reads_the_parents_cuda_visible_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_gpu_tree(tmp_path, FOUR_GPUS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    found = discover_gpus(root / "proc", root / "sys", smi=None)
    assert [(g.index, g.node, g.visible_id) for g in found.gpus] == [(0, 1, "3"), (1, 1, "2")]


def test_unknown_node_is_none(tmp_path: Path) -> None:
    root = make_gpu_tree(tmp_path, {"0000:3b:00.0": (0, "GPU-a")})
    (root / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0" / "numa_node").write_text("-1\n")
    assert fake_discovery(root).gpus[0].node is None


def test_nvidia_smi_is_the_second_choice(tmp_path: Path) -> None:
    root = make_gpu_tree(tmp_path, FOUR_GPUS, driver=False)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--query-gpu=index,pci.bus_id*) ;; *) exit 9;; esac\n'
        "echo '1, 00000000:3B:00.0, GPU-bbbb'\n"
        "echo '0, 00000000:1B:00.0, GPU-aaaa'\n"
        "echo '2, 00000000:86:00.0, GPU-cccc'\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    found = discover_gpus(root / "proc", root / "sys", None, smi=str(smi), from_environment=False)
    assert "nvidia-smi" in found.source
    assert [(g.index, g.bus_id, g.node) for g in found.gpus] == [
        (0, "0000:1b:00.0", 0),
        (1, "0000:3b:00.0", 0),
        (2, "0000:86:00.0", 1),
    ]


def test_no_driver_and_no_smi_finds_nothing(tmp_path: Path) -> None:
    found = discover_gpus(tmp_path / "proc", tmp_path / "sys", None, smi=None)
    assert found.gpus == () and "none" in found.source


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00.0"),
        ("0001:AF:1F.7", "0001:af:1f.7"),
    ],
)
def test_bus_ids_are_normalised(text: str, expected: str) -> None:
    assert normalise_bus_id(text) == expected


def test_parse_visible() -> None:
    assert parse_visible(None) is None
    assert parse_visible(" 0, 2 ") == ["0", "2"]
    assert parse_visible("") == []


# ---------------------------------------------------------------------------- gpus= values


def test_resolve_gpus_values(tmp_path: Path) -> None:
    discover = functools.partial(fake_discovery, make_gpu_tree(tmp_path, FOUR_GPUS))
    assert resolve_gpus(None, discover=discover) is None
    assert [g.bus_id for g in resolve_gpus("auto", discover=discover) or []][-1] == "0000:af:00.0"
    picked = resolve_gpus([3, 0], discover=discover) or []
    assert [(g.index, g.node) for g in picked] == [(3, 1), (0, 0)]
    mapped = resolve_gpus({0: 1, 5: None}, discover=discover) or []
    # The mapping's nodes win; the bus id still comes from discovery where it knows the GPU.
    assert [(g.index, g.node, g.bus_id) for g in mapped] == [
        (0, 1, "0000:1b:00.0"),
        (5, None, None),
    ]
    with pytest.raises(
        ValueError, match=r"gpus=\[7\]: no GPU 7 here; this process sees GPUs \[0, 1, 2, 3\]"
    ):
        resolve_gpus([7], discover=discover)


def test_resolve_gpus_without_gpus(tmp_path: Path) -> None:
    def discover() -> GpuTopology:
        return fake_discovery(tmp_path)

    with pytest.raises(ValueError, match='gpus="auto" found no GPU'):
        resolve_gpus("auto", discover=discover)
    # A list still assigns the GPUs (nodes unknown): machines whose topology cannot be read.
    assert [(g.index, g.node) for g in resolve_gpus([1, 0], discover=discover) or []] == [
        (1, None),
        (0, None),
    ]


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("all", ValueError, "gpus must be None"),
        ([], ValueError, "at least one GPU"),
        ([0, 0], ValueError, "GPU 0 is listed twice"),
        ([-1], ValueError, "non-negative ints"),
        ({0: -2}, ValueError, "the node of GPU 0"),
        (1.5, TypeError, "gpus must be None"),
    ],
)
def test_resolve_gpus_refuses(value: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        resolve_gpus(value, discover=lambda: GpuTopology(()))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- planning


def four_gpus() -> list[Gpu]:
    return [Gpu(0, 0), Gpu(1, 0), Gpu(2, 1), Gpu(3, 1)]


def test_workers_follow_their_gpu_to_its_node() -> None:
    topo = Topology({0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}, allowed=tuple(range(8)))
    plan = plan_placement(topo, 6, gpus=four_gpus()) or []
    assert [(p.gpu, p.node) for p in plan] == [(0, 0), (1, 0), (2, 1), (3, 1), (0, 0), (1, 0)]
    assert all(p.cpus == topo.nodes[p.node or 0] for p in plan)
    # pin="core" applies within the GPU's node: node 0 has four workers for its four CPUs.
    core = plan_placement(topo, 6, "core", gpus=four_gpus()) or []
    assert [p.cpus for p in core] == [(0,), (1,), (4,), (5,), (2,), (3,)]


def test_gpu_with_unknown_node_is_placed_round_robin() -> None:
    topo = Topology({0: (0,), 1: (1,)}, allowed=(0, 1))
    gpus = [Gpu(0, 1), Gpu(1, None), Gpu(2, 5)]  # node 5 has no CPU here
    plan = plan_placement(topo, 3, gpus=gpus) or []
    assert [(p.gpu, p.node) for p in plan] == [(0, 1), (1, 0), (2, 1)]


def test_gpus_without_pinning_keep_the_gpus() -> None:
    plan = plan_placement(None, 3, gpus=[Gpu(0, 0), Gpu(1, 1)]) or []
    assert [(p.worker, p.node, p.cpus, p.gpu) for p in plan] == [
        (0, None, None, 0),
        (1, None, None, 1),
        (2, None, None, 0),
    ]
    assert plan_placement(None, 3) is None


# ---------------------------------------------------------------------------- worker_env values


def test_worker_env_values_are_checked() -> None:
    where = Placement(2, 1, (1,), 0)
    assert worker_environment({"A": "1", "B": None}, where) == {"A": "1", "B": None}
    assert worker_environment(lambda p: {"W": str(p.worker)}, where) == {"W": "2"}
    with pytest.raises(
        TypeError, match=r"A=1 \(int\) for worker 2; environment values must be str"
    ):
        worker_environment({"A": 1}, where)  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="returned list for worker 2"):
        worker_environment(lambda p: [], where)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="bad variable name 'A=B'"):
        worker_environment({"A=B": "x"}, where)


def test_worker_env_must_be_a_dict_or_callable() -> None:
    with pytest.raises(TypeError, match="worker_env must be a dict"):
        SubprocVectorEnv([StartRecorder], worker_env=["A=1"])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- EGL lookup


def test_egl_index_by_pci_bus_id(tmp_path: Path) -> None:
    drm = tmp_path / "class" / "drm"
    drm.mkdir(parents=True)
    devices = tmp_path / "devices" / "pci0000:00"
    for card, bus in (("card0", "0000:3b:00.0"), ("card1", "0000:1b:00.0")):
        (devices / bus).mkdir(parents=True)
        (drm / card).mkdir()
        (drm / card / "device").symlink_to(devices / bus)
    # EGL lists a software device first (no DRM file), then card1, then card0.
    files = [None, "/dev/dri/card1", "/dev/dri/card0"]
    assert egl_index("0000:3b:00.0", drm_files=files, sysfs_root=tmp_path) == 2
    assert egl_index("00000000:1B:00.0", drm_files=files, sysfs_root=tmp_path) == 1
    assert egl_index("0000:86:00.0", drm_files=files, sysfs_root=tmp_path) is None


# ---------------------------------------------------------------------------- in the workers


def recorded(envs: SubprocVectorEnv) -> list[dict[str, str | None]]:
    return list(envs.get_attr("environ"))


@needs_cpus_0_1
@pytest.mark.timeout(60)
def test_workers_see_their_gpu_and_worker_env(tmp_path: Path) -> None:
    gpus = fake_discovery(make_gpu_tree(tmp_path, FOUR_GPUS), "3,0,2")  # cuda 0,1,2 on 1,0,1
    envs = SubprocVectorEnv(
        [StartRecorder] * 4,
        num_workers=4,
        numa=TWO_NODES,
        gpus=gpus,
        worker_env=lambda p: {"SIM_TAG": f"w{p.worker} node {p.node} gpu {p.gpu} cpus {p.cpus}"},
    )
    try:
        assert [(r.gpu, r.node) for r in envs.placement] == [(0, 1), (1, 0), (2, 1), (0, 1)]
        assert [os.sched_getaffinity(r.pid) for r in envs.placement] == [{1}, {0}, {1}, {1}]
        seen = recorded(envs)
        assert [e["CUDA_VISIBLE_DEVICES"] for e in seen] == ["3", "0", "2", "3"]
        # No MUJOCO_GL=egl: EGL is not queried, the index is the CUDA index in the parent.
        assert [e["MUJOCO_EGL_DEVICE_ID"] for e in seen] == ["0", "1", "2", "0"]
        assert [e["EGL_DEVICE_ID"] for e in seen] == ["0", "1", "2", "0"]
        assert seen[1]["SIM_TAG"] == "w1 node 0 gpu 1 cpus (0,)"
        assert [r.cuda_visible_devices for r in envs.placement] == ["3", "0", "2", "3"]
        assert all("fallback" in (r.egl_source or "") for r in envs.placement)
        assert "SIM_TAG" not in os.environ  # never in the parent
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_worker_env_dict_wins_over_the_gpu_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the mapping's GPUs as they are
    # The GPU from a mapping (no discovery): env vars set, unpinned (numa=None).
    envs = SubprocVectorEnv(
        [StartRecorder] * 2,
        num_workers=2,
        numa=None,
        gpus={1: 0, 0: 1},
        worker_env={"SIM_TAG": "robot", "EGL_DEVICE_ID": "7", "MUJOCO_GL": "egl"},
    )
    try:
        seen = recorded(envs)
        assert [e["SIM_TAG"] for e in seen] == ["robot", "robot"]
        assert [e["CUDA_VISIBLE_DEVICES"] for e in seen] == ["1", "0"]
        # One EGL variable given: the other follows it.
        assert [(e["EGL_DEVICE_ID"], e["MUJOCO_EGL_DEVICE_ID"]) for e in seen] == [("7", "7")] * 2
        assert [r.egl_source for r in envs.placement] == ["worker_env EGL_DEVICE_ID"] * 2
        assert [r.node for r in envs.placement] == [None, None]
        assert "SIM_TAG" not in os.environ
    finally:
        envs.close()


@pytest.mark.timeout(60)
def test_egl_is_queried_when_mujoco_gl_is_egl(tmp_path: Path) -> None:
    # This machine's libEGL (if any) has no device with the fake bus id: the report says why
    # the fallback was taken, and the worker still starts.
    gpus = fake_discovery(make_gpu_tree(tmp_path, {"0000:3b:00.0": (0, "GPU-a")}))
    envs = SubprocVectorEnv([StartRecorder], gpus=gpus, worker_env={"MUJOCO_GL": "egl"})
    try:
        (report,) = envs.placement
        assert report.egl_device == 0
        assert report.egl_source is not None and "fallback" in report.egl_source
        assert "MUJOCO_GL" not in report.egl_source  # it was queried
        assert recorded(envs)[0]["MUJOCO_EGL_DEVICE_ID"] == "0"
    finally:
        envs.close()


@needs_cpus_0_1
@pytest.mark.timeout(60)
def test_restarted_worker_keeps_its_gpu_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    envs = SubprocVectorEnv(
        [StartRecorder] * 2,
        num_workers=2,
        numa=TWO_NODES,
        gpus={0: 1, 1: 0},
        worker_env=lambda p: {"SIM_TAG": f"gpu {p.gpu}"},
        on_worker_failure="restart",
        max_concurrent_starts=1,
    )
    try:
        envs.reset(seed=0)
        before = recorded(envs)
        old = envs.placement[1]
        os.kill(old.pid, signal.SIGKILL)
        _, _, _, truncated, infos = envs.step(np.zeros(2, np.int64))
        assert truncated[1] and infos["worker_restarted"][1]
        new = envs.placement[1]
        assert new.pid != old.pid
        assert (new.gpu, new.node, new.cpus) == (old.gpu, old.node, old.cpus) == (1, 0, (0,))
        assert os.sched_getaffinity(new.pid) == {0}
        assert recorded(envs) == before
        assert before[1]["SIM_TAG"] == "gpu 1" and before[1]["CUDA_VISIBLE_DEVICES"] == "1"
    finally:
        envs.close()


# ---------------------------------------------------------------------------- CLI


def test_cli_topology_prints_the_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root = make_gpu_tree(tmp_path, FOUR_GPUS)
    nodes = root / "sys" / "devices" / "system" / "node"
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        (nodes / f"node{node}").mkdir(parents=True)
        (nodes / f"node{node}" / "cpulist").write_text(cpus + "\n")
    argv = ["topology", "--workers", "5", "--allowed", "0-7"]
    argv += ["--sysfs-root", str(root / "sys"), "--proc-root", str(root / "proc")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "gpus:    4 (NVIDIA driver" in out
    assert "gpu 2: 0000:86:00.0, node 1, CUDA_VISIBLE_DEVICES=2" in out
    assert "plan for 5 workers (pin=node, gpus=auto):" in out
    assert "worker 2: node 1, cpus 4-7, gpu 2" in out
    assert "worker 4: node 0, cpus 0-3, gpu 0" in out
