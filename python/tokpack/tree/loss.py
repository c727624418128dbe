"""Per-sequence log-probs and losses from a tree batch's logits, in the sequences' original
order: each distinct prediction is scored once, then read by every sequence that trains it
(a branch point's last token scores each child's first token)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .._checks import check_choice

_REDUCTIONS = ("sum", "token_mean", "sequence_mean")


def prediction_logps(logits: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
    """``[U]``: the log-prob of each distinct prediction (``tree_pred_*``)."""
    dev = logits.device
    rows = batch["tree_pred_row"].to(dev)
    pos = batch["tree_pred_pos"].to(dev)
    tok = batch["tree_pred_token"].to(dev)
    picked = logits[rows, pos]
    return picked.gather(-1, tok[:, None])[:, 0] - torch.logsumexp(picked, dim=-1)


def token_logps(logits: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
    """``[S, T]``: per sequence (rows in ``tree_seq_index`` order) the log-probs of its trained
    targets in order, zero past ``tree_completion_lengths`` (``T`` their maximum)."""
    lp = prediction_logps(logits, batch)[batch["tree_target_pred"].to(logits.device)]
    lengths = batch["tree_completion_lengths"].to(logits.device)
    s = lengths.numel()
    width = int(lengths.max()) if s else 0
    out = lp.new_zeros((s, width))
    mask = torch.arange(width, device=logits.device)[None, :] < lengths[:, None]
    out[mask] = lp
    return out


def sequence_logps(logits: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
    """``[S]``: each sequence's summed log-prob of its trained targets, exactly what the
    sequence alone gives, in ``tree_seq_index`` order (ascending original index)."""
    lp = prediction_logps(logits, batch)[batch["tree_target_pred"].to(logits.device)]
    lengths = batch["tree_completion_lengths"].to(logits.device)
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=logits.device), lengths)
    return lp.new_zeros(lengths.numel()).index_add_(0, seq, lp)


def tree_loss(
    logits: torch.Tensor, batch: Mapping[str, Any], reduction: str = "sum"
) -> torch.Tensor:
    """The cross-entropy of the batch's sequences, each shared prediction scored once and
    weighted by the sequences that train it. ``"sum"``: the sum of every sequence's summed loss
    alone; ``"token_mean"``: over all trained targets (what flat packing of the same sequences
    gives); ``"sequence_mean"``: the mean over sequences of each one's per-token mean."""
    check_choice("reduction", reduction, _REDUCTIONS)
    if reduction == "sequence_mean":
        lengths = batch["tree_completion_lengths"].to(logits.device)
        per = -sequence_logps(logits, batch) / lengths.clamp(min=1)
        return per.mean()
    weight = batch["tree_pred_weight"].to(logits.device)
    total = -(prediction_logps(logits, batch) * weight).sum()
    if reduction == "token_mean":
        return total / weight.sum().clamp(min=1)
    return total
