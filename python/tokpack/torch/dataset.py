"""``PackedDataset``: map-style access to the rows of a packed directory."""

from __future__ import annotations

import contextlib
import operator
import os
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import torch

from .._checks import MAX_ROWS, check_int
from ..remote import open_packed
from ._rows import GroupCache
from ._workers import worker_slot

__all__ = ["PackedDataset", "StepBatch"]

# Rows read at most this far apart, in increasing order, count as reading forward.
_FORWARD_STEP = 8


class StepBatch(list):
    """A list (of row indices, then of rows) carrying ``step_counts``: the (loss terms, samples)
    of its batch's whole optimizer step over every rank (see :class:`PackedBatchSampler`)."""

    def __init__(self, items: Iterable, step_counts: Tuple[int, int]) -> None:
        super().__init__(items)
        self.step_counts = step_counts


def _row_index(index: object) -> int:
    """``index`` as a Python int when it is an integer (``__index__``), never a bool."""
    is_bool = isinstance(index, (bool, np.bool_)) or (
        isinstance(index, torch.Tensor) and index.dtype == torch.bool
    )
    if not is_bool:
        with contextlib.suppress(TypeError):
            return operator.index(index)  # type: ignore[arg-type]
    raise TypeError(f"row indices must be integers, got {type(index).__name__} {index!r}")


class PackedDataset(torch.utils.data.Dataset):
    """Map-style dataset over a packed directory written by ``tokpack pack``.

    ``ds[i]`` is a dict of 1-D tensors for packed row ``i``: ``input_ids`` (int32), ``labels``
    (int32, when the corpus has labels), ``seq_lengths`` (int32) and ``sample_ids`` (int64). They
    are the caller's own copies: writing into them does not change later reads. ``i`` is an
    integer (``int``, a numpy integer or a 0-d integer tensor); anything else is a TypeError.
    A tree directory's rows (sample kind ``tree``) hold its tree columns instead of ``labels``:
    collate them with ``tokpack.tree.PackedTreeCollator`` (flat collators refuse them).

    Every row group is checked against the checksums of the manifest when it is decoded: a
    damaged shard, or a directory rebuilt since the dataset was opened, raises
    :class:`tokpack.CorruptOutputError` rather than returning other rows.

    Rows are decoded one Parquet row group at a time and the last ``cache_row_groups`` groups are
    kept, so sequential or group-local access (``DistributedSampler(shuffle=False)``, the
    streaming :class:`PackedIterableDataset`) decodes each group once; fully random access decodes
    a group for most rows and is better served by ``device=`` mode on corpora that fit in memory.

    With ``device`` set (``"cuda"``, or ``"cpu"`` for the same code path on the host), the whole
    corpus is loaded once as flat token/label tensors on that device plus host-side row offsets
    (``seq_lengths`` and ``sample_ids`` stay on the host), and rows are slices of those tensors:
    no decoding and no host-to-device copy of tokens per step. Use it with
    ``num_workers=0`` (CUDA tensors must not cross into worker processes).

    The dataset holds only numpy arrays with one entry per row group (or, in device mode, per
    row), never per-row Python objects, so copying it into workers is cheap.

    Object storage: ``path`` may be a URI (``s3://bucket/packed``, ``gs://...``, ...) or a path
    on ``filesystem`` (a ``pyarrow.fs`` or fsspec file system). Row groups are then fetched by
    byte range as they are needed (and ahead), checked against the manifest, and kept in a
    local cache of at most ``cache_limit`` bytes under ``cache_dir`` (default
    ``$TOKPACK_CACHE_DIR/remote`` or ``~/.cache/tokpack/remote``), shared by every process of the
    machine: see the "Object storage" guide.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        device: Optional[Union[str, torch.device]] = None,
        *,
        cache_row_groups: int = 4,
        filesystem: Any = None,
        cache_dir: Optional[Union[str, os.PathLike]] = None,
        cache_limit: Optional[int] = None,
    ) -> None:
        cache_row_groups = check_int(cache_row_groups, "cache_row_groups", 1, MAX_ROWS)
        self.packed = open_packed(
            path, filesystem=filesystem, cache_dir=cache_dir, cache_limit=cache_limit
        )
        self.max_len = self.packed.max_len
        self.has_labels = self.packed.has_labels
        self.device = None if device is None else torch.device(device)
        self._cache = GroupCache(self.packed, cache_row_groups, 2 * cache_row_groups)
        self._last = -1  # the row read last in this process
        # Device mode: each column's flat values (a tensor) and host row offsets.
        self._flat: Dict[str, Tuple[torch.Tensor, np.ndarray]] = {}
        if self.device is not None:
            self._load_flat()

    def __len__(self) -> int:
        return self.packed.num_rows

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        n = len(self)
        i = _row_index(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {index} out of range for a packed directory of {n} rows")
        if self._flat:
            # Copies, as in the streaming path: the flat tensors must not be written through.
            return {
                name: values[int(offsets[i]) : int(offsets[i + 1])].clone()
                for name, (values, offsets) in self._flat.items()
            }
        worker_slot()  # in a DataLoader worker: one decoding thread (set once per process)
        group, r = self.packed.locate(i)
        row = self._cache.get(group).row(r)
        # Reading forward (a sequential or DistributedSampler(shuffle=False)) past the middle of
        # a group: with several workers, the next group is decoded in the background meanwhile.
        forward = 0 < i - self._last <= _FORWARD_STEP
        if (
            forward
            and 2 * r >= self.packed.group_rows[group]
            and group + 1 < self.packed.num_groups
        ):
            self._cache.prefetch(group + 1)
        self._last = i
        return row

    def __getitems__(self, indices: List[int]) -> List[Dict[str, torch.Tensor]]:
        """A batch's rows (what a DataLoader asks for), keeping the step counts a
        :class:`PackedBatchSampler` batch carries for :class:`PackedCollator`."""
        rows = [self[i] for i in indices]
        counts = getattr(indices, "step_counts", None)
        return rows if counts is None else StepBatch(rows, counts)

    def _load_flat(self) -> None:
        """Decode every row group once into flat device tensors and host row offsets."""
        groups = [self.packed.decode(g) for g in range(self.packed.num_groups)]
        for name in self.packed.columns:
            values = np.concatenate([g[name][0] for g in groups] or [np.zeros(0, np.int32)])
            lens = np.concatenate([np.diff(g[name][1]) for g in groups] or [np.zeros(0, np.int64)])
            # Tokens and labels live on the device; the small boundary columns stay on the host
            # so collating needs no device-to-host synchronisation.
            device = self.device if name in ("input_ids", "labels") else "cpu"
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
            self._flat[name] = (torch.from_numpy(values).to(device), offsets)
