"""``PackedCollator``: packed rows in, one training batch out, in the layout a trainer expects.

Every format masks the label of the first token of each sample (-100), so no loss term predicts a
sample's first token from the previous sample, and reports ``num_loss_tokens`` / ``num_seqs`` so a
trainer can normalise the loss over the whole batch instead of averaging per row.

With ``cp_size > 1`` the flat formats return one context-parallel rank's slice of the batch in
TransformerEngine's THD layout (see ``_context_parallel``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .._checks import MAX_LEN, check_choice, check_int
from .._contract import IGNORE_INDEX
from ..errors import ConfigError, DataError
from ._batch import (
    _add_carried,
    _check_layer_masks,
    _check_splits,
    _count_trained,
    _host_rows,
    _per_sample_weights,
    boundary_fields,
    refuse_tree_rows,
)
from ._transport import ship
from .attention import layer_type_masks
from .pairs import PAIR_FORMATS, add_pair_fields, row_tensor
from .static import StaticShapes, check_static, static_batch

__all__ = ["PackedCollator", "FORMATS", "IGNORE_INDEX"]

FORMATS = ("hf", "flash", "padded", "torchtune", "per_sample")
CP_FORMATS = ("hf", "flash")


def _cat64(parts: Sequence[Any]) -> torch.Tensor:
    """A column of the rows concatenated, as a new int64 tensor: NumPy arrays on the host,
    tensors on their device."""
    if isinstance(parts[0], np.ndarray):
        return torch.from_numpy(np.concatenate(parts, dtype=np.int64))
    return torch.cat(list(parts)).to(torch.int64)


def _as_tensor(value: Any, name: str, row: int) -> torch.Tensor:
    t = row_tensor(value)
    if t.dim() != 1:
        raise DataError(f"row {row}: column {name!r} must be 1-D, got shape {tuple(t.shape)}")
    return t


@dataclasses.dataclass(eq=False)
class PackedCollator:
    """Collate packed rows (dicts with ``input_ids``, ``seq_lengths`` and optional ``labels``).

    Args:
        format: ``"hf"`` (padding-free ``[1, T]`` + ``cu_seq_lens_q/k``), ``"flash"`` (flat 1-D
            tensors + ``cu_seqlens``), ``"padded"`` (``[B, L]`` + ``document_ids``) or
            ``"torchtune"`` (``tokens``, ``labels``, ``input_pos``, ``seq_lens``) or
            ``"per_sample"`` (``[S, L]``: each of the batch's S samples alone in a right-padded
            row, exact for every causal model, recurrent ones included, at the cost of the
            padding). :meth:`for_model` picks the one a model needs.
        pad_to: row length of the padded formats (static shapes for ``torch.compile``); None pads
            to the longest row of the batch. Ignored by the flat formats.
        pad_id: token id used for padding.
        return_seq_idx: also return ``seq_idx`` (int32, the sample index of every token within the
            batch, ``-1`` on padding), as ``DataCollatorWithFlattening`` does.
        return_loss_weights: also return ``loss_weights`` (float32, shaped like ``labels``): ``1 /
            n_s`` on the loss tokens of a sample with ``n_s`` loss tokens, 0 elsewhere, so
            ``(token_loss * loss_weights).sum() / num_seqs`` is the mean of per-sample mean losses.
        return_pairs: also return what preference and KTO losses need (``seq_roles``,
            ``pair_index``, ``num_pairs``, ``seq_spans``, ``logp_terms``, ``completion_lengths``,
            and ``sample_ids`` / ``label`` when the rows have them; see ``tokpack.torch.pairs``),
            with the positions and boundaries of the shared-prompt layout. Formats hf, flash
            (separate layout only) and padded.
        layer_masks: also return ``attention_mask`` as a dict of 4-D block-causal masks, one per
            layer type (``{"full_attention": None, "sliding_attention": 128}``: the sliding
            window of each, None for full attention), for models whose mask code ignores
            ``position_ids`` (gpt-oss). Formats hf and padded.
        mask_dtype: the masks' dtype: None for boolean masks (sdpa; True = may attend), a float
            dtype for additive masks (eager attention: 0 or the dtype's minimum).
        static: a :class:`tokpack.torch.static.StaticShapes`: batches whose shapes depend only
            on it (fixed-capacity boundary arrays, aligned segments, a tail policy, FlexAttention
            block tables); formats hf, flash and padded.

    The collator holds only its options: it is picklable and cheap to copy into workers. Derived
    tensors are built on the device of the rows' ``input_ids`` (CPU in DataLoader workers).
    """

    #: The collator never writes into its rows (every batch tensor is a new one), so tokpack's
    #: readers hand it views of their cached row groups instead of copies.
    reads_rows_only: ClassVar[bool] = True

    format: str = "hf"
    pad_to: Optional[int] = None
    pad_id: int = 0
    return_seq_idx: bool = False
    return_loss_weights: bool = False
    cp_size: int = 1
    cp_rank: int = 0
    return_pairs: bool = False
    layer_masks: Optional[Mapping[str, Optional[int]]] = None
    mask_dtype: Optional[torch.dtype] = None
    static: Optional[StaticShapes] = None

    def __post_init__(self) -> None:
        check_choice("format", self.format, FORMATS)
        if self.pad_to is not None:
            self.pad_to = check_int(self.pad_to, "pad_to", 1, MAX_LEN)
        self.cp_size = check_int(self.cp_size, "cp_size", 1, MAX_LEN)
        self.cp_rank = check_int(self.cp_rank, "cp_rank", 0, self.cp_size - 1)
        if self.cp_size > 1 and self.format not in CP_FORMATS:
            raise ConfigError(
                f"context parallelism (cp_size={self.cp_size}) needs format"
                f" {' or '.join(CP_FORMATS)}, got {self.format!r}"
            )
        if self.return_pairs and (self.format not in PAIR_FORMATS or self.cp_size > 1):
            raise ConfigError(
                f"return_pairs needs format {', '.join(PAIR_FORMATS)} without context"
                f" parallelism, got format={self.format!r}, cp_size={self.cp_size}"
            )
        if self.layer_masks is not None:
            self.layer_masks = _check_layer_masks(self)
        if self.mask_dtype is not None and not (
            isinstance(self.mask_dtype, torch.dtype) and self.mask_dtype.is_floating_point
        ):
            raise ConfigError(
                f"mask_dtype must be None or a float torch.dtype, got {self.mask_dtype!r}"
            )
        self.pad_id = int(self.pad_id)
        self.return_seq_idx = bool(self.return_seq_idx)
        self.return_loss_weights = bool(self.return_loss_weights)
        self.return_pairs = bool(self.return_pairs)
        if self.static is not None:
            check_static(self)

    @classmethod
    def for_model(
        cls, model: Any, format: Optional[str] = None, *, check: bool = True, **options: Any
    ) -> "PackedCollator":
        """The collator that gives ``model`` (a transformers model) the batch fields its family
        reads to keep packed samples apart, in its cheapest exact layout: ``hf`` (``[1, T]`` with
        ``cu_seq_lens``) for varlen kernels, ``padded`` (``[B, L]`` rows, positions restarting
        per sample) under sdpa and eager, with per-layer-type block masks (``layer_masks``) or
        ``seq_idx`` where the family needs them. ``format`` asks for one of
        ``tokpack.torch.models.MODEL_FORMATS`` (``"per_sample"``: one sample per padded row,
        exact for every family); ``options`` are the other ``PackedCollator`` arguments.

        ``check=True`` (the default) runs ``tokpack.torch.check_packing`` once on ``model``
        with this collator's packed batches before returning it: about two no-grad forwards of
        300 tokens on the model's device (tens of ms for a tiny model on CPU); ``check=False``
        skips it. The ``per_sample`` layout is not checked: it runs each sample alone.

        Raises:
            PackingError: the model would mix packed samples in that format on this machine
                (a recurrent layer without its kernels, say, or a check that fails); the message
                names the model, the layer kind and the fix.
        """
        from .models import packing_support

        support = packing_support(model, format).require()
        static = options.get("static")
        if static is not None and support.rule == "kernels":
            # Linear-attention kernels break on zero-length segments: one padding segment.
            options["static"] = dataclasses.replace(static, tail="coalesce")
        collator = cls(**{**options, **support.collator_options()})
        if check and collator.format != "per_sample":
            from .check import check_packing

            check_packing(model, collator, fix=support.check_fix())
        return collator

    def __repr__(self) -> str:
        cp = f", cp_size={self.cp_size}, cp_rank={self.cp_rank}" if self.cp_size > 1 else ""
        pairs = ", return_pairs=True" if self.return_pairs else ""
        masks = ""
        if self.layer_masks is not None:
            masks = f", layer_masks={self.layer_masks!r}, mask_dtype={self.mask_dtype!r}"
        return (
            f"PackedCollator(format={self.format!r}, pad_to={self.pad_to!r}, pad_id={self.pad_id},"
            f" return_seq_idx={self.return_seq_idx},"
            f" return_loss_weights={self.return_loss_weights}{cp}{pairs}{masks})"
        )

    def reads_columns(self, columns: Sequence[str]) -> Tuple[str, ...]:
        """Which of a packed directory's row ``columns`` this collator reads, so tokpack's
        readers decode only those: all but ``sample_ids``, which only ``return_pairs`` uses."""
        return tuple(c for c in columns if c != "sample_ids" or self.return_pairs)

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        # In a DataLoader worker the batch crosses to the main process in one shared-memory slot.
        return ship(self.collate(rows))

    def collate(self, rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        """The batch of ``rows`` as a plain dict (what ``__call__`` returns in the main
        process), for collators that add fields to it."""
        if len(rows) == 0:
            raise DataError("PackedCollator got an empty batch")
        refuse_tree_rows(rows, "PackedCollator")
        flat = self.format in ("hf", "flash") and self.cp_size == 1
        host = None
        if flat and self.static is None and not self.return_pairs:
            host = _host_rows(rows)
        if self.static is not None:
            batch = static_batch(rows, self.static, self.format, self.pad_id)
        elif host is not None:
            batch = self._flat(*host)
        else:
            ids, labels, seg_lens = self._rows(rows)
            if self.cp_size > 1:
                batch = self._context_parallel(ids, labels, seg_lens)
            elif flat:
                batch = self._flat(ids, labels, seg_lens)
            else:
                batch = self._padded(ids, labels, seg_lens)
            if self.return_pairs:
                add_pair_fields(batch, rows, labels, seg_lens, self.format)
        if self.layer_masks is not None:
            batch["attention_mask"] = layer_type_masks(batch, self.layer_masks, self.mask_dtype)
        _add_carried(batch, rows)
        # The optimizer step's global counts, from a PackedBatchSampler batch.
        counts = getattr(rows, "step_counts", None)
        if counts is not None:
            batch["global_num_loss_tokens"], batch["global_num_samples"] = counts
        return batch

    def _rows(self, rows: Sequence[Mapping[str, Any]]):
        """[input_ids, labels, seq_lengths] of the rows, checked: three lists of tensors."""
        checked = []
        for i, row in enumerate(rows):
            try:
                x = _as_tensor(row["input_ids"], "input_ids", i)
                s = _as_tensor(row["seq_lengths"], "seq_lengths", i)
            except KeyError as exc:
                raise DataError(f"row {i}: missing column {exc.args[0]!r}") from None
            y = row.get("labels")
            y = x if y is None else _as_tensor(y, "labels", i)
            if y.shape != x.shape:
                raise DataError(
                    f"row {i}: labels have {y.shape[0]} tokens but input_ids have {x.shape[0]}"
                )
            if int(s.sum()) != x.shape[0] or (s.numel() and int(s.min()) < 1):
                raise DataError(
                    f"row {i}: seq_lengths {s.tolist()} do not split the row's {x.shape[0]} tokens"
                )
            checked.append((x, y, s))
        return [list(column) for column in zip(*checked)]

    def _flat(self, ids, labels, seg_lens) -> Dict[str, Any]:
        """The flat formats' batch of the rows (lists of NumPy arrays or of checked tensors): the
        tokens concatenated on their device, the index arithmetic in NumPy on the host, whose
        cost per call is a fraction of torch's at batch sizes (a batch of 8 rows of 4,096
        tokens is collated in about half the time)."""
        lens = _cat64(seg_lens).cpu().numpy()
        cu = np.zeros(lens.size + 1, dtype=np.int64)
        np.cumsum(lens, out=cu[1:])
        if isinstance(ids[0], np.ndarray):  # host rows, not checked yet
            _check_splits(ids, seg_lens, lens, cu)
        input_ids, lab = _cat64(ids), _cat64(labels)
        device = input_ids.device

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device)

        total = int(cu[-1])
        starts = cu[:-1]
        lab.index_fill_(0, dev(starts), IGNORE_INDEX)
        # Position within its segment: 1 per token, stepping back at every segment start.
        step = np.ones(total, dtype=np.int64)
        step[starts[1:]] = 1 - lens[:-1]
        if total:
            step[0] = 0
        shape = (-1,) if self.format == "flash" else (1, -1)
        max_len = int(lens.max()) if lens.size else 0
        out: Dict[str, Any] = {
            "input_ids": input_ids.view(shape),
            "labels": lab.view(shape),
            "position_ids": dev(np.cumsum(step, out=step)).view(shape),
            **boundary_fields(self.format, dev(cu.astype(np.int32)), max_len),
            "num_loss_tokens": _count_trained(lab),
            "num_seqs": int(lens.size),
        }
        if self.return_seq_idx or self.return_loss_weights:
            seq_idx = dev(np.repeat(np.arange(lens.size, dtype=np.int32), lens)).view(shape)
            if self.return_seq_idx:
                out["seq_idx"] = seq_idx
            if self.return_loss_weights:
                trained = out["labels"] != IGNORE_INDEX
                out["loss_weights"] = _per_sample_weights(trained, seq_idx, lens.size)
        return out

    def _context_parallel(self, ids, labels, seg_lens) -> Dict[str, Any]:
        """Rank ``cp_rank``'s slice of the batch in TransformerEngine's THD layout, as Megatron's
        ``get_batch_on_this_cp_rank`` builds it with TE's ``thd_get_partitioned_indices``.

        Every sample is padded to a multiple of ``2 * cp_size`` (``pad_id``, label -100, positions
        continuing) and cut into ``2 * cp_size`` equal chunks; the rank takes chunks ``cp_rank`` and
        ``2 * cp_size - 1 - cp_rank`` of each sample, which balances causal attention work across
        ranks. ``cu_seqlens`` (real lengths) and ``cu_seqlens_padded`` (sample offsets in the padded
        stream) describe the whole group, not the rank: TE divides them by ``cp_size`` itself. The
        labels are shifted on the whole padded stream before it is cut (``shift_labels``): a rank
        shifting its own slice would pair the last token of a chunk with the first of its next one.
        """
        # Index arithmetic in NumPy on the host (lengths are host data, and NumPy's per-call cost is
        # a fraction of torch's at these sizes); the tokens are gathered on their own device.
        device = ids[0].device
        lens = np.concatenate([s.cpu().numpy() for s in seg_lens]).astype(np.int64)
        n_seqs = lens.size
        cu = np.concatenate(([0], np.cumsum(lens)))
        n_chunks = 2 * self.cp_size
        chunk = -(-lens // n_chunks)
        cu_padded = np.concatenate(([0], np.cumsum(chunk * n_chunks)))
        # The rank's two pieces of every sample, in stream order: runs of consecutive positions of
        # the padded sample starting at `first`. Per local token: its position in its sample, its
        # index in the batch's tokens and how many of the sample's tokens are left from it on.
        # The per-token arrays are int32 (a batch has far fewer than 2^31 tokens): half the memory
        # traffic of int64, which is most of the cost of this arithmetic.
        piece_len = np.repeat(chunk, 2)
        first = (chunk[:, None] * np.array([self.cp_rank, n_chunks - 1 - self.cp_rank])).ravel()
        shift = first - (np.cumsum(piece_len) - piece_len)
        local = np.arange(int(piece_len.sum()), dtype=np.int32)

        def per_token(per_piece: np.ndarray) -> np.ndarray:
            return np.repeat(per_piece.astype(np.int32), piece_len)

        position = per_token(shift) + local
        src = per_token(np.repeat(cu[:-1], 2) + shift) + local
        left = per_token(np.repeat(lens, 2) - shift) - local
        # Padding reads one value appended after the batch (index `sentinel`).
        sentinel = int(cu[-1])
        token_src = np.where(left > 0, src, sentinel)
        tokens = torch.cat([*ids, ids[0].new_full((1,), self.pad_id)])
        # Two values appended: `lab[1:]` is then the next token's label for every index up to
        # the sentinel. Each sample's first label is masked, so the target of a sample's last
        # token (the next sample's first label, or an appended one) is -100 too: shift_labels
        # need no index of their own.
        lab = torch.cat([*labels, labels[0].new_full((2,), IGNORE_INDEX)])

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device)

        starts = dev(cu[:-1])
        lab.index_fill_(0, starts, IGNORE_INDEX)
        index = dev(token_src)
        # The four per-token fields are rows of one int64 tensor and the two boundary arrays of
        # one int32 tensor: a batch sent from a DataLoader worker then moves two shared-memory
        # blocks instead of six, and each block costs far more than its bytes.
        fields = torch.empty((4, index.numel()), dtype=torch.int64, device=device)
        fields[0].copy_(tokens.index_select(0, index))
        fields[1].copy_(lab.index_select(0, index))
        fields[2].copy_(lab[1:].index_select(0, index))
        fields[3].copy_(dev(position))
        bounds = dev(np.stack([cu, cu_padded]).astype(np.int32))
        flat = self.format == "flash"
        shape = (-1,) if flat else (1, -1)
        out: Dict[str, Any] = {
            "input_ids": fields[0].view(shape),
            "labels": fields[1].view(shape),
            "shift_labels": fields[2].view(shape),
            "position_ids": fields[3].view(shape),
            "cu_seqlens": bounds[0],
            "cu_seqlens_padded": bounds[1],
            "max_seqlen": int(chunk.max()) * n_chunks if n_seqs else 0,
            # The whole group's loss terms: a rank divides its summed loss by this.
            "num_loss_tokens": _count_trained(lab),
            "num_seqs": n_seqs,
        }
        if self.return_seq_idx:
            sample = np.repeat(np.arange(n_seqs, dtype=np.int32), 2 * chunk)
            out["seq_idx"] = dev(np.where(left > 0, sample, -1)).view(shape)
        if self.return_loss_weights:
            # Per-sample counts over the whole group, aligned like shift_labels.
            trained = lab[:-2] != IGNORE_INDEX
            seq_idx = dev(np.repeat(np.arange(n_seqs), lens))
            weights = _per_sample_weights(trained, seq_idx, n_seqs)
            weights = torch.cat([weights, weights.new_zeros(2)])
            out["loss_weights"] = weights[1:].index_select(0, index).view(shape)
        return out

    def _padded(self, ids, labels, seg_lens) -> Dict[str, Any]:
        """``[B, L]`` right-padded rows: a packed row each (formats padded and torchtune,
        positions restarting per sample), or each sample of the batch alone (per_sample: a
        causal model never reads the padding after a token, so every family sees each sample
        exactly as alone; no positions, the model's default 0..n-1 are each sample's, and no
        mask). Index arithmetic in NumPy on the host; the tokens are scattered on their device."""
        per_sample = self.format == "per_sample"
        input_ids, lab = _cat64(ids), _cat64(labels)
        device = input_ids.device
        lens = _cat64(seg_lens).cpu().numpy()
        tokens = np.array([x.shape[0] for x in ids], dtype=np.int64)
        longest = int((lens if per_sample else tokens).max(initial=0))
        width = longest if self.pad_to is None else self.pad_to
        if longest > width:
            what = "sample" if per_sample else "row"
            raise DataError(f"a {what} has {longest} tokens, more than pad_to={width}")

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device)

        # Per token: its sample (numbered across the batch), position in it, row and column.
        seg = np.repeat(np.arange(lens.size), lens)
        seg_start = np.cumsum(lens) - lens
        pos = np.arange(seg.size) - seg_start[seg]
        row = seg if per_sample else np.repeat(np.arange(len(ids)), tokens)
        col = pos if per_sample else np.arange(seg.size) - (np.cumsum(tokens) - tokens)[row]
        n_rows = lens.size if per_sample else len(ids)
        flat = row * width + col
        index = dev(flat)
        lab.index_fill_(0, dev(seg_start), IGNORE_INDEX)

        def scatter(values: torch.Tensor, fill: int, dtype: torch.dtype) -> torch.Tensor:
            out = torch.full((n_rows, width), fill, dtype=dtype, device=device)
            if device.type == "cpu":  # NumPy: no thread pool to wake (and wait for) on a copy
                out.numpy().reshape(-1)[flat] = values.numpy()
            else:
                out.view(-1)[index] = values.to(dtype)
            return out

        out_ids = scatter(input_ids, self.pad_id, torch.int64)
        out_lab = scatter(lab, IGNORE_INDEX, torch.int64)
        seq_idx = scatter(dev(seg), -1, torch.int32)
        out: Dict[str, Any] = {"input_ids": out_ids, "labels": out_lab}
        if not per_sample:
            # torchtune gives the padding its own segment and continuing positions.
            positions = np.arange(width) - tokens[:, None]
            positions.reshape(-1)[row * width + col] = pos
            n_segs = [s.numel() for s in seg_lens]
            seg_first = np.cumsum(n_segs) - n_segs
            doc = scatter(dev(seg - seg_first[row]), -1, torch.int32)
            seq_lens = [
                dev(np.append(part, width - n) if n < width else part).to(torch.int32)
                for part, n in zip(np.split(lens, np.cumsum(n_segs)[:-1]), tokens)
            ]
            if self.format == "padded":
                out.update(position_ids=dev(positions), document_ids=doc)
            else:
                out = {"tokens": out_ids, "labels": out_lab, "input_pos": dev(positions)}
                out["seq_lens"] = seq_lens
        self._extras(out, out_lab, seq_idx, lens.size)
        return out

    def _extras(
        self, out: Dict[str, Any], lab: torch.Tensor, seq_idx: torch.Tensor, n_seqs: int
    ) -> None:
        """The normalisers every format reports, and the optional per-token tensors."""
        trained = lab != IGNORE_INDEX
        out["num_loss_tokens"] = int(trained.sum())
        out["num_seqs"] = int(n_seqs)
        if self.return_seq_idx:
            out["seq_idx"] = seq_idx.to(torch.int32)
        if self.return_loss_weights:
            out["loss_weights"] = _per_sample_weights(trained, seq_idx, n_seqs)
