"""Rows of a packed tree directory (``tokpack pack`` of tree token shards) as training batches:
:class:`PackedTreeCollator`, the DataLoader ``collate_fn`` of ``tokpack.torch.PackedDataset``
and the streaming readers on such a directory.

A packed tree row holds its row-local arrays (``docs/format.md``, the tree kind): tokens in DFS
order with each token's node, per node its parent, depth, token interval and length, per
sequence (``sample_ids`` ascending) its end node and its targets as predictions of the row, per
distinct prediction its position, token and weight. The collator lays rows side by side as
:func:`tokpack.tree.pack_trees` lays its rows: the same keys (``tokpack.tree.batch``), node and
prediction arrays flat over the rows, sequences sorted by sample id over the batch (the order
of every per-sequence result), per-token arrays padded to ``[B, width]``. Positions and
``tree_tout`` are derived from the nodes. Everything is numpy over whole columns.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np
import torch

from .._checks import check_int
from ..errors import DataError
from ..packed.format import SHARD_COLUMNS
from ..packed.tree_integrity import (
    TREE_NODE_COLUMNS,
    TREE_PRED_COLUMNS,
    TREE_SEQ_COLUMNS,
    TREE_TARGETS,
    TREE_TOKEN_COLUMNS,
)
from ..torch._transport import ship
from .batch import as_tensors

__all__ = ["PackedTreeCollator", "TREE_ROW_COLUMNS"]

_MAX_INT = 2**63 - 1

# The columns of a packed tree row the collator reads, by what they are indexed by.
PER_TOKEN = ("input_ids", *TREE_TOKEN_COLUMNS)
PER_NODE = TREE_NODE_COLUMNS
PER_SEQ = ("sample_ids", "seq_lengths", "seq_loss_tokens", *TREE_SEQ_COLUMNS)
PER_PRED = TREE_PRED_COLUMNS
TARGETS = TREE_TARGETS
#: Every column of a packed tree row the collator reads.
TREE_ROW_COLUMNS: Tuple[str, ...] = PER_TOKEN + PER_NODE + PER_SEQ + (TARGETS,) + PER_PRED
# Not carried: the shard's own columns (counts, ...) and the tree's.
_NOT_CARRIED = frozenset(SHARD_COLUMNS) | frozenset(TREE_ROW_COLUMNS)


def _host(value: Any, name: str, row: int) -> np.ndarray:
    """A row's integer column as a 1-D int64 host array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    a = np.asarray(value)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise DataError(
            f"row {row}: column {name!r} must be a 1-D list of integers, got shape {a.shape}"
            f" of {a.dtype}"
        )
    return a.astype(np.int64, copy=False)


def _columns(rows: Sequence[Mapping[str, Any]]) -> Dict[str, List[np.ndarray]]:
    """Every tree column of every row, as int64 host arrays (DataError naming the row and the
    column that is missing: a flat directory's rows, say)."""
    out: Dict[str, List[np.ndarray]] = {name: [] for name in TREE_ROW_COLUMNS}
    for i, row in enumerate(rows):
        for name in TREE_ROW_COLUMNS:
            try:
                value = row[name]
            except KeyError:
                raise DataError(
                    f"row {i}: no column {name!r}: PackedTreeCollator reads the rows of a packed"
                    " tree directory (tokpack pack of tree token shards); for other rows use"
                    " tokpack.torch.PackedCollator, or tokpack.tree.TreeCollator for samples"
                ) from None
            out[name].append(_host(value, name, i))
    return out


def _same(got: np.ndarray, want: np.ndarray, name: str, other: str, why: str = "") -> None:
    """Column ``name``'s per-row entry counts ``got`` are ``want`` (what ``other`` gives), else
    a DataError naming the first row that differs."""
    if not np.array_equal(got, want):
        r = int(np.argmax(got != want))
        raise DataError(
            f"row {r}: column {name!r} has {int(got[r])} entries, {other} {int(want[r])}{why}"
        )


def _lengths(parts: List[np.ndarray]) -> np.ndarray:
    return np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _check_sizes(cols: Dict[str, List[np.ndarray]]) -> Tuple[np.ndarray, ...]:
    """Per row: tokens, nodes, sequences, targets and predictions, each group of columns of one
    length; DataError naming the row and column where one is not."""
    groups = ((PER_TOKEN, "tokens"), (PER_NODE, "nodes"), (PER_SEQ, "sequences"))
    sizes = []
    for names, what in groups + ((PER_PRED, "predictions"),):
        first = _lengths(cols[names[0]])
        for name in names[1:]:
            _same(_lengths(cols[name]), first, name, f"{names[0]!r} has", f" (one per {what[:-1]})")
        sizes.append(first)
    tokens, nodes, seqs, preds = sizes
    loss = cols["seq_loss_tokens"]
    for r, s in enumerate(loss):
        if s.size and int(s.min()) < 0:
            raise DataError(f"row {r}: column 'seq_loss_tokens' holds {int(s.min())}")
    want = np.fromiter((int(s.sum()) for s in loss), dtype=np.int64, count=len(loss))
    targets = _lengths(cols[TARGETS])
    _same(targets, want, TARGETS, "'seq_loss_tokens' sum to")
    return tokens, nodes, seqs, targets, preds


def _check_range(values: np.ndarray, row_of: np.ndarray, bound: np.ndarray, name: str) -> None:
    """Row-local indices ``values`` (row ``row_of`` each) lie in ``0 .. bound[row]``."""
    bad = (values < 0) | (values >= bound[row_of])
    if bad.any():
        k = int(np.argmax(bad))
        r = int(row_of[k])
        raise DataError(
            f"row {r}: column {name!r} holds {int(values[k])}, outside the row's"
            f" {int(bound[r])} (a damaged row: run tokpack verify)"
        )


class PackedTreeCollator:
    """A DataLoader ``collate_fn``: rows of a packed tree directory (as
    ``tokpack.torch.PackedDataset`` and the streaming readers yield them) into one tree batch,
    the dict :func:`tokpack.tree.pack_trees` returns (without its ``tree_stats``: a directory's
    figures are in its manifest), so :func:`~tokpack.tree.model_inputs`,
    :func:`~tokpack.tree.sequence_logps`, :func:`~tokpack.tree.token_logps`,
    :func:`~tokpack.tree.tree_loss` and the masks take it as they take an in-memory batch.

    Sequences are ordered by sample id over the batch (``tree_seq_index``: the sample ids; in a
    ``PackedMixture`` they are each source's own, ``batch["sources"][tree_seq_row]`` names the
    source). Carried per-sequence columns (``--carry reward``) come out as tensors (lists for
    strings) in that order. The rows' widest is padded to a multiple of
    ``pad_to_multiple_of`` with ``pad_token_id``. A :class:`~tokpack.torch.PackedBatchSampler`
    batch's step counts come along as ``global_num_loss_tokens`` / ``global_num_samples``.

    Picklable (it holds its two options); every tensor is a new CPU one, so the readers hand it
    views of their cached row groups."""

    #: As :attr:`tokpack.torch.PackedCollator.reads_rows_only`: rows are only read.
    reads_rows_only = True
    #: What tokpack's readers check to take a tree directory's rows (see ``tokpack.torch``).
    reads_tree_rows = True

    def __init__(self, *, pad_to_multiple_of: int = 1, pad_token_id: int = 0) -> None:
        self.pad_to_multiple_of = check_int(pad_to_multiple_of, "pad_to_multiple_of", 1, _MAX_INT)
        self.pad_token_id = check_int(pad_token_id, "pad_token_id", -_MAX_INT - 1, _MAX_INT)

    def __repr__(self) -> str:
        return (
            f"PackedTreeCollator(pad_to_multiple_of={self.pad_to_multiple_of},"
            f" pad_token_id={self.pad_token_id})"
        )

    def reads_columns(self, columns: Sequence[str]) -> Tuple[str, ...]:
        """Which of a directory's row ``columns`` the readers decode for it: all of them (the
        tree's, and the carried ones)."""
        return tuple(columns)

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        # In a DataLoader worker the batch crosses to the main process in one shared-memory slot.
        return ship(self.collate(rows))

    def collate(self, rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        """The batch of ``rows`` as a plain dict (what ``__call__`` returns in the main
        process)."""
        if len(rows) == 0:
            raise DataError("PackedTreeCollator got an empty batch")
        cols = _columns(rows)
        n_tok, n_node, n_seq, n_tgt, n_pred = _check_sizes(cols)
        batch = self._arrays(cols, n_tok, n_node, n_seq, n_tgt, n_pred)
        order = batch.pop("_order")
        out = as_tensors(batch)
        _add_carried(out, rows, n_seq, order)
        counts = getattr(rows, "step_counts", None)
        if counts is not None:
            out["global_num_loss_tokens"], out["global_num_samples"] = counts
        return out

    def _arrays(
        self,
        cols: Dict[str, List[np.ndarray]],
        n_tok: np.ndarray,
        n_node: np.ndarray,
        n_seq: np.ndarray,
        n_tgt: np.ndarray,
        n_pred: np.ndarray,
    ) -> Dict[str, np.ndarray]:
        b = n_tok.size
        cat = {name: np.concatenate(parts) for name, parts in cols.items()}
        tok_off, node_off, pred_off = _offsets(n_tok), _offsets(n_node), _offsets(n_pred)
        rows = np.arange(b, dtype=np.int64)
        tok_row = np.repeat(rows, n_tok)
        seq_row = np.repeat(rows, n_seq)
        node = cat["tree_node"]
        _check_range(node, tok_row, n_node, "tree_node")
        _check_range(cat["tree_seq_end_node"], seq_row, n_node, "tree_seq_end_node")
        _check_range(cat[TARGETS], np.repeat(rows, n_tgt), n_pred, TARGETS)
        _check_range(cat["tree_pred_pos"], np.repeat(rows, n_pred), n_tok, "tree_pred_pos")
        multiple = self.pad_to_multiple_of
        longest = int(n_tok.max())
        width = -(-longest // multiple) * multiple
        # Each real token's place in the [B, width] blocks, its column and global node.
        col = np.arange(tok_row.size, dtype=np.int64) - tok_off[:-1][tok_row]
        flat = tok_row * width + col
        g_node = node + node_off[:-1][tok_row]
        input_ids = np.full(b * width, self.pad_token_id, dtype=np.int64)
        input_ids[flat] = cat["input_ids"]
        position = np.zeros(b * width, dtype=np.int64)
        position[flat] = cat["tree_node_depth"][g_node] + col - cat["tree_node_tin"][g_node]
        tout = np.tile(np.arange(1, width + 1, dtype=np.int64), b)
        tout[flat] = cat["tree_node_tout"][g_node]
        token_node = np.full(b * width, -1, dtype=np.int64)
        token_node[flat] = node
        # Sequences by sample id over the batch (stable: rows in order on equal ids), each with
        # its targets as global predictions.
        order = np.argsort(cat["sample_ids"], kind="stable")
        loss = cat["seq_loss_tokens"]
        seq_tgt_start = _offsets(loss)[:-1]
        global_pred = cat[TARGETS] + pred_off[:-1][np.repeat(rows, n_tgt)]
        lengths = loss[order]
        target_offsets = _offsets(lengths)
        starts = np.repeat(seq_tgt_start[order] - target_offsets[:-1], lengths)
        target_pred = global_pred[starts + np.arange(starts.size, dtype=np.int64)]
        shape = (b, width)
        return {
            "input_ids": input_ids.reshape(shape),
            "position_ids": position.reshape(shape),
            "tree_tout": tout.reshape(shape),
            "tree_node": token_node.reshape(shape),
            "tree_node_offsets": node_off,
            "tree_node_parent": cat["tree_node_parent"],
            "tree_node_depth": cat["tree_node_depth"],
            "tree_node_tin": cat["tree_node_tin"],
            "tree_node_tout": cat["tree_node_tout"],
            "tree_node_len": cat["tree_node_len"],
            "tree_seq_index": cat["sample_ids"][order],
            "tree_seq_row": seq_row[order],
            "tree_seq_end_node": cat["tree_seq_end_node"][order],
            "tree_target_offsets": target_offsets,
            "tree_target_pred": target_pred,
            "tree_pred_row": np.repeat(rows, n_pred),
            "tree_pred_pos": cat["tree_pred_pos"],
            "tree_pred_token": cat["tree_pred_token"],
            "tree_pred_weight": cat["tree_pred_weight"],
            "tree_completion_lengths": lengths,
            "_order": order,
        }


def _add_carried(
    out: Dict[str, Any], rows: Sequence[Mapping[str, Any]], n_seq: np.ndarray, order: np.ndarray
) -> None:
    """The rows' carried columns (one entry per sequence in every row), in the batch's sequence
    order: a tensor, or a list for strings. Others (a mixture's per-row ``source``) are left."""
    for name in rows[0]:
        if name in _NOT_CARRIED or name in out:
            continue
        values = [row.get(name) for row in rows]
        if not all(_per_sequence(v, int(n)) for v, n in zip(values, n_seq)):
            continue
        if isinstance(values[0], list):
            flat = [v for part in values for v in part]  # type: ignore[union-attr]
            out[name] = [flat[i] for i in order.tolist()]
            continue
        parts = [
            v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
            for v in values
        ]
        out[name] = torch.from_numpy(np.ascontiguousarray(np.concatenate(parts)[order]))


def _per_sequence(value: Any, n: int) -> bool:
    if isinstance(value, list):
        return len(value) == n
    shape = getattr(value, "shape", None)
    return shape is not None and tuple(shape) == (n,)
