"""Process topology: which rank and DataLoader worker this code runs in, and thread limits there.

Forked DataLoader workers must not inherit a thread pool started in the parent (a rayon or Arrow
pool forked mid-use deadlocks). tokpack's Rust pool is process-local and rebuilt after fork; on
top of that each worker defaults to one Rust thread and one Arrow thread, since ``num_workers``
processes already use the cores.

A worker also keeps the memory it frees for its next batch (glibc ``mallopt``: blocks up to 32 MB
come from the heap, which is not trimmed below 64 MB). A worker allocates and frees the same
sizes every batch (decoded row groups of a few MB, collated batches of a few hundred KB); with
glibc's defaults each of them is mapped anew and faulted in page by page: a fifth of the CPU
time of a 2-worker reader (measured on 60k samples packed at 4,096). Workers of a process that
set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` itself keep its settings.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional, Tuple

import pyarrow as pa
import torch

from .._checks import MAX_ROWS, check_int

__all__ = ["worker_slot", "resolve_rank"]

_limited_pid: Optional[int] = None


def worker_slot() -> Tuple[int, int]:
    """(worker id, number of workers) of the current DataLoader worker, (0, 1) outside one."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 0, 1
    global _limited_pid
    if _limited_pid != os.getpid():
        _limited_pid = os.getpid()
        os.environ.setdefault("TOKPACK_NUM_THREADS", "1")
        if os.environ["TOKPACK_NUM_THREADS"] == "1":
            pa.set_cpu_count(1)
        _keep_freed_memory()
    return info.id, info.num_workers


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _keep_freed_memory() -> None:
    """In a DataLoader worker: blocks up to 32 MB from the heap, kept up to 64 MB (module doc)."""
    if not sys.platform.startswith("linux") or any(
        k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    ):
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version()  # glibc only: another libc's mallopt means other things
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 64 << 20)


def resolve_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """Given rank/world size, else torch.distributed's, else ``RANK``/``WORLD_SIZE``, else 0/1."""
    dist = torch.distributed
    live = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if live else int(os.environ.get("WORLD_SIZE", "1"))
    if rank is None:
        rank = dist.get_rank() if live else int(os.environ.get("RANK", "0"))
    world_size = check_int(world_size, "world_size", 1, MAX_ROWS)
    return check_int(rank, "rank", 0, world_size - 1), world_size
