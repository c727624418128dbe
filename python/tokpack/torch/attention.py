"""Attention structure of a packed batch: each token attends only to earlier tokens of its own
sample. Built from the boundary information every ``PackedCollator`` format carries. In the
shared-prompt layout of preference pairs (``return_pairs=True``), each completion also attends to
its pair's prompt segment, and the rejected completion not to the chosen one.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch

from ..errors import ConfigError
from .pairs import shared_prompt_ids

__all__ = ["document_ids", "sdpa_block_causal_mask", "flex_block_mask", "layer_type_masks"]


def _ids_from_lengths(lengths: torch.Tensor, device: torch.device) -> torch.Tensor:
    lengths = lengths.to(device=device, dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)


def document_ids(batch: Mapping[str, Any]) -> torch.Tensor:
    """``[B, L]`` int64: the sample index of every token (distinct per sample within a row).

    Works for every collator format: ``document_ids`` (padded; padding is ``-1``, its own
    document; also hf shared-prompt pair batches), ``cu_seq_lens_q`` (hf, ``[1, T]``),
    ``cu_seqlens`` (flash, ``[1, T]``) and ``seq_lens`` (torchtune, the padding tail is its own
    segment); not for a context-parallel slice (``cp_size > 1``), whose boundaries span the
    whole CP group.
    """
    if "cu_seqlens_padded" in batch:
        raise ConfigError(
            "a context-parallel batch (cp_size > 1) holds one rank's slice and attends across the"
            " whole group: use a context-parallel attention (e.g. TransformerEngine's THD with"
            " cu_seqlens and cu_seqlens_padded), not a local mask"
        )
    if "document_ids" in batch:
        return batch["document_ids"].to(torch.int64)
    for key in ("cu_seq_lens_q", "cu_seqlens"):
        if key in batch:
            cu = batch[key]
            return _ids_from_lengths(cu[1:] - cu[:-1], cu.device).view(1, -1)
    if "seq_lens" in batch:
        device = batch["tokens"].device
        return torch.stack([_ids_from_lengths(s, device) for s in batch["seq_lens"]])
    raise ConfigError(
        "batch has no boundary information (document_ids, cu_seq_lens_q, cu_seqlens or seq_lens)"
    )


def sdpa_block_causal_mask(batch: Mapping[str, Any]) -> torch.Tensor:
    """Boolean ``[B, 1, L, L]`` mask for ``scaled_dot_product_attention`` (True = may attend).

    Memory grows as L^2 per row: for long rows prefer FlexAttention or varlen kernels.
    """
    doc = document_ids(batch)
    n = doc.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=doc.device).tril()
    mask = (doc.unsqueeze(2) == doc.unsqueeze(1)) & causal
    prompt = shared_prompt_ids(batch, doc)
    if prompt is not None:
        # The prompt precedes its completions: no causal term needed.
        mask |= (prompt.unsqueeze(2) == doc.unsqueeze(1)) & (prompt >= 0).unsqueeze(2)
    return mask.unsqueeze(1)


def layer_type_masks(
    batch: Mapping[str, Any],
    windows: Mapping[str, Optional[int]],
    dtype: Optional[torch.dtype] = None,
) -> Dict[str, torch.Tensor]:
    """One ``[B, 1, L, L]`` block-causal mask per layer type, for models that take
    ``attention_mask`` as such a dict and build no mask of their own from ``position_ids``
    (gpt-oss). ``windows``: layer type -> sliding window, None for full attention; a sliding
    layer's token attends to the ``window`` last tokens of its own sample, itself included (as
    transformers' ``sliding_window_overlay``). ``dtype``: None for boolean masks (True = may
    attend, sdpa), else additive masks of that float dtype (0 or its minimum, eager attention).
    """
    doc = document_ids(batch)
    n = doc.shape[1]
    q = torch.arange(n, device=doc.device)
    distance = q.view(-1, 1) - q.view(1, -1)
    same = (doc.unsqueeze(2) == doc.unsqueeze(1)) & (distance >= 0)
    masks: Dict[str, torch.Tensor] = {}
    by_window: Dict[Optional[int], torch.Tensor] = {}
    for layer_type, window in windows.items():
        if window not in by_window:
            allowed = same if window is None else same & (distance < window)
            if dtype is not None:
                allowed = torch.zeros(allowed.shape, dtype=dtype, device=doc.device).masked_fill_(
                    ~allowed, torch.finfo(dtype).min
                )
            by_window[window] = allowed.unsqueeze(1)
        masks[layer_type] = by_window[window]
    return masks


def flex_block_mask(
    batch: Mapping[str, Any], *, block_size: int = 128, device: Optional[torch.device] = None
):
    """A FlexAttention ``BlockMask`` (``create_block_mask``) of same-document causal attention.

    Blocks with no allowed pair are skipped by ``flex_attention``, so packed rows cost little more
    than their samples would alone. Shared-prompt pairs: a completion also attends to its prompt.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    doc = document_ids(batch)
    if device is not None:
        doc = doc.to(device)
    b, n = doc.shape
    prompt = shared_prompt_ids(batch, doc)

    def same_document_causal(bi, h, q_idx, kv_idx):
        return (doc[bi, q_idx] == doc[bi, kv_idx]) & (q_idx >= kv_idx)

    def with_shared_prompt(bi, h, q_idx, kv_idx):
        p = prompt[bi, q_idx]
        return same_document_causal(bi, h, q_idx, kv_idx) | ((p == doc[bi, kv_idx]) & (p >= 0))

    mask_mod = same_document_causal if prompt is None else with_shared_prompt
    return create_block_mask(mask_mod, b, None, n, n, device=doc.device, BLOCK_SIZE=block_size)
