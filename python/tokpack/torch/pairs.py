"""Preference pairs and unpaired (KTO) sequences in packed batches: what ``PackedCollator(...,
return_pairs=True)`` adds, the shared-prompt attention structure, and ``sequence_logps``.

A packed preference row holds whole pairs (the contract of ``tokpack pack``): segments with
``seq_roles`` 1 (chosen) then 2 (rejected), each the whole prompt + completion ("separate"
layout), or 3 (shared prompt), 1, 2 where both completions attend to the prompt segment and
continue its positions ("shared-prompt" layout). Rows without ``seq_roles`` (KTO, SFT) hold
unpaired sequences (role 0).

The log-probability of a sequence is the sum over its completion tokens (labels other than -100)
of log p(token | what precedes it), as TRL computes it on the sequence alone: a token is predicted
by the logits of the token before it in its segment, and the first token of a shared-prompt
completion by the logits of the prompt's last token. The collator lists these terms once per
batch (``logp_terms``), so ``sequence_logps`` is one gather and one scatter-add for every format.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from .._contract import IGNORE_INDEX, SEGMENT_ROLES
from ..errors import ConfigError, DataError

__all__ = ["ROLE_SEQUENCE", "ROLE_CHOSEN", "ROLE_REJECTED", "ROLE_PROMPT", "sequence_logps"]

ROLE_SEQUENCE, ROLE_CHOSEN, ROLE_REJECTED, ROLE_PROMPT = map(
    SEGMENT_ROLES.index, ("sequence", "chosen", "rejected", "prompt")
)
PAIR_FORMATS = ("hf", "flash", "padded")


def row_tensor(value: Any) -> torch.Tensor:
    """A row's column as a tensor, sharing a numpy array's memory. The collators only read
    row tensors (every batch tensor is a new one: cat, index_select, copies), so a read-only
    array (Ray's batches over Arrow memory, via ``rows_collate``) is shared without a copy, and
    torch's warning that writes to it would be undefined does not apply."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            return torch.as_tensor(value)
    return torch.as_tensor(value)


def prompt_segments(roles: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """Per segment, the index of the shared prompt segment it also attends to, -1 if none."""
    # One spare entry: unpaired segments (pair -1) read it.
    prompt_of_pair = np.full(max(int(pair.max(initial=-1)) + 1, 1), -1, dtype=np.int64)
    is_prompt = np.flatnonzero(roles == ROLE_PROMPT)
    prompt_of_pair[pair[is_prompt]] = is_prompt
    completion = (roles == ROLE_CHOSEN) | (roles == ROLE_REJECTED)
    return np.where(completion, prompt_of_pair[np.maximum(pair, 0)], -1)


def _row_roles(rows: Sequence[Mapping[str, Any]], seg_lens: List[torch.Tensor]) -> np.ndarray:
    roles = []
    for i, (row, s) in enumerate(zip(rows, seg_lens)):
        r = row.get("seq_roles")
        r = np.zeros(s.numel(), np.int64) if r is None else row_tensor(r).cpu().numpy()
        r = r.astype(np.int64, copy=False)
        if r.shape != (s.numel(),):
            raise DataError(
                f"row {i}: seq_roles has {r.size} entries but seq_lengths has {s.numel()}"
            )
        roles.append(r)
    return np.concatenate(roles)


def _pair_index(roles: np.ndarray, seg_row: np.ndarray) -> np.ndarray:
    """Pair index of every segment (-1 for unpaired batches); DataError naming the row unless
    the roles are whole pairs ``1 2`` or ``3 1 2`` within each row (every row starts a pair)."""
    paired = roles != ROLE_SEQUENCE
    if not paired.any():
        return np.full(roles.size, -1, dtype=np.int64)
    if not paired.all():
        raise DataError(
            f"rows {int(seg_row[np.argmax(paired)])} and {int(seg_row[np.argmin(paired)])}: a"
            " batch mixes preference pairs (seq_roles 1-3) and unpaired sequences (no seq_roles,"
            " or role 0)"
        )
    prev = np.concatenate(([ROLE_SEQUENCE], roles[:-1]))
    new_row = np.concatenate(([True], seg_row[1:] != seg_row[:-1]))
    start = new_row | (roles == ROLE_PROMPT) | ((roles == ROLE_CHOSEN) & (prev != ROLE_PROMPT))
    starts = np.flatnonzero(start)
    pair = np.cumsum(start) - 1
    shared = roles[starts] == ROLE_PROMPT
    size = np.diff(np.append(starts, roles.size))
    offset = np.arange(roles.size) - starts[pair]
    expected = np.where(
        shared[pair],
        np.array([ROLE_PROMPT, ROLE_CHOSEN, ROLE_REJECTED])[np.minimum(offset, 2)],
        np.array([ROLE_CHOSEN, ROLE_REJECTED, -1])[np.minimum(offset, 2)],
    )
    ok = (roles == expected) & (size[pair] == np.where(shared, 3, 2)[pair])
    if not ok.all():
        row = int(seg_row[np.argmin(ok)])
        raise DataError(
            f"row {row}: seq_roles {roles[seg_row == row].tolist()} are not whole pairs: chosen"
            " (1) then rejected (2), each pair optionally after its shared prompt (3)"
        )
    return pair


def _carried(rows: Sequence[Mapping[str, Any]], name: str, n_segs: List[int]):
    """The per-segment column ``name`` of every row, concatenated; None if no row has it."""
    if all(name not in row for row in rows):
        return None
    parts = []
    for i, (row, n) in enumerate(zip(rows, n_segs)):
        if name not in row:
            raise DataError(f"row {i}: missing column {name!r} (other rows of the batch have it)")
        t = row_tensor(row[name])
        if t.shape != (n,):
            raise DataError(f"row {i}: column {name!r} must have one entry per segment ({n})")
        parts.append(t)
    return torch.cat(parts)


def add_pair_fields(
    out: Dict[str, Any],
    rows: Sequence[Mapping[str, Any]],
    labels: List[torch.Tensor],
    seg_lens: List[torch.Tensor],
    format: str,
) -> None:
    """Add the pair fields to a collated batch ``out`` (see ``PackedCollator``), and for the
    shared-prompt layout fix the completions' positions and the boundary fields."""
    device = labels[0].device
    n_segs = [s.numel() for s in seg_lens]
    lens = np.concatenate([s.cpu().numpy() for s in seg_lens]).astype(np.int64)
    seg_row = np.repeat(np.arange(len(rows)), n_segs)
    roles = _row_roles(rows, seg_lens)
    pair = _pair_index(roles, seg_row)
    prompt = prompt_segments(roles, pair)
    shared = bool((prompt >= 0).any())
    if shared and format == "flash":
        raise ConfigError(
            "format 'flash' cannot express shared-prompt attention (cu_seqlens make each"
            " segment attend only to itself, so a completion would not see its prompt): use"
            " format 'hf' or 'padded' with flex_block_mask / sdpa_block_causal_mask, or pack"
            " with --pair-layout separate"
        )

    def dev(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

    # Index arithmetic in NumPy on the host, as the context-parallel slicing does (torch's
    # per-call cost dominates at batch sizes). Stream coordinates: the rows' tokens
    # concatenated. Logits coordinates: the index in logits.reshape(-1, vocab), which for the
    # padded format skips each row's padding; `shift` (per segment) takes the first to the second.
    cu = np.concatenate(([0], np.cumsum(lens)))
    shift = np.zeros_like(lens)
    if format == "padded":
        row_start = np.concatenate(([0], np.cumsum([y.shape[0] for y in labels])))[:-1]
        shift = (np.arange(len(rows)) * out["input_ids"].shape[1] - row_start)[seg_row]
    seg = np.repeat(np.arange(lens.size), lens)
    n_pairs = int(pair.max(initial=-1)) + 1
    terms = _logp_terms(torch.cat(labels).cpu().numpy(), seg, shift, roles, pair, prompt, cu)
    counts = np.bincount(terms[2], minlength=2 * n_pairs if n_pairs else lens.size)

    out["seq_roles"] = torch.from_numpy(roles.astype(np.int8)).to(device)
    out["pair_index"] = dev(pair)
    out["num_pairs"] = n_pairs
    out["seq_spans"] = dev(np.stack([cu[:-1] + shift, cu[1:] + shift], axis=1))
    out["logp_terms"] = dev(terms)
    out["completion_lengths"] = dev(counts.reshape(n_pairs, 2) if n_pairs else counts)
    for name in ("sample_ids", "label"):
        value = _carried(rows, name, n_segs)
        if value is not None:
            out[name] = value.to(device)
    if shared:
        # Completions continue the positions of their prompt.
        offset = np.repeat(np.where(prompt >= 0, lens[prompt], 0), lens)
        coords = np.arange(seg.size) + shift[seg]
        out["position_ids"].view(-1).index_add_(0, dev(coords), dev(offset))
        if format == "hf":
            # Varlen boundaries would make each segment attend only to itself: the attention
            # needs the mask helpers, which read document_ids and the roles.
            for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
                del out[key]
            out["document_ids"] = torch.from_numpy(seg.astype(np.int32)).to(device).view(1, -1)


def _logp_terms(
    labels: np.ndarray,
    seg: np.ndarray,
    shift: np.ndarray,
    roles: np.ndarray,
    pair: np.ndarray,
    prompt: np.ndarray,
    cu: np.ndarray,
) -> np.ndarray:
    """``[3, N]`` int64, one column per completion token with a predictor: the logits
    coordinate of the token predicting it, the token, and its sequence (``2 * pair + 1`` for a
    rejected completion, ``2 * pair`` for a chosen one, the segment index if unpaired).
    ``labels`` and ``seg`` (each token's segment) are in stream coordinates, ``cu`` the segment
    offsets there."""
    # A token is predicted by the token before it in its segment; the first token of a
    # shared-prompt completion by the prompt's last token; a segment's first token otherwise
    # by nothing.
    pred = np.arange(-1, labels.size - 1, dtype=np.int64)
    pred[cu[:-1]] = np.where(prompt >= 0, cu[prompt + 1] - 1, -1)
    take = (labels != IGNORE_INDEX) & (pred >= 0) & (roles != ROLE_PROMPT)[seg]
    at = np.flatnonzero(take)
    seg_at = seg[at]
    seq = np.where(pair >= 0, 2 * pair + (roles == ROLE_REJECTED), np.arange(roles.size))
    # The predictor is in the token's row, so the token's shift maps it too.
    return np.stack([pred[at] + shift[seg_at], labels[at].astype(np.int64), seq[seg_at]])


def shared_prompt_ids(batch: Mapping[str, Any], doc: torch.Tensor) -> Optional[torch.Tensor]:
    """``[B, L]``: the row-local document index of the shared prompt each token also attends
    to (-1 if none), for ``doc`` = ``document_ids(batch)``; None if the batch has no shared
    prompt."""
    roles = batch.get("seq_roles")
    if roles is None or not bool((roles == ROLE_PROMPT).any()):
        return None
    prompt = prompt_segments(
        roles.cpu().numpy().astype(np.int64), batch["pair_index"].cpu().numpy()
    )
    prompt = torch.from_numpy(prompt).to(doc.device)  # type: ignore[assignment]
    # Segments are numbered across the batch, documents within each row.
    per_row = (doc.max(dim=1).values + 1).clamp(min=0)
    first = (torch.cumsum(per_row, 0) - per_row).unsqueeze(1)
    valid = doc >= 0
    p = prompt[torch.where(valid, doc + first, 0)]
    return torch.where(valid & (p >= 0), p - first, -1)


def sequence_logps(
    logits: torch.Tensor, batch: Mapping[str, Any], *, average: bool = False
) -> torch.Tensor:
    """Per-sequence log-probability of the completion tokens of a ``PackedCollator(...,
    return_pairs=True)`` batch.

    Args:
        logits: the model's output for the batch, unshifted (``[1, T, V]``, ``[T, V]`` or
            ``[B, L, V]`` as the batch's ``input_ids``).
        average: divide each sum by the sequence's number of completion tokens
            (``batch["completion_lengths"]``; a sequence without any gives 0).

    Returns ``[num_pairs, 2]`` (chosen, rejected) for preference batches, ``[num_seqs]`` for
    unpaired ones (KTO), in the logits' dtype (at least float32), differentiable.
    """
    terms = batch.get("logp_terms")
    if terms is None:
        raise ConfigError(
            "batch has no logp_terms: collate it with PackedCollator(..., return_pairs=True)"
        )
    flat = logits.reshape(-1, logits.shape[-1])
    n_tokens = batch["input_ids"].numel()
    if flat.shape[0] != n_tokens:
        raise ConfigError(
            f"logits have {flat.shape[0]} positions but the batch has {n_tokens} tokens: pass"
            " the model's unshifted logits for the whole batch"
        )
    terms = terms.to(logits.device)
    picked = flat.index_select(0, terms[0]).to(torch.promote_types(logits.dtype, torch.float32))
    logp = picked.gather(1, terms[1].unsqueeze(1)).squeeze(1) - torch.logsumexp(picked, dim=1)
    counts = batch["completion_lengths"].to(logits.device)
    sums = logp.new_zeros(counts.numel()).index_add(0, terms[2], logp)
    if average:
        sums = sums / counts.reshape(-1).clamp(min=1).to(sums.dtype)
    return sums.view(counts.shape)
