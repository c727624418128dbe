"""Labels from character spans: a token is trained when its offsets cover a character of a
trained span (the rule transformers' ``return_assistant_tokens_mask`` applies). Only the span
boundaries go through Python; labels are filled with numpy slices."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .._contract import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "labels_from_spans"]


def _token_at(encoding: Any, positions: range) -> Optional[int]:
    """The token of the first of ``positions`` a token covers (characters covered by none,
    trimmed offsets or stripped text, are skipped)."""
    return next((t for t in map(encoding.char_to_token, positions) if t is not None), None)


def labels_from_spans(
    encoding: Any, ids: np.ndarray, spans: Sequence[Tuple[int, int]]
) -> np.ndarray:
    """``ids`` on the tokens of the character ``spans`` of the encoded text, -100 elsewhere."""
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int32)
    for start, end in spans:
        first = _token_at(encoding, range(start, end))
        if first is None:
            continue
        last = _token_at(encoding, range(end - 1, start - 1, -1))
        labels[first : last + 1] = ids[first : last + 1]  # type: ignore[operator]
    return labels
