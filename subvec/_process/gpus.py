"""GPU discovery, the GPU each worker renders on, and the variables that tell it which.

Data flow::

    parent                                         worker w (its own process)
    ------                                         --------------------------
    discover_gpus(proc_root, sysfs_root, visible)
      /proc/driver/nvidia/gpus/*/information       (first choice: no process started)
      or nvidia-smi --query-gpu=index,pci.bus_id   (second choice)
      /sys/bus/pci/devices/<bus id>/numa_node
      CUDA_VISIBLE_DEVICES of the parent
          -> GpuTopology [Gpu(index, bus_id, node, cuda_id)]
    resolve_gpus(gpus=...) -> [Gpu]
    plan_placement(..., gpus)  (``_process.topology``)
          -> Placement(w, node of its GPU, cpus, gpu) ---> gpu_environment(placement, env)
                                                             CUDA_VISIBLE_DEVICES, then
                                                             the user's worker_env, then
                                                             MUJOCO_EGL_DEVICE_ID /
                                                             EGL_DEVICE_ID (EGL index by PCI
                                                             bus id when MUJOCO_GL is egl)

**Indices.** A GPU index in ``gpus=`` is a CUDA ordinal as the parent process sees it: with
``CUDA_VISIBLE_DEVICES=2,3`` in the parent, ``gpus=[0]`` is physical GPU 2, and its worker gets
``CUDA_VISIBLE_DEVICES=2`` (the parent's own entry, UUIDs included), so that the worker sees
exactly that one GPU as its ``cuda:0``. The driver's GPUs are taken in PCI bus order, which is
nvidia-smi's order and CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (or with identical GPUs).

**EGL.** EGL numbers its devices on its own: in a container with a subset of the GPUs the EGL
index of a GPU is often not its CUDA index. When the worker's ``MUJOCO_GL`` (or
``PYOPENGL_PLATFORM``) is ``egl``, the worker asks libEGL for its devices
(``eglQueryDevicesEXT``) and the DRM device file of each (``EGL_EXT_device_drm``), whose sysfs
entry names its PCI address: the device with the GPU's bus id gives the index. Otherwise, or
when that fails, the index is the GPU's CUDA ordinal in the parent (the usual guess), and the
worker's report says so (``egl_source``). Querying happens in the worker only, before its
factories are unpickled: the parent never loads libEGL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "EGL_VARIABLES",
    "Gpu",
    "GpuReport",
    "GpuSpec",
    "GpuTopology",
    "discover_gpus",
    "egl_index",
    "gpu_environment",
    "parse_visible",
    "resolve_gpus",
]

#: The variables that choose the EGL device: MuJoCo's and the generic one (dm_control, others).
EGL_VARIABLES = ("MUJOCO_EGL_DEVICE_ID", "EGL_DEVICE_ID")

#: Seconds nvidia-smi may take to answer (it can hang on a GPU in a bad state).
_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Gpu:
    """One GPU this process may use.

    Attributes:
        index: its CUDA ordinal in this process (what ``gpus=[...]`` names).
        node: the NUMA node it is attached to, or None when unknown.
        bus_id: its PCI address as sysfs writes it (``0000:3b:00.0``), or None when unknown.
        cuda_id: what a worker's ``CUDA_VISIBLE_DEVICES`` holds to see it (and only it): the
            parent's own entry for it (an index or a UUID), else its physical index.
        uuid: its UUID (``GPU-...``) when the driver says, else None.
    """

    index: int
    node: int | None = None
    bus_id: str | None = None
    cuda_id: str | None = None
    uuid: str | None = None

    @property
    def visible_id(self) -> str:
        """The value of ``CUDA_VISIBLE_DEVICES`` for a worker on this GPU."""
        return str(self.index) if self.cuda_id is None else self.cuda_id


@dataclass(frozen=True)
class GpuTopology:
    """The GPUs this process may use, in CUDA order, and where they were read from."""

    gpus: tuple[Gpu, ...]
    source: str = "explicit"

    def by_index(self) -> dict[int, Gpu]:
        """The GPUs by CUDA ordinal."""
        return {gpu.index: gpu for gpu in self.gpus}


#: What ``gpus=`` accepts: None, ``"auto"``, GPU indices, ``{gpu: numa_node}``, a GpuTopology.
GpuSpec = str | Sequence[int] | Mapping[int, int | None] | GpuTopology | None


# --------------------------------------------------------------------------------------------
# Discovery (parent side)
# --------------------------------------------------------------------------------------------


def normalise_bus_id(text: str) -> str:
    """A PCI address as sysfs names it: ``00000000:3B:00.0`` (nvidia-smi) -> ``0000:3b:00.0``.

    Raises:
        ValueError: not a ``[domain:]bus:device.function`` address.
    """
    match = re.fullmatch(
        r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])", text.strip()
    )
    if match is None:
        raise ValueError(f"not a PCI address: {text!r} (expected domain:bus:device.function)")
    domain = int(match.group(1) or "0", 16) & 0xFFFF
    bus, device = int(match.group(2), 16), int(match.group(3), 16)
    return f"{domain:04x}:{bus:02x}:{device:02x}.{match.group(4)}"


def parse_visible(text: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as its entries, or None when it is unset (every GPU visible).

    As CUDA reads it: entries are comma-separated, and the list ends at the first entry that
    is ``-1`` (an empty or ``-1`` value hides every GPU).
    """
    if text is None:
        return None
    entries: list[str] = []
    for part in text.split(","):
        item = part.strip()
        if not item or item.startswith("-"):
            break
        entries.append(item)
    return entries


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
        return None


def _numa_node(sysfs_root: Path, bus_id: str | None) -> int | None:
    """``/sys/bus/pci/devices/<bus id>/numa_node``; -1 (no affinity) and a missing file give
    None."""
    if bus_id is None:
        return None
    text = _read(sysfs_root / "bus" / "pci" / "devices" / bus_id / "numa_node")
    if text is None:
        return None
    with contextlib.suppress(ValueError):
        node = int(text.strip())
        return node if node >= 0 else None
    return None


def _from_driver(proc_root: Path) -> list[tuple[str, str | None]] | None:
    """(bus id, uuid) of each GPU the NVIDIA driver lists, in bus order; None without it."""
    gpus_dir = proc_root / "driver" / "nvidia" / "gpus"
    if not gpus_dir.is_dir():
        return None
    found: list[tuple[str, str | None]] = []
    for entry in gpus_dir.iterdir():
        text = _read(entry / "information") or ""
        fields = dict(
            (key.strip(), value.strip())
            for key, sep, value in (line.partition(":") for line in text.splitlines())
            if sep
        )
        try:
            bus_id = normalise_bus_id(fields.get("Bus Location") or entry.name)
        except ValueError:
            continue  # not a GPU directory
        found.append((bus_id, fields.get("GPU UUID") or None))
    return sorted(found)


def _from_smi(smi: str) -> list[tuple[str, str | None]] | None:
    """(bus id, uuid) of each GPU nvidia-smi lists, in its index order; None without it."""
    path = shutil.which(smi)
    if path is None:
        return None
    try:
        result = subprocess.run(
            [path, "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    rows: list[tuple[int, str, str | None]] = []
    for line in result.stdout.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 2 or not fields[0].isdigit():
            continue
        try:
            bus_id = normalise_bus_id(fields[1])
        except ValueError:
            continue
        uuid = fields[2] if len(fields) > 2 and fields[2].startswith("GPU-") else None
        rows.append((int(fields[0]), bus_id, uuid))
    return [(bus_id, uuid) for _, bus_id, uuid in sorted(rows)]


def discover_gpus(
    proc_root: str | os.PathLike[str] = "/proc",
    sysfs_root: str | os.PathLike[str] = "/sys",
    visible: str | None = None,
    *,
    smi: str | None = "nvidia-smi",
    from_environment: bool = True,
) -> GpuTopology:
    """Read the GPUs this process may use and their NUMA nodes.

    The GPUs come from the NVIDIA driver's ``<proc_root>/driver/nvidia/gpus/*/information``
    (PCI bus id and UUID), else from ``nvidia-smi --query-gpu=index,pci.bus_id,uuid`` when
    ``smi`` is on the PATH; each GPU's node from ``<sysfs_root>/bus/pci/devices/<bus id>/
    numa_node``. ``visible`` (default, with ``from_environment``: this process's
    ``CUDA_VISIBLE_DEVICES``) selects and orders them as CUDA does: entry ``k`` (a physical
    index or a GPU UUID, a prefix of one included) is CUDA ordinal ``k``; the list stops at
    the first entry that names no GPU here.

    Args:
        proc_root: procfs mount (tests point it at a fake tree).
        sysfs_root: sysfs mount.
        visible: a ``CUDA_VISIBLE_DEVICES`` value to use instead of the environment's.
        smi: the nvidia-smi command, or None not to run it.
        from_environment: read ``CUDA_VISIBLE_DEVICES`` when ``visible`` is None.

    Returns:
        The :class:`GpuTopology`; no GPU at all when neither source is there.
    """
    if visible is None and from_environment:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    driver_dir = Path(proc_root) / "driver" / "nvidia" / "gpus"
    physical = _from_driver(Path(proc_root))
    source = f"NVIDIA driver {driver_dir}"
    if physical is None and smi is not None:
        physical = _from_smi(smi)
        source = "nvidia-smi --query-gpu=index,pci.bus_id"
    if physical is None:
        return GpuTopology((), f"none: no {driver_dir} and no nvidia-smi")
    entries = parse_visible(visible)
    chosen: list[tuple[int, str]] = []  # (physical index, the entry that named it)
    if entries is None:
        chosen = [(i, str(i)) for i in range(len(physical))]
    else:
        source += f", CUDA_VISIBLE_DEVICES={visible}"
        for entry in entries:
            match = _match_entry(entry, physical)
            if match is None or any(match == i for i, _ in chosen):
                break  # CUDA ignores the rest of the list from here
            chosen.append((match, entry))
    root = Path(sysfs_root)
    gpus = tuple(
        Gpu(
            index=ordinal,
            node=_numa_node(root, physical[i][0]),
            bus_id=physical[i][0],
            cuda_id=entry,
            uuid=physical[i][1],
        )
        for ordinal, (i, entry) in enumerate(chosen)
    )
    return GpuTopology(gpus, source)


def _match_entry(entry: str, physical: Sequence[tuple[str, str | None]]) -> int | None:
    """The physical index that a ``CUDA_VISIBLE_DEVICES`` entry names, or None."""
    if entry.isdigit():
        index = int(entry)
        return index if index < len(physical) else None
    if entry.startswith("GPU-"):
        hits = [i for i, (_, uuid) in enumerate(physical) if uuid and uuid.startswith(entry)]
        return hits[0] if len(hits) == 1 else None
    return None  # a MIG instance or something else: not a whole GPU we can place


def resolve_gpus(
    gpus: GpuSpec,
    *,
    discover: Callable[[], GpuTopology] = discover_gpus,
) -> list[Gpu] | None:
    """The GPUs the workers are assigned to, in order, or None for ``gpus=None``.

    ``"auto"``: every GPU discovery finds. A list: those CUDA ordinals, in that order (nodes
    and bus ids from discovery where it knows the GPU, else unknown). ``{gpu: node}``: those
    ordinals on those nodes (None: unknown), whatever discovery says; bus ids are still taken
    from discovery where it knows the GPU (for the EGL lookup). A :class:`GpuTopology`: its
    GPUs as they are.

    Raises:
        TypeError: another kind of value.
        ValueError: ``"auto"`` with no GPU found, an empty list or mapping, a negative or
            repeated index, a negative node, or an index discovery does not know while it
            found GPUs.
    """
    if gpus is None:
        return None
    if isinstance(gpus, GpuTopology):
        if not gpus.gpus:
            raise ValueError(f"gpus: the GpuTopology holds no GPU ({gpus.source})")
        return list(gpus.gpus)
    if isinstance(gpus, str):
        if gpus != "auto":
            raise ValueError(
                f'gpus must be None, "auto", a list or a {{gpu: node}} dict, got {gpus!r}'
            )
        found = discover()
        if not found.gpus:
            raise ValueError(
                f'gpus="auto" found no GPU this process may use ({found.source}); pass '
                "gpus=None, or a {gpu: numa_node} dict where the topology cannot be read"
            )
        return list(found.gpus)
    if isinstance(gpus, Mapping):
        indices = _check_indices(list(gpus))
        nodes = {}
        for index in indices:
            node = gpus[index]
            bad = isinstance(node, bool) or not isinstance(node, int) or node < 0
            if node is not None and bad:
                raise ValueError(
                    f"gpus: the node of GPU {index} must be an int >= 0 or None, got {node!r}"
                )
            nodes[index] = node
        known = discover().by_index()
        return [
            Gpu(
                index,
                nodes[index],
                known[index].bus_id if index in known else None,
                known[index].cuda_id if index in known else _visible_entry(index),
                known[index].uuid if index in known else None,
            )
            for index in indices
        ]
    if isinstance(gpus, Iterable):
        indices = _check_indices(list(gpus))
        found = discover()
        known = found.by_index()
        if known:
            missing = [index for index in indices if index not in known]
            if missing:
                raise ValueError(
                    f"gpus={list(indices)}: no GPU {missing[0]} here; this process sees GPUs "
                    f"{sorted(known)} ({found.source})"
                )
            return [known[index] for index in indices]
        return [Gpu(index, None, None, _visible_entry(index)) for index in indices]
    raise TypeError(
        f'gpus must be None, "auto", a list of GPU indices, a {{gpu: numa_node}} dict or a '
        f"GpuTopology, got {type(gpus).__name__}: {gpus!r}"
    )


def _check_indices(indices: list[Any]) -> list[int]:
    if not indices:
        raise ValueError("gpus: give at least one GPU index (or gpus=None for no GPU)")
    seen: set[int] = set()
    for index in indices:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"gpus: GPU indices must be non-negative ints, got {index!r}")
        if index in seen:
            raise ValueError(f"gpus: GPU {index} is listed twice")
        seen.add(index)
    return indices


def _visible_entry(index: int) -> str | None:
    """The parent's ``CUDA_VISIBLE_DEVICES`` entry for CUDA ordinal ``index``, if it has one."""
    entries = parse_visible(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if entries is not None and index < len(entries):
        return entries[index]
    return None


# --------------------------------------------------------------------------------------------
# The worker's GPU variables (worker side, before its factories are unpickled)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuReport:
    """What a worker on a GPU set: the EGL index and how it was found."""

    egl_device: int | None
    egl_source: str


def gpu_environment(
    gpu: Gpu | None,
    env: Mapping[str, str | None],
    *,
    egl_lookup: Callable[[str], int | None] | None = None,
) -> GpuReport | None:
    """Set this process's environment for its GPU and ``worker_env`` (call it in the worker).

    Order: ``CUDA_VISIBLE_DEVICES`` for ``gpu``; then ``env`` (the user's, which wins); then,
    unless ``env`` set them, ``MUJOCO_EGL_DEVICE_ID`` and ``EGL_DEVICE_ID`` to the GPU's EGL
    index. One of the two set by ``env`` gives its value to the other.

    Returns:
        What was chosen for EGL, or None without a GPU.
    """
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu.visible_id
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if gpu is None:
        return None
    given = [key for key in EGL_VARIABLES if key in env]
    if given:
        value = env[given[0]]
        for key in EGL_VARIABLES:
            if key not in env and value is not None:
                os.environ[key] = value
        index = int(value) if value is not None and value.strip().isdigit() else None
        return GpuReport(index, f"worker_env {given[0]}")
    index, source = _choose_egl(gpu, egl_lookup)
    for key in EGL_VARIABLES:
        os.environ[key] = str(index)
    return GpuReport(index, source)


def _choose_egl(gpu: Gpu, egl_lookup: Callable[[str], int | None] | None) -> tuple[int, str]:
    fallback = "CUDA index in the parent (fallback: {})"
    platform = os.environ.get("MUJOCO_GL") or os.environ.get("PYOPENGL_PLATFORM")
    if platform != "egl":
        return gpu.index, fallback.format(f"MUJOCO_GL={platform or '(unset)'}, EGL not queried")
    if gpu.bus_id is None:
        return gpu.index, fallback.format("the GPU's PCI bus id is unknown")
    lookup = egl_index if egl_lookup is None else egl_lookup
    try:
        index = lookup(gpu.bus_id)
    except Exception as exc:  # a broken libEGL must not stop the worker: the guess remains
        return gpu.index, fallback.format(f"EGL query failed: {type(exc).__name__}: {exc}")
    if index is None:
        return gpu.index, fallback.format(f"no EGL device has PCI bus id {gpu.bus_id}")
    return index, f"EGL device with PCI bus id {gpu.bus_id}"


# --------------------------------------------------------------------------------------------
# EGL device index by PCI bus id
# --------------------------------------------------------------------------------------------

_EGL_DRM_DEVICE_FILE_EXT = 0x3233


def egl_index(
    bus_id: str,
    *,
    drm_files: Sequence[str | None] | None = None,
    sysfs_root: str | os.PathLike[str] = "/sys",
) -> int | None:
    """The index of the EGL device (in ``eglQueryDevicesEXT``'s order, which MuJoCo's
    ``MUJOCO_EGL_DEVICE_ID`` counts in) whose PCI address is ``bus_id``, or None.

    Each EGL device's DRM device file (``/dev/dri/cardN``) names a sysfs entry
    (``<sysfs_root>/class/drm/cardN/device``) that links to its PCI device. ``drm_files``
    gives one file (or None) per EGL device; by default libEGL is asked.
    """
    files = _egl_drm_files() if drm_files is None else drm_files
    want = normalise_bus_id(bus_id)
    root = Path(sysfs_root)
    for index, drm_file in enumerate(files):
        if not drm_file:
            continue
        link = root / "class" / "drm" / Path(drm_file).name / "device"
        try:
            target = os.path.basename(os.path.realpath(link))
            if normalise_bus_id(target) == want:
                return index
        except ValueError:
            continue
    return None


def _egl_drm_files() -> list[str | None]:
    """Every EGL device's DRM device file (None where the device has none), from libEGL.

    Raises:
        OSError: no libEGL, or one without the device extensions.
    """
    egl = ctypes.CDLL("libEGL.so.1")
    get_proc = egl.eglGetProcAddress
    get_proc.restype = ctypes.c_void_p
    get_proc.argtypes = [ctypes.c_char_p]
    query_devices_addr = get_proc(b"eglQueryDevicesEXT")
    query_string_addr = get_proc(b"eglQueryDeviceStringEXT")
    if not query_devices_addr or not query_string_addr:
        raise OSError("libEGL has no EGL_EXT_device_enumeration / EGL_EXT_device_query")
    query_devices = ctypes.CFUNCTYPE(
        ctypes.c_uint, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int)
    )(query_devices_addr)
    query_string = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int)(
        query_string_addr
    )
    count = ctypes.c_int(0)
    if not query_devices(0, None, ctypes.byref(count)) or count.value <= 0:
        return []
    devices = (ctypes.c_void_p * count.value)()
    if not query_devices(count.value, devices, ctypes.byref(count)):
        return []
    files: list[str | None] = []
    for device in devices[: count.value]:
        name = query_string(device, _EGL_DRM_DEVICE_FILE_EXT)
        files.append(name.decode() if name else None)
    return files
