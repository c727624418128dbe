"""Pack multimodal token shards: :func:`tokpack.pack_files` carrying the media columns.

Vision tokens are tokens: a sample's ``length`` counts them, so they count against
``max_len``, with every strategy. ``media``, ``vision_tokens`` and ``vision_patches`` are
carried per segment (the packed format's carried columns).

No sample is cut inside an image (its pad tokens with their ``vision_start`` and
``vision_end`` markers: its block). Over-long samples with images are cut where tokenize-time
``max_len`` cuts them (:func:`tokpack.multimodal.tokenize.safe_pieces`, the core's one rule):
``truncate`` at the last safe boundary at or before ``max_len``, ``split`` into pieces each
ending at such a boundary. These pieces are the core's chosen cuts (``tokpack_core::cuts``);
each piece carries exactly its own images, spans rebased to the piece, and its own
``vision_tokens`` and ``vision_patches``. A sample with no safe cut (an image alone longer
than ``max_len``, or one at the very start that does not fit) is dropped and counted: the
dropped list gives it the reason ``"no_safe_cut"``. ``drop`` and ``error`` are unchanged.

The ``random`` strategy (shuffle, concatenate, cut at row ends) cuts a sample with images only
at a safe boundary: the last at or before the row's end, which then ends shorter (padded),
the rest of the sample starting the next row. The core honours the samples' blocks; the
pieces it will cut are planned here first (the same plan, from the same lengths) so that each
carries its own images, and the packer checks that its plan is that one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import _tokpack
from ..errors import ConfigError, SchemaError
from .tokenize import (
    MEDIA_COLUMNS,
    MULTIMODAL_KEY,
    MultimodalSample,
    image_blocks,
    piece_media,
    safe_pieces,
)

__all__ = [
    "MediaCuts",
    "media_config",
    "media_cuts",
    "refuse_multimodal",
    "is_multimodal_shard",
    "NO_SAFE_CUT",
]

NO_SAFE_CUT = "no_safe_cut"


@dataclass
class MediaCuts:
    """What the core needs to pack multimodal shards without cutting inside an image: the
    chosen cuts of over-long samples (``samples``, ``offsets``, ``starts``, ``lengths``), the
    blocks of every sample with images (``random`` only), and ``values`` (each media column's
    value for each piece of ``pieces``: the chosen cuts', or the pieces ``random`` cuts), and
    the samples with no safe cut (dropped)."""

    samples: List[int] = field(default_factory=list)
    offsets: List[int] = field(default_factory=lambda: [0])
    starts: List[int] = field(default_factory=list)
    lengths: List[int] = field(default_factory=list)
    blocks: Optional[Tuple[List[int], List[int], List[int], List[int]]] = None
    pieces: Optional[Tuple[List[int], List[int], List[int], List[int]]] = None
    values: Dict[str, List[Any]] = field(default_factory=dict)
    types: Dict[str, pa.DataType] = field(default_factory=dict)
    no_safe_cut: List[int] = field(default_factory=list)

    def plan_args(self) -> Dict[str, Any]:
        """The keyword arguments of ``_tokpack.plan`` (the cuts and blocks)."""
        cuts = (self.samples, self.offsets, self.starts, self.lengths) if self.samples else None
        return {"cuts": cuts, "blocks": self.blocks}

    def core_args(self) -> Dict[str, Any]:
        """The keyword arguments of ``_tokpack.pack_files`` (none without cuts or blocks)."""
        if not self.samples and self.blocks is None:
            return {}
        args: Dict[str, Any] = {
            **self.plan_args(),
            "piece_values": {c: pa.array(v, type=self.types[c]) for c, v in self.values.items()},
        }
        if self.pieces is not None:
            args["pieces"] = self.pieces
        return args


def media_cuts(
    files: Sequence[os.PathLike], config: Any, threads: Optional[int] = None
) -> Optional[MediaCuts]:
    """The cuts and blocks packing multimodal token shards ``files`` with ``config`` needs
    (None for text shards, or when nothing may be cut inside an image): every sample longer
    than ``max_len`` with images under ``truncate`` or ``split``, and with the ``random``
    strategy every sample with images (its blocks) and the pieces of the plan."""
    random = config.strategy == "random"
    cutting = config.overlong in ("truncate", "split")
    if not (random or cutting) or not all(is_multimodal_shard(f) for f in files):
        return None
    out = MediaCuts(values={c: [] for c in MEDIA_COLUMNS})
    media: Dict[int, List[Dict[str, Any]]] = {}  # of the samples with images that matter
    all_lengths = []
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
        all_lengths.append(lengths.to_numpy().astype(np.int64))
        wanted = pc.greater(table.column("vision_tokens"), 0)
        if not random:
            wanted = pc.and_(wanted, pc.greater(lengths, config.max_len))
        column = table.column("media")
        for row in pc.indices_nonzero(wanted).to_pylist():
            items = json.loads(column[row].as_py())
            if items:
                media[base + row] = items
        base += table.num_rows
    lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int64)
    for sample, items in media.items():
        n = int(lengths[sample])
        if not cutting or n <= config.max_len:
            continue
        pieces = safe_pieces(n, config.max_len, config.overlong, image_blocks(items))
        out.samples.append(sample)
        if not pieces:
            out.no_safe_cut.append(sample)
        for start, end in pieces:
            out.starts.append(start)
            out.lengths.append(end - start)
            if not random:
                _add_values(out, items, start, end)
        out.offsets.append(len(out.starts))
    if random:
        out.blocks = _blocks_of(media)
        if config.overlong != "error" or not (lengths > config.max_len).any():
            # (else the packer refuses the over-long sample, naming its file and row)
            _random_pieces(out, lengths, media, config, threads)
    return out


def _blocks_of(
    media: Dict[int, List[Dict[str, Any]]],
) -> Tuple[List[int], List[int], List[int], List[int]]:
    """``(samples, offsets, starts, ends)`` of the image blocks of the samples in ``media``."""
    samples, offsets, starts, ends = [], [0], [], []
    for sample in sorted(media):
        samples.append(sample)
        for a, b in sorted(image_blocks(media[sample])):
            starts.append(a)
            ends.append(b)
        offsets.append(len(starts))
    return samples, offsets, starts, ends


def _random_pieces(
    out: MediaCuts,
    lengths: np.ndarray,
    media: Dict[int, List[Dict[str, Any]]],
    config: Any,
    threads: Optional[int],
) -> None:
    """The pieces the ``random`` plan cuts (every segment of every sample it truncates or
    splits) and their media values: the plan the packer makes from these lengths, cuts and
    blocks (it checks that its own plan cuts the same)."""
    plan = _tokpack.plan(lengths=lengths, config=config, threads=threads, **out.plan_args())
    keep = np.isin(plan.sample_ids, np.union1d(plan.split, plan.truncated))
    sample_ids, starts, seg_lengths = (
        np.asarray(a)[keep] for a in (plan.sample_ids, plan.starts, plan.lengths)
    )
    order = np.lexsort((starts, sample_ids))
    sample_ids, starts, seg_lengths = sample_ids[order], starts[order], seg_lengths[order]
    samples, first = np.unique(sample_ids, return_index=True)
    for sample, start, n in zip(sample_ids.tolist(), starts.tolist(), seg_lengths.tolist()):
        _add_values(out, media.get(sample, []), start, start + n)
    offsets = [*first.tolist(), len(sample_ids)]
    out.pieces = (samples.tolist(), offsets, starts.tolist(), seg_lengths.tolist())


def _add_values(out: MediaCuts, items: List[Dict[str, Any]], start: int, end: int) -> None:
    kept = piece_media(items, start, end)
    piece = MultimodalSample(np.zeros(0, np.int32), np.zeros(0, np.int32), kept)
    out.values["media"].append(json.dumps(kept, separators=(",", ":")))
    out.values["vision_tokens"].append(piece.vision_tokens)
    out.values["vision_patches"].append(piece.vision_patches)


def media_config(files: Sequence[os.PathLike], config: Any) -> Any:
    """``config`` for packing ``files``: unchanged for text token shards; for multimodal ones
    (:func:`tokenize_files`' schema metadata), the media columns carried per segment. Without
    them a packed row would hold image tokens and no images."""
    multimodal = [is_multimodal_shard(f) for f in files]
    if not any(multimodal):
        return config
    if not all(multimodal):
        plain = files[multimodal.index(False)]
        raise SchemaError(f"{plain}: a text token shard among multimodal ones (no media columns)")
    carry = [*MEDIA_COLUMNS, *(c for c in config.carry if c not in MEDIA_COLUMNS)]
    return config.replace(carry=carry)


def is_multimodal_shard(path: os.PathLike) -> bool:
    """``path`` is a multimodal token shard (:func:`tokenize_files`' schema metadata)."""
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


def refuse_multimodal(
    entry: str,
    instead: str,
    *,
    files: Sequence[os.PathLike] = (),
    columns: Iterable[str] = (),
    where: str = "",
) -> None:
    """The one check of the entry points that cannot carry images: ConfigError naming
    ``entry`` and what to use ``instead`` when ``files`` hold a multimodal token shard or
    ``columns`` (a table's, or a packed directory's carried ones) the ``media`` column. Packed
    there, rows would hold image tokens without their images, or samples cut inside one."""
    found = next((str(f) for f in files if is_multimodal_shard(f)), None)
    if found is None and MEDIA_COLUMNS[0] in set(columns):
        found = where or "the input"
    if found is not None:
        raise ConfigError(
            f"{found}: multimodal data (a '{MEDIA_COLUMNS[0]}' column of images per sample);"
            f" {entry} would lose its images or cut inside one: use {instead}"
        )
