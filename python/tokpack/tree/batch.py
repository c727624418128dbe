"""Rows of prefix trees as a training batch, and the tree attention in the forms kernels take.

A batch is a dict of tensors. What the model reads: ``input_ids`` and ``position_ids``
``[B, L]`` (positions along each token's own path). The tree: ``tree_tout`` ``[B, L]`` — key
``k`` is visible from query ``q`` of its row iff ``k <= q < tree_tout[b, k]`` (``k`` is on
``q``'s path and not after it; padding sees only itself) — and per node (row-local, flat over
rows by ``tree_node_offsets``) ``tree_node_parent`` / ``_depth`` (its first position) /
``_tin`` / ``_tout`` / ``_len``, with ``tree_node`` ``[B, L]`` each token's node. Per sequence
(ascending original index ``tree_seq_index``): ``tree_seq_row``, ``tree_seq_end_node``,
``tree_completion_lengths`` (its trained targets) and ``tree_target_offsets`` /
``tree_target_pred`` (its targets as predictions); per distinct prediction ``tree_pred_row`` /
``_pos`` / ``_token`` / ``_weight`` (logits of row, position scoring token, trained by that
many sequences).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np
import torch

from ..errors import ConfigError

#: The keys a model reads; every other key of a tree batch is tokpack's bookkeeping.
MODEL_KEYS = ("input_ids", "position_ids", "attention_mask")


def as_tensors(arrays: Mapping[str, np.ndarray]) -> Dict[str, Any]:
    """The Rust layout's batch (its arrays under this module's keys, the per-token ones
    already ``[B, L]`` and padded) as tensors sharing the arrays' memory."""
    return {key: torch.from_numpy(value) for key, value in arrays.items()}


def dense_mask(batch: Mapping[str, Any], dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The tree attention as a dense ``[B, 1, L, L]`` mask (query, key): bool (True attends:
    sdpa's form) or, given a floating ``dtype``, additive (0 attends, the dtype's minimum
    masks: eager attention's form, which adds the mask to the scores)."""
    tout = batch["tree_tout"]
    idx = torch.arange(tout.shape[1], device=tout.device)
    q, k = idx[:, None], idx[None, :]
    allowed = (k <= q)[None] & (q[None] < tout[:, None, :])
    allowed = allowed[:, None]
    if dtype is None:
        return allowed
    if not dtype.is_floating_point:
        raise ConfigError(f"dtype must be a floating dtype for an additive mask, got {dtype}")
    out = torch.zeros(allowed.shape, dtype=dtype, device=tout.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


def block_mask(batch: Mapping[str, Any], block_size: int = 128) -> Any:
    """The tree attention as a FlexAttention ``BlockMask`` (``torch.nn.attention.flex_attention``)
    built from the intervals: blocks no query of which sees any key are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    tout = batch["tree_tout"]
    b, length = tout.shape

    def tree(bi: Any, h: Any, q: Any, kv: Any) -> Any:
        return (kv <= q) & (q < tout[bi, kv])

    return create_block_mask(
        tree,
        B=b,
        H=None,
        Q_LEN=length,
        KV_LEN=length,
        device=str(tout.device),
        BLOCK_SIZE=block_size,
    )


def attention_pairs(batch: Mapping[str, Any]) -> int:
    """Query-key pairs the tree attention computes (each token sees its path up to itself):
    the mask's count of True over real tokens, from the positions alone."""
    real = batch["tree_node"] >= 0
    return int((batch["position_ids"][real] + 1).sum())
