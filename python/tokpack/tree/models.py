"""Which models can run a tree batch, and the inputs they get.

A tree batch is exact only where every token mixes with others through attention alone, and
the attention takes an arbitrary mask: recurrent layers (Mamba, linear attention, gated delta
nets) carry a state along the row, across branches, and a sliding window is replaced by the
tree mask. :func:`tree_refusal` asks the family rules of ``tokpack.torch.models``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch

from ..errors import PackingError
from ..torch.models import ATTENTION_KINDS, packing_support
from .batch import MODEL_KEYS, block_mask, dense_mask

# Layer kinds (config.layer_types) whose window a tree mask would replace.
_WINDOWED_LAYERS = ("sliding_attention", "chunked_attention", "reference_sliding_attention")


def tree_refusal(config: Any) -> Optional[str]:
    """Why a model of ``config`` cannot train on tree batches exactly, or None when it can.

    The family rules are ``tokpack.torch.models``': a tree needs a family whose attention
    follows ``position_ids`` and takes a free-form mask (rule ``positions``); recurrent layers
    carry their state across the branches, and families whose masks ignore positions (ALiBi,
    positions counted from the mask, sinks) would not follow the paths. Windowed attention is
    refused too: the tree mask replaces the window.
    """
    support = packing_support(config)
    family = support.family
    if support.rule != "positions":
        return (
            f"{family}'s {support.layer} layers keep samples apart by more than positions and"
            " a mask, which a tree batch cannot give them"
        )
    if getattr(config, "text_config", None) is not None:
        config = config.text_config
    stateful = [k for k in support.layer_kinds if k not in ATTENTION_KINDS]
    if stateful:
        return f"{family} has {', '.join(stateful)} layers, whose state runs across branches"
    windowed = sorted(k for k in support.layer_kinds if k in _WINDOWED_LAYERS)
    if windowed or (
        getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    ):
        return (
            f"{family} has {', '.join(windowed) or 'sliding-window'} attention, which a tree "
            "mask replaces; pack it flat, or set config.sliding_window = None when every "
            "sequence is shorter than the window"
        )
    return None


def check_tree_model(model: Any) -> None:
    """Raises :class:`~tokpack.PackingError` when ``model`` cannot train on tree batches."""
    config = getattr(model, "config", model)
    why = tree_refusal(config)
    if why is not None:
        raise PackingError(
            f"tokpack.tree cannot pack for this model: {why}; train it on flat packed batches "
            "(tokpack.torch.PackedCollator) instead"
        )


def model_inputs(batch: Mapping[str, Any], model: Any) -> Dict[str, Any]:
    """What ``model`` (a transformers model) reads of a tree batch: ``input_ids``,
    ``position_ids`` and the tree attention as ``attention_mask`` in the form its attention
    implementation takes (sdpa: a bool 4-D mask; eager: an additive one in the model's dtype;
    flex_attention: a ``BlockMask``). transformers passes a 4-D mask through as given."""
    check_tree_model(model)
    config = model.config
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl == "flex_attention":
        mask: Any = block_mask(batch)
    elif impl == "sdpa":
        mask = dense_mask(batch)
    elif impl == "eager":
        mask = dense_mask(batch, dtype=model.dtype)
    else:
        raise PackingError(
            f"tokpack.tree gives masks for sdpa, eager and flex_attention; this model uses "
            f"{impl!r}: load it with attn_implementation='sdpa' (or pass the intervals "
            "tree_tout to a kernel that takes them)"
        )
    device = getattr(model, "device", torch.device("cpu"))
    out = {k: batch[k].to(device) for k in MODEL_KEYS if k != "attention_mask"}
    out["attention_mask"] = mask.to(device) if isinstance(mask, torch.Tensor) else mask
    return out
