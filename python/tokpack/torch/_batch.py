"""The per-batch helpers of :class:`~tokpack.torch.collate.PackedCollator`: host copies of
rows, checks of layer masks, context-parallel splits and static shapes, per-sample loss
weights, and the carried columns of a batch."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from .._checks import MAX_LEN, check_int
from .._contract import IGNORE_INDEX
from ..errors import ConfigError, DataError, PackingError
from ..packed.format import SHARD_COLUMNS
from .pairs import row_tensor


def _check_layer_masks(c: Any) -> Dict[str, Optional[int]]:
    """The layer masks of collator ``c``, checked against its layout."""
    if c.format not in ("hf", "padded") or c.cp_size > 1 or c.return_pairs:
        raise ConfigError(
            f"layer_masks needs format hf or padded without context parallelism or pairs,"
            f" got format={c.format!r}, cp_size={c.cp_size}, return_pairs={c.return_pairs}"
        )
    if not isinstance(c.layer_masks, Mapping) or not c.layer_masks:
        raise ConfigError(
            f"layer_masks must be a non-empty dict of layer type -> sliding window or None,"
            f" got {c.layer_masks!r}"
        )
    return {
        str(k): None if w is None else check_int(w, f"layer_masks[{k!r}]", 1, MAX_LEN)
        for k, w in c.layer_masks.items()
    }


def _host(value: Any) -> Optional[np.ndarray]:
    """A row's integer column as a 1-D NumPy array without a copy when it is host data (a
    NumPy array, a CPU tensor), else None (the torch path handles it, and its errors)."""
    if isinstance(value, np.ndarray):
        a = value
    elif type(value) is torch.Tensor and value.device.type == "cpu" and not value.requires_grad:
        a = value.numpy()
    else:
        return None
    return a if a.ndim == 1 and a.dtype.kind in "iu" else None


def _host_rows(rows: Sequence[Mapping[str, Any]]):
    """(input_ids, labels, seq_lengths) of every row as NumPy arrays, or None when one is not
    host integer data or a row is malformed (the torch path then names the problem)."""
    host = []
    for row in rows:
        x = _host(row.get("input_ids"))
        s = _host(row.get("seq_lengths"))
        y = row.get("labels")
        y = x if y is None else _host(y)
        if x is None or s is None or y is None or y.shape != x.shape:
            return None
        host.append((x, y, s))
    return [list(column) for column in zip(*host)]


# The column of a packed tree directory's rows (sample kind ``tree``) that marks them: each
# token's node. Such rows hold sequences sharing prefixes, stored once.
TREE_ROW_KEY = "tree_node"
TREE_COLLATOR = "tokpack.tree.PackedTreeCollator"


def refuse_tree_rows(rows: Sequence[Mapping[str, Any]], who: str) -> None:
    """PackingError when ``rows`` are a tree directory's: a flat batch of them would give a
    sequence the tokens of its siblings (its tokens are on a path of the tree, not a run)."""
    if any(TREE_ROW_KEY in row for row in rows):
        raise PackingError(
            f"{who} got the rows of a packed tree directory (sample kind 'tree'): their"
            " sequences share prefixes stored once, which a flat batch would mix; collate them"
            f" with {TREE_COLLATOR} (and train with tokpack.tree.model_inputs)"
        )


def _check_splits(
    ids: List[np.ndarray], seg_lens: List[np.ndarray], lens: np.ndarray, cu: np.ndarray
) -> None:
    """Every row's seq_lengths are positive and sum to its tokens (``lens``: all of them
    concatenated, ``cu``: their offsets), checked at once; the first row that fails is named."""
    row_ends = np.cumsum([s.size for s in seg_lens])
    row_tokens = np.cumsum([x.size for x in ids])
    if (lens.size == 0 or int(lens.min()) >= 1) and np.array_equal(cu[row_ends], row_tokens):
        return
    for i, (x, s) in enumerate(zip(ids, seg_lens)):
        if int(s.sum()) != x.size or (s.size and int(s.min()) < 1):
            raise DataError(
                f"row {i}: seq_lengths {s.tolist()} do not split the row's {x.size} tokens"
            )


def _count_trained(lab: torch.Tensor) -> int:
    """How many labels are not IGNORE_INDEX; counted by NumPy for CPU tensors, where torch's fixed
    cost per call is several times the work at batch sizes."""
    if lab.device.type == "cpu":
        return int(np.count_nonzero(lab.numpy() != IGNORE_INDEX))
    return int((lab != IGNORE_INDEX).sum())


def _per_sample_weights(trained: torch.Tensor, seq_idx: torch.Tensor, n_seqs: int) -> torch.Tensor:
    """``1 / n_s`` on the trained tokens of each sample s (0 for samples without loss tokens)."""
    flat_trained = trained.reshape(-1)
    flat_idx = seq_idx.reshape(-1).to(torch.int64)
    # Padding in padded rows has seq_idx -1 and is never trained: send it to an extra bucket.
    bucket = torch.where(flat_idx < 0, torch.full_like(flat_idx, n_seqs), flat_idx)
    counts = torch.zeros(n_seqs + 1, dtype=torch.float32, device=trained.device)
    counts.index_add_(0, bucket, flat_trained.to(torch.float32))
    inv = torch.where(counts > 0, 1.0 / counts.clamp(min=1.0), torch.zeros_like(counts))
    return (inv[bucket] * flat_trained).view(trained.shape)


def boundary_fields(format: str, cu32: torch.Tensor, max_len: int) -> Dict[str, Any]:
    """The segment boundaries of a flat format: ``cu_seqlens`` and ``max_seqlen`` (flash),
    ``cu_seq_lens_q/k`` and ``max_length_q/k`` (hf)."""
    if format == "flash":
        return {"cu_seqlens": cu32, "max_seqlen": max_len}
    return dict(cu_seq_lens_q=cu32, cu_seq_lens_k=cu32, max_length_q=max_len, max_length_k=max_len)


# The columns of a packed row other than the carried ones (``--carry``, KTO's label).
_ROW_KEYS = frozenset(SHARD_COLUMNS)


def _add_carried(batch: Dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
    """The rows' carried columns, one entry per segment across the batch (row by row, as
    ``seq_roles``): a tensor, or a list for strings. Only per-segment values are carried (a
    mixture's per-row ``source``, say, is not); columns already set are left alone."""
    for name in rows[0]:
        if name in _ROW_KEYS or name in batch:
            continue
        values = [row.get(name) for row in rows]
        if not all(_per_segment(v, len(row["seq_lengths"])) for v, row in zip(values, rows)):
            continue
        if isinstance(values[0], list):
            batch[name] = [v for part in values for v in part]  # type: ignore[union-attr]
        else:
            batch[name] = torch.cat([row_tensor(v) for v in values])


def _per_segment(value: Any, n_segments: int) -> bool:
    if isinstance(value, list):
        return len(value) == n_segments
    shape = getattr(value, "shape", None)  # a tensor or numpy array
    return shape is not None and tuple(shape) == (n_segments,)
