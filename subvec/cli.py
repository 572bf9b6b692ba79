"""``subvec`` / ``python -m subvec`` command line.

``subvec topology`` is here, over the discovery and placement of ``_process.topology`` and
``_process.gpus``. ``subvec shm`` and ``subvec bench``/``tune`` register themselves from the
modules that own them (``_process.shm``, ``_bench``) through an ``add_cli_parser(subparsers)``
function, since those modules exist for their commands.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from subvec._process import gpus as _gpus
from subvec._process import topology as _topology


def build_parser() -> argparse.ArgumentParser:
    from subvec import __version__

    parser = argparse.ArgumentParser(prog="subvec", description="subvec command line tools")
    parser.add_argument("--version", action="version", version=f"subvec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from subvec import _bench
    from subvec._process import shm as _shm

    _add_topology_parser(sub)
    _shm.add_cli_parser(sub)
    _bench.add_cli_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


def _add_topology_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``topology`` sub-command."""
    parser = subparsers.add_parser(
        "topology",
        help="show NUMA nodes, allowed CPUs, GPUs and the worker placement plan",
        description="Show the NUMA topology and the GPUs this process may use, and how subvec "
        'would place workers on them (with gpus="auto" when there are GPUs).',
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="number of workers to plan for (default: one per usable CPU, as SubprocVectorEnv "
        "starts for enough envs; with --allowed, one per allowed CPU)",
    )
    parser.add_argument(
        "--pin", choices=_topology.PIN_MODES, default="node", help="pin mode (default: node)"
    )
    parser.add_argument(
        "--sysfs-root", default="/sys", metavar="PATH", help="sysfs mount (default: /sys)"
    )
    parser.add_argument(
        "--proc-root",
        default="/proc",
        metavar="PATH",
        help="procfs mount, where the NVIDIA driver lists its GPUs (default: /proc)",
    )
    parser.add_argument(
        "--no-gpus",
        action="store_true",
        help="plan without the GPUs (as gpus=None)",
    )
    parser.add_argument(
        "--allowed",
        type=_topology.parse_cpulist,
        default=None,
        metavar="CPULIST",
        help="allowed CPUs, e.g. 0-15 (default: this process's affinity)",
    )
    parser.set_defaults(func=_cli_topology)


def _cli_topology(args: argparse.Namespace) -> int:
    topology = _topology.discover(args.sysfs_root, args.allowed)
    if args.workers is not None:
        workers: int = args.workers
    elif args.allowed is None:  # what SubprocVectorEnv would start: a CPU quota counts too
        workers = min(len(topology.cpus), _topology.usable_cpus()) or 1
    else:
        workers = len(topology.cpus)
    if workers < 1:
        print(f"error: --workers must be >= 1, got {workers}")
        return 2
    online = "unknown" if topology.online is None else _topology.format_cpulist(topology.online)
    print(f"source:  {topology.source}")
    print(f"online:  {online}")
    print(f"allowed: {_topology.format_cpulist(topology.allowed)} ({len(topology.allowed)} CPUs)")
    quota = _topology.cpu_quota()
    limit = "none" if quota is None else f"{quota:g} CPUs (cgroup CPU bandwidth limit)"
    print(f"quota:   {limit}")
    print(
        f"usable:  {_topology.usable_cpus()} CPUs (the default number of workers is at most this)"
    )
    print(f"nodes:   {len(topology.nodes)}")
    for node, cpus in topology.nodes.items():
        n_cores = len({topology.core_of(cpu) for cpu in cpus})
        print(
            f"  node {node}: {_topology.format_cpulist(cpus)} ({len(cpus)} CPUs, {n_cores} cores)"
        )
    if len(topology.nodes) < 2:
        print('numa="auto": no placement on a single node; plan below is for numa=True')
    found = _gpus.discover_gpus(args.proc_root, args.sysfs_root)
    print(f"gpus:    {len(found.gpus) or 'none'} ({found.source})")
    for gpu in found.gpus:
        on = "unknown" if gpu.node is None else str(gpu.node)
        bus = gpu.bus_id or "bus id unknown"
        print(f"  gpu {gpu.index}: {bus}, node {on}, CUDA_VISIBLE_DEVICES={gpu.visible_id}")
    gpus = list(found.gpus) if found.gpus and not args.no_gpus else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = _topology.plan_placement(topology, workers, args.pin, gpus=gpus)
    assert plan is not None  # an explicit Topology always gives a plan
    with_gpus = ", gpus=auto" if gpus else ""
    print(f"plan for {workers} workers (pin={args.pin}{with_gpus}):")
    for placement in plan:
        print(f"  worker {placement.worker}: {_topology.describe_placement(placement)}")
    for warning in caught:
        print(f"note: {warning.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
