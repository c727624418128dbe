"""Tiny models of every causal-LM family of the installed transformers, and what packing does to
them: each sample packed (three samples in two rows, longer than the tiny sliding window) against
the same sample alone, per collator format, on the logits of every real token.

The comparison is the tests' own (logits of the whole model), independent of
``tokpack.torch.check_packing``, which it checks.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch

from tokpack.errors import PackingError
from tokpack.torch import PackedCollator, model_inputs, packing_support
from tokpack.torch.models import MODEL_FORMATS
from tokpack.torch.tiny import tiny_model

# Three samples longer than the tiny sliding window, packed as rows [19, 11] and [26].
SAMPLE_LENS = (19, 11, 26)
ROWS = ((0, 1), (2,))
# float64 throughout but for the float32 parts some families keep (routers, softcaps): exact paths
# differ by at most ~1e-7 (the same for a sample alone in a padded row), mixing by 1e-3 to 5.
EXACT = 1e-6


def transformers_causal_lms() -> List[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def build(family: str, attn_implementation: Optional[str] = None) -> Any:
    from transformers import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model(CONFIG_MAPPING[family](), attn_implementation=attn_implementation)


def samples(model: Any, seed: int = 0) -> List[torch.Tensor]:
    """Random ids of :data:`SAMPLE_LENS`, avoiding the special ids (0-3 in a tiny config)."""
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (n,), generator=g) for n in SAMPLE_LENS]


def rows(pieces: List[torch.Tensor]) -> List[Dict[str, torch.Tensor]]:
    out = []
    for members in ROWS:
        ids = torch.cat([pieces[i] for i in members])
        lens = torch.tensor([len(pieces[i]) for i in members])
        out.append({"input_ids": ids, "labels": ids.clone(), "seq_lengths": lens})
    return out


def _real_tokens(logits: torch.Tensor, fmt: str) -> torch.Tensor:
    """The logits of the batch's real tokens, in sample order."""
    if fmt in ("hf", "flash"):
        return logits.reshape(-1, logits.shape[-1])
    if fmt == "per_sample":
        return torch.cat([logits[s, :n] for s, n in enumerate(SAMPLE_LENS)])
    lens = [sum(SAMPLE_LENS[i] for i in members) for members in ROWS]
    return torch.cat([logits[r, :n] for r, n in enumerate(lens)])


def packed_error(model: Any, collator: PackedCollator) -> float:
    """max |logits packed - logits alone| over every real token of the three samples."""
    pieces = samples(model)
    batch = collator.collate(rows(pieces))
    with torch.no_grad():
        packed = _real_tokens(model(**model_inputs(batch)).logits, collator.format)
        alone = torch.cat([model(input_ids=p.view(1, -1)).logits[0] for p in pieces])
    return float((packed - alone).abs().max())


def verdicts(model: Any) -> Dict[str, Tuple[str, str]]:
    """format -> (verdict, detail) on this machine: ``exact`` (packed == alone, max error in the
    detail), ``refused`` (``for_model`` raised PackingError: its message), or ``MIXES`` (a
    format tokpack accepts mixes samples: the bug these tests exist for)."""
    out = {}
    for fmt in MODEL_FORMATS:
        support = packing_support(model, fmt)
        if not support.exact:
            try:
                PackedCollator.for_model(model, fmt, check=False)
            except PackingError as exc:
                out[fmt] = ("refused", str(exc))
            else:
                out[fmt] = ("MIXES", "packing_support refuses it but for_model did not")
            continue
        err = packed_error(model, PackedCollator.for_model(model, fmt, check=False))
        out[fmt] = ("exact" if err <= EXACT else "MIXES", f"{err:.1e}")
    return out
