"""One shared-memory block per vector env, and the numpy views over it.

Ownership: the parent creates the block and is the only process that unlinks it; workers attach
by name and only ``close()``. The parent starts the resource tracker *before* any worker exists,
so every worker (fork, forkserver or spawn) reports to the parent's tracker: if the whole process
tree is killed, that tracker unlinks the block. Workers must not ``unregister`` (on Python < 3.13
a child's unregister removes the parent's entry and the segment would leak).

Layout: regions are placed one after another, each starting on a page boundary so that a
worker's first write of its observation rows decides the NUMA node of those pages. The parent
never writes the observation region: the kernel hands out zero pages on first touch.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from subvec.errors import SharedMemoryTooSmallError

__all__ = [
    "SEGMENT_PREFIX",
    "BlockLayout",
    "Region",
    "SharedBlock",
    "has_free_space",
    "remove_stale_segments",
]

SEGMENT_PREFIX = "subvec_"
_ALIGN = 4096
_SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class Region:
    """One array in the block: name, dtype, full shape (num_envs first for per-env arrays)
    and byte offset."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))


@dataclass(frozen=True)
class BlockLayout:
    """The regions of a block and its total size; pickled to workers in the ATTACH command."""

    regions: tuple[Region, ...]
    size: int

    @classmethod
    def plan(cls, arrays: Iterable[tuple[str, np.dtype[Any], tuple[int, ...]]]) -> BlockLayout:
        regions = []
        offset = 0
        for name, dtype, shape in arrays:
            region = Region(name, np.dtype(dtype).str, tuple(shape), offset)
            regions.append(region)
            offset += -(-max(region.nbytes, 1) // _ALIGN) * _ALIGN
        return cls(tuple(regions), max(offset, _ALIGN))


def layout_views(buffer: Any, layout: BlockLayout) -> dict[str, np.ndarray]:
    """Each region of ``layout`` as an array over ``buffer`` (a mapped block, or the parent's
    own memory when every env runs in-process)."""
    return {
        region.name: np.frombuffer(
            buffer,
            dtype=np.dtype(region.dtype),
            count=int(np.prod(region.shape, dtype=np.int64)),
            offset=region.offset,
        ).reshape(region.shape)
        for region in layout.regions
    }


class SharedBlock:
    """A mapped block and its views. ``create`` in the parent, ``attach`` in a worker."""

    def __init__(self, shm: shared_memory.SharedMemory, layout: BlockLayout, owner: bool) -> None:
        self._shm: shared_memory.SharedMemory | None = shm
        self.name = shm.name
        self.layout = layout
        self.owner = owner
        buf = shm.buf
        assert buf is not None
        self.views = layout_views(buf, layout)

    @classmethod
    def create(cls, layout: BlockLayout) -> SharedBlock:
        check_free_space(layout.size)
        # The tracker must run before workers start (see module docstring); creating the block
        # below would start it too late for workers forked earlier.
        resource_tracker.ensure_running()
        name = f"{SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=layout.size)
        return cls(shm, layout, owner=True)

    @classmethod
    def attach(cls, name: str, layout: BlockLayout) -> SharedBlock:
        shm = shared_memory.SharedMemory(name=name, create=False)
        return cls(shm, layout, owner=False)

    def close(self) -> None:
        """Drop our views, unmap, and (owner only) unlink. Safe to call twice.

        If the caller still holds views (``copy=False`` results), unmapping is impossible until
        they are garbage-collected; the name is unlinked regardless, so nothing outlives the
        process in ``/dev/shm``.
        """
        shm, self._shm = self._shm, None
        if shm is None:
            return
        self.views = {}
        try:
            shm.close()
        except BufferError:
            # Someone still holds a view (a copy=False result). Let the mapping die with the
            # last view instead of failing now, and stop SharedMemory.__del__ from retrying.
            shm._mmap = None  # type: ignore[attr-defined]
            if getattr(shm, "_fd", -1) >= 0:
                os.close(shm._fd)  # type: ignore[attr-defined]
                shm._fd = -1  # type: ignore[attr-defined]
        finally:
            if self.owner:
                try:
                    shm.unlink()
                except FileNotFoundError:
                    pass  # already unlinked (`subvec shm clean`, or a second close): done


def _free_space(directory: str) -> int | None:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None  # no /dev/shm (macOS): the platform reports failures at creation
    return stats.f_bavail * stats.f_frsize


def has_free_space(size: int, directory: str = _SHM_DIR) -> bool:
    """Whether a block of ``size`` bytes fits (True where that cannot be told)."""
    available = _free_space(directory)
    return available is None or size <= available


def check_free_space(size: int, directory: str = _SHM_DIR) -> None:
    """Refuse a block that does not fit, instead of a SIGBUS in a worker on first touch."""
    available = _free_space(directory)
    if available is not None and size > available:
        raise SharedMemoryTooSmallError(
            f"the shared-memory block needs {size / 2**20:.1f} MiB but {directory} has only "
            f"{available / 2**20:.1f} MiB free; enlarge it (docker: --shm-size), use fewer envs, "
            f"or pass shared_memory=False to send observations through pipes",
            needed=size,
            available=available,
        )


def list_segments(directory: str = _SHM_DIR) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if n.startswith(SEGMENT_PREFIX))
    except OSError:
        return []


def remove_stale_segments(
    directory: str = _SHM_DIR, pids: Sequence[int] | None = None
) -> list[str]:
    """Remove ``/dev/shm/subvec_<pid>_*`` segments whose creating process no longer exists.

    Returns the names removed. Segments of live processes are kept: their owner still uses them.
    """
    removed = []
    for name in list_segments(directory):
        try:
            pid = int(name[len(SEGMENT_PREFIX) :].split("_", 1)[0])
        except ValueError:
            continue
        if pids is not None and pid not in pids:
            continue
        if _pid_alive(pid):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except FileNotFoundError:
            pass  # its owner (or another cleaner) removed it meanwhile
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def add_cli_parser(subparsers: Any) -> None:
    """``subvec shm [--clean]``: list subvec's segments in /dev/shm, remove the stale ones."""
    parser = subparsers.add_parser(
        "shm",
        help="list /dev/shm/subvec_* segments; --clean removes those of dead processes",
    )
    parser.add_argument("--clean", action="store_true", help="remove segments of dead processes")
    parser.add_argument("--dir", default=_SHM_DIR, help="shared-memory directory (/dev/shm)")
    parser.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.dir):
        # macOS keeps POSIX shared memory out of the file system: nothing can be listed, and
        # the resource tracker is what unlinks a dead process's segments there.
        print(
            f"{args.dir} does not exist ({sys.platform}): no segments can be listed. On "
            "macOS POSIX shared memory is not in the file system; multiprocessing's resource "
            "tracker unlinks the segments of dead processes there"
        )
        return 0
    removed = remove_stale_segments(args.dir) if args.clean else []
    for name in removed:
        print(f"removed {name}")
    for name in list_segments(args.dir):
        pid = name[len(SEGMENT_PREFIX) :].split("_", 1)[0]
        state = "live" if pid.isdigit() and _pid_alive(int(pid)) else "stale"
        print(f"{state:5} {name}")
    if not removed and not list_segments(args.dir):
        print(f"no {SEGMENT_PREFIX}* segments in {args.dir}")
    return 0
