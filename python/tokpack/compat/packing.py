"""Drop-in replacements for the packing functions of the token-packing guide users already call
(``pack_sequences``, ``concatenate_and_pack``), with the same names, arguments and outputs.

Semantics, as the guide's examples show: sequences are packed in input order, a new row starts
when the next sequence does not fit, and every row is padded to ``max_length``. Torch tensors in
give torch tensors out; lists or numpy arrays in give numpy arrays out (torch is never imported
unless the caller passed tensors).
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from .. import _tokpack
from .._contract import IGNORE_INDEX
from .._io.arrays import is_torch_tensor, to_numpy_1d
from ..errors import DataError, OverlongError
from ..pack.config import PackConfig

__all__ = ["pack_sequences", "concatenate_and_pack"]


class _Layout:
    """Where every token of a next-fit packing lands in a ``[rows, max_length]`` grid."""

    def __init__(self, lengths: np.ndarray, max_length: int):
        config = PackConfig(max_length, strategy="next_fit", row_order="plan")
        parts = _tokpack.plan(lengths=lengths, config=config, threads=1)
        bin_offsets, seg_lengths = parts.bin_offsets, parts.lengths
        self.sample_ids = parts.sample_ids
        self.max_length = max_length
        self.n_rows = len(bin_offsets) - 1
        self.row_cuts = bin_offsets.tolist()
        self.row_of_seg = np.repeat(np.arange(self.n_rows), np.diff(bin_offsets))
        seg_starts = np.cumsum(seg_lengths) - seg_lengths
        self.col_start = seg_starts - seg_starts[bin_offsets[:-1]][self.row_of_seg]
        self.col_end = self.col_start + seg_lengths
        # Flat destination of every token, segment after segment.
        dest_start = self.row_of_seg * max_length + self.col_start
        within = np.arange(int(seg_lengths.sum())) - np.repeat(seg_starts, seg_lengths)
        self.dest = np.repeat(dest_start, seg_lengths) + within

    def fill(self, parts: List[np.ndarray], pad: Any) -> np.ndarray:
        """The ``[rows, max_length]`` grid of ``parts`` (in their common dtype), ``pad`` around."""
        nonempty = [a.dtype for a in parts if a.size]
        dtype = np.result_type(*nonempty) if nonempty else np.dtype(np.int64)
        out = np.full((self.n_rows, self.max_length), pad, dtype=dtype)
        if len(self.sample_ids):
            out.reshape(-1)[self.dest] = np.concatenate([parts[i] for i in self.sample_ids])
        return out

    def boundaries(self) -> List[List[Tuple[int, int]]]:
        spans = list(zip(self.col_start.tolist(), self.col_end.tolist()))
        return [spans[a:b] for a, b in zip(self.row_cuts, self.row_cuts[1:])]


def _as_arrays(sequences: Sequence[Any], what: str) -> Tuple[List[np.ndarray], bool, Any]:
    seqs = list(sequences)
    torch_in = any(is_torch_tensor(s) for s in seqs)
    device = next((s.device for s in seqs if is_torch_tensor(s)), None)
    arrays = [to_numpy_1d(s, f"{what}[{i}]") for i, s in enumerate(seqs)]
    return arrays, torch_in, device


def _lengths(arrays: List[np.ndarray], max_length: int, what: str) -> np.ndarray:
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    too_long = np.flatnonzero(lengths > max_length)
    if too_long.size:
        i = int(too_long[0])
        raise OverlongError(
            f"{what}[{i}] has {int(lengths[i])} tokens, more than max_length={max_length}; "
            f"truncate first, e.g. [s[:max_length] for s in sequences if len(s) > 0]"
        )
    return lengths


def _to_output(arr: np.ndarray, torch_in: bool, device: Any):
    if not torch_in:
        return arr
    import torch

    tensor = torch.from_numpy(arr)
    return tensor.to(device) if device is not None and device.type != "cpu" else tensor


def pack_sequences(
    sequences: Sequence[Any],
    max_length: int,
    pad_token_id: int = 0,
    return_boundaries: bool = False,
):
    """Pack sequences in order into rows of ``max_length`` tokens, padded with ``pad_token_id``.

    A new row starts when the next sequence does not fit. Empty sequences are skipped. A sequence
    longer than ``max_length`` raises :class:`tokpack.OverlongError` (truncate first).

    Returns a ``[rows, max_length]`` tensor (torch in) or numpy array (lists / numpy in); with
    ``return_boundaries=True`` also, per row, a list of ``(start, end)`` column indices of each
    original sequence (end exclusive).

    >>> pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12]], max_length=8).tolist()
    [[1, 2, 3, 4, 5, 0, 0, 0], [6, 7, 8, 9, 10, 11, 12, 0]]
    """
    max_length = PackConfig(max_length).max_len
    arrays, torch_in, device = _as_arrays(sequences, "sequences")
    layout = _Layout(_lengths(arrays, max_length, "sequences"), max_length)
    packed = _to_output(layout.fill(arrays, pad_token_id), torch_in, device)
    return (packed, layout.boundaries()) if return_boundaries else packed


def concatenate_and_pack(
    input_sequences: Sequence[Any],
    label_sequences: Sequence[Any],
    attention_masks: Sequence[Any],
    max_length: int,
    pad_token_id: int = 0,
    label_pad_id: int = IGNORE_INDEX,
):
    """Pack inputs, labels and attention masks together (same layout as :func:`pack_sequences`).

    Returns ``(packed_inputs, packed_labels, packed_masks)``, each ``[rows, max_length]``; padding
    is ``pad_token_id``, ``label_pad_id`` and 0 respectively.

    >>> ids, labels, masks = concatenate_and_pack([[1, 2, 3], [4, 5, 6, 7]],
    ...     [[-100, 2, 3], [-100, -100, 6, 7]], [[1, 1, 1], [1, 1, 1, 1]], max_length=8)
    >>> labels.tolist()
    [[-100, 2, 3, -100, -100, 6, 7, -100]]
    """
    max_length = PackConfig(max_length).max_len
    inputs, torch_in, device = _as_arrays(input_sequences, "input_sequences")
    labels, torch_l, _ = _as_arrays(label_sequences, "label_sequences")
    masks, torch_m, _ = _as_arrays(attention_masks, "attention_masks")
    torch_in = torch_in or torch_l or torch_m
    for what, other in (("label_sequences", labels), ("attention_masks", masks)):
        if len(other) != len(inputs):
            raise DataError(
                f"{what} has {len(other)} sequences but input_sequences has {len(inputs)}"
            )
        for i, (a, b) in enumerate(zip(inputs, other)):
            if a.size != b.size:
                raise DataError(
                    f"{what}[{i}] has {b.size} entries but input_sequences[{i}] has {a.size}"
                )
    layout = _Layout(_lengths(inputs, max_length, "input_sequences"), max_length)
    padded = ((inputs, pad_token_id), (labels, label_pad_id), (masks, 0))
    return tuple(_to_output(layout.fill(a, pad), torch_in, device) for a, pad in padded)
