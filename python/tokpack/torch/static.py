"""Static-shape packed batches (issue 38): every tensor's shape depends only on the config, so
``torch.compile`` compiles once and a CUDA graph captured on one batch replays on all of them.

``StaticShapes(rows, max_len, max_segments, align=1, tail="zero")`` is given to
``PackedCollator(format, static=...)`` (formats ``"flash"``, ``"hf"``, ``"padded"``). A batch
always holds ``rows`` rows of ``max_len`` tokens (a short last batch gets rows of padding), each
segment at an offset that is a multiple of ``align`` (its padding follows it inside its segment:
``pad_id``, label -100, positions continuing), and boundary arrays of a fixed capacity:

- flat formats: the rows' segments one after the other, then one padding segment up to
  ``rows * max_len`` tokens; ``cu_seqlens`` always has ``rows * max_segments + 2`` entries, the
  unused ones repeating the total: zero-length segments, all after the last non-empty one.
  ``tail="zero"`` (FlashAttention, TransformerEngine: they skip zero-length segments anywhere)
  and ``tail="coalesce"`` (chunked linear-attention kernels) give the same arrays: those
  kernels number sequences by counting their first chunks (FLA's ``prepare_chunk_indices``),
  so a zero-length segment between two real ones would shift every later one, while the
  zero-length entries here come after all of them and renumber nothing; the padding is one
  coalesced segment, never a run of one-token ones. ``max_seqlen`` is ``max_len``.
- ``"padded"``: ``[rows, max_len]`` tensors with ``document_ids`` (padding ``-1``).

``block_mask=True`` adds ``block_mask_data``: FlexAttention's block tables of same-document
causal attention (what ``create_block_mask`` computes, equal to it), computed from the lengths
with NumPy in the DataLoader worker; :func:`block_mask` makes the ``BlockMask`` in the main
process without touching the dense mask. Rows over ``max_segments`` or over ``max_len`` once
aligned are refused with the row and the fix (repack with ``--max-segments-per-row`` /
``--align-segments``). Nothing here reads a device tensor back to the host (no ``.item()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .._checks import MAX_LEN, check_choice, check_int
from .._contract import IGNORE_INDEX
from ..errors import ConfigError, DataError
from ._batch import boundary_fields

__all__ = ["StaticShapes", "TAILS", "STATIC_FORMATS", "block_mask", "block_mask_data"]

TAILS = ("zero", "coalesce")
STATIC_FORMATS = ("flash", "hf", "padded")


@dataclass(frozen=True)
class StaticShapes:
    """The fixed shapes of a static batch: ``rows`` rows of ``max_len`` tokens, at most
    ``max_segments`` segments per row, each at a multiple of ``align``; ``tail`` is the padding
    policy of the flat boundary arrays (``"zero"`` or ``"coalesce"``, see the module); with
    ``block_mask`` the batch carries FlexAttention block tables of ``block_size``."""

    rows: int
    max_len: int
    max_segments: int
    align: int = 1
    tail: str = "zero"
    block_mask: bool = False
    block_size: int = 128

    def __post_init__(self) -> None:
        check_int(self.rows, "rows", 1, MAX_LEN)
        check_int(self.max_len, "max_len", 1, MAX_LEN)
        check_int(self.max_segments, "max_segments", 1, MAX_LEN)
        check_int(self.align, "align", 1, self.max_len)
        check_int(self.block_size, "block_size", 1, MAX_LEN)
        if self.max_len % self.align:
            raise ConfigError(
                f"max_len must be a multiple of align ({self.align}), got {self.max_len}"
            )
        check_choice("tail", self.tail, TAILS)

    @classmethod
    def of_packed(cls, manifest: Mapping[str, Any], rows: int, **options: Any) -> "StaticShapes":
        """The shapes a packed directory's manifest guarantees (its ``max_len``,
        ``max_segments_per_row`` and ``align_segments``), for batches of ``rows`` rows."""
        config = manifest["config"]
        cap = config.get("max_segments_per_row")
        if cap is None:
            raise ConfigError(
                "the packed directory has no segment cap: repack it with "
                "--max-segments-per-row N so its rows fit fixed-capacity boundary arrays"
            )
        return cls(rows, config["max_len"], cap, config.get("align_segments", 1), **options)

    @property
    def tokens(self) -> int:
        """Tokens of a batch (flat formats)."""
        return self.rows * self.max_len

    @property
    def capacity(self) -> int:
        """Segments of the flat boundary arrays (either tail): the real ones and one padding
        segment."""
        return self.rows * self.max_segments + 1


def check_static(c: Any) -> None:
    """Static shapes are their own layout: formats hf, flash and padded, one rank's whole
    rows, no other layout option (``c``: the ``PackedCollator``)."""
    if not isinstance(c.static, StaticShapes):
        raise ConfigError(f"static must be a StaticShapes, got {type(c.static).__name__}")
    others = {
        "cp_size > 1": c.cp_size > 1,
        "return_pairs": c.return_pairs,
        "layer_masks": c.layer_masks is not None,
        "pad_to (static sets the row length)": c.pad_to is not None,
        "return_seq_idx": c.return_seq_idx,
        "return_loss_weights": c.return_loss_weights,
    }
    clash = [name for name, on in others.items() if on]
    if c.format not in STATIC_FORMATS or clash:
        raise ConfigError(
            f"static shapes need format {', '.join(STATIC_FORMATS)} without"
            f" {', '.join(others)}; got format={c.format!r}"
            + (f" with {', '.join(clash)}" if clash else "")
        )


def _row_lengths(rows: Sequence[Mapping[str, Any]], shapes: StaticShapes) -> List[np.ndarray]:
    """Each row's seq_lengths, checked against the shapes (the row and the fix named)."""
    if len(rows) > shapes.rows:
        raise DataError(
            f"a batch of {len(rows)} rows is over the static shapes' rows={shapes.rows}: "
            "give the DataLoader batch_size the same value"
        )
    out = []
    for i, row in enumerate(rows):
        s = np.asarray(row["seq_lengths"], dtype=np.int64)
        if s.size > shapes.max_segments:
            raise DataError(
                f"row {i} has {s.size} segments, more than max_segments={shapes.max_segments}: "
                f"repack with --max-segments-per-row {shapes.max_segments}"
            )
        footprint = int((-(-s // shapes.align) * shapes.align).sum())
        if footprint > shapes.max_len:
            raise DataError(
                f"row {i} takes {footprint} tokens with its segments aligned to {shapes.align},"
                f" more than max_len={shapes.max_len}: repack with --align-segments "
                f"{shapes.align}"
            )
        out.append(s)
    return out


def static_batch(
    rows: Sequence[Mapping[str, Any]], shapes: StaticShapes, format: str, pad_id: int
) -> Dict[str, Any]:
    """The static-shape batch of ``rows`` in ``format`` (``PackedCollator(static=...)``)."""
    lens = _row_lengths(rows, shapes)
    k, width = shapes.align, shapes.max_len
    flat = format != "padded"
    b = 1 if flat else shapes.rows
    n = shapes.tokens if flat else width
    ids = np.full((b, n), pad_id, dtype=np.int64)
    lab = np.full((b, n), IGNORE_INDEX, dtype=np.int64)
    pos = np.zeros((b, n), dtype=np.int64)
    doc = np.full((b, n), -1, dtype=np.int32)
    bounds: List[np.ndarray] = []  # per batch row: segment starts (real, then padding), end
    cursor, n_seqs, seg_base = 0, 0, 0
    for r, s in enumerate(lens):
        row = rows[r]
        x = np.asarray(row["input_ids"], dtype=np.int64)
        y = row.get("labels")
        y = x if y is None else np.asarray(y, dtype=np.int64)
        if int(s.sum()) != x.size or (s.size and int(s.min()) < 1):
            raise DataError(f"row {r}: seq_lengths {s.tolist()} do not split its {x.size} tokens")
        padded = -(-s // k) * k
        src = np.cumsum(s) - s
        if not flat:
            cursor, seg_base = 0, 0
        dst = cursor + np.cumsum(padded) - padded
        line = 0 if flat else r
        for j in range(s.size):
            a, ln, p = int(dst[j]), int(s[j]), int(padded[j])
            ids[line, a : a + ln] = x[src[j] : src[j] + ln]
            lab[line, a : a + ln] = y[src[j] : src[j] + ln]
            lab[line, a] = IGNORE_INDEX
            pos[line, a : a + p] = np.arange(p)
            doc[line, a : a + p] = seg_base + j
        if not flat:
            used = int(padded.sum())
            pos[r, used:] = np.arange(width - used)
            bounds.append(np.concatenate([[0], np.cumsum(padded), [width]]))
        cursor += int(padded.sum())
        seg_base += s.size
        n_seqs += s.size
    if flat:
        cu = np.concatenate([[0], np.cumsum(np.concatenate([-(-s // k) * k for s in lens]))])
        used = int(cu[-1])
        pos[0, used:] = np.arange(n - used)
        doc[0, used:] = n_seqs  # the padding segment
        ends = np.concatenate([cu, [n]]) if used < n else cu
        bounds = [np.concatenate([ends, np.full(shapes.capacity + 1 - ends.size, n)])]
    else:
        for r in range(len(lens), shapes.rows):
            pos[r] = np.arange(width)
            bounds.append(np.array([0, width]))
    out: Dict[str, Any] = {}
    shape = (-1,) if format == "flash" else (b, n)
    out["input_ids"] = torch.from_numpy(ids).view(shape)
    out["labels"] = torch.from_numpy(lab).view(shape)
    out["position_ids"] = torch.from_numpy(pos).view(shape)
    if flat:
        out.update(boundary_fields(format, torch.from_numpy(bounds[0].astype(np.int32)), width))
    out["document_ids"] = torch.from_numpy(doc)
    out["num_loss_tokens"] = int(np.count_nonzero(lab != IGNORE_INDEX))
    out["num_seqs"] = n_seqs
    if shapes.block_mask:
        out["block_mask_data"] = {
            name: torch.from_numpy(a)
            for name, a in block_mask_data(bounds, n, shapes.block_size).items()
        }
    return out


def block_mask_data(
    bounds: Sequence[np.ndarray], length: int, block_size: int = 128
) -> Dict[str, np.ndarray]:
    """FlexAttention's kv-side block tables of same-document causal attention over ``length``
    tokens, one batch row per entry of ``bounds`` (its segments' starts, then ``length``;
    segments cover the row, padding being one of them): ``kv_num_blocks`` / ``kv_indices``
    (partial blocks) and ``full_kv_num_blocks`` / ``full_kv_indices``, int32, shaped as
    ``create_block_mask`` makes them (``[B, 1, nq]``, ``[B, 1, nq, nk]``) and equal to them.

    Documents are runs of tokens, so a block pair is decided by the documents of its first and
    last tokens: kv block ``j`` before q block ``i`` meets it when kv's last token and q's first
    share a document, and is full when kv's first token and q's last do (and both blocks are
    whole); a diagonal block is always partial. O(blocks^2), never O(tokens^2).
    """
    nb = -(-length // block_size)
    first = np.arange(nb) * block_size
    last = np.minimum(first + block_size, length) - 1
    whole = first + block_size <= length
    i = np.arange(nb)[:, None]
    j = np.arange(nb)[None, :]
    below = j < i
    partial_all, full_all = [], []
    for b in bounds:
        b = np.asarray(b, dtype=np.int64)
        doc_first = np.searchsorted(b, first, side="right")
        doc_last = np.searchsorted(b, last, side="right")
        meets = below & (doc_last[None, :] == doc_first[:, None])
        full = below & (doc_first[None, :] == doc_last[:, None]) & whole[:, None] & whole[None, :]
        partial_all.append((meets & ~full) | (i == j))
        full_all.append(full)

    def ordered(dense: List[np.ndarray]) -> "tuple[np.ndarray, np.ndarray]":
        d = np.stack(dense)[:, None]  # [B, 1, nq, nk]
        num = d.sum(-1, dtype=np.int32)
        # argsort(descending, stable) of 0/1: the set blocks ascending, then the others.
        idx = np.argsort(~d, axis=-1, kind="stable").astype(np.int32)
        return num, idx

    kv_num, kv_idx = ordered(partial_all)
    full_num, full_idx = ordered(full_all)
    return {
        "kv_num_blocks": kv_num,
        "kv_indices": kv_idx,
        "full_kv_num_blocks": full_num,
        "full_kv_indices": full_idx,
    }


def block_mask(batch: Mapping[str, Any], device: Optional[Union[str, torch.device]] = None):
    """The FlexAttention ``BlockMask`` of a static batch with ``block_mask_data`` (made in the
    main process from the worker's tables: ``BlockMask.from_kv_blocks``, no dense mask), with
    a same-document causal ``mask_mod`` over the batch's ``document_ids``."""
    from torch.nn.attention.flex_attention import BlockMask

    data = batch.get("block_mask_data")
    if data is None:
        raise ConfigError(
            "the batch has no block_mask_data: give PackedCollator "
            "static=StaticShapes(..., block_mask=True)"
        )
    doc = batch["document_ids"]
    if device is not None:
        doc = doc.to(device)
        data = {k: v.to(device) for k, v in data.items()}
    n = doc.shape[-1]
    block = -(-n // data["kv_indices"].shape[-1])

    def same_document_causal(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)

    return BlockMask.from_kv_blocks(
        data["kv_num_blocks"],
        data["kv_indices"],
        data["full_kv_num_blocks"],
        data["full_kv_indices"],
        BLOCK_SIZE=block,
        mask_mod=same_document_causal,
        seq_lengths=(n, n),
    )
