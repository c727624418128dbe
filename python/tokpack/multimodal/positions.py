"""mRoPE position ids (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), tokpack's own implementation of the
rule of transformers' ``get_rope_index`` (5.x).

Within one sample: text tokens take consecutive positions on all three axes; the tokens of an
image or video of grid ``(t, h, w)`` (``t`` temporal patches of ``h / merge`` rows of
``w / merge`` tokens, row-major) take ``(p + T(t_i), p + h_i, p + w_i)`` from the position
``p`` it starts at, and the text after it resumes at ``p + max(h, w) / merge``. ``T`` is the
identity for images and Qwen2-VL videos; for a Qwen2.5-VL video (an entry with
``second_per_grid_t`` and ``tokens_per_second``) ``T(i) = floor(i * tokens_per_second *
second_per_grid_t)``, computed in float32 as transformers does. A packed row restarts the rule
at 0 for every segment and concatenates.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np

from ..errors import DataError

__all__ = ["sample_positions", "packed_positions"]


def sample_positions(length: int, media: Sequence[Dict[str, Any]], merge_size: int) -> np.ndarray:
    """``[3, length]`` int64 mRoPE positions of one sample whose images and videos are
    ``media`` (objects with ``grid`` ``[t, h, w]`` and ``span`` ``[start, n]``, in token
    order; a Qwen3-VL video's ``groups`` ``[offset, n]`` place each temporal patch's pads
    within its span, the tokens between them being text)."""
    out = np.empty((3, length), dtype=np.int64)
    at = 0  # next token
    pos = 0  # next position
    for start, n, (t, h, w), m in _blocks(media, length):
        h, w = h // merge_size, w // merge_size
        if t * h * w != n or start < at or start + n > length:
            raise DataError(f"image span {m['span']} does not match its grid {m['grid']}")
        out[:, at:start] = pos + np.arange(start - at)
        pos += start - at
        tt, hh, ww = np.indices((t, h, w)).reshape(3, -1)
        if "second_per_grid_t" in m:
            step = np.float32(m["tokens_per_second"]) * np.float32(m["second_per_grid_t"])
            tt = (tt.astype(np.float32) * step).astype(np.int64)
        out[:, start : start + n] = pos + np.stack([tt, hh, ww])
        pos += max(h, w)
        at = start + n
    out[:, at:] = pos + np.arange(length - at)
    return out


def _blocks(media: Sequence[Dict[str, Any]], length: int):
    """``(start, n, grid, medium)`` of each run of pads, in token order."""
    blocks = []
    for m in media:
        start, n = int(m["span"][0]), int(m["span"][1])
        t, h, w = (int(g) for g in m["grid"])
        groups = m.get("groups")
        if groups is None:
            blocks.append((start, n, (t, h, w), m))
            continue
        if len(groups) != t or any(off + k > n for off, k in groups):
            raise DataError(f"video span {m['span']} does not match its groups {groups}")
        blocks.extend((start + int(off), int(k), (1, h, w), m) for off, k in groups)
    return sorted(blocks, key=lambda b: b[0])


def packed_positions(
    seq_lengths: Sequence[int], media: Sequence[Sequence[Dict[str, Any]]], merge_size: int
) -> np.ndarray:
    """``[4, T]`` int64 for a packed row of segments ``seq_lengths``: row 0 the text positions
    (0, 1, ... restarting per segment: what transformers reads segment boundaries from), rows
    1-3 the mRoPE ``t, h, w`` positions of each segment, each restarting at 0."""
    parts = [
        np.vstack([np.arange(int(n), dtype=np.int64), sample_positions(int(n), m, merge_size)])
        for n, m in zip(seq_lengths, media)
    ]
    return np.concatenate(parts, axis=1) if parts else np.zeros((4, 0), dtype=np.int64)
