"""Per-row counts of a packed directory as the collators see them, from its index side files.

A collator masks the label of every sample's first token (no loss term predicts a sample's first
token from the previous one), so a row's *loss terms* are its labels other than -100 minus the
samples whose first label is trained. The index side files give each row's ``num_tokens``,
``num_seqs`` and ``num_loss_tokens`` (labels other than -100, first tokens included), which
settles a row without reading tokens when it has no labels (terms = tokens - samples), or when
all or none of its labels are trained. Only row groups holding other rows (typically SFT rows
with masked prompts) have their ``labels`` and ``seq_lengths`` decoded, once, to look at the
first label of each sample.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._contract import IGNORE_INDEX
from ..kinds import KINDS
from .integrity import _read_index
from .reader import PackedDir, segment_sums

__all__ = ["RowCounts", "row_counts"]


class RowCounts(NamedTuple):
    """Per packed row (global numbering), int64: tokens, samples and loss terms."""

    tokens: np.ndarray
    samples: np.ndarray
    loss_terms: np.ndarray


def row_counts(packed: PackedDir) -> RowCounts:
    """The per-row counts of ``packed`` (see the module docstring for what is read)."""
    parts = [_read_index(packed, k) for k in range(len(packed.shard_paths))]
    tokens = np.concatenate([p["num_tokens"] for p in parts]).astype(np.int64)
    samples = np.concatenate([p["num_seqs"] for p in parts]).astype(np.int64)
    if KINDS[packed.kind].trees:
        # A tree row's loss terms are its sequences' trained targets (a sequence's first token
        # is never one), as its num_loss_tokens counts them.
        loss = np.concatenate([p["num_loss_tokens"] for p in parts]).astype(np.int64)
        return RowCounts(tokens, samples, loss)
    if not packed.has_labels:
        return RowCounts(tokens, samples, tokens - samples)
    trained = np.concatenate([p["num_loss_tokens"] for p in parts]).astype(np.int64)
    # Samples whose first label is trained: all of them when every label is, none when none is.
    first_trained = np.where(trained == tokens, samples, 0)
    unsettled = (trained > 0) & (trained < tokens)
    starts = packed.group_start
    for g in np.unique(np.searchsorted(starts, np.flatnonzero(unsettled), side="right") - 1):
        g = int(g)
        cols = packed.decode(g, ["labels", "seq_lengths"])
        labels, _ = cols["labels"]
        lengths, seq_offsets = cols["seq_lengths"]
        # Samples are contiguous in the group's flat labels: each starts where the previous ends.
        lengths = lengths.astype(np.int64)
        first = np.cumsum(lengths) - lengths
        rows = slice(int(starts[g]), int(starts[g + 1]))
        first_trained[rows] = segment_sums(labels[first] != IGNORE_INDEX, seq_offsets)
    return RowCounts(tokens, samples, trained - first_trained)
