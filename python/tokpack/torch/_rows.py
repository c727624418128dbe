"""Decoded row groups as torch tensors, and rows copied out of them."""

from __future__ import annotations

import os
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..packed.reader import Column, PackedDir
from ._shared import SharedGroups, readahead
from ._workers import worker_slot

__all__ = ["TensorGroup", "GroupCache"]

# The background decoding thread of this process (see `GroupCache.decode_ahead`): one for every
# reader and source of the process, made on first use, and made anew in a forked child.
_decoder: Tuple[int, Optional[ThreadPoolExecutor]] = (0, None)


def _decoder_pool() -> ThreadPoolExecutor:
    global _decoder
    if _decoder[0] != os.getpid() or _decoder[1] is None:
        _decoder = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="tokpack-decode"))
    return _decoder[1]  # type: ignore[return-value]


class TensorGroup:
    """One decoded row group: per column, flat values (NumPy) plus row offsets (a list of ints:
    indexing it costs a fraction of a numpy scalar's conversion)."""

    __slots__ = ("columns",)

    def __init__(self, cols: Dict[str, Column]) -> None:
        self.columns: Dict[str, Tuple[np.ndarray, List[int]]] = {
            name: (values, offsets.tolist()) for name, (values, offsets) in cols.items()
        }

    def row(self, i: int, copy: bool = True) -> Dict[str, Any]:
        """Row ``i``: with ``copy``, as tensors of its own (a caller writing into them must not
        change what later reads of the cached group return; a row is at most a few tens of KB to
        copy); without, as NumPy views of the group, for a reader that only reads them
        (:class:`~tokpack.torch.PackedCollator` builds every batch tensor anew). A carried
        string column's rows are lists of str either way."""
        out: Dict[str, Any] = {}
        for name, (values, offsets) in self.columns.items():
            part = values[offsets[i] : offsets[i + 1]]
            if values.dtype == object:
                out[name] = part.tolist()
            else:
                out[name] = torch.from_numpy(part.copy()) if copy else part
        return out


class GroupCache:
    """A small LRU of decoded row groups, local to the process that fills it. In a DataLoader
    with several workers, the groups come through :class:`SharedGroups` of ``shared_capacity``
    groups, so the workers decode each group once between them instead of once each."""

    def __init__(
        self,
        packed: PackedDir,
        capacity: int,
        shared_capacity: int,
        columns: Optional[Sequence[str]] = None,
    ) -> None:
        self.packed = packed
        # The columns decoded (None: all the reader's row columns).
        self.columns = None if columns is None else tuple(columns)
        self.capacity = max(1, int(capacity))
        self.shared = SharedGroups(shared_capacity)
        self._init_local()

    def _init_local(self) -> None:
        # Never pickled (see __getstate__): the decoded groups, those handed to the readahead
        # thread lately (not asked for again) and this reader's background decodes.
        self._groups: "OrderedDict[int, TensorGroup]" = OrderedDict()
        self._ahead: "OrderedDict[int, None]" = OrderedDict()
        self._pid = os.getpid()
        self._decoding: "Dict[int, Future]" = {}

    def get(self, group: int) -> TensorGroup:
        hit = self._groups.get(group)
        if hit is not None:
            self._groups.move_to_end(group)
            return hit
        pending = self._pending().pop(group, None)
        if pending is not None:
            # Decoded (or being decoded) ahead: its errors are raised here, as a decode's.
            decoded = TensorGroup(pending.result())
        elif worker_slot()[1] > 1:
            decoded = TensorGroup(self.shared.get(group, partial(self._decode, group)))
        else:
            decoded = TensorGroup(self._decode(group))
        self._groups[group] = decoded
        while len(self._groups) > self.capacity:
            self._groups.popitem(last=False)
        return decoded

    def prefetch(self, group: int) -> None:
        """In a DataLoader with several workers, have group ``group`` decoded and published in
        the background (a group about to be needed); in one process reading object storage,
        its bytes fetched; elsewhere nothing."""
        if group in self._groups or group in self._ahead:
            return
        several = worker_slot()[1] > 1
        if not several and not self.packed.remote:
            return
        self._ahead[group] = None
        while len(self._ahead) > self.shared.capacity:
            self._ahead.popitem(last=False)
        if several:
            readahead(self.shared, group, partial(self._decode, group))
        else:
            # One process reading object storage: its bytes are fetched in the background.
            self.packed.prefetch(group)

    def decode_ahead(self, group: int) -> bool:
        """In one process (no DataLoader workers, or one), have group ``group`` decoded on a
        background thread while this one collates (the decoder releases the GIL), so a reader
        without workers uses a second core; at most ``capacity`` groups wait to be taken (with the
        ``capacity`` groups kept, two shuffle windows' groups decoded at most). With
        several workers, nothing: they share their decodes (:meth:`prefetch`). On object
        storage, only a group already in the local cache (its fetch-ahead threads fetch ahead).
        False when the group is not decoded, nor being decoded, nor handed over now (worth
        asking again later)."""
        pending = self._pending()
        if group in self._groups or group in pending:
            return True
        if len(pending) >= self.capacity or worker_slot()[1] > 1:
            return False
        if self.packed.remote and not self.packed.cached(group):  # type: ignore[attr-defined]
            # Object storage: only what the fetch-ahead threads brought in (they stop when the
            # reader does); this thread never fetches.
            return False
        pending[group] = _decoder_pool().submit(self._decode, group)
        return True

    def _decode(self, group: int) -> Dict[str, Column]:
        return self.packed.decode(group, self.columns)

    def _pending(self) -> "Dict[int, Future]":
        """The decodes handed to the background thread, of this process: a forked worker
        inherits its parent's, whose thread it does not have, and starts without them."""
        if self._pid != os.getpid():
            self._pid, self._decoding = os.getpid(), {}
        return self._decoding

    def cancel_prefetch(self) -> None:
        """Forget the groups handed to the background and drop the fetches not started (an
        iteration stopped: what it asked ahead is not needed)."""
        self._ahead.clear()
        self.cancel_decodes()
        self.packed.cancel_prefetch()

    def cancel_decodes(self) -> None:
        """Drop the decodes asked ahead (an iteration stopped): the queued ones do not run."""
        for pending in self._pending().values():
            pending.cancel()
        self._decoding.clear()

    def __getstate__(self):
        # Decoded data never travels by pickle: workers share groups through `shared` only.
        return {k: self.__dict__[k] for k in ("packed", "capacity", "shared", "columns")}

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._init_local()
