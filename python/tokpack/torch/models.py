"""Which batch fields a model family reads to keep packed samples apart, and whether the installed
transformers and kernels give it an exact path on this machine.

A packed row is only as good as the boundaries the model honours. Attention layers of most
families detect packing from ``position_ids`` restarting at 0 (transformers' masking utilities)
or read ``cu_seq_lens_*`` (FlashAttention kernels); some build their masks without positions
(gpt-oss: attention sinks and sliding windows), and need a block mask per layer type; recurrent
layers carry state from one token to the next and need ``seq_idx`` (Mamba-2) or ``cu_seq_lens``
(Gated DeltaNet), which transformers honours only with the CUDA kernels installed. Where no
exact path exists, :func:`packing_support` says so and :meth:`ModelPacking.require` raises a
:class:`~tokpack.PackingError` naming the model, the layer kind and the fix, before any step is
taken. The ``per_sample`` layout (one sample per padded row) is exact for every family: right
padding never reaches a causal model's earlier tokens.

The family table is checked family by family on the installed transformers by
``tests/test_model_families.py``, which also writes the support matrix of the docs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from .._checks import check_choice
from ..errors import ConfigError, PackingError

__all__ = [
    "ModelPacking",
    "MODEL_FORMATS",
    "BOOKKEEPING_KEYS",
    "ATTENTION_KINDS",
    "packing_support",
    "model_inputs",
]

#: The layouts a model-aware collator gives: ``hf`` (one ``[1, T]`` padding-free sequence with
#: ``cu_seq_lens_q/k``, for FlashAttention-style kernels), ``padded`` (``[B, L]``, several samples
#: per row, positions restarting: the cheapest exact layout under sdpa and eager) and
#: ``per_sample`` (one sample per row, right-padded: exact for every family, at the cost of the
#: padding).
MODEL_FORMATS = ("hf", "padded", "per_sample")

#: Batch keys that are tokpack's bookkeeping, not model inputs (:func:`model_inputs`).
BOOKKEEPING_KEYS = frozenset(
    {
        "num_loss_tokens",
        "num_seqs",
        "position",
        "global_num_loss_tokens",
        "global_num_samples",
        "sample_ids",
        "document_ids",
        "loss_weights",
        # return_pairs: read by tokpack.torch.pairs, never by the model.
        "seq_roles",
        "pair_index",
        "num_pairs",
        "seq_spans",
        "logp_terms",
        "completion_lengths",
        "label",
    }
)

#: Layer kinds (``config.layer_types`` values) whose mixing is handled by attention masks;
#: anything else carries state along the sequence.
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})

# Attention implementations that read cu_seq_lens (varlen kernels) rather than a dense mask.
_VARLEN_MARKERS = ("flash", "paged")


@dataclass(frozen=True)
class _Rule:
    """How a family keeps samples apart.

    ``path``: ``"positions"`` (attention masks built from position_ids), ``"layer_masks"`` (its
    mask code ignores position_ids: a 4-D block mask per layer type is passed as a dict),
    ``"kernels"`` (recurrent layers exact only with ``packages`` importable, in the ``hf``
    layout, reading ``fields``) or ``"none"`` (no packed path in transformers: per_sample only).
    ``layer``: the layer kind that mixes without the path (for the message).
    """

    path: str
    layer: str = "attention"
    packages: Tuple[str, ...] = ()
    fields: Tuple[str, ...] = ()


_POSITIONS = _Rule("positions")
_GDN = _Rule("kernels", "Gated DeltaNet (linear attention)", ("fla",), ("cu_seq_lens_q",))
_MAMBA2_HYBRID = _Rule(
    "kernels", "Mamba-2 (SSM)", ("causal_conv1d", "mamba_ssm"), ("seq_idx", "cu_seq_lens_q")
)


def _no_path(layer: str) -> _Rule:
    return _Rule("none", layer)


# Families checked by tests/test_model_families.py on the installed transformers (tiny random
# configs, float64, CPU). A family not listed is unverified: treated by its config's layer kinds,
# and check_packing decides.
_FAMILIES: Dict[str, _Rule] = {
    "gpt_oss": _Rule("layer_masks", "attention with sinks and sliding windows"),
    "afmoe": _Rule("layer_masks", "sliding-window attention"),
    "bamba": _MAMBA2_HYBRID,
    "nemotron_h": _MAMBA2_HYBRID,
    "falcon_h1": _MAMBA2_HYBRID,
    "granitemoehybrid": _MAMBA2_HYBRID,
    "mamba2": _no_path("Mamba-2 (SSM; seq_idx is ignored)"),
    "jamba": _no_path("Mamba (SSM; seq_idx is ignored)"),
    "mamba": _no_path("Mamba (SSM)"),
    "falcon_mamba": _no_path("Mamba (SSM)"),
    "recurrent_gemma": _no_path("RG-LRU recurrent"),
    "rwkv": _no_path("RWKV recurrent"),
    "minimax": _no_path("lightning (linear) attention"),
    "lfm2": _no_path("short convolution"),
    "lfm3": _no_path("short convolution"),
    "inkling_text": _no_path("hybrid recurrent"),
    "deepseek_v4": _no_path("compressed attention"),
}
for _name in (
    "qwen3_next qwen3_5 qwen3_5_text qwen3_5_moe qwen3_5_moe_text olmo_hybrid lara_mini"
).split():
    _FAMILIES[_name] = _GDN
# Attention whose masks come from attention_mask alone (ALiBi, learned or no positions, older
# mask code, decoders of encoder-decoder models): position_ids do not separate samples, and
# the models take no per-layer-type masks.
for _name in (
    "axk1 bart bigbird_pegasus biogpt blenderbot blenderbot-small bloom mbart mpt mvp openai-gpt"
    " opt pegasus plbart trocr"
).split():
    _FAMILIES[_name] = _no_path("attention (its masks ignore position_ids)")
for _name in (
    "apertus apertus1p5_text arcee aria_text beam bitnet codegen cohere cohere2 cohere2_moe ctrl"
    " cwm deepseek_v2 deepseek_v3 diffllama doge dots1 emu3 ernie4_5 exaone exaone4 exaone_moe"
    " falcon flex_olmo flint fuyu gemma gemma2 gemma3 gemma3_text glm glm4 glm4_moe glm4_moe_lite"
    " got_ocr2 gpt-sw3 gpt2 gpt_bigcode gpt_neox gpt_neox_japanese gptj granite granite_swa"
    " granitemoe granitemoe_swa granitemoeshared helium hrm_text hunyuan_v1_dense hunyuan_v1_moe"
    " hy_v3 hy_v4 hyperclovax internlm3 iquestcoder jais2 jetmoe kolibri1 llama llama4"
    " llama4_text longcat_flash mellum mimo_v2_flash minicpm3 minimax_m2 minimax_m3_vl_text"
    " ministral ministral3 mistral mixtral modernbert-decoder moshi moss_transcribe_diarize"
    " nanochat nemotron olmo olmo2 olmo3 olmoe persimmon phi phi3 phi4_multimodal phimoe qwen2"
    " qwen2_moe qwen3 qwen3_moe sarvam_mla sarvam_moe seed_oss smollm3 solar_open stablelm"
    " starcoder2 vaultgemma whisper youtu"
).split():
    _FAMILIES[_name] = _POSITIONS


@dataclass(frozen=True)
class ModelPacking:
    """What a model family needs from a packed batch, for one collator format.

    ``fields``: the batch fields the model reads to keep samples apart in that format.
    ``exact``: whether that format trains every sample as if alone on this machine; if not,
    ``fix`` is the one-line reason and remedy (:meth:`require` raises it). ``verified``: the
    family is in tokpack's table, checked by its tests on this transformers; an unverified family
    is judged by its config's layer kinds (run ``tokpack.torch.check_packing`` on it).
    ``layer_masks``: layer type -> sliding window (None: full causal) when the model needs a
    block mask per layer type. ``mask_dtype``: the additive mask dtype (eager attention), None
    for boolean masks (sdpa).
    """

    family: str
    attn_implementation: str
    layer_kinds: Tuple[str, ...]
    format: str
    fields: Tuple[str, ...]
    exact: bool
    fix: str = ""
    verified: bool = True
    layer_masks: Optional[Mapping[str, Optional[int]]] = None
    mask_dtype: Any = None
    return_seq_idx: bool = False
    rule: str = field(default="positions", repr=False)
    #: The layer kind that would mix packed samples without the family's path (for messages).
    layer: str = field(default="attention", repr=False)

    def require(self) -> "ModelPacking":
        """This support, or a :class:`~tokpack.PackingError` with :attr:`fix` if not exact."""
        if not self.exact:
            raise PackingError(self.fix)
        return self

    def check_fix(self) -> str:
        """What a failed ``check_packing`` of this support tells the user to do."""
        if not self.verified:
            return (
                f"tokpack has not verified family {self.family!r}: train with"
                " PackedCollator.for_model(model, format='per_sample') (one sample per row,"
                " exact for every family)"
            )
        return (
            "use PackedCollator.for_model(model, format='per_sample') (one sample per row,"
            " exact for every family), and report the family to tokpack"
        )

    def collator_options(self) -> Dict[str, Any]:
        """The ``PackedCollator`` options of this support (format included)."""
        options: Dict[str, Any] = {"format": self.format}
        if self.return_seq_idx:
            options["return_seq_idx"] = True
        if self.layer_masks is not None:
            options["layer_masks"] = dict(self.layer_masks)
            options["mask_dtype"] = self.mask_dtype
        return options


def _config_of(model_or_config: Any) -> Any:
    config = getattr(model_or_config, "config", model_or_config)
    if not hasattr(config, "model_type"):
        raise ConfigError(
            f"packing_support needs a transformers model or config, got"
            f" {type(model_or_config).__name__}"
        )
    # Composite configs (vision-language models) keep their decoder's layers in text_config.
    text = getattr(config, "text_config", None)
    if text is not None and getattr(config, "layer_types", None) is None:
        return config, text
    return config, config


def _attn_implementation(config: Any) -> str:
    impl = getattr(config, "_attn_implementation", None)
    return impl if isinstance(impl, str) and impl else "sdpa"


def _layer_kinds(config: Any) -> Tuple[str, ...]:
    kinds = getattr(config, "layer_types", None)
    if not kinds:
        return ("full_attention",)
    return tuple(dict.fromkeys(map(str, kinds)))


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _unverified_rule(kinds: Tuple[str, ...]) -> _Rule:
    other = [k for k in kinds if k not in ATTENTION_KINDS]
    return _no_path(f"{other[0]} (not verified by tokpack)") if other else _POSITIONS


def packing_support(model_or_config: Any, format: Optional[str] = None) -> ModelPacking:
    """What ``model_or_config`` (a transformers model or its config) needs from a packed batch in
    ``format`` (one of :data:`MODEL_FORMATS`; None: the cheapest exact one for its attention
    implementation, ``hf`` for varlen kernels, ``padded`` for sdpa / eager).

    Never raises for a model that cannot be packed: the result is ``exact=False`` with the fix;
    call :meth:`ModelPacking.require` to refuse.
    """
    if format is not None:
        check_choice("format", format, MODEL_FORMATS)
    config, text = _config_of(model_or_config)
    family = str(config.model_type)
    impl = _attn_implementation(config)
    kinds = _layer_kinds(text)
    verified = family in _FAMILIES
    rule = _FAMILIES[family] if verified else _unverified_rule(kinds)
    varlen = any(marker in impl for marker in _VARLEN_MARKERS)
    chosen = format or ("hf" if varlen or rule.path == "kernels" else "padded")
    support: Dict[str, Any] = dict(
        family=family,
        attn_implementation=impl,
        layer_kinds=kinds,
        format=chosen,
        verified=verified,
        rule=rule.path,
        layer=rule.layer,
    )
    if chosen == "per_sample":
        return ModelPacking(fields=("input_ids",), exact=True, **support)
    positions = ("position_ids",) if chosen == "padded" else ("position_ids", "cu_seq_lens_q")
    # Varlen kernels take cu_seq_lens and the window themselves, not a dense mask.
    if rule.path == "positions" or (rule.path == "layer_masks" and varlen):
        return ModelPacking(fields=positions, exact=True, **support)
    if rule.path == "layer_masks":
        return ModelPacking(
            fields=("attention_mask",) + positions,
            exact=True,
            layer_masks=_layer_windows(text, kinds),
            mask_dtype=None if impl == "sdpa" else _model_dtype(model_or_config),
            **support,
        )
    name = f"{family} ({type(model_or_config).__name__})"
    per_sample = "PackedCollator.for_model(model, format='per_sample') (one sample per row, exact)"
    if rule.path == "kernels":
        missing = [p for p in rule.packages if not _installed(p)]
        if missing:
            pip = " ".join(_PIP_NAMES.get(p, p) for p in missing)
            fix = (
                f"{name}: its {rule.layer} layers would mix packed samples: transformers keeps"
                f" them apart only with {', '.join(missing)} installed (pip install {pip}, CUDA);"
                f" or use {per_sample}"
            )
            return ModelPacking(fields=rule.fields, exact=False, fix=fix, **support)
        if chosen != "hf":
            fix = (
                f"{name}: its {rule.layer} layers read boundaries only in the 'hf' layout"
                f" ({', '.join(rule.fields)}), not {chosen!r}: use format='hf' or 'per_sample'"
            )
            return ModelPacking(fields=rule.fields, exact=False, fix=fix, **support)
        fields = positions + tuple(f for f in rule.fields if f not in positions)
        return ModelPacking(
            fields=fields, exact=True, return_seq_idx="seq_idx" in fields, **support
        )
    fix = (
        f"{name}: its {rule.layer} layers would mix packed samples, and tokpack knows no exact"
        f" packed path for them in transformers: use {per_sample}"
    )
    return ModelPacking(fields=(), exact=False, fix=fix, **support)


# Import name -> pip name, for the fix line.
_PIP_NAMES = {
    "fla": "flash-linear-attention",
    "causal_conv1d": "causal-conv1d",
    "mamba_ssm": "mamba-ssm",
}


def _layer_windows(config: Any, kinds: Tuple[str, ...]) -> Dict[str, Optional[int]]:
    window = getattr(config, "sliding_window", None)
    return {k: (int(window) if k == "sliding_attention" and window else None) for k in kinds}


def _model_dtype(model_or_config: Any) -> Any:
    import torch

    dtype = getattr(model_or_config, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def model_inputs(batch: Mapping[str, Any]) -> Dict[str, Any]:
    """``batch`` without tokpack's bookkeeping keys (:data:`BOOKKEEPING_KEYS`: the loss
    normalisers, the resume ``position``, ``sample_ids``, ...), so ``model(**model_inputs(batch))``
    gets only what the model reads. Carried columns (``--carry``) are left in: pop them first.
    A tree batch (``tokpack.tree``) is refused: its attention is a mask this does not build."""
    if "tree_tout" in batch:
        raise PackingError(
            "tokpack.torch.model_inputs got a tree batch (tokpack.tree): without its tree mask"
            " a model would let every branch see the others; use tokpack.tree.model_inputs("
            "batch, model)"
        )
    return {k: v for k, v in batch.items() if k not in BOOKKEEPING_KEYS}
