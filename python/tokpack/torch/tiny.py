"""Tiny random models of a transformers architecture: the config's every size shrunk (hidden 64,
vocabulary 256, a few experts, small state sizes), enough layers to have each of its layer
types once, sliding windows shorter than a test sample. No weights are read: what is built is
the architecture's code path, which is what decides whether packed samples stay apart.

Used by ``tokpack check-model`` and the model-family tests.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..errors import ConfigError

__all__ = ["tiny_config", "tiny_model", "SLIDING_WINDOW"]

#: The sliding window of a tiny model: shorter than the samples of a packing check, so a window
#: crossing a sample boundary shows.
SLIDING_WINDOW = 8

# Size fields and their tiny values, set wherever a config has them (each name a family uses
# for the same size). Heads 4 x head_dim 16 = hidden 64; two key/value heads keep grouped-query
# attention.
_SIZES: Dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embedding_size"), 64),
    **dict.fromkeys(
        ("intermediate_size", "ffn_hidden_size", "n_inner", "dense_intermediate_size"), 128
    ),
    **dict.fromkeys(("decoder_ffn_dim", "encoder_ffn_dim"), 128),
    **dict.fromkeys(
        (
            "moe_intermediate_size",
            "expert_intermediate_size",
            "shared_expert_intermediate_size",
            "shared_intermediate_size",
        ),
        32,
    ),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads"), 4),
    **dict.fromkeys(("decoder_attention_heads", "encoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads"), 2),
    **dict.fromkeys(("head_dim", "kv_channels", "d_head"), 16),
    **dict.fromkeys(("vocab_size", "n_words"), 256),
    **dict.fromkeys(("max_position_embeddings", "n_positions"), 512),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk"), 2),
    **dict.fromkeys(("n_shared_experts", "n_group", "topk_group", "first_k_dense_replace"), 1),
    # Multi-head latent attention (DeepSeek-V2/V3 and relatives).
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # Mamba / Mamba-2 mixers.
    **dict.fromkeys(("state_size", "ssm_state_size", "mamba_d_state"), 8),
    **dict.fromkeys(("mamba_n_heads", "mamba_num_heads"), 4),
    **dict.fromkeys(("mamba_d_head", "mamba_head_dim"), 32),
    **dict.fromkeys(("mamba_n_groups", "n_groups"), 1),
    **dict.fromkeys(("mamba_chunk_size", "chunk_size"), 16),
    "mamba_d_ssm": 128,
    "time_step_rank": 8,
    # Gated DeltaNet and other linear attentions.
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    **dict.fromkeys(("sliding_window", "attention_chunk_size"), SLIDING_WINDOW),
    "rotary_dim": 8,
    "use_cache": False,
}

# Fields whose None means "no such feature" (no window, no low-rank query).
_NONE_IS_OFF = frozenset({"sliding_window", "attention_chunk_size", "q_lora_rank", "rotary_dim"})

# Special token ids must lie in the tiny vocabulary.
_TOKEN_IDS = {
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
    "sep_token_id": 2,
    "cls_token_id": 1,
    "mask_token_id": 3,
}

# Layer counts: the number of layers, per stack.
_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "decoder_layers", "encoder_layers")

# The config fields that list one value per layer.
_PER_LAYER = ("layer_types", "mlp_layer_types", "layers_block_type")

# Families whose sizes are tied differently: Mamba-2's heads x head_dim = expand x hidden_size.
# LFM2's defaults have attention layers only: its checkpoints interleave short convolutions.
_FAMILY_SIZES: Dict[str, Dict[str, Any]] = {
    "mamba2": {"head_dim": 32},
    "lfm2": {"layer_types": ["conv", "full_attention"], "full_attn_idxs": [1]},
}


def tiny_config(config: Any) -> Any:
    """A copy of ``config`` (a transformers ``PreTrainedConfig``) with its sizes shrunk and
    enough layers to have each layer type; nested configs (``text_config``, ...) too."""
    values = config.to_dict()
    for key in _PER_LAYER:
        # Some configs derive their layer types at init (from layer indices, a period): take the
        # derived list, so the tiny model keeps every kind.
        derived = getattr(config, key, None)
        if isinstance(derived, (list, tuple)) and key in values:
            values[key] = list(derived)
    shrunk = _shrink(type(config), values)
    try:
        return type(config)(**shrunk)
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"{config.model_type}: cannot shrink its config to a tiny model ({exc})"
        ) from None


def _shrink(cls: Any, values: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(values)
    for key in ("_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype"):
        out.pop(key, None)
    for key, value in values.items():
        if key in _SIZES and (value is None or isinstance(value, (int, bool))):
            # None is a size still to derive (head_dim from hidden_size, ...) except where it
            # switches a feature off.
            if value is not None or key not in _NONE_IS_OFF:
                out[key] = _SIZES[key]
        elif key in _TOKEN_IDS and value is not None:
            out[key] = _tiny_token_id(value, _TOKEN_IDS[key])
        elif isinstance(value, dict) and "model_type" in value:
            out[key] = _shrink(None, value)
    if "qk_rope_head_dim" in values:
        # Multi-head latent attention: head_dim is the rotary part of a query.
        # Its keys and values are decompressed per query head, and qk_head_dim is derived.
        out["head_dim"] = _SIZES["qk_rope_head_dim"]
        out["num_key_value_heads"] = _SIZES["num_attention_heads"]
        if "qk_head_dim" in values:
            out["qk_head_dim"] = _SIZES["qk_rope_head_dim"] + _SIZES["qk_nope_head_dim"]
    layers = _layers_needed(values)
    if layers is not None:
        for key in _LAYER_COUNTS:
            if key in values:
                out[key] = layers
        for key in _PER_LAYER:
            if isinstance(values.get(key), list):
                out[key] = values[key][:layers]
    family = _FAMILY_SIZES.get(str(values.get("model_type")), {})
    out.update(family)
    if "layer_types" in family:
        for key in _LAYER_COUNTS:
            if key in values:
                out[key] = len(family["layer_types"])
    return out


def _tiny_token_id(value: Any, tiny: int) -> Any:
    if isinstance(value, list):
        return [_tiny_token_id(v, tiny) for v in value]
    return tiny if isinstance(value, int) and value >= _SIZES["vocab_size"] else value


def _layers_needed(values: Dict[str, Any]) -> Optional[int]:
    """The fewest leading layers that hold every layer type of the config (at least 2)."""
    n = next((values[k] for k in _LAYER_COUNTS if k in values), None)
    if not isinstance(n, int):
        return None
    patterns: List[List[Any]] = [values[k] for k in _PER_LAYER if isinstance(values.get(k), list)]
    needed = 2
    for pattern in patterns:
        kinds = set(map(str, pattern))
        seen = set()
        for i, kind in enumerate(pattern):
            seen.add(str(kind))
            if seen == kinds:
                needed = max(needed, i + 1)
                break
    return min(n, needed)


def tiny_model(
    config: Any, *, attn_implementation: Optional[str] = None, dtype: Any = None, seed: int = 0
) -> Any:
    """A random causal LM of ``config``'s architecture (shrunk with :func:`tiny_config`), in
    eval mode, in ``dtype`` (default float64), seeded."""
    import torch
    from transformers import AutoModelForCausalLM

    small = tiny_config(config)
    torch.manual_seed(seed)
    # The experts' grouped matmul kernels take no float64: the eager loop computes the same.
    kwargs: Dict[str, Any] = {"experts_implementation": "eager"}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_config(small, **kwargs)
    return model.to(torch.float64 if dtype is None else dtype).eval()
