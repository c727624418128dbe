"""Tokenize conversational records with images and videos into token shards (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL: :mod:`tokpack.multimodal.family`).

A record is a chat (``messages``: role/content dicts, a content being a string or a list of
``{"type": "text", "text": ...}`` / ``{"type": "image"}`` / ``{"type": "video"}`` parts) plus
an ``images`` column holding the images of the image parts, in order, and a ``videos`` column
holding the videos of the video parts, each a list of frames (images of one size; no video
file is decoded). The chat template renders each image part as
``<|vision_start|><|image_pad|><|vision_end|>`` (a video part with ``<|video_pad|>``); the one
pad token is expanded into as many as the model will see for that image or video
(:class:`VisionRules`, from the image headers: pixels are not decoded), as the model's
processor expands it in the text: for Qwen3-VL, a video's pad becomes one
``<t seconds><|vision_start|>pads<|vision_end|>`` block per temporal patch. Vision tokens
(``vision_start``, the pads, ``vision_end``, Qwen3-VL's timestamps) are never trained on.

Token shards get, besides ``input_ids``, ``labels`` and ``length``:

- ``media`` (string): JSON list, one object per image or video in token order: for an image
  ``ref`` (see :mod:`tokpack.multimodal.media`), ``hash``, ``size`` ``[width, height]``,
  ``grid`` ``[t, h, w]`` (the processor's ``image_grid_thw``) and ``span`` ``[start, n]``: the
  image's ``n`` pad tokens start at token ``start`` of the sample; for a video ``"type":
  "video"``, ``frames`` (``ref`` and ``hash`` of each), ``size``, ``grid`` (the video
  processor's ``video_grid_thw``), ``span``, and by family: ``second_per_grid_t`` and
  ``tokens_per_second`` (Qwen2.5-VL's time step), or ``frame_count``, ``fps``, ``tokens`` (its
  pads) and ``groups`` (``[offset, n]`` of each temporal patch's pads in the span, which also
  holds the timestamps: Qwen3-VL);
- ``vision_tokens`` (int32): the sample's pad tokens; ``vision_patches`` (int32): the patches
  the vision encoder runs on (``t * h * w`` summed), a second cost to balance rows on.

Over-long samples (``max_len``) are never cut inside an image or video: ``truncate`` cuts
before the ``vision_start`` of one that would not fit whole, ``split`` ends each piece at such
a boundary (each piece keeps its own media), and a sample with no safe cut (an image alone
longer than ``max_len``, or an image at the very start) is dropped and counted.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from .._checks import MAX_LEN, check_int
from .._contract import IGNORE_INDEX, OVERLONG_HINT, OVERLONG_POLICIES
from .._io.arrays import list_array
from .._io.inputs import RAW_SUFFIXES, resolve_inputs
from ..errors import ConfigError, DataError, InputNotFoundError, InvalidRecordError
from ..kinds import KINDS, MULTIMODAL_KEY
from ..packed.mixture import _positive as positive_number
from ..tokenize.encoder import overlong_error
from ..tokenize.formats import Record, read_records
from ..tokenize.masks import labels_from_spans
from ..tokenize.options import TokenizeOptions
from ..tokenize.pipeline import chunked
from ..tokenize.schema import TOKEN_SCHEMA
from ..tokenize.template import ChatTemplate, resolve_template
from ..tokenize.tokenizer import LoadedTokenizer, load_tokenizer, read_json_object
from .family import detect_family
from .media import describe_ref, media_hash, resolve_image
from .pieces import MultimodalSample, image_blocks, piece, safe_pieces
from .vision import VisionRules, image_size, read_preprocessor_config

__all__ = [
    "VisionTokens",
    "MultimodalSample",
    "MultimodalEncoder",
    "OVERLONG",
    "token_schema",
    "tokenize_files",
    "iter_samples",
]

OVERLONG = OVERLONG_POLICIES
MULTIMODAL = KINDS["multimodal"]
# The per-sample columns a packed directory carries for the multimodal readers.


def token_schema(family: str = "qwen2-vl") -> pa.Schema:
    """The token shards' schema: the SFT columns, then the multimodal kind's media columns
    (``tokpack.kinds``); its metadata names the model family."""
    media = [("media", pa.string()), ("vision_tokens", pa.int32()), ("vision_patches", pa.int32())]
    return pa.schema(list(TOKEN_SCHEMA) + media, metadata={MULTIMODAL_KEY: family.encode()})


@dataclass(frozen=True)
class VisionTokens:
    """The family's vision token strings (Qwen2-VL's by default)."""

    start: str = "<|vision_start|>"
    image_pad: str = "<|image_pad|>"
    end: str = "<|vision_end|>"
    video_pad: str = "<|video_pad|>"


@dataclass
class _Counts:
    records: int = 0
    samples: int = 0
    rejected: int = 0
    truncated: int = 0
    split: int = 0
    dropped_overlong: int = 0
    images: int = 0
    videos: int = 0
    tokens: int = 0
    vision_tokens: int = 0
    trained_tokens: int = 0


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
        family: str = "auto",
        videos_column: str = "videos",
        video_fps: Optional[float] = None,
        tokens_per_second: Optional[int] = None,
    ) -> None:
        # Checked by their owner.
        self.options = TokenizeOptions(train_on=train_on, max_len=max_len, overlong=overlong)
        self.columns = {
            "messages": messages_column,
            "images": images_column,
            "videos": videos_column,
        }
        processor_config = {} if isinstance(vision, VisionRules) else vision
        if not isinstance(processor_config, dict):
            processor_config = read_preprocessor_config(processor_config)
        self.family = detect_family(processor_config, family)
        if isinstance(vision, VisionRules):
            self.rules = self.video_rules = vision
        else:
            self.rules = VisionRules.from_dict(processor_config, self.family.name)
        self._video_settings(vision, processor_config, video_fps, tokens_per_second)
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
        self.image_root = None if image_root is None else Path(os.path.abspath(image_root))
        self.tokens = tokens
        self.start_id = _token_id(self.tokenizer, tokens.start, "vision start")
        self.pad_id = _token_id(self.tokenizer, tokens.image_pad, "image pad")
        self.end_id = _token_id(self.tokenizer, tokens.end, "vision end")
        self.video_pad_id: Optional[int] = self.tokenizer.tokenizer.token_to_id(tokens.video_pad)

    def _video_settings(
        self,
        vision: Any,
        processor_config: Dict[str, Any],
        video_fps: Optional[float],
        tokens_per_second: Optional[int],
    ) -> None:
        """The video rules, the frame lists' rate and Qwen2.5-VL's ``tokens_per_second``."""
        model_config: Dict[str, Any] = {}
        if not isinstance(vision, VisionRules):
            video_config = processor_config
            if not isinstance(vision, dict):
                # As transformers: the video processor reads video_preprocessor_config.json,
                # or preprocessor_config.json when the model has none.
                video_config = (
                    _json_beside(vision, "video_preprocessor_config.json") or video_config
                )
                model_config = _json_beside(vision, "config.json") or {}
            self.video_rules = VisionRules.from_dict(video_config, self.family.name, video=True)
        if video_fps is not None:
            positive_number("video_fps", video_fps)
        # transformers' rate for a frame list given without its metadata.
        self.video_fps = float(video_fps) if video_fps is not None else 24.0
        if tokens_per_second is None:
            vision_config = model_config.get("vision_config") or {}
            tokens_per_second = vision_config.get("tokens_per_second", 2)
        self.tokens_per_second = check_int(tokens_per_second, "tokens_per_second", 1, MAX_LEN)

    def config(self) -> Dict[str, Any]:
        """What besides the input bytes decides the output (for the cache key)."""
        return {
            "tokenizer": dict(self.tokenizer.fingerprint),
            "template": self.template_info,
            "family": self.family.name,
            "vision": self.rules.as_dict(),
            "video": {
                **self.video_rules.as_dict(),
                "fps": self.video_fps,
                "tokens_per_second": self.tokens_per_second,
            },
            "vision_tokens": self.tokens.__dict__,
            "train_on": self.options.train_on,
            "max_len": self.options.max_len,
            "overlong": self.options.overlong,
            "columns": dict(self.columns),
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
        messages = value.get(self.columns["messages"])
        if not isinstance(messages, list) or not messages:
            raise record.fail(f"{self.columns['messages']!r} must be a non-empty list of messages")
        image_parts, video_parts = _media_parts(messages, record, self.columns["messages"])
        images = self._column(record, value, self.columns["images"], image_parts, "image")
        videos = self._column(record, value, self.columns["videos"], video_parts, "video")
        if videos and self.video_pad_id is None:
            raise record.fail(
                f"{self.tokenizer.path}: the tokenizer has no video pad token"
                f" {self.tokens.video_pad!r}"
            )
        text, spans = self.template.trained_spans(messages, self.options.train_on, record)
        encoding = self.tokenizer.tokenizer.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, dtype=np.int32)
        labels = labels_from_spans(encoding, ids, spans)
        image_pads = np.flatnonzero(ids == self.pad_id)
        video_pads = np.flatnonzero(ids == self.video_pad_id) if videos else image_pads[:0]
        for pads, items, pad, kind in (
            (image_pads, images, self.tokens.image_pad, "image"),
            (video_pads, videos, self.tokens.video_pad, "video"),
        ):
            if len(pads) != len(items):
                raise record.fail(
                    f"the chat template rendered {len(pads)} {pad!r} token(s) for"
                    f" {len(items)} {kind}(s); the template must render each {kind} part as"
                    f" {self.tokens.start}{pad}{self.tokens.end}"
                )
        root = self.image_root or input_file.parent
        placed = [
            (p, self._image(record, image, i, root))
            for i, (p, image) in enumerate(zip(image_pads.tolist(), images))
        ]
        placed += [
            (p, self._video(record, video, i, root))
            for i, (p, video) in enumerate(zip(video_pads.tolist(), videos))
        ]
        placed.sort(key=lambda x: x[0])
        # Each placeholder pad becomes its medium's tokens: n pads, or for a Qwen3-VL video one
        # "<t seconds><|vision_start|>pads<|vision_end|>" block per temporal patch.
        expanded = [self._tokens_of(m) for _, m in placed]
        reps = np.ones(len(ids), dtype=np.int64)
        reps[[pad for pad, _ in placed]] = [len(tokens) for tokens in expanded]
        starts = np.cumsum(reps) - reps
        ids, labels = np.repeat(ids, reps), np.repeat(labels, reps)
        for (pad, m), tokens in zip(placed, expanded):
            start = int(starts[pad])
            m["span"] = [start, len(tokens)]
            ids[start : start + len(tokens)] = tokens
            labels[start : start + len(tokens)] = IGNORE_INDEX
        vision = [self.pad_id, self.start_id, self.end_id, self.video_pad_id]
        labels[np.isin(ids, [v for v in vision if v is not None])] = IGNORE_INDEX
        return MultimodalSample(ids, labels, [m for _, m in placed])

    def _tokens_of(self, m: Dict[str, Any]) -> np.ndarray:
        """The tokens a medium's placeholder pad becomes. A Qwen3-VL video also gets ``groups``:
        ``[offset, n]`` of each temporal patch's pads within them."""
        if m.get("type") != "video":
            return np.full(self.rules.tokens(tuple(m["grid"])), self.pad_id, dtype=np.int32)
        n = self.video_rules.tokens(tuple(m["grid"]))
        if self.family.video_time != "timestamps":
            return np.full(n, self.video_pad_id, dtype=np.int32)
        per_group = n // int(m["grid"][0])
        ids: List[int] = []
        m["groups"] = []
        for seconds in _timestamps(m["frame_count"], self.video_fps, self.video_rules):
            ids += self.tokenizer.tokenizer.encode(
                f"<{seconds:.1f} seconds>", add_special_tokens=False
            ).ids
            m["groups"].append([len(ids) + 1, per_group])
            ids += [self.start_id, *[self.video_pad_id] * per_group, self.end_id]  # type: ignore[list-item]
        m["tokens"] = n
        return np.asarray(ids, dtype=np.int32)

    def _column(
        self, record: Record, value: Dict[str, Any], column: str, parts: int, kind: str
    ) -> List[Any]:
        items = value.get(column)
        items = [] if items is None else items
        if not isinstance(items, list):
            raise record.fail(f"column {column!r} must be a list of {kind}s")
        if parts != len(items):
            raise record.fail(
                f"{parts} {kind} part(s) in {self.columns['messages']!r} but {len(items)} {kind}(s)"
                f" in column {column!r}"
            )
        return items

    def _where(self, record: Record, column: str, index: int, **frame: int) -> Dict[str, Any]:
        # Bytes are referenced by their Parquet row (a JSONL line cannot hold bytes).
        if not record.is_row:
            return {}
        file = str(Path(os.path.abspath(record.path)))
        return {"file": file, "row": record.line, "column": column, "index": index, **frame}

    def _image(self, record: Record, image: Any, i: int, root: Path) -> Dict[str, Any]:
        where = self._where(record, self.columns["images"], i)
        try:
            ref, data = resolve_image(image, root, where)
            width, height = image_size(io.BytesIO(data), name=ref.get("path", ""))
            grid = self.rules.grid(width, height)
        except (DataError, InputNotFoundError) as exc:
            raise record.fail(f"image {i}: {exc}") from None
        return {"ref": ref, "hash": media_hash(data), "size": [width, height], "grid": list(grid)}

    def _video(self, record: Record, video: Any, i: int, root: Path) -> Dict[str, Any]:
        """A video given as its list of frames (paths, bytes or ``{"bytes", "path"}``, all of
        one size): its frames' references and hashes, grid and the time-axis step."""
        if not isinstance(video, list) or not video:
            raise record.fail(f"video {i}: a video must be a non-empty list of frames")
        frames, size = [], None
        for j, frame in enumerate(video):
            where = self._where(record, self.columns["videos"], i, frame=j)
            try:
                ref, data = resolve_image(frame, root, where)
                frame_size = image_size(io.BytesIO(data), name=ref.get("path", ""))
            except (DataError, InputNotFoundError) as exc:
                raise record.fail(f"video {i}, frame {j}: {exc}") from None
            if size is None:
                size = frame_size
            elif frame_size != size:
                raise record.fail(
                    f"video {i}, frame {j} ({describe_ref(ref)}): {frame_size[0]}x{frame_size[1]}"
                    f" pixels, frame 0 has {size[0]}x{size[1]}: the frames of a video must be of"
                    " one size"
                )
            frames.append({"ref": ref, "hash": media_hash(data)})
        assert size is not None
        try:
            grid = self.video_rules.video_grid(
                len(frames), *size, clip_pixels=self.family.video_time == "timestamps"
            )
        except DataError as exc:
            raise record.fail(f"video {i}: {exc}") from None
        entry = {"type": "video", "frames": frames, "size": list(size), "grid": list(grid)}
        if self.family.video_time == "timestamps":
            entry["frame_count"] = len(frames)  # type: ignore[assignment]
            entry["fps"] = self.video_fps  # type: ignore[assignment]
        if self.family.video_time == "seconds":
            entry["second_per_grid_t"] = self.video_rules.temporal_patch_size / self.video_fps  # type: ignore[assignment]
            entry["tokens_per_second"] = self.tokens_per_second  # type: ignore[assignment]
        return entry

    # --- max_len --------------------------------------------------------------------------

    def fit(
        self, sample: MultimodalSample, record: Record, counts: _Counts
    ) -> List[MultimodalSample]:
        """The sample, or its pieces, within ``max_len`` by the overlong policy (counted)."""
        n, max_len, overlong = len(sample.input_ids), self.options.max_len, self.options.overlong
        if max_len is None or n <= max_len:
            return [sample]
        if overlong == "error":
            raise overlong_error(record, n, max_len, OVERLONG_HINT)
        blocks = image_blocks(sample.media)
        pieces = [] if overlong == "drop" else safe_pieces(n, max_len, overlong, blocks)
        if not pieces:
            counts.dropped_overlong += 1
            return []
        if overlong == "truncate":
            counts.truncated += 1
        else:
            counts.split += 1
        return [piece(sample, start, end) for start, end in pieces]


def _media_parts(messages: List[Any], record: Record, column: str) -> Tuple[int, int]:
    """The image parts and the video parts of a conversation."""
    images = videos = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise record.fail(f"{column}[{i}] must be an object with 'role' and 'content'")
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image":
                    images += 1
                elif isinstance(part, dict) and part.get("type") == "video":
                    videos += 1
    return images, videos


def _timestamps(frames: int, fps: float, rules: VisionRules) -> List[float]:
    """Qwen3-VL's time of each temporal patch of a frame list (transformers'
    ``Qwen3VLProcessor._calculate_timestamps``): frame ``i`` at ``i / fps``, the last frame
    repeated up to a multiple of ``temporal_patch_size``, each patch at the mean of its first
    and last frame."""
    size = rules.temporal_patch_size
    indices = list(range(frames))
    indices += [indices[-1]] * (-frames % size)
    times = [i / fps for i in indices]
    return [(times[i] + times[i + size - 1]) / 2 for i in range(0, len(times), size)]


def _json_beside(vision: Union[str, os.PathLike], name: str) -> Optional[Dict[str, Any]]:
    """``name`` in the model directory ``vision`` (or beside the config file it names), as a
    dict; None when there is no such file."""
    base = Path(vision)
    file = (base if base.is_dir() else base.parent) / name
    return read_json_object(file) if file.is_file() else None


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
                videos = sum(m.get("type") == "video" for m in sample.media)
                counts.videos += videos
                counts.images += len(sample.media) - videos
                counts.tokens += len(sample.input_ids)
                counts.vision_tokens += sample.vision_tokens
                counts.trained_tokens += int(np.count_nonzero(sample.labels != IGNORE_INDEX))
                yield sample


def _batch(samples: List[MultimodalSample], family: str) -> pa.RecordBatch:
    lengths = np.array([len(s.input_ids) for s in samples], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)])

    def flat(name: str) -> pa.Array:
        return list_array(offsets, np.concatenate([getattr(s, name) for s in samples]), pa.int32())

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
        schema=token_schema(family),
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
    ``max_len``, ``overlong``, ``messages_column``, ``images_column``, ``videos_column``,
    ``image_root``, ``family`` (``"auto"``: from the processor config; ``"qwen2-vl"``,
    ``"qwen2.5-vl"``, ``"qwen3-vl"``), ``video_fps`` (the frame rate of the frame lists, default
    24 as transformers assumes), ``tokens_per_second`` (Qwen2.5-VL; default the model
    directory's ``config.json``, else 2)). Videos take the rules of the model directory's
    ``video_preprocessor_config.json``, else of ``preprocessor_config.json``, as transformers
    does. Images and frames are read (hashed, header parsed) but not decoded. A changed image
    under an unchanged input is not noticed here (``force=True`` rebuilds); the collator's hash
    check refuses it when loading.

    Returns the manifest; ``counts`` holds records, samples, rejected, truncated, split,
    dropped_overlong, images, videos, tokens, vision_tokens and trained_tokens.
    """
    from .._io.store import cached_run, destination
    from ..tokenize.writer import REJECTED_NAME, _RejectedFile, _ShardWriter

    dest = destination(output_dir, filesystem)
    files = resolve_inputs(inputs, RAW_SUFFIXES, output_dir=dest.place)
    encoder = MultimodalEncoder(tokenizer, vision, **options)
    config = {**encoder.config(), "skip_invalid": bool(skip_invalid), "shard_rows": shard_rows}

    def build(tmp: Path, described: List[Dict[str, Any]]) -> Dict[str, Any]:
        counts = _Counts()
        family = encoder.family.name
        with contextlib.closing(_RejectedFile(tmp)) as rejected:
            samples = iter_samples(files, encoder, counts, rejected if skip_invalid else None)
            batches = (_batch(chunk, family) for chunk in chunked(samples, batch_rows))
            shards = _ShardWriter(tmp, shard_rows, token_schema(family)).write_all(batches)
        return {
            "kind": "tokenize",
            "sample_kind": MULTIMODAL.name,
            "multimodal": {"family": encoder.family.name, "columns": list(MULTIMODAL.carried)},
            "inputs": described,
            "tokenizer": {"path": str(encoder.tokenizer.path.resolve())},
            "template": encoder.template_info,
            "config": config,
            "counts": asdict(counts),
            "shards": shards,
            "rejected_file": REJECTED_NAME if counts.rejected else None,
        }

    manifest, hit, _ = cached_run(dest, "tokenize-multimodal", files, config, build, force=force)
    return {**manifest, "cache_hit": True} if hit else manifest
