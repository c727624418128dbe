"""Process topology: which rank and DataLoader worker this code runs in, and thread limits there.

Forked DataLoader workers must not inherit a thread pool started in the parent (a rayon or Arrow
pool forked mid-use deadlocks). tokpack's Rust pool is process-local and rebuilt after fork; on
top of that each worker defaults to one Rust thread and one Arrow thread, since ``num_workers``
processes already use the cores.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import pyarrow as pa
import torch

from ..errors import ConfigError

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
    return info.id, info.num_workers


def resolve_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """Given rank/world size, else torch.distributed's, else ``RANK``/``WORLD_SIZE``, else 0/1."""
    dist = torch.distributed
    live = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if live else int(os.environ.get("WORLD_SIZE", "1"))
    if rank is None:
        rank = dist.get_rank() if live else int(os.environ.get("RANK", "0"))
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return int(rank), int(world_size)
