"""Pack multimodal token shards: :func:`tokpack.pack_files` carrying the media columns.

Vision tokens are tokens: a sample's ``length`` counts them, so they count against
``max_len``, with every strategy but ``random`` (which cuts samples anywhere across rows: it
is refused). ``media``, ``vision_tokens`` and ``vision_patches`` are carried per segment (the
packed format's carried columns).

No sample is cut inside an image (its pad tokens with their ``vision_start`` and
``vision_end`` markers). Over-long samples with images are cut where tokenize-time ``max_len``
cuts them (:func:`tokpack.multimodal.tokenize.safe_pieces`, one rule): ``truncate`` at the
last safe boundary at or before ``max_len``, ``split`` into pieces each ending at such a
boundary. These pieces are the core's chosen cuts (``tokpack_core::cuts``); each piece
carries exactly its own images, spans rebased to the piece, and its own ``vision_tokens`` and
``vision_patches``. A sample with no safe cut (an image alone longer than ``max_len``, or one
at the very start that does not fit) is dropped and counted: the dropped list gives it the
reason ``"no_safe_cut"``. ``drop`` and ``error`` are unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import ConfigError, SchemaError
from .tokenize import (
    MEDIA_COLUMNS,
    MULTIMODAL_KEY,
    MultimodalSample,
    image_blocks,
    piece_media,
    safe_pieces,
)

__all__ = ["MediaCuts", "media_config", "media_cuts", "NO_SAFE_CUT"]

# The dropped list's reason for a sample with no safe cut.
NO_SAFE_CUT = "no_safe_cut"


@dataclass
class MediaCuts:
    """The chosen cuts of a pack job's over-long samples with images: the core's ``cuts``
    (samples, offsets, starts, lengths) and ``piece_values`` (each media column's value for
    each piece), and the samples with no safe cut (dropped)."""

    samples: List[int] = field(default_factory=list)
    offsets: List[int] = field(default_factory=lambda: [0])
    starts: List[int] = field(default_factory=list)
    lengths: List[int] = field(default_factory=list)
    values: Dict[str, List[Any]] = field(default_factory=dict)
    types: Dict[str, pa.DataType] = field(default_factory=dict)
    no_safe_cut: List[int] = field(default_factory=list)

    def core_args(self) -> Dict[str, Any]:
        """The keyword arguments of ``_tokpack.pack_files`` (none without chosen cuts)."""
        if not self.samples:
            return {}
        return {
            "cuts": (self.samples, self.offsets, self.starts, self.lengths),
            "piece_values": {c: pa.array(v, type=self.types[c]) for c, v in self.values.items()},
        }


def media_cuts(files: Sequence[os.PathLike], config: Any) -> Optional[MediaCuts]:
    """The chosen cuts packing multimodal token shards ``files`` with ``config`` needs (None
    for text shards, or when the overlong policy cuts nothing): every sample longer than
    ``max_len`` with images, under ``truncate`` or ``split``."""
    if config.overlong not in ("truncate", "split") or not all(_is_multimodal(f) for f in files):
        return None
    out = MediaCuts(values={c: [] for c in MEDIA_COLUMNS})
    base = 0
    for path in files:
        try:
            table = pq.read_table(path, columns=["length", *MEDIA_COLUMNS])
        except Exception as exc:
            raise SchemaError(
                f"{path}: not a multimodal token shard with 'length' and {list(MEDIA_COLUMNS)}"
                f" ({exc})"
            ) from None
        for c in MEDIA_COLUMNS:
            out.types.setdefault(c, table.schema.field(c).type)
        lengths = table.column("length")
        long_rows = pc.indices_nonzero(pc.greater(lengths, config.max_len)).to_pylist()
        media = table.column("media")
        for row in long_rows:
            items = json.loads(media[row].as_py())
            if not items:
                continue  # no image: the core's own cut
            n = int(lengths[row].as_py())
            pieces = safe_pieces(n, config.max_len, config.overlong, image_blocks(items))
            out.samples.append(base + row)
            if not pieces:
                out.no_safe_cut.append(base + row)
            for start, end in pieces:
                _add_piece(out, items, start, end)
            out.offsets.append(len(out.starts))
        base += table.num_rows
    return out


def _add_piece(out: MediaCuts, items: List[Dict[str, Any]], start: int, end: int) -> None:
    kept = piece_media(items, start, end)
    piece = MultimodalSample(np.zeros(0, np.int32), np.zeros(0, np.int32), kept)
    out.starts.append(start)
    out.lengths.append(end - start)
    out.values["media"].append(json.dumps(kept, separators=(",", ":")))
    out.values["vision_tokens"].append(piece.vision_tokens)
    out.values["vision_patches"].append(piece.vision_patches)


def media_config(files: Sequence[os.PathLike], config: Any) -> Any:
    """``config`` for packing ``files``: unchanged for text token shards; for multimodal ones
    (:func:`tokenize_files`' schema metadata), the media columns carried per segment. Without
    them a packed row would hold image tokens and no images."""
    multimodal = [_is_multimodal(f) for f in files]
    if not any(multimodal):
        return config
    if not all(multimodal):
        plain = files[multimodal.index(False)]
        raise SchemaError(f"{plain}: a text token shard among multimodal ones (no media columns)")
    if config.strategy == "random":
        raise ConfigError(
            f"{files[0]}: strategy 'random' cuts samples anywhere across rows, inside images;"
            " multimodal token shards are packed with 'bfd', 'ffd', 'next_fit' or 'padding'"
        )
    carry = [*MEDIA_COLUMNS, *(c for c in config.carry if c not in MEDIA_COLUMNS)]
    return config.replace(carry=carry)


def _is_multimodal(path: os.PathLike) -> bool:
    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet, or unreadable: the packer names the problem
        return False
    return MULTIMODAL_KEY in metadata


def dropped_reasons(cuts: Optional[MediaCuts]) -> Dict[str, Tuple[int, ...]]:
    """The dropped list's reasons besides the core's (``write_dropped``'s ``reasons``)."""
    if cuts is None or not cuts.no_safe_cut:
        return {}
    return {NO_SAFE_CUT: tuple(cuts.no_safe_cut)}
