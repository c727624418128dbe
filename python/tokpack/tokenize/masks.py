"""Labels from character spans: a token is trained when its offsets cover a character of a
trained span (the rule transformers' ``return_assistant_tokens_mask`` applies). Only the span
boundaries go through Python; labels are filled with numpy slices."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .._contract import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "labels_from_spans"]


def _first_token(encoding: Any, start: int, end: int) -> Optional[int]:
    # Characters covered by no token (trimmed offsets, stripped text) are skipped.
    for pos in range(start, end):
        token = encoding.char_to_token(pos)
        if token is not None:
            return token
    return None


def _last_token(encoding: Any, start: int, end: int) -> Optional[int]:
    for pos in range(end - 1, start - 1, -1):
        token = encoding.char_to_token(pos)
        if token is not None:
            return token
    return None


def labels_from_spans(
    encoding: Any, ids: np.ndarray, spans: Sequence[Tuple[int, int]]
) -> np.ndarray:
    """``ids`` on the tokens of the character ``spans`` of the encoded text, -100 elsewhere."""
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int32)
    for start, end in spans:
        first = _first_token(encoding, start, end)
        if first is None:
            continue
        last = _last_token(encoding, start, end)
        labels[first : last + 1] = ids[first : last + 1]
    return labels
