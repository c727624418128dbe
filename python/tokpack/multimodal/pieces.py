"""A multimodal sample and its pieces: the image blocks no cut falls inside, the pieces an
over-long sample keeps (the core's one rule, ``tokpack_core::cuts``) and each piece's own
images, for tokenize-time cuts and the packer's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .. import _tokpack

__all__ = ["MultimodalSample", "image_blocks", "safe_pieces", "piece_media", "piece"]


@dataclass
class MultimodalSample:
    """One sample: ids and labels with expanded image pads, and its images (``media``)."""

    input_ids: np.ndarray
    labels: np.ndarray
    media: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def vision_tokens(self) -> int:
        # ``tokens``: a Qwen3-VL video's pads (its span also holds its timestamps' text)
        return sum(int(m.get("tokens", m["span"][1])) for m in self.media)

    @property
    def vision_patches(self) -> int:
        return sum(int(np.prod(m["grid"])) for m in self.media)


def image_blocks(media: Sequence[Dict[str, Any]]) -> List[Tuple[int, int]]:
    """The tokens ``[a, b)`` each image takes with its ``vision_start`` and ``vision_end``
    markers: a sample is never cut inside one."""
    return [(m["span"][0] - 1, m["span"][0] + m["span"][1] + 1) for m in media]


def safe_pieces(
    n: int, max_len: int, overlong: str, blocks: Sequence[Tuple[int, int]]
) -> List[Tuple[int, int]]:
    """``(start, end)`` of the pieces a sample of ``n > max_len`` tokens keeps under
    ``overlong`` ``truncate`` (one piece from 0) or ``split`` (pieces tiling it), each cut at
    the last safe boundary: never inside a block. ``[]`` when there is no safe cut (an image
    alone longer than ``max_len``, or one starting a piece it cannot fit): the sample is
    dropped. The one rule of tokenize-time and pack-time cuts, the core's
    (``tokpack_core::cuts::safe_pieces``; the ``random`` strategy cuts by it too)."""
    return _tokpack.safe_pieces(
        length=n, max_len=max_len, overlong=overlong, blocks=[(a, b) for a, b in blocks]
    )


def piece_media(media: Sequence[Dict[str, Any]], start: int, end: int) -> List[Dict[str, Any]]:
    """The images of tokens ``start:end`` of a sample (whole, with their markers), their spans
    rebased to the piece."""
    out = []
    for m in media:
        s = m["span"][0]
        if start < s and s + m["span"][1] < end:
            out.append({**m, "span": [s - start, m["span"][1]]})
    return out


def piece(sample: MultimodalSample, start: int, end: int) -> MultimodalSample:
    media = piece_media(sample.media, start, end)
    return MultimodalSample(sample.input_ids[start:end], sample.labels[start:end], media)
