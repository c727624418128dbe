"""Vision-token figures of multimodal token shards, for ``tokpack stats`` (the length
distribution it prints already counts vision tokens: they are tokens of ``input_ids``)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._io.inputs import TOKEN_SUFFIXES, is_parquet, resolve_inputs
from .._io.tables import table

__all__ = ["vision_stats", "render_vision_stats"]


def vision_stats(inputs: Union[str, Sequence[str]]) -> Optional[Dict[str, Any]]:
    """Samples with images (or videos), images, videos, vision tokens (and their share of all
    tokens), vision encoder patches and the most vision tokens of a sample, over the Parquet
    inputs holding a ``vision_tokens`` column; None when none does."""
    files = [p for p in resolve_inputs(inputs, TOKEN_SUFFIXES) if is_parquet(p)]
    out = {"samples": 0, "samples_with_images": 0, "images": 0, "videos": 0, "tokens": 0}
    out.update({"vision_tokens": 0, "vision_patches": 0, "max_vision_tokens": 0})
    found = False
    for path in files:
        names = pq.read_schema(path).names
        if not {"vision_tokens", "vision_patches", "media", "length"} <= set(names):
            continue
        found = True
        t = pq.read_table(path, columns=["length", "media", "vision_tokens", "vision_patches"])
        vision = t.column("vision_tokens")
        out["samples"] += t.num_rows
        out["samples_with_images"] += pc.sum(pc.greater(vision, 0)).as_py() or 0
        media = t.column("media")
        videos = pc.sum(pc.count_substring(media, '"type":"video"')).as_py() or 0
        out["videos"] += videos
        out["images"] += (pc.sum(pc.count_substring(media, '"span"')).as_py() or 0) - videos
        out["tokens"] += pc.sum(t.column("length")).as_py() or 0
        out["vision_tokens"] += pc.sum(vision).as_py() or 0
        out["vision_patches"] += pc.sum(t.column("vision_patches")).as_py() or 0
        out["max_vision_tokens"] = max(out["max_vision_tokens"], pc.max(vision).as_py() or 0)
    if not found:
        return None
    out["vision_token_share"] = out["vision_tokens"] / out["tokens"] if out["tokens"] else 0.0
    return out


def render_vision_stats(stats: Dict[str, Any]) -> str:
    return table(
        [
            "samples with images",
            "images",
            "videos",
            "vision tokens",
            "share of tokens",
            "max per sample",
            "encoder patches",
        ],
        [
            [
                f"{stats['samples_with_images']:,} of {stats['samples']:,}",
                f"{stats['images']:,}",
                f"{stats['videos']:,}",
                f"{stats['vision_tokens']:,}",
                f"{stats['vision_token_share']:.1%}",
                f"{stats['max_vision_tokens']:,}",
                f"{stats['vision_patches']:,}",
            ]
        ],
    )
