"""Decoded row groups as torch tensors, and rows copied out of them."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from functools import partial
from typing import Any, Dict, Tuple, Union

import numpy as np
import torch

from ..packed.reader import Column, PackedDir
from ._shared import SharedGroups, readahead
from ._workers import worker_slot

__all__ = ["TensorGroup", "GroupCache"]


def _tensor(values: np.ndarray) -> Union[torch.Tensor, np.ndarray]:
    """A numeric column as a tensor; a carried string column stays a numpy object array (its
    rows are lists of str)."""
    if values.dtype == object:
        return values
    # The decoded buffer is private to the cache: rows are copied out of it (`row`), so sharing
    # the numpy memory is safe (torch only warns that writes would be undefined).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(values)


class TensorGroup:
    """One decoded row group: per column, flat values as a tensor plus numpy row offsets."""

    __slots__ = ("columns",)

    def __init__(self, cols: Dict[str, Column]) -> None:
        self.columns: Dict[str, Tuple[Any, np.ndarray]] = {
            name: (_tensor(values), offsets) for name, (values, offsets) in cols.items()
        }

    def row(self, i: int) -> Dict[str, Any]:
        """Row ``i`` as tensors of its own: a caller writing into them must not change what
        later reads of the cached group return (a row is at most a few tens of KB to copy)."""
        out: Dict[str, Any] = {}
        for name, (values, offsets) in self.columns.items():
            part = values[int(offsets[i]) : int(offsets[i + 1])]
            out[name] = part.tolist() if isinstance(part, np.ndarray) else part.clone()
        return out


class GroupCache:
    """A small LRU of decoded row groups, local to the process that fills it. In a DataLoader
    with several workers, the groups come through :class:`SharedGroups` of ``shared_capacity``
    groups, so the workers decode each group once between them instead of once each."""

    def __init__(self, packed: PackedDir, capacity: int, shared_capacity: int) -> None:
        self.packed = packed
        self.capacity = max(1, int(capacity))
        self.shared = SharedGroups(shared_capacity)
        self._groups: "OrderedDict[int, TensorGroup]" = OrderedDict()
        # Groups handed to the readahead thread lately (not asked for again).
        self._ahead: "OrderedDict[int, None]" = OrderedDict()

    def get(self, group: int) -> TensorGroup:
        hit = self._groups.get(group)
        if hit is not None:
            self._groups.move_to_end(group)
            return hit
        if worker_slot()[1] > 1:
            decoded = TensorGroup(self.shared.get(group, partial(self.packed.decode, group)))
        else:
            decoded = TensorGroup(self.packed.decode(group))
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
            readahead(self.shared, group, partial(self.packed.decode, group))
        else:
            # One process reading object storage: its bytes are fetched in the background.
            self.packed.prefetch(group)

    def cancel_prefetch(self) -> None:
        """Forget the groups handed to the background and drop the fetches not started (an
        iteration stopped: what it asked ahead is not needed)."""
        self._ahead.clear()
        self.packed.cancel_prefetch()

    def __getstate__(self):
        # Decoded data never travels by pickle: workers share groups through `shared` only.
        return {"packed": self.packed, "capacity": self.capacity, "shared": self.shared}

    def __setstate__(self, state) -> None:
        self.packed = state["packed"]
        self.capacity = state["capacity"]
        self.shared = state["shared"]
        self._groups = OrderedDict()
        self._ahead = OrderedDict()
