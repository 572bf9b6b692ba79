"""NUMA topology discovery, worker placement, and how many CPUs the defaults may use.

Data flow::

    parent                                   worker w (its own process)
    ------                                   --------------------------
    discover(sysfs_root, allowed)
      node*/cpulist ∩ cpu/online ∩ allowed
          -> Topology {node: cpus}
    plan_placement(numa, num_workers, pin)
          -> [Placement(w, node, cpus)] ---> apply_placement(placement)   # first thing
                                               sched_setaffinity(0) + every /proc/self/task tid
                                               optional preferred mempolicy (libnuma)
                                             <- PlacementReport(pid, node, cpus)

The parent only plans: it never pins itself, so that a forkserver started from it (and every
worker the forkserver forks) begins with the full allowed mask. Each worker pins itself before
it builds its envs and before it first writes its observation rows, so the pages it touches first
are allocated on its node by the kernel's default first-touch policy.

Placement rules (``docs/numa.md``):

- worker ``w`` goes to node ``w % n_nodes``;
- ``pin="node"``: the worker may run on any CPU of its node;
- ``pin="core"``: one CPU per worker, spreading over physical cores before using hyperthread
  siblings; a node with more workers than CPUs falls back to ``pin="node"`` with a warning.

Platforms: without a sysfs node tree (macOS) the topology is one node of every CPU, so the
default ``numa="auto"`` places nothing; without CPU affinity (macOS, Windows: no
``os.sched_getaffinity``/``sched_setaffinity``) every CPU counts as allowed and an explicit
``numa=`` warns that the workers run unpinned instead of failing in them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from subvec._process.gpus import Gpu

__all__ = [
    "NumaSpec",
    "Placement",
    "PlacementReport",
    "Topology",
    "apply_placement",
    "cpu_quota",
    "describe_placement",
    "discover",
    "format_cpulist",
    "parse_cpulist",
    "plan_placement",
    "usable_cpus",
]

PIN_MODES = ("node", "core")

# Rounds of /proc/self/task listing in apply_placement: a thread that has not been re-pinned
# yet may start a new thread (which inherits its creator's wide mask) while we walk the list,
# so we list again until a pass finds no new thread. Real workers settle in one or two passes.
_MAX_REPIN_PASSES = 8

# From <linux/mempolicy.h>; used to check that numa_set_preferred really took effect.
_MPOL_PREFERRED = 1


# --------------------------------------------------------------------------------------------
# cpulist strings
# --------------------------------------------------------------------------------------------


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse a kernel cpulist such as ``"0-3,8-11,15"`` into sorted unique CPU ids.

    Surrounding whitespace and the trailing newline of sysfs files are ignored; an empty string
    (a memory-only node's ``cpulist``) gives ``()``.
    """
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return ()
    for part in stripped.split(","):
        item = part.strip()
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", item)
        if match is None:
            raise ValueError(
                f"malformed cpulist {text!r}: {item!r} is not a CPU id or a range like 0-3"
            )
        first = int(match.group(1))
        last = first if match.group(2) is None else int(match.group(2))
        if last < first:
            raise ValueError(f"malformed cpulist {text!r}: range {item!r} is reversed")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU ids the way the kernel does: ``(0, 1, 2, 3, 8)`` -> ``"0-3,8"``."""
    ordered = sorted(set(cpus))
    if not ordered:
        return ""
    parts: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)


# --------------------------------------------------------------------------------------------
# Topology
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """The NUMA nodes this process may use.

    ``nodes`` maps node id -> sorted CPUs of that node that are online and allowed. ``allowed``
    is the affinity mask the topology was built against, ``online`` the online CPUs (None when
    unknown). ``cores`` maps a CPU to a key shared by the hyperthread siblings of one physical
    core (a CPU missing from it counts as a core of its own); it is used by ``pin="core"``.
    Construction validates: node ids and CPUs are non-negative ints, every node has CPUs, no CPU
    is in two nodes, and every CPU is in ``allowed``.
    """

    nodes: Mapping[int, tuple[int, ...]] = field(hash=False)
    allowed: tuple[int, ...]
    online: tuple[int, ...] | None = None
    cores: Mapping[int, int] = field(default_factory=dict, hash=False)
    source: str = "explicit"

    def __post_init__(self) -> None:
        allowed = _as_cpus(self.allowed, "allowed")
        nodes: dict[int, tuple[int, ...]] = {}
        owner: dict[int, int] = {}
        for node in sorted(self.nodes, key=_node_sort_key):
            if isinstance(node, bool) or not isinstance(node, int) or node < 0:
                raise ValueError(f"NUMA node ids must be non-negative ints, got {node!r}")
            cpus = _as_cpus(self.nodes[node], f"CPUs of node {node}")
            if not cpus:
                raise ValueError(f"node {node} has an empty CPU list; drop it or give it CPUs")
            for cpu in cpus:
                if cpu in owner:
                    raise ValueError(f"CPU {cpu} is listed under both node {owner[cpu]} and {node}")
                owner[cpu] = node
            outside = sorted(set(cpus) - set(allowed))
            if outside:
                raise ValueError(
                    f"node {node}: CPUs {format_cpulist(outside)} are not in the allowed set "
                    f"{format_cpulist(allowed) or '(empty)'} (os.sched_getaffinity, i.e. "
                    "cgroup/taskset limits); remove them from the topology"
                )
            nodes[node] = cpus
        if not nodes:
            raise ValueError("a topology needs at least one node with CPUs")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "allowed", allowed)
        if self.online is not None:
            object.__setattr__(self, "online", _as_cpus(self.online, "online"))
        object.__setattr__(self, "cores", dict(self.cores))

    @classmethod
    def from_mapping(
        cls,
        mapping: Mapping[int, Iterable[int]],
        *,
        allowed: Iterable[int] | None = None,
        sysfs_root: str | os.PathLike[str] = "/sys",
    ) -> Topology:
        """Build an explicit topology from ``{node: [cpus]}``.

        The CPUs must be in ``allowed`` (default: this process's ``os.sched_getaffinity(0)``).
        Hyperthread siblings for ``pin="core"`` are read from ``sysfs_root`` when present.
        """
        if not isinstance(mapping, Mapping):
            raise TypeError(f"expected a {{node: [cpus]}} mapping, got {type(mapping).__name__}")
        allowed_cpus = tuple(sorted(allowed_cpus_now() if allowed is None else allowed))
        nodes = {node: _as_cpus(cpus, f"CPUs of node {node}") for node, cpus in mapping.items()}
        all_cpus = [cpu for cpus in nodes.values() for cpu in cpus]
        return cls(
            nodes=nodes,
            allowed=allowed_cpus,
            online=None,
            cores=_read_cores(Path(sysfs_root), all_cpus),
            source="explicit mapping",
        )

    @property
    def cpus(self) -> tuple[int, ...]:
        """All CPUs of all nodes, sorted."""
        return tuple(sorted(cpu for cpus in self.nodes.values() for cpu in cpus))

    def core_of(self, cpu: int) -> int:
        """Key of the physical core ``cpu`` belongs to (the CPU id itself when unknown)."""
        return self.cores.get(cpu, cpu)


def _node_sort_key(node: object) -> tuple[int, str]:
    # Sort valid ids numerically; invalid ones only need a stable order to be reported.
    return (node, "") if isinstance(node, int) else (-1, repr(node))


def _as_cpus(cpus: object, what: str) -> tuple[int, ...]:
    if isinstance(cpus, (str, bytes)) or not isinstance(cpus, Iterable):
        raise TypeError(f"{what} must be an iterable of CPU ids, got {cpus!r}")
    out: set[int] = set()
    for cpu in cpus:
        if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
            raise ValueError(f"{what}: CPU ids must be non-negative ints, got {cpu!r}")
        out.add(cpu)
    return tuple(sorted(out))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None


def _read_cores(root: Path, cpus: Iterable[int]) -> dict[int, int]:
    """Map each CPU to a key shared by its hyperthread siblings (the lowest sibling's id).

    ``thread_siblings_list`` names the siblings directly; without it, CPUs with the same
    ``(physical_package_id, core_id)`` are siblings; without either the CPU is left out (and so
    counts as its own core).
    """
    cores: dict[int, int] = {}
    by_core_id: dict[tuple[int, int], list[int]] = {}
    for cpu in cpus:
        topo = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        siblings_text = _read_text(topo / "thread_siblings_list")
        if siblings_text is not None:
            try:
                siblings = parse_cpulist(siblings_text)
            except ValueError:
                siblings = ()
            if cpu in siblings:
                cores[cpu] = siblings[0]
                continue
        core_text = _read_text(topo / "core_id")
        if core_text is not None and core_text.strip().isdigit():
            package_text = _read_text(topo / "physical_package_id") or "0"
            package = int(package_text) if package_text.strip().isdigit() else 0
            by_core_id.setdefault((package, int(core_text)), []).append(cpu)
    for members in by_core_id.values():
        for cpu in members:
            cores[cpu] = min(members)
    return cores


def can_pin() -> bool:
    """Whether this platform can pin a process to CPUs (``os.sched_setaffinity``: Linux and
    some BSDs; macOS and Windows have no CPU affinity)."""
    return hasattr(os, "sched_setaffinity")


def allowed_cpus_now() -> tuple[int, ...]:
    """The CPUs this process may run on: its affinity mask (``os.sched_getaffinity``, which
    reflects ``taskset`` and cpusets), or every CPU where the platform has no affinity
    (macOS, Windows)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def discover(
    sysfs_root: str | os.PathLike[str] = "/sys", allowed: Iterable[int] | None = None
) -> Topology:
    """Read the NUMA topology that this process may use.

    Each ``<sysfs_root>/devices/system/node/node*/cpulist`` is intersected with the online CPUs
    (``devices/system/cpu/online``; all CPUs when the file is missing) and with ``allowed``
    (default ``os.sched_getaffinity(0)``, which already reflects cgroups and taskset). Nodes left
    without CPUs (memory-only nodes, nodes outside the cgroup) are dropped. Without a sysfs node
    directory, or when no node keeps a CPU, the result is one node 0 holding every allowed
    online CPU.
    """
    root = Path(sysfs_root)
    allowed_set = set(allowed_cpus_now() if allowed is None else allowed)
    online_text = _read_text(root / "devices" / "system" / "cpu" / "online")
    online = None if online_text is None else parse_cpulist(online_text)
    usable = allowed_set if online is None else allowed_set & set(online)
    if not usable:
        raise ValueError(
            f"no usable CPU: allowed {format_cpulist(allowed_set) or '(empty)'}, online "
            f"{format_cpulist(online) if online is not None else 'unknown'}"
        )

    node_dir = root / "devices" / "system" / "node"
    nodes: dict[int, tuple[int, ...]] = {}
    source = f"sysfs {node_dir}"
    if node_dir.is_dir():
        for entry in node_dir.iterdir():
            match = re.fullmatch(r"node(\d+)", entry.name)
            if match is None or not entry.is_dir():
                continue
            text = _read_text(entry / "cpulist")
            cpus = tuple(sorted(set(parse_cpulist(text or "")) & usable))
            if cpus:
                nodes[int(match.group(1))] = cpus
        if not nodes:
            source = f"fallback: no node in {node_dir} has an allowed online CPU"
    else:
        source = f"fallback: {node_dir} not found"
    if not nodes:
        nodes = {0: tuple(sorted(usable))}
    all_cpus = [cpu for cpus in nodes.values() for cpu in cpus]
    return Topology(
        nodes=nodes,
        allowed=tuple(sorted(allowed_set)),
        online=online,
        cores=_read_cores(root, all_cpus),
        source=source,
    )


# --------------------------------------------------------------------------------------------
# Planning (parent side)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where one worker should run: its NUMA node, the CPUs it may use (None: unpinned) and
    the GPU it is given (None: none; see ``subvec._process.gpus``).

    This is what a ``worker_env`` callable receives.

    Attributes:
        worker: the worker's index.
        node: the NUMA node it is pinned to (None: not pinned).
        cpus: the CPUs it may run on (None: unpinned).
        gpu: the CUDA ordinal (in the parent) of its GPU, or None.
        gpu_info: that GPU as discovered (bus id, node, ``CUDA_VISIBLE_DEVICES`` entry).
    """

    worker: int
    node: int | None
    cpus: tuple[int, ...] | None
    gpu: int | None = None
    gpu_info: Gpu | None = field(default=None, repr=False)


#: What ``numa=`` accepts: ``"auto"``, ``True``, ``None``/``False``, ``{node: [cpus]}``, Topology.
NumaSpec = str | bool | None | Mapping[int, Iterable[int]] | Topology


def _core_spread_order(topology: Topology, cpus: tuple[int, ...]) -> list[int]:
    """Order ``cpus`` so that every physical core is used once before any sibling is reused."""
    by_core: dict[int, list[int]] = {}
    for cpu in cpus:  # cpus is sorted, so each core's list is sorted too
        by_core.setdefault(topology.core_of(cpu), []).append(cpu)
    cores = sorted(by_core.values(), key=lambda members: members[0])
    order: list[int] = []
    depth = max(len(members) for members in cores)
    for rank in range(depth):
        order.extend(members[rank] for members in cores if rank < len(members))
    return order


def _resolve_topology(
    numa: NumaSpec, sysfs_root: str | os.PathLike[str], allowed: Iterable[int] | None
) -> tuple[Topology, bool] | None:
    """Return (topology, forced) for a ``numa=`` value, or None when placement is off."""
    if numa is None or numa is False:
        return None
    if numa is True:
        return discover(sysfs_root, allowed), True
    if isinstance(numa, str):
        if numa != "auto":
            raise ValueError(
                f'unknown numa value {numa!r}: use "auto", True, None/False, '
                "a {node: [cpus]} dict or a Topology"
            )
        return discover(sysfs_root, allowed), False
    if isinstance(numa, Topology):
        return numa, True
    if isinstance(numa, Mapping):
        return Topology.from_mapping(numa, allowed=allowed, sysfs_root=sysfs_root), True
    raise TypeError(
        f'numa must be "auto", True, None/False, a {{node: [cpus]}} dict or a Topology, '
        f"got {type(numa).__name__}: {numa!r}"
    )


def plan_placement(
    numa: NumaSpec,
    num_workers: int,
    pin: str = "node",
    *,
    gpus: Sequence[Gpu] | None = None,
    sysfs_root: str | os.PathLike[str] = "/sys",
    allowed: Iterable[int] | None = None,
) -> list[Placement] | None:
    """Return one Placement per worker, or None when no placement is wanted.

    ``numa``: ``"auto"`` places workers only when the machine has several usable NUMA nodes
    (on one node it pins nothing, whatever ``pin`` says); ``True`` places even on one node;
    ``None``/``False`` disables placement; a ``{node: [cpus]}`` dict or a :class:`Topology`
    gives the topology explicitly (and always places).

    Without ``gpus``, worker ``w`` goes to node ``w % n_nodes``. With ``gpus`` (see
    ``subvec._process.gpus.resolve_gpus``), worker ``w`` gets GPU ``gpus[w % len(gpus)]`` and goes
    to that GPU's node; a worker whose GPU's node is unknown or has no CPU here is placed
    round-robin among the nodes, as without GPUs. ``pin="node"`` lets a worker use all CPUs
    of its node; ``pin="core"`` gives it one CPU, spreading over physical cores before
    hyperthread siblings. When a node gets more workers than it has CPUs, its workers get the
    whole node instead of sharing single CPUs, and a ``UserWarning`` says so. With ``gpus``
    and no pinning (``numa=None``, or ``"auto"`` on one node), the placements carry only the
    GPUs (node and CPUs None).

    ``sysfs_root`` and ``allowed`` (default ``os.sched_getaffinity(0)``) are for discovery and
    for validating an explicit dict; tests point them at a fake tree.
    """
    if pin not in PIN_MODES:
        raise ValueError(f"unknown pin mode {pin!r}: use 'node' (whole node) or 'core'")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise TypeError(f"num_workers must be an int, got {num_workers!r}")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    gpu_of: list[Gpu | None] = [
        gpus[worker % len(gpus)] if gpus else None for worker in range(num_workers)
    ]
    unpinned = None if not gpus else [_placed(w, None, None, gpu_of[w]) for w in range(num_workers)]
    resolved = _resolve_topology(numa, sysfs_root, allowed)
    if resolved is None:
        return unpinned
    topology, forced = resolved
    if not forced and len(topology.nodes) < 2:
        return unpinned
    if not can_pin():
        # Only an explicit numa= gets here without a sysfs (a one-node fallback is not placed).
        warnings.warn(
            f"numa={numa!r} asks to pin each worker to the CPUs of a NUMA node, but this "
            f"platform ({sys.platform}) cannot pin processes (no os.sched_setaffinity; Linux "
            "can): the workers run unpinned",
            UserWarning,
            stacklevel=3,
        )
        return unpinned

    node_ids = list(topology.nodes)
    assigned: dict[int, list[int]] = {node: [] for node in node_ids}
    round_robin = 0  # the workers placed without a GPU's node, so far
    for worker in range(num_workers):
        gpu = gpu_of[worker]
        if gpu is not None and gpu.node is not None and gpu.node in topology.nodes:
            assigned[gpu.node].append(worker)
        else:
            assigned[node_ids[round_robin % len(node_ids)]].append(worker)
            round_robin += 1

    placements: dict[int, Placement] = {}
    downgraded: list[str] = []
    for node, workers in assigned.items():
        cpus = topology.nodes[node]
        if pin == "core" and len(workers) > len(cpus):
            downgraded.append(f"node {node} ({len(workers)} workers, {len(cpus)} CPUs)")
        if pin == "node" or len(workers) > len(cpus):
            for worker in workers:
                placements[worker] = _placed(worker, node, cpus, gpu_of[worker])
        else:
            order = _core_spread_order(topology, cpus)
            for worker, cpu in zip(workers, order, strict=False):  # order may be longer
                placements[worker] = _placed(worker, node, (cpu,), gpu_of[worker])
    if downgraded:
        warnings.warn(
            "pin='core' needs one CPU per worker; more workers than CPUs on "
            + ", ".join(downgraded)
            + ": those workers are pinned to their whole node instead",
            UserWarning,
            stacklevel=2,
        )
    return [placements[worker] for worker in range(num_workers)]


def _placed(
    worker: int, node: int | None, cpus: tuple[int, ...] | None, gpu: Gpu | None
) -> Placement:
    return Placement(worker, node, cpus, None if gpu is None else gpu.index, gpu)


def describe_placement(placement: Placement) -> str:
    """One line for a planned worker: ``node 1, cpus 8-15, gpu 2``."""
    where = "unpinned" if placement.cpus is None else format_cpulist(placement.cpus)
    line = f"node {placement.node}, cpus {where}"
    if placement.gpu is not None:
        line += f", gpu {placement.gpu}"
    return line


# --------------------------------------------------------------------------------------------
# Applying (worker side)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementReport:
    """What a worker reports in its ready handshake: where it actually runs, and on which GPU.

    ``cpus`` is the worker's affinity after placement; ``preferred_node`` is the node of the
    "preferred" memory policy when it was set through libnuma, else None.
    """

    pid: int
    node: int | None
    cpus: tuple[int, ...]
    preferred_node: int | None = None
    #: the CUDA ordinal (in the parent) of the worker's GPU, or None
    gpu: int | None = None
    #: the worker's ``CUDA_VISIBLE_DEVICES`` once set (its GPU's entry, or worker_env's)
    cuda_visible_devices: str | None = None
    #: the EGL device index the worker was given (``MUJOCO_EGL_DEVICE_ID``), or None
    egl_device: int | None = None
    #: how ``egl_device`` was chosen (an EGL query, worker_env, or the documented fallback)
    egl_source: str | None = None


def _thread_ids() -> set[int]:
    try:
        return {int(name) for name in os.listdir("/proc/self/task") if name.isdigit()}
    except OSError:  # no procfs: only the calling thread can be pinned
        return set()


def _pin_all_threads(cpus: tuple[int, ...]) -> None:
    # sched_setaffinity(0) pins only the calling thread; the others (numpy/BLAS pools, anything
    # a sitecustomize started) are pinned one by one. Threads created later inherit the mask of
    # the thread that creates them, so pinning every existing thread covers future ones too.
    os.sched_setaffinity(0, cpus)
    done: set[int] = set()
    for _ in range(_MAX_REPIN_PASSES):
        new = _thread_ids() - done
        if not new:
            break
        for tid in new:
            with contextlib.suppress(ProcessLookupError):  # it exited since we listed it
                os.sched_setaffinity(tid, cpus)
        done |= new


def _set_preferred_node(node: int) -> int | None:
    """Best effort: make ``node`` the calling thread's preferred memory node via libnuma.

    Returns the node when the policy is in place, None when libnuma is missing, NUMA is not
    available (no kernel support, or set/get_mempolicy blocked by a seccomp profile), the node
    does not exist, or the call did not take. Never binds: allocation falls back to other nodes
    when this one is full. The policy is per thread and is inherited by threads created after.
    """
    try:
        lib = ctypes.CDLL("libnuma.so.1", use_errno=True)
        # numa_available() must come first; it is -1 when the mempolicy syscalls are unusable,
        # which also keeps numa_set_preferred from printing perror() noise on stderr.
        if lib.numa_available() < 0 or node > lib.numa_max_node():
            return None
        lib.numa_set_preferred(ctypes.c_int(node))
        mode = ctypes.c_int(-1)
        if lib.get_mempolicy(ctypes.byref(mode), None, ctypes.c_ulong(0), None, 0) != 0:
            return None
        if mode.value != _MPOL_PREFERRED or lib.numa_preferred() != node:
            return None
        return node
    except (OSError, AttributeError):  # no libnuma, or one without these symbols
        return None


def apply_placement(placement: Placement | None, *, prefer_memory: bool = True) -> PlacementReport:
    """Pin the calling process (all its threads) as planned and report the result.

    Call it first thing in the worker, before building envs and before touching shared
    observation rows. ``placement.cpus=None`` (or ``placement=None``) pins nothing. With
    ``prefer_memory`` and a node, libnuma's "preferred" policy is set when available (best
    effort, never "bind"). Raises OSError naming the worker when the kernel refuses the CPUs.
    """
    preferred: int | None = None
    if placement is not None and placement.cpus is not None:
        cpus = placement.cpus
        if not cpus:
            raise ValueError(f"worker {placement.worker}: empty CPU set in {placement!r}")
        try:
            _pin_all_threads(cpus)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"worker {placement.worker}: cannot pin to CPUs {format_cpulist(cpus)} "
                f"(allowed: {format_cpulist(allowed_cpus_now())}): {exc.strerror}",
            ) from exc
    if placement is not None and placement.node is not None and prefer_memory:
        preferred = _set_preferred_node(placement.node)
    return PlacementReport(
        pid=os.getpid(),
        node=None if placement is None else placement.node,
        cpus=allowed_cpus_now(),
        preferred_node=preferred,
    )


# --------------------------------------------------------------------------------------------
# How many CPUs' worth of time we may use: affinity and the cgroup CPU bandwidth limit
# --------------------------------------------------------------------------------------------


def _cgroup_entries(proc_cgroup: Path) -> list[tuple[list[str], str]]:
    """``/proc/self/cgroup`` as (controllers, path) pairs; cgroup v2's line has no controller."""
    text = _read_text(proc_cgroup)
    entries = []
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            entries.append(([c for c in parts[1].split(",") if c], parts[2]))
    return entries


def _walk_up(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors up to ``mount``. When the path is not under the
    mount (a container that sees the host's path but has its own cgroup mounted at the root),
    the mount itself is the cgroup."""
    leaf = mount / path.lstrip("/")
    if not leaf.is_dir():
        return [mount]
    dirs = [leaf]
    while dirs[-1] != mount and mount in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def cpu_quota(
    cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
) -> float | None:
    """The CPU bandwidth limit on this process (``docker --cpus``, a Kubernetes CPU limit), in
    CPUs (quota / period), or None when there is none or it cannot be read.

    Such a limit caps CPU *time*, not which CPUs: ``sched_getaffinity`` still lists every CPU of
    the host. It is the tightest ``cpu.max`` (cgroup v2) or ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (v1) on the way from the process's cgroup up to the mount.
    """
    root = Path(cgroup_root)
    limits: list[float] = []
    for controllers, path in _cgroup_entries(Path(proc_cgroup)):
        if not controllers:  # cgroup v2
            for directory in _walk_up(root, path):
                fields = (_read_text(directory / "cpu.max") or "").split()
                if len(fields) == 2 and fields[0] != "max":
                    with contextlib.suppress(ValueError, ZeroDivisionError):
                        limits.append(int(fields[0]) / int(fields[1]))
        elif "cpu" in controllers:
            mounts = [root / ",".join(controllers), root / "cpu,cpuacct", root / "cpu"]
            mount = next((m for m in mounts if m.is_dir()), None)
            for directory in _walk_up(mount, path) if mount is not None else []:
                quota = (_read_text(directory / "cpu.cfs_quota_us") or "").strip()
                period = (_read_text(directory / "cpu.cfs_period_us") or "").strip()
                with contextlib.suppress(ValueError, ZeroDivisionError):
                    if int(quota) > 0:
                        limits.append(int(quota) / int(period))
    positive = [limit for limit in limits if limit > 0]
    return min(positive) if positive else None


def usable_cpus() -> int:
    """CPUs this process can keep busy at once: its affinity, capped by the CPU bandwidth
    limit rounded down (at least 1). A 1.5-CPU limit counts as one CPU: spinning workers or a
    second worker would exhaust the quota and get the whole cgroup throttled (stopped until the
    next period, 100 ms by default), far worse than leaving half a CPU unused."""
    count = len(allowed_cpus_now())
    limit = cpu_quota()
    if limit is not None:
        count = min(count, max(1, int(limit)))
    return count
