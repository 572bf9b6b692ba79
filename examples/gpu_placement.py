"""Where subvec would run each worker with ``gpus="auto"``: on this machine, and on a fake
two-socket server with four GPUs (two per socket). Needs no GPU: the fake server is a small
sysfs + NVIDIA driver tree written to a temporary directory, read the way the real ones are.

    python examples/gpu_placement.py --workers 8 --pin core
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

from subvec._process.gpus import GpuTopology, discover_gpus
from subvec._process.topology import Topology, describe_placement, discover, plan_placement

#: The fake server: NUMA node -> CPUs, and GPU PCI bus id -> its node.
FAKE_NODES = {0: "0-15", 1: "16-31"}
FAKE_GPUS = {"0000:1b:00.0": 0, "0000:3b:00.0": 0, "0000:86:00.0": 1, "0000:af:00.0": 1}


def write_fake_server(root: Path) -> None:
    """sysfs (``<root>/sys``) and procfs (``<root>/proc``) trees of the fake server."""
    for node, cpus in FAKE_NODES.items():
        node_dir = root / "sys" / "devices" / "system" / "node" / f"node{node}"
        node_dir.mkdir(parents=True)
        (node_dir / "cpulist").write_text(cpus + "\n")
    for i, (bus, node) in enumerate(FAKE_GPUS.items()):
        pci = root / "sys" / "bus" / "pci" / "devices" / bus
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{node}\n")
        info = root / "proc" / "driver" / "nvidia" / "gpus" / bus
        info.mkdir(parents=True)
        (info / "information").write_text(
            f"Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-{i:08x}-0000-0000-0000-000000000000\n"
            f"Bus Location: \t {bus}\n"
        )


def show(title: str, topology: Topology, gpus: GpuTopology, workers: int, pin: str) -> None:
    print(f"== {title}")
    for node, cpus in topology.nodes.items():
        print(f"node {node}: {len(cpus)} CPUs")
    print(f"GPUs: {len(gpus.gpus) or 'none'} ({gpus.source})")
    for gpu in gpus.gpus:
        print(f"  gpu {gpu.index}: {gpu.bus_id}, node {gpu.node}")
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always")
        # numa=the topology: place even on one node, so that the plan shows the CPUs.
        plan = plan_placement(topology, workers, pin, gpus=list(gpus.gpus) or None)
    assert plan is not None
    for placement in plan:
        print(f"  worker {placement.worker}: {describe_placement(placement)}")
    for note in notes:
        print(f"  note: {note.message}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--pin", choices=("node", "core"), default="node")
    args = parser.parse_args()

    show("this machine", discover(), discover_gpus(), args.workers, args.pin)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_fake_server(root)
        topology = discover(root / "sys", allowed=range(32))
        # from_environment=False: as if CUDA_VISIBLE_DEVICES were unset, whatever this shell has.
        gpus = discover_gpus(root / "proc", root / "sys", smi=None, from_environment=False)
        show("a two-socket server with four GPUs (fake)", topology, gpus, args.workers, args.pin)


if __name__ == "__main__":
    main()
