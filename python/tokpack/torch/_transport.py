"""Batches from DataLoader workers to the main process through one shared-memory ring per worker.

torch sends each tensor of a worker's batch through a shared-memory block of its own, and the main
process fetches each block's file descriptor over a socket from a thread of the worker, which
needs the worker's GIL: about a millisecond per tensor on a busy 2-core machine, more than
building the batch. Here a worker copies all the tensors of a batch into one slot of a ring of
shared memory it creates once; the batch crosses the DataLoader's queue as the slot's number, the
tensors' dtypes and shapes and the rest of the batch (ints, lists, ...). The ring's own storage
crosses once, with the first batch that uses it (a worker's messages arrive in order). The main
process rebuilds a plain ``dict`` whose tensors are views of the slot, and the slot is free again
once every tensor of that batch has been freed there: a batch the caller holds is never
overwritten. When every slot is held, the batch travels in a shared block of its own (one
descriptor instead of one per tensor).

Only :class:`WorkerBatch` takes this route, and only when pickled by multiprocessing's
``ForkingPickler`` (the DataLoader's queues); :func:`ship` wraps a batch made inside a DataLoader
worker and leaves it alone elsewhere, so ``num_workers=0`` returns the dict itself.

The queue pickles a batch later, on its feeder thread, where an exception is printed and the
batch lost (the main process then waits for it forever). So :func:`ship` takes the batch's
shared memory (a slot, or a block of its own) in the worker itself, where a failure (no space
left in ``/dev/shm``) is raised to the DataLoader, which re-raises it in the main process; the
feeder thread only copies the tensors in.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch

from .._io.pids import pid_alive
from ..errors import OutputError

__all__ = ["WorkerBatch", "ship"]

# Offsets of tensors in a slot: a multiple of every element size, so views of any dtype are legal.
_ALIGN = 64
_PAGE = 4096
# Slots per ring. The lowest free slot is taken, so only as many are ever touched (and backed by
# memory) as the main process holds at once: about prefetch_factor per worker plus the batch in use.
_SLOTS = 8
# A ring's slots hold 1.25 times its first batch (batches of a loader differ a little), at least
# this many bytes; a batch too big for them gets a new ring.
_MIN_SLOT = 1 << 16

# dtypes whose values a byte copy carries exactly (views of uint8 storage in any of them are legal).
_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    }
)


class WorkerBatch(dict):
    """A batch made in a DataLoader worker: a dict, which crosses a multiprocessing queue through
    the worker's shared-memory ring and arrives as a plain ``dict``. Pickled any other way (a
    file, ``copy``) it is a plain dict too."""

    # The shared memory ship() took for it, used by its first trip through a queue.
    __slots__ = ("_place",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._place: Optional[_Place] = None

    def __copy__(self) -> "WorkerBatch":
        return WorkerBatch(self)

    def __reduce__(self):
        return (dict, (dict(self),))

    def __del__(self) -> None:
        place, self._place = getattr(self, "_place", None), None
        if place is not None:  # never sent: the slot is free again
            place.release()


def ship(batch: Any) -> Any:
    """``batch`` as a :class:`WorkerBatch` when it is a dict made inside a DataLoader worker,
    its shared memory taken here (module docstring)."""
    if type(batch) is dict and torch.utils.data.get_worker_info() is not None:
        shipped = WorkerBatch(batch)
        tensors: List[torch.Tensor] = []
        _strip(shipped, tensors, {})
        if tensors:
            shipped._place = _take_place(_layout(tensors)[1])
        return shipped
    return batch


class _Leaf(NamedTuple):
    """Where tensor ``i`` of the batch goes back into its structure."""

    i: int


def _movable(t: Any) -> bool:
    return (
        type(t) is torch.Tensor
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and t.dtype in _DTYPES
        and not t.requires_grad
    )


def _strip(obj: Any, tensors: List[torch.Tensor], seen: Dict[int, _Leaf]) -> Any:
    """``obj`` with its movable tensors (in dicts, lists and tuples) replaced by ``_Leaf``s; the
    same tensor twice becomes the same leaf, so it arrives as one tensor."""
    if isinstance(obj, torch.Tensor):
        if not _movable(obj):
            return obj
        leaf = seen.get(id(obj))
        if leaf is None:
            leaf = seen[id(obj)] = _Leaf(len(tensors))
            tensors.append(obj)
        return leaf
    if type(obj) in (dict, WorkerBatch):
        return {k: _strip(v, tensors, seen) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_strip(v, tensors, seen) for v in obj)
    return obj


def _fill(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if type(obj) is _Leaf:
        return tensors[obj.i]
    if type(obj) is dict:
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


Spec = Tuple[int, int, torch.dtype, Tuple[int, ...]]


def _layout(tensors: List[torch.Tensor]) -> Tuple[List[Spec], int]:
    """(offset, bytes, dtype, shape) of each tensor in a slot, and the bytes used."""
    specs = []
    used = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        specs.append((used, n, t.dtype, tuple(t.shape)))
        used += -(-n // _ALIGN) * _ALIGN
    return specs, used


def _write(block: torch.Tensor, tensors: List[torch.Tensor], specs: List[Spec]) -> None:
    for t, view in zip(tensors, _views(block, specs)):
        view.copy_(t)


def _views(block: torch.Tensor, specs: List[Spec]) -> List[torch.Tensor]:
    """The tensors laid out in ``block`` (uint8, aligned, a multiple of ``_ALIGN`` bytes long)
    by ``specs``: one strided view each of the block seen as its dtype."""
    typed: Dict[torch.dtype, torch.Tensor] = {}
    out = []
    for offset, _, dtype, shape in specs:
        base = typed.get(dtype)
        if base is None:
            base = typed[dtype] = block.view(dtype)
        start = offset // dtype.itemsize
        out.append(base[start : start + math.prod(shape)].view(shape))
    return out


def _shared_bytes(n: int) -> torch.Tensor:
    """A uint8 tensor of ``n`` bytes in shared memory."""
    storage = torch.UntypedStorage._new_shared(max(n, 1))  # an empty one cannot be mapped
    return torch.empty(0, dtype=torch.uint8).set_(storage)[:n]


# What torch raises when shared memory cannot be had ("unable to allocate shared memory(shm)
# ...: No space left on device (28)", too many open files, ...).
_ALLOCATION_ERRORS = (RuntimeError, OSError)


# -- worker side ---------------------------------------------------------------------------------


class _Ring:
    """A worker's ring: a header of slot flags (1 = held by the main process), then the slots."""

    def __init__(self, serial: int, slot_bytes: int) -> None:
        self.key = (os.getpid(), serial)
        self.slot_bytes = slot_bytes
        self.memory = _shared_bytes(_PAGE + _SLOTS * slot_bytes)
        self.flags = self.memory[:_SLOTS].numpy()
        self.sent = False

    def take(self) -> Optional[int]:
        slot = self.flags.tobytes().find(0)
        if slot < 0:
            return None
        self.flags[slot] = 1
        return slot

    def slot(self, slot: int, used: int) -> torch.Tensor:
        start = _PAGE + slot * self.slot_bytes
        return self.memory[start : start + used]


_lock = threading.Lock()
_ring: Optional[_Ring] = None
_serial = 0


def _worker_slot(used: int) -> Optional[Tuple[_Ring, int]]:
    """A free slot of this process's ring of at least ``used`` bytes (a bigger ring replaces a
    ring too small; the main process keeps the old one mapped while its batches live)."""
    global _ring, _serial
    ring = _ring
    if ring is None or ring.key[0] != os.getpid() or ring.slot_bytes < used:
        _serial += 1
        slot_bytes = -(-max(used + used // 4, _MIN_SLOT) // _PAGE) * _PAGE
        ring = _Ring(_serial, slot_bytes)  # raises when shared memory is short
        _ring = ring
    slot = ring.take()
    return None if slot is None else (ring, slot)


class _Place:
    """Where a batch of up to ``capacity`` bytes goes: slot ``slot`` of ``ring``, or ``block``."""

    __slots__ = ("ring", "slot", "block", "capacity")

    def __init__(self, ring: Optional[_Ring], slot: int, block: Optional[torch.Tensor]) -> None:
        self.ring, self.slot, self.block = ring, slot, block
        self.capacity = ring.slot_bytes if ring is not None else len(block)  # type: ignore[arg-type]

    def release(self) -> None:
        if self.ring is not None:
            self.ring.flags[self.slot] = 0


def _take_place(used: int) -> _Place:
    """Shared memory for a batch of ``used`` bytes: a slot of the ring, else (every slot held,
    or no room for a ring) a block of its own; an OutputError when neither can be had."""
    try:
        with _lock:
            found = _worker_slot(used)
    except _ALLOCATION_ERRORS:
        found = None  # a ring holds several batches: one batch's block may still fit
    if found is not None:
        return _Place(*found, None)
    try:
        return _Place(None, 0, _shared_bytes(used))
    except _ALLOCATION_ERRORS as exc:
        raise OutputError(
            f"cannot get {used:,} bytes of shared memory for a batch of this DataLoader worker"
            f" ({exc}): give /dev/shm more room (docker: --shm-size), or hold fewer batches"
            " (fewer workers, a lower prefetch_factor), or load in the main process"
            " (num_workers=0)"
        ) from None


def _reduce_batch(batch: WorkerBatch):
    # On the queue's feeder thread: only copies, into the place ship() took in the worker. A
    # batch that did not come through ship() (or grew since) takes its place here, where a
    # failure cannot be raised: it travels to the main process, which raises it.
    place, batch._place = getattr(batch, "_place", None), None
    tensors: List[torch.Tensor] = []
    skeleton = _strip(batch, tensors, {})
    specs, used = _layout(tensors)
    if place is not None and (not tensors or place.capacity < used):
        place.release()
        place = None
    if not tensors:
        return (dict, (skeleton,))
    if place is None:
        try:
            place = _take_place(used)
        except OutputError as error:
            return (_raise, (error,))
    if place.block is not None:
        block = place.block[:used]
        _write(block, tensors, specs)
        return (_rebuild_block, (block, specs, skeleton))
    ring, slot = place.ring, place.slot
    assert ring is not None
    with _lock:
        memory = None if ring.sent else ring.memory
        ring.sent = True
    _write(ring.slot(slot, used), tensors, specs)
    return (_rebuild_slot, (ring.key, memory, ring.slot_bytes, slot, used, specs, skeleton))


ForkingPickler.register(WorkerBatch, _reduce_batch)


# -- main-process side ---------------------------------------------------------------------------

# Rings this process has received, by (worker pid, serial): each is the ring's bytes as numpy.
_rings: Dict[Tuple[int, int], np.ndarray] = {}


def _after_fork_in_child() -> None:
    # A forked worker starts with its own lock (the parent's may have been held by its
    # pin-memory thread) and without the parent's rings (it never receives batches).
    global _lock, _rings
    _lock = threading.Lock()
    _rings = {}


os.register_at_fork(after_in_child=_after_fork_in_child)


def _done(pid: int, ring: np.ndarray) -> bool:
    return not ring[:_SLOTS].any() and not pid_alive(pid)


def _received_ring(key: Tuple[int, int], memory: Optional[torch.Tensor]) -> np.ndarray:
    with _lock:
        if memory is not None:
            # A worker's new ring supersedes its older ones (its messages arrive in order). A
            # ring of a worker that has exited is done once none of its slots is flagged: a
            # batch still queued holds its slot's flag (batches already here keep their own
            # references to the memory).
            for old in [k for k, r in _rings.items() if k[0] == key[0] or _done(k[0], r)]:
                del _rings[old]
            _rings[key] = memory.numpy()
        ring = _rings.get(key)
    if ring is None:
        raise RuntimeError(
            f"a batch refers to shared-memory ring {key} that this process never received"
            " (tokpack worker batches are meant for the DataLoader that made them)"
        )
    return ring


def _release(flags: np.ndarray, slot: int, pid: int) -> None:
    # Only the process that received the batch hands its slot back: a process forked from it
    # inherits the batch and may free it too, after the slot has carried another batch.
    if os.getpid() == pid:
        flags[slot] = 0


def _rebuild_slot(key, memory, slot_bytes, slot, used, specs, skeleton) -> Dict[str, Any]:
    ring = _received_ring(key, memory)
    start = _PAGE + slot * slot_bytes
    # A view object of the batch's own: the tensors below keep it alive, and the slot is handed
    # back to the worker when the last of them is freed.
    data = ring[start : start + used]
    weakref.finalize(data, _release, ring[:_SLOTS], slot, os.getpid())
    return _fill(skeleton, _views(torch.from_numpy(data), specs))


def _rebuild_block(block: torch.Tensor, specs, skeleton) -> Dict[str, Any]:
    return _fill(skeleton, _views(block, specs))


def _raise(error: BaseException) -> Dict[str, Any]:
    raise error
