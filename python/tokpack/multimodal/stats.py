"""Vision-token figures of multimodal token shards, for ``tokpack stats`` (the length
distribution it prints already counts vision tokens: they are tokens of ``input_ids``), and the
vision-encoder cost of packed rows (the patches of each row's images: a second cost, besides
tokens, to balance rows on), for the manifest, ``tokpack inspect`` and the readers."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._io.inputs import TOKEN_SUFFIXES, is_parquet, resolve_inputs
from .._io.tables import table
from ..kinds import KINDS
from ..packed.reader import PackedDir, segment_sums

__all__ = [
    "vision_stats",
    "render_vision_stats",
    "row_vision_patches",
    "row_patch_figures",
    "packed_vision_figures",
]

# The per-segment column of vision-encoder patches (``t * h * w`` of each image, summed).
MEDIA = KINDS["multimodal"].carried  # media, vision_tokens, vision_patches
PATCHES = MEDIA[2]


def vision_stats(inputs: Union[str, Sequence[str]]) -> Optional[Dict[str, Any]]:
    """Samples with images (or videos), images, videos, vision tokens (and their share of all
    tokens), vision encoder patches and the most vision tokens of a sample, over the Parquet
    inputs holding a ``vision_tokens`` column; None when none does."""
    files = [p for p in resolve_inputs(inputs, TOKEN_SUFFIXES) if is_parquet(p)]
    out = {"samples": 0, "samples_with_images": 0, "images": 0, "videos": 0, "tokens": 0}
    out.update({"vision_tokens": 0, "vision_patches": 0, "max_vision_tokens": 0})
    found = False
    for path in files:
        if not {"length", *MEDIA} <= set(pq.read_schema(path).names):
            continue
        found = True
        t = pq.read_table(path, columns=["length", *MEDIA])
        vision = t.column("vision_tokens")
        out["samples"] += t.num_rows
        out["samples_with_images"] += pc.sum(pc.greater(vision, 0)).as_py() or 0
        media = t.column("media")
        videos = pc.sum(pc.count_substring(media, '"type":"video"')).as_py() or 0
        out["videos"] += videos
        out["images"] += (pc.sum(pc.count_substring(media, '"span"')).as_py() or 0) - videos
        for key, column in (("tokens", "length"), *((c, c) for c in MEDIA[1:])):
            out[key] += pc.sum(t.column(column)).as_py() or 0
        out["max_vision_tokens"] = max(out["max_vision_tokens"], pc.max(vision).as_py() or 0)
    if not found:
        return None
    out["vision_token_share"] = out["vision_tokens"] / out["tokens"] if out["tokens"] else 0.0  # type: ignore[assignment]
    return out


def render_vision_stats(stats: Dict[str, Any]) -> str:
    return _one_row(
        ("samples with images", f"{stats['samples_with_images']:,} of {stats['samples']:,}"),
        ("images", f"{stats['images']:,}"),
        ("videos", f"{stats['videos']:,}"),
        ("vision tokens", f"{stats['vision_tokens']:,}"),
        ("share of tokens", f"{stats['vision_token_share']:.1%}"),
        ("max per sample", f"{stats['max_vision_tokens']:,}"),
        ("encoder patches", f"{stats['vision_patches']:,}"),
    )


def _one_row(*cells: Tuple[str, str]) -> str:
    """A table of one row from its ``(header, value)`` cells."""
    return table([h for h, _ in cells], [[v for _, v in cells]])


def row_vision_patches(packed: Union[str, os.PathLike, PackedDir]) -> np.ndarray:
    """The vision-encoder patches of every row of a multimodal packed directory (int64, global
    row numbering, the readers' row order): the second cost of a row, besides its tokens.
    Reads the ``vision_patches`` column alone."""
    if not isinstance(packed, PackedDir):
        from ..remote import open_packed

        packed = open_packed(packed)
    return packed.row_sums(PATCHES)


def row_patch_figures(per_row: np.ndarray) -> Dict[str, Any]:
    """min / mean / p99 / max of the patches per row, and the imbalance (max over mean: 1.0 is
    even; the heaviest row's vision encoder works that many times the average)."""
    if not len(per_row):
        return {"rows": 0, "min": 0, "mean": 0.0, "p99": 0.0, "max": 0, "imbalance": 1.0}
    mean = float(per_row.mean())
    return {
        "rows": int(len(per_row)),
        "min": int(per_row.min()),
        "mean": mean,
        "p99": float(np.percentile(per_row, 99)),
        "max": int(per_row.max()),
        "imbalance": float(per_row.max()) / mean if mean else 1.0,
    }


def render_row_patches(figures: Dict[str, Any]) -> str:
    return _one_row(
        ("rows", f"{figures['rows']:,}"),
        ("min", f"{figures['min']:,}"),
        ("mean", f"{figures['mean']:,.1f}"),
        ("p99", f"{figures['p99']:,.1f}"),
        ("max", f"{figures['max']:,}"),
        ("max / mean", f"{figures['imbalance']:.2f}x"),
    )


def packed_vision_figures(shards: Sequence[Union[str, os.PathLike]]) -> Dict[str, int]:
    """The manifest figures of a multimodal pack's shards (in row order): ``vision_patches``
    (all rows) and ``vision_patches_max_row`` (the heaviest row's)."""
    total = top = 0
    for path in shards:
        column = pq.read_table(path, columns=[PATCHES]).column(PATCHES).combine_chunks()
        per_row = segment_sums(column.values.to_numpy(), column.offsets.to_numpy())
        total += int(per_row.sum())
        top = max(top, int(per_row.max(initial=0)))
    return {"vision_patches": total, "vision_patches_max_row": top}
