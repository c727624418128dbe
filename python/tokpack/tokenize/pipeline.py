"""Raw records to token batches: read -> parse -> render (main thread, compiled template) ->
encode (``tokenizers``' Rust encoder on worker threads, GIL released, overlapping the render of
the next chunk) -> labels (numpy) -> over-long policy -> ``pyarrow.RecordBatch``.

Chunks have a fixed number of records and results are put back in input order, so the batches
are identical for any number of threads.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from ..errors import ConfigError, InvalidRecordError, OverlongError
from ..planning import OVERLONG_POLICIES
from .formats import FORMATS, Record, parse_record, read_records, resolve_columns
from .masks import IGNORE_INDEX, labels_from_spans
from .progress import Progress
from .template import TRAIN_ON, ChatTemplate, resolve_template
from .tokenizer import LoadedTokenizer, load_tokenizer

__all__ = ["TokenizeStats", "TokenStream", "tokenize_to_batches", "TOKEN_SCHEMA"]

TOKEN_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("length", pa.int32()),
    ]
)

PathLike = Union[str, os.PathLike]


@dataclass
class TokenizeStats:
    """Accounting of a run: every record read is a sample, split into pieces, truncated, dropped
    as over-long, or rejected (``records == samples_in + rejected``)."""

    records: int = 0
    rejected: int = 0
    samples_in: int = 0
    samples_out: int = 0
    formats: Dict[str, int] = field(default_factory=dict)
    overlong: int = 0
    truncated: int = 0
    dropped: int = 0
    split: int = 0
    split_pieces: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    untrained_samples: int = 0

    def as_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["trained_share"] = self.trained_tokens / self.tokens if self.tokens else 0.0
        return data


@dataclass
class _Prepared:
    record: Record
    text: str
    spans: Optional[List[Tuple[int, int]]]  # None: plain text, every token trained
    eos_trained: bool


@contextlib.contextmanager
def _sequential_tokenizers() -> Iterator[None]:
    # Each worker thread encodes its slice sequentially; tokpack's own threads are the only
    # parallelism, so --threads is exact. tokenizers reads this variable at every call.
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def _default_threads() -> int:
    env = os.environ.get("TOKPACK_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return os.cpu_count() or 1


class TokenStream:
    """An iterable of token ``RecordBatch``es (``input_ids``, ``labels``, ``length``) from raw
    inputs, with the accounting in :attr:`stats` (complete once iteration has finished) and the
    rejected records in :attr:`rejected` (unless an ``on_reject`` callback takes them).

    Iterate once. Build it with :func:`tokenize_to_batches`.
    """

    def __init__(
        self,
        inputs: Sequence[PathLike],
        tokenizer: Union[PathLike, LoadedTokenizer],
        *,
        chat_template: Optional[PathLike] = None,
        format: str = "auto",
        train_on: str = "assistant",
        max_len: Optional[int] = None,
        overlong: str = "error",
        add_eos: Optional[bool] = None,
        columns: Optional[Mapping[str, str]] = None,
        threads: Optional[int] = None,
        skip_invalid: bool = False,
        on_reject: Optional[Callable[[Dict[str, Any]], None]] = None,
        batch_size: int = 2048,
        progress: Optional[Progress] = None,
    ) -> None:
        if isinstance(inputs, (str, os.PathLike)):
            inputs = [inputs]
        self.inputs = [Path(p) for p in inputs]
        if not self.inputs:
            raise ConfigError("no input files")
        if format not in FORMATS:
            raise ConfigError(f"unknown format {format!r}; choose among {', '.join(FORMATS)}")
        if train_on not in TRAIN_ON:
            raise ConfigError(f"unknown train_on {train_on!r}; choose among {', '.join(TRAIN_ON)}")
        if overlong not in OVERLONG_POLICIES:
            raise ConfigError(
                f"unknown overlong policy {overlong!r}; choose among {', '.join(OVERLONG_POLICIES)}"
            )
        if max_len is not None and (not isinstance(max_len, int) or max_len < 1):
            raise ConfigError(f"max_len must be a positive integer, got {max_len!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"threads must be at least 1 (or None for all cores), got {threads}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        self.format = format
        self.train_on = train_on
        self.max_len = max_len
        self.overlong = overlong
        self.add_eos = add_eos
        self.columns = resolve_columns(columns)
        self.threads = threads if threads is not None else _default_threads()
        self.skip_invalid = skip_invalid
        self.batch_size = batch_size
        self.progress = progress
        self.tokenizer = (
            tokenizer if isinstance(tokenizer, LoadedTokenizer) else load_tokenizer(tokenizer)
        )
        source, info = resolve_template(self.tokenizer.chat_template, chat_template)
        self.template = ChatTemplate(
            source, self.tokenizer.special_tokens, self.tokenizer.special_token_strings
        )
        self.template_info = {
            **info,
            "hash": self.template.hash,
            "generation_markers": self.template.has_generation,
        }
        self._eos_id = self.tokenizer.eos_id()
        if add_eos and self._eos_id is None:
            raise ConfigError(
                "add_eos needs an EOS token: the tokenizer config names none (or it is not in "
                "the vocabulary)"
            )
        self.stats = TokenizeStats()
        self.rejected: List[Dict[str, Any]] = []
        self._on_reject = on_reject if on_reject is not None else self.rejected.append
        self._used = False

    def config(self) -> Dict[str, Any]:
        """Everything besides the input bytes that determines the output (for the cache key)."""
        import tokenizers

        return {
            "format": self.format,
            "train_on": self.train_on,
            "max_len": self.max_len,
            "overlong": self.overlong,
            "add_eos": self.add_eos,
            "columns": self.columns,
            "skip_invalid": self.skip_invalid,
            "batch_size": self.batch_size,
            "tokenizer": self.tokenizer.fingerprint,
            "tokenizers_version": tokenizers.__version__,
            "template": self.template_info,
        }

    # --- stages ------------------------------------------------------------------------------

    def _reject(self, record: Record, reason: str) -> None:
        self.stats.rejected += 1
        self._on_reject(record.to_rejection(reason))

    def _records(self) -> Iterator[Record]:
        on_bytes = self.progress.advance if self.progress is not None else None
        for path in self.inputs:
            for record in read_records(path, on_bytes):
                self.stats.records += 1
                yield record

    def _prepare(self, record: Record) -> Optional[_Prepared]:
        """Parse and render one record; None when it was rejected."""
        try:
            sample = parse_record(record, self.format, self.columns)
            if sample.text is not None:
                fmt = "text"
                prepared = _Prepared(record, sample.text, None, True)
            else:
                messages = sample.messages or []
                fmt = "chat"
                text, spans = self.template.trained_spans(messages, self.train_on, record)
                if not text:
                    raise record.fail("the chat template rendered an empty text")
                last_trained = self.train_on == "all" or messages[-1].get("role") == "assistant"
                prepared = _Prepared(record, text, spans, last_trained)
        except InvalidRecordError as exc:
            if not self.skip_invalid:
                raise
            self._reject(record, exc.reason)
            return None
        self.stats.formats[fmt] = self.stats.formats.get(fmt, 0) + 1
        return prepared

    def _chunks(self) -> Iterator[List[_Prepared]]:
        chunk: List[_Prepared] = []
        for record in self._records():
            prepared = self._prepare(record)
            if prepared is None:
                continue
            chunk.append(prepared)
            if len(chunk) == self.batch_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def _encode(self, pool: ThreadPoolExecutor, chunk: List[_Prepared]) -> List[Future]:
        """Starts encoding a chunk on the worker threads (chat text without the tokenizer's
        added special tokens, as ``apply_chat_template``; plain text with them)."""
        tok = self.tokenizer.tokenizer
        step = -(-len(chunk) // self.threads)
        futures = []
        for lo in range(0, len(chunk), step):
            part = chunk[lo : lo + step]
            futures.append(pool.submit(_encode_part, tok, part))
        return futures

    def _build(self, chunk: List[_Prepared], encodings: List[Any]) -> Optional[pa.RecordBatch]:
        ids_parts: List[np.ndarray] = []
        label_parts: List[np.ndarray] = []
        stats = self.stats
        for item, enc in zip(chunk, encodings):
            ids = np.array(enc.ids, dtype=np.int32)
            if item.spans is None:
                labels = ids.copy()
            else:
                labels = labels_from_spans(enc, ids, item.spans)
            add_eos = self.add_eos if self.add_eos is not None else item.spans is None
            if add_eos and self._eos_id is not None and (not len(ids) or ids[-1] != self._eos_id):
                eos = np.array([self._eos_id], dtype=np.int32)
                ids = np.concatenate([ids, eos])
                eos_label = eos if item.eos_trained else np.array([IGNORE_INDEX], dtype=np.int32)
                labels = np.concatenate([labels, eos_label])
            stats.samples_in += 1
            for piece_ids, piece_labels in self._apply_max_len(item.record, ids, labels):
                ids_parts.append(piece_ids)
                label_parts.append(piece_labels)
        if not ids_parts:
            return None
        lengths = np.fromiter((len(a) for a in ids_parts), dtype=np.int64, count=len(ids_parts))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] >= 2**31:
            raise ConfigError("batch_size too large: a batch holds more than 2**31 tokens")
        values = np.concatenate(ids_parts)
        label_values = np.concatenate(label_parts)
        trained = int(np.count_nonzero(label_values != IGNORE_INDEX))
        stats.samples_out += len(ids_parts)
        stats.tokens += int(offsets[-1])
        stats.trained_tokens += trained
        stats.untrained_samples += sum(1 for lab in label_parts if not np.any(lab != IGNORE_INDEX))
        off32 = pa.array(offsets.astype(np.int32))
        return pa.RecordBatch.from_arrays(
            [
                pa.ListArray.from_arrays(off32, pa.array(values, pa.int32())),
                pa.ListArray.from_arrays(off32, pa.array(label_values, pa.int32())),
                pa.array(lengths.astype(np.int32), pa.int32()),
            ],
            schema=TOKEN_SCHEMA,
        )

    def _apply_max_len(
        self, record: Record, ids: np.ndarray, labels: np.ndarray
    ) -> List[Tuple[np.ndarray, np.ndarray]]:
        max_len = self.max_len
        n = len(ids)
        if max_len is None or n <= max_len:
            return [(ids, labels)]
        stats = self.stats
        stats.overlong += 1
        if self.overlong == "error":
            where = f"{record.path}:{'row ' if record.is_row else ''}{record.line}"
            raise OverlongError(
                f"{where}: sample of {n} tokens is longer than max_len {max_len} "
                "(choose overlong 'truncate', 'drop' or 'split')"
            )
        if self.overlong == "truncate":
            stats.truncated += 1
            return [(ids[:max_len], labels[:max_len])]
        if self.overlong == "drop":
            stats.dropped += 1
            return []
        stats.split += 1
        pieces = [(ids[i : i + max_len], labels[i : i + max_len]) for i in range(0, n, max_len)]
        stats.split_pieces += len(pieces)
        return pieces

    # --- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._used:
            raise ConfigError("a TokenStream can be iterated only once")
        self._used = True
        with _sequential_tokenizers(), ThreadPoolExecutor(self.threads) as pool:
            pending: Optional[Tuple[List[_Prepared], List[Future]]] = None
            for chunk in self._chunks():
                # Encoding of this chunk runs while the previous one is finished in Python.
                started = (chunk, self._encode(pool, chunk))
                if pending is not None:
                    batch = self._finish(*pending)
                    if batch is not None:
                        yield batch
                pending = started
            if pending is not None:
                batch = self._finish(*pending)
                if batch is not None:
                    yield batch

    def _finish(self, chunk: List[_Prepared], futures: List[Future]) -> Optional[pa.RecordBatch]:
        encodings: List[Any] = []
        for future in futures:
            encodings.extend(future.result())
        batch = self._build(chunk, encodings)
        if self.progress is not None:
            self.progress.add_samples(len(chunk))
        return batch


def _encode_part(tokenizer: Any, part: List[_Prepared]) -> List[Any]:
    chat = [p.text for p in part if p.spans is not None]
    if len(chat) == len(part):
        return tokenizer.encode_batch(chat, add_special_tokens=False)
    plain = [p.text for p in part if p.spans is None]
    chat_encs = iter(tokenizer.encode_batch(chat, add_special_tokens=False) if chat else [])
    plain_encs = iter(tokenizer.encode_batch(plain, add_special_tokens=True) if plain else [])
    return [next(plain_encs) if p.spans is None else next(chat_encs) for p in part]


def tokenize_to_batches(
    inputs: Union[PathLike, Sequence[PathLike]],
    tokenizer: Union[PathLike, LoadedTokenizer],
    **options: Any,
) -> TokenStream:
    """Tokenize raw chat / instruction / text files into token ``RecordBatch``es without
    writing anything: the building block of ``tokenize_files`` and of one-step ``pack``.

    Args:
        inputs: JSONL, ``.jsonl.gz`` or Parquet files.
        tokenizer: a ``tokenizer.json`` file or a directory holding it (and
            ``tokenizer_config.json``), or a loaded tokenizer.
        chat_template: a Jinja file overriding the tokenizer config's template.
        format: ``"auto"`` (per record), ``"messages"``, ``"sharegpt"``, ``"alpaca"``, ``"text"``.
        train_on: ``"assistant"`` (default), ``"last"`` or ``"all"``.
        max_len, overlong: over-long samples follow the packer's policies (``"error"``,
            ``"truncate"``, ``"drop"``, ``"split"``).
        add_eos: append the EOS token (None: to plain-text samples only).
        columns: column-name overrides, e.g. ``{"messages": "chat"}``.
        threads: encoding threads (default ``TOKPACK_NUM_THREADS`` or all cores); the output is
            identical for every value.
        skip_invalid: reject bad records (to ``on_reject`` or :attr:`TokenStream.rejected`)
            instead of raising :class:`tokpack.InvalidRecordError`.

    Returns:
        A :class:`TokenStream`: iterate it for batches, then read ``.stats``.
    """
    return TokenStream(inputs, tokenizer, **options)
