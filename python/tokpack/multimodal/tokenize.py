"""Tokenize conversational records with images into token shards (Qwen2-VL / Qwen2.5-VL).

A record is a chat (``messages``: role/content dicts, a content being a string or a list of
``{"type": "text", "text": ...}`` / ``{"type": "image"}`` parts) plus an ``images`` column
holding the images of the image parts, in order. The chat template renders each image part as
``<|vision_start|><|image_pad|><|vision_end|>``; the one ``<|image_pad|>`` token is expanded
into as many as the model will see for that image (:class:`VisionRules`, from the image header:
pixels are not decoded), as the model's processor expands it in the text. Vision tokens
(``vision_start``, the pads, ``vision_end``) are never trained on.

Token shards get, besides ``input_ids``, ``labels`` and ``length``:

- ``media`` (string): JSON list, one object per image in order: ``ref`` (see
  :mod:`tokpack.multimodal.media`), ``hash``, ``size`` ``[width, height]``, ``grid``
  ``[t, h, w]`` (the processor's ``image_grid_thw``) and ``span`` ``[start, n]``: the image's
  ``n`` pad tokens start at token ``start`` of the sample;
- ``vision_tokens`` (int32): the sample's pad tokens; ``vision_patches`` (int32): the patches
  the vision encoder runs on (``t * h * w`` summed), a second cost to balance rows on.

Over-long samples (``max_len``) are never cut inside an image: ``truncate`` cuts before the
``vision_start`` of an image that would not fit whole, ``split`` ends each piece at such a
boundary (each piece keeps its own images), and a sample with no safe cut (an image alone
longer than ``max_len``, or an image at the very start) is dropped and counted.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from .._contract import IGNORE_INDEX
from .._io.inputs import RAW_SUFFIXES, resolve_inputs
from ..errors import ConfigError, DataError, InputNotFoundError, InvalidRecordError, OverlongError
from ..tokenize.formats import Record, read_records
from ..tokenize.masks import labels_from_spans
from ..tokenize.template import TRAIN_ON, ChatTemplate, resolve_template
from ..tokenize.tokenizer import LoadedTokenizer, load_tokenizer
from .media import media_hash, resolve_image
from .vision import VisionRules, image_size

__all__ = [
    "VisionTokens",
    "MultimodalSample",
    "MultimodalEncoder",
    "MEDIA_COLUMNS",
    "MULTIMODAL_KEY",
    "OVERLONG",
    "token_schema",
    "tokenize_files",
    "iter_samples",
]

OVERLONG = ("error", "truncate", "drop", "split")
# The per-sample columns a packed directory carries for the multimodal readers.
MEDIA_COLUMNS = ("media", "vision_tokens", "vision_patches")
MULTIMODAL_KEY = b"tokpack.multimodal"

_IDS = pa.list_(pa.int32())


def token_schema() -> pa.Schema:
    return pa.schema(
        [
            ("input_ids", _IDS),
            ("labels", _IDS),
            ("length", pa.int32()),
            ("media", pa.string()),
            ("vision_tokens", pa.int32()),
            ("vision_patches", pa.int32()),
        ],
        metadata={MULTIMODAL_KEY: b"qwen2-vl"},
    )


@dataclass(frozen=True)
class VisionTokens:
    """The family's vision token strings (Qwen2-VL's by default)."""

    start: str = "<|vision_start|>"
    image_pad: str = "<|image_pad|>"
    end: str = "<|vision_end|>"


@dataclass
class MultimodalSample:
    """One sample: ids and labels with expanded image pads, and its images (``media``)."""

    input_ids: np.ndarray
    labels: np.ndarray
    media: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def vision_tokens(self) -> int:
        return sum(int(m["span"][1]) for m in self.media)

    @property
    def vision_patches(self) -> int:
        return sum(int(np.prod(m["grid"])) for m in self.media)


@dataclass
class _Counts:
    records: int = 0
    samples: int = 0
    rejected: int = 0
    truncated: int = 0
    split: int = 0
    dropped_overlong: int = 0
    images: int = 0
    tokens: int = 0
    vision_tokens: int = 0
    trained_tokens: int = 0

    def as_dict(self) -> Dict[str, int]:
        return dict(self.__dict__)


def _token_id(tokenizer: LoadedTokenizer, text: str, what: str) -> int:
    found = tokenizer.tokenizer.token_to_id(text)
    if found is None:
        raise ConfigError(
            f"{tokenizer.path}: the tokenizer has no {what} token {text!r} (not a Qwen2-VL-style"
            " vocabulary?)"
        )
    return int(found)


class MultimodalEncoder:
    """A tokenizer, chat template and :class:`VisionRules`: records in, samples out."""

    def __init__(
        self,
        tokenizer: Union[str, os.PathLike, LoadedTokenizer],
        vision: Union[VisionRules, str, os.PathLike, Dict[str, Any]],
        *,
        chat_template: Optional[Union[str, os.PathLike]] = None,
        train_on: str = "assistant",
        max_len: Optional[int] = None,
        overlong: str = "error",
        messages_column: str = "messages",
        images_column: str = "images",
        image_root: Optional[Union[str, os.PathLike]] = None,
        tokens: VisionTokens = VisionTokens(),
    ) -> None:
        if train_on not in TRAIN_ON:
            raise ConfigError(f"train_on must be one of {TRAIN_ON}, got {train_on!r}")
        if overlong not in OVERLONG:
            raise ConfigError(f"overlong must be one of {OVERLONG}, got {overlong!r}")
        if max_len is not None and (
            isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1
        ):
            raise ConfigError(f"max_len must be a positive int or None, got {max_len!r}")
        if isinstance(vision, VisionRules):
            self.rules = vision
        elif isinstance(vision, dict):
            self.rules = VisionRules.from_dict(vision)
        else:
            self.rules = VisionRules.from_pretrained(vision)
        self.tokenizer = (
            tokenizer if isinstance(tokenizer, LoadedTokenizer) else load_tokenizer(tokenizer)
        )
        source, info = resolve_template(self.tokenizer.chat_template, chat_template)
        # Jinja renders: image parts are lists the Rust renderer's probe does not cover.
        self.template = ChatTemplate(
            source,
            self.tokenizer.special_tokens,
            self.tokenizer.special_token_strings,
            renderer="python",
            train_on=train_on,
        )
        self.template_info = {**info, "hash": self.template.hash}
        self.train_on = train_on
        self.max_len = max_len
        self.overlong = overlong
        self.messages_column = messages_column
        self.images_column = images_column
        self.image_root = None if image_root is None else Path(os.path.abspath(image_root))
        self.tokens = tokens
        self.start_id = _token_id(self.tokenizer, tokens.start, "vision start")
        self.pad_id = _token_id(self.tokenizer, tokens.image_pad, "image pad")
        self.end_id = _token_id(self.tokenizer, tokens.end, "vision end")

    def config(self) -> Dict[str, Any]:
        """What besides the input bytes decides the output (for the cache key)."""
        return {
            "tokenizer": dict(self.tokenizer.fingerprint),
            "template": self.template_info,
            "vision": self.rules.as_dict(),
            "vision_tokens": self.tokens.__dict__,
            "train_on": self.train_on,
            "max_len": self.max_len,
            "overlong": self.overlong,
            "columns": {"messages": self.messages_column, "images": self.images_column},
            "image_root": None if self.image_root is None else str(self.image_root),
        }

    # --- one record -----------------------------------------------------------------------

    def encode(self, record: Record, input_file: Path) -> MultimodalSample:
        """The whole sample of one record (before any ``max_len`` cut); problems raise the
        record's :class:`InvalidRecordError` (file and line or row)."""
        value = record.value
        if record.error is not None:
            raise record.fail(record.error)
        if not isinstance(value, dict):
            raise record.fail("a record must be a JSON object")
        messages = value.get(self.messages_column)
        if not isinstance(messages, list) or not messages:
            raise record.fail(f"{self.messages_column!r} must be a non-empty list of messages")
        parts = _image_parts(messages, record, self.messages_column)
        images = value.get(self.images_column)
        images = [] if images is None else images
        if not isinstance(images, list):
            raise record.fail(f"column {self.images_column!r} must be a list of images")
        if parts != len(images):
            raise record.fail(
                f"{parts} image part(s) in {self.messages_column!r} but {len(images)} image(s) in"
                f" column {self.images_column!r}"
            )
        text, spans = self.template.trained_spans(messages, self.train_on, record)
        encoding = self.tokenizer.tokenizer.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, dtype=np.int32)
        labels = labels_from_spans(encoding, ids, spans)
        pads = np.flatnonzero(ids == self.pad_id)
        if len(pads) != len(images):
            raise record.fail(
                f"the chat template rendered {len(pads)} {self.tokens.image_pad!r} token(s) for"
                f" {len(images)} image(s); the template must render each image part as"
                f" {self.tokens.start}{self.tokens.image_pad}{self.tokens.end}"
            )
        root = self.image_root or input_file.parent
        media = []
        for i, image in enumerate(images):
            # Bytes are referenced by their Parquet row (a JSONL line cannot hold bytes).
            where: Dict[str, Any] = {}
            if record.is_row:
                where = {
                    "file": str(Path(os.path.abspath(input_file))),
                    "row": record.line,
                    "column": self.images_column,
                    "index": i,
                }
            try:
                ref, data = resolve_image(image, root, where)
                width, height = image_size(io.BytesIO(data), name=ref.get("path", ""))
                grid = self.rules.grid(width, height)
            except (DataError, InputNotFoundError) as exc:
                raise record.fail(f"image {i}: {exc}") from None
            media.append(
                {"ref": ref, "hash": media_hash(data), "size": [width, height], "grid": list(grid)}
            )
        counts = np.ones(len(ids), dtype=np.int64)
        n_tokens = [self.rules.tokens(tuple(m["grid"])) for m in media]
        counts[pads] = n_tokens
        ids = np.repeat(ids, counts)
        labels = np.repeat(labels, counts)
        vision = (ids == self.pad_id) | (ids == self.start_id) | (ids == self.end_id)
        labels[vision] = IGNORE_INDEX
        shift = 0
        for m, pad, n in zip(media, pads.tolist(), n_tokens):
            m["span"] = [pad + shift, n]
            shift += n - 1
        return MultimodalSample(ids, labels, media)

    # --- max_len --------------------------------------------------------------------------

    def fit(
        self, sample: MultimodalSample, record: Record, counts: _Counts
    ) -> List[MultimodalSample]:
        """The sample, or its pieces, within ``max_len`` by the overlong policy (counted)."""
        n = len(sample.input_ids)
        if self.max_len is None or n <= self.max_len:
            return [sample]
        if self.overlong == "error":
            where = (
                f"{record.path}:row {record.line}"
                if record.is_row
                else f"{record.path}:{record.line}"
            )
            raise OverlongError(
                f"{where}: sample of {n} tokens is longer than max_len {self.max_len}"
                " (overlong='truncate', 'split' or 'drop' handles it)"
            )
        if self.overlong == "drop":
            counts.dropped_overlong += 1
            return []
        pieces = safe_pieces(n, self.max_len, self.overlong, image_blocks(sample.media))
        if not pieces:
            counts.dropped_overlong += 1
            return []
        if self.overlong == "truncate":
            counts.truncated += 1
        else:
            counts.split += 1
        return [_piece(sample, start, end) for start, end in pieces]


def _image_parts(messages: List[Any], record: Record, column: str) -> int:
    n = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise record.fail(f"{column}[{i}] must be an object with 'role' and 'content'")
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image":
                    n += 1
    return n


def image_blocks(media: Sequence[Dict[str, Any]]) -> List[Tuple[int, int]]:
    """The tokens ``[a, b)`` each image takes with its ``vision_start`` and ``vision_end``
    markers: a sample is never cut inside one."""
    return [(m["span"][0] - 1, m["span"][0] + m["span"][1] + 1) for m in media]


def _safe_cut(start: int, end: int, blocks: Sequence[Tuple[int, int]]) -> int:
    """``end``, or the start of the image block ``end`` falls inside (never inside one)."""
    for a, b in blocks:
        if a < end < b:
            return max(start, a)
    return end


def safe_pieces(
    n: int, max_len: int, overlong: str, blocks: Sequence[Tuple[int, int]]
) -> List[Tuple[int, int]]:
    """``(start, end)`` of the pieces a sample of ``n > max_len`` tokens keeps under
    ``overlong`` ``truncate`` (one piece from 0) or ``split`` (pieces tiling it), each cut at
    the last safe boundary (:func:`_safe_cut`): never inside a block. ``[]`` when there is no
    safe cut (an image alone longer than ``max_len``, or one starting a piece it cannot fit):
    the sample is dropped. The one rule of tokenize-time and pack-time cuts."""
    if overlong == "truncate":
        cut = _safe_cut(0, max_len, blocks)
        return [(0, cut)] if cut > 0 else []
    pieces, start = [], 0
    while start < n:
        end = min(n, start + max_len)
        cut = _safe_cut(start, end, blocks) if end < n else end
        if cut == start:
            return []
        pieces.append((start, cut))
        start = cut
    return pieces


def piece_media(media: Sequence[Dict[str, Any]], start: int, end: int) -> List[Dict[str, Any]]:
    """The images of tokens ``start:end`` of a sample (whole, with their markers), their spans
    rebased to the piece."""
    out = []
    for m in media:
        s = m["span"][0]
        if start < s and s + m["span"][1] < end:
            out.append({**m, "span": [s - start, m["span"][1]]})
    return out


def _piece(sample: MultimodalSample, start: int, end: int) -> MultimodalSample:
    media = piece_media(sample.media, start, end)
    return MultimodalSample(sample.input_ids[start:end], sample.labels[start:end], media)


# --- files ------------------------------------------------------------------------------------


def iter_samples(
    inputs: Sequence[Path],
    encoder: MultimodalEncoder,
    counts: _Counts,
    on_reject: Optional[Any] = None,
) -> Iterator[MultimodalSample]:
    """Every sample of the inputs in order; a bad record raises, or with ``on_reject`` (a
    function of the rejection dict) is set aside and counted."""
    for path in inputs:
        for record in read_records(path):
            counts.records += 1
            try:
                whole = encoder.encode(record, path)
            except InvalidRecordError as exc:
                if on_reject is None:
                    raise
                counts.rejected += 1
                on_reject(record.to_rejection(exc.reason))
                continue
            for sample in encoder.fit(whole, record, counts):
                counts.samples += 1
                counts.images += len(sample.media)
                counts.tokens += len(sample.input_ids)
                counts.vision_tokens += sample.vision_tokens
                counts.trained_tokens += int(np.count_nonzero(sample.labels != IGNORE_INDEX))
                yield sample


def _batch(samples: List[MultimodalSample]) -> pa.RecordBatch:
    lengths = np.array([len(s.input_ids) for s in samples], dtype=np.int32)
    offsets = np.zeros(len(samples) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])

    def flat(name: str) -> pa.Array:
        values = [getattr(s, name) for s in samples]
        data = np.concatenate(values).astype(np.int32) if values else np.zeros(0, np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(data))

    media = [json.dumps(s.media, separators=(",", ":")) for s in samples]
    return pa.RecordBatch.from_arrays(
        [
            flat("input_ids"),
            flat("labels"),
            pa.array(lengths),
            pa.array(media, pa.string()),
            pa.array([s.vision_tokens for s in samples], pa.int32()),
            pa.array([s.vision_patches for s in samples], pa.int32()),
        ],
        schema=token_schema(),
    )


def tokenize_files(
    inputs: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
    output_dir: Union[str, os.PathLike],
    tokenizer: Union[str, os.PathLike, LoadedTokenizer],
    *,
    vision: Union[VisionRules, str, os.PathLike, Dict[str, Any]],
    skip_invalid: bool = False,
    shard_rows: int = 100_000,
    batch_rows: int = 1024,
    force: bool = False,
    filesystem: Any = None,
    **options: Any,
) -> Dict[str, Any]:
    """Tokenize image chats (JSONL or Parquet) into multimodal token shards in ``output_dir``
    (written atomically, a cache hit when inputs and options are unchanged, as ``tokpack
    tokenize``; a URI or a path on ``filesystem`` is object storage, as for
    :func:`tokpack.pack_files`). ``vision``: :class:`VisionRules`, a
    ``preprocessor_config.json`` dict, or the model directory / file holding it; ``options``:
    the keyword options of :class:`MultimodalEncoder` (``chat_template``, ``train_on``,
    ``max_len``, ``overlong``, ``messages_column``, ``images_column``, ``image_root``). Images
    are read (hashed, header parsed) but not decoded. A changed image under an unchanged input
    is not noticed here (``force=True`` rebuilds); the collator's hash check refuses it when
    loading.

    Returns the manifest; ``counts`` holds records, samples, rejected, truncated, split,
    dropped_overlong, images, tokens, vision_tokens and trained_tokens.
    """
    from .._io.store import cached_run, destination
    from ..tokenize.writer import REJECTED_NAME, _RejectedFile, _ShardWriter

    dest = destination(output_dir, filesystem)
    files = resolve_inputs(inputs, RAW_SUFFIXES, output_dir=dest.local)
    encoder = MultimodalEncoder(tokenizer, vision, **options)
    config = {**encoder.config(), "skip_invalid": bool(skip_invalid), "shard_rows": shard_rows}

    def build(tmp: Path, described: List[Dict[str, Any]]) -> Dict[str, Any]:
        counts = _Counts()
        shards = _ShardWriter(tmp, shard_rows, token_schema())
        rejected = _RejectedFile(tmp) if skip_invalid else None
        try:
            pending: List[MultimodalSample] = []
            for sample in iter_samples(files, encoder, counts, rejected):
                pending.append(sample)
                if len(pending) == batch_rows:
                    shards.write(_batch(pending))
                    pending = []
            if pending:
                shards.write(_batch(pending))
            shards.finish()
        except BaseException:
            shards.abort()
            raise
        finally:
            if rejected is not None:
                rejected.close()
        return {
            "kind": "tokenize",
            "sample_kind": "sft",
            "multimodal": {"family": "qwen2-vl", "columns": list(MEDIA_COLUMNS)},
            "inputs": described,
            "tokenizer": {"path": str(encoder.tokenizer.path.resolve())},
            "template": encoder.template_info,
            "config": config,
            "counts": counts.as_dict(),
            "shards": shards.shards,
            "rejected_file": REJECTED_NAME if counts.rejected else None,
        }

    manifest, hit, _ = cached_run(dest, "tokenize-multimodal", files, config, build, force=force)
    return {**manifest, "cache_hit": True} if hit else manifest
