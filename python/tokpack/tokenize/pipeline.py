"""Raw records to token batches: read -> parse -> render (main thread, compiled template) ->
encode + labels (in Rust with the GIL released, overlapping the render of the next chunk) ->
over-long policy -> ``pyarrow.RecordBatch``.

Encoding uses tokpack's byte-level BPE encoder (``tokpack-core``'s ``bpe``: exact ids of the
tokenizer, labels from the character spans) when it reproduces the tokenizer, otherwise
``tokenizers``' encoder on worker threads with labels from its offsets.

Chunks have a fixed number of records and results are put back in input order, so the batches
are identical for any number of threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np
import pyarrow as pa

from .. import _tokpack
from .._contract import OVERLONG_HINT, OVERLONG_POLICIES
from .._inputs import RAW_SUFFIXES, resolve_inputs
from ..errors import ConfigError, InvalidRecordError, OverlongError
from ..planning import MAX_LEN, MAX_ROWS, check_int, checked_threads
from .formats import FORMATS, Record, parse_record, read_records, resolve_columns
from .masks import IGNORE_INDEX, labels_from_spans
from .progress import Progress
from .template import TRAIN_ON, ChatTemplate, resolve_template
from .tokenizer import ENCODERS, LoadedTokenizer, load_tokenizer

__all__ = [
    "TokenizeStats",
    "TokenStream",
    "tokenize_to_batches",
    "TOKEN_SCHEMA",
    "SOURCE_SCHEMA",
    "ENCODERS",
]

TOKEN_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("length", pa.int32()),
    ]
)

# TOKEN_SCHEMA plus where each sample comes from (``sources=True``): the index of its input
# file and its JSONL line (from 1) or Parquet row (from 0). One-step pack stages these columns,
# which the packer does not read, to name the raw record of a dropped sample.
SOURCE_SCHEMA = TOKEN_SCHEMA.append(pa.field("source_file", pa.int32())).append(
    pa.field("source_line", pa.int64())
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

    def merge(self, other: "TokenizeStats") -> None:
        """Adds the counts of ``other`` (a worker's part of the run)."""
        for name, value in asdict(other).items():
            if name == "formats":
                for fmt, n in value.items():
                    self.formats[fmt] = self.formats.get(fmt, 0) + n
            else:
                setattr(self, name, getattr(self, name) + value)

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


# A batch as flat arrays: offsets (n + 1), ids, labels, lengths (n), source files and lines (n).
_Arrays = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass
class _Flat:
    """A chunk encoded by tokpack's encoder: item ``i`` owns ``ids[offsets[i]:offsets[i+1]]``."""

    ids: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray

    def pairs(self) -> List[Tuple[np.ndarray, np.ndarray]]:
        bounds = self.offsets.tolist()
        return [(self.ids[a:b], self.labels[a:b]) for a, b in zip(bounds, bounds[1:])]


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
        encoder: str = "auto",
        sources: bool = False,
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
        if max_len is not None:
            max_len = check_int(max_len, "max_len", 1, MAX_LEN)
        threads = checked_threads(threads)
        batch_size = check_int(batch_size, "batch_size", 1, MAX_ROWS)
        if encoder not in ENCODERS:
            raise ConfigError(f"unknown encoder {encoder!r}; choose among {', '.join(ENCODERS)}")
        self.format = format
        self.train_on = train_on
        self.max_len = max_len
        self.overlong = overlong
        self.add_eos = add_eos
        self.columns = resolve_columns(columns)
        self.threads = threads if threads is not None else _tokpack.default_threads()
        self.skip_invalid = skip_invalid
        self.batch_size = batch_size
        self.progress = progress
        self.sources = sources
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
        self.encoder = encoder
        self._fast = self.tokenizer.fast if encoder == "auto" else None
        if self._fast is not None:
            self.encoder_info: Dict[str, Any] = {"name": "tokpack-bpe"}
        else:
            why = "requested" if encoder == "tokenizers" else self.tokenizer.fast_unsupported
            self.encoder_info = {"name": "tokenizers", "reason": why}
        eos = self.tokenizer.eos_token
        if eos is not None and self._eos_id is None and add_eos is not False:
            # Otherwise samples meant to end with EOS would silently go without it.
            raise ConfigError(
                f"eos_token {eos!r} of {self.tokenizer.config_path} is not in the vocabulary of "
                f"{self.tokenizer.path}; fix the tokenizer config, or turn add_eos off "
                "(--no-add-eos) to append no EOS"
            )
        if add_eos and self._eos_id is None:
            raise ConfigError(
                "add_eos needs an EOS token: the tokenizer config names none (or it is not in "
                "the vocabulary)"
            )
        self.stats = TokenizeStats()
        self.rejected: List[Dict[str, Any]] = []
        self._on_reject = on_reject if on_reject is not None else self.rejected.append
        self._used = False
        # What a worker process needs to build the same stream (everything but the inputs).
        self._worker_options: Dict[str, Any] = {
            "tokenizer": str(self.tokenizer.path),
            "chat_template": None if chat_template is None else str(chat_template),
            "format": format,
            "train_on": train_on,
            "max_len": max_len,
            "overlong": overlong,
            "add_eos": add_eos,
            "columns": self.columns,
            "skip_invalid": skip_invalid,
            "batch_size": batch_size,
            "encoder": encoder,
        }

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
            "encoder": self.encoder,
            "tokenizer": self.tokenizer.fingerprint,
            "tokenizers_version": tokenizers.__version__,
            "template": self.template_info,
        }

    # --- stages ------------------------------------------------------------------------------

    def _reject(self, record: Record, reason: str) -> None:
        self.stats.rejected += 1
        self._on_reject(record.to_rejection(reason))

    def _records(self, decode: bool = True) -> Iterator[Record]:
        on_bytes = self.progress.advance if self.progress is not None else None
        for index, path in enumerate(self.inputs):
            for record in read_records(path, on_bytes, decode=decode):
                record.file_index = index
                self.stats.records += 1
                yield record

    def _record_chunks(self, decode: bool) -> Iterator[List[Record]]:
        """``batch_size`` records at a time: batch boundaries depend on the input only."""
        chunk: List[Record] = []
        for record in self._records(decode):
            chunk.append(record)
            if len(chunk) == self.batch_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

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

    def _prepare_all(self, records: List[Record]) -> List[_Prepared]:
        return [p for p in map(self._prepare, records) if p is not None]

    def _encode_chunk(self, chunk: List[_Prepared]) -> Any:
        """Ids and labels of a chunk (chat text without the tokenizer's added special tokens,
        as ``apply_chat_template``; plain text with them): a :class:`_Flat` from tokpack's
        encoder, or ``(ids, labels)`` pairs from ``tokenizers``."""
        if self._fast is not None:
            return self._encode_fast(chunk)
        return _encode_part(self.tokenizer.tokenizer, chunk)

    def _encode_fast(
        self, chunk: List[_Prepared]
    ) -> Union[_Flat, List[Tuple[np.ndarray, np.ndarray]]]:
        # Plain text gets the post-processor's tokens (BOS, ...) with add_special_tokens=True;
        # tokpack's encoder has no post-processor, so such text goes to tokenizers.
        slow = self._fast.post_processor_adds_tokens
        items = [p for p in chunk if p.spans is not None or not slow]
        counts = np.zeros(len(items) + 1, dtype=np.int64)
        starts: List[int] = []
        ends: List[int] = []
        for i, p in enumerate(items):
            spans = p.spans if p.spans is not None else [(0, len(p.text))]
            counts[i + 1] = len(spans)
            for a, b in spans:
                starts.append(a)
                ends.append(b)
        ids, labels, offsets, fallback = self._fast.encode_batch(
            [p.text for p in items],
            np.cumsum(counts),
            np.array(starts, dtype=np.int64),
            np.array(ends, dtype=np.int64),
            self.threads,
        )
        flat = _Flat(ids, labels, offsets)
        if len(items) == len(chunk) and not len(fallback):
            return flat
        fast = flat.pairs()
        # Text the encoder leaves to tokenizers (not in NFC, for an NFC tokenizer).
        missing = fallback.tolist()
        tok = self.tokenizer.tokenizer
        for i, pair in zip(missing, _encode_part(tok, [items[i] for i in missing])):
            fast[i] = pair
        if len(items) == len(chunk):
            return fast
        plain = [p.text for p in chunk if p.spans is None]
        encs = tok.encode_batch(plain, add_special_tokens=True)
        plain_pairs = iter([(_ids(e), _ids(e)) for e in encs])
        fast_pairs = iter(fast)
        return [next(plain_pairs) if p.spans is None else next(fast_pairs) for p in chunk]

    def _build(
        self, chunk: List[_Prepared], encoded: List[Tuple[np.ndarray, np.ndarray]]
    ) -> Optional[_Arrays]:
        ids_parts: List[np.ndarray] = []
        label_parts: List[np.ndarray] = []
        files: List[int] = []
        lines: List[int] = []
        stats = self.stats
        for item, (ids, labels) in zip(chunk, encoded):
            add_eos = self.add_eos if self.add_eos is not None else item.spans is None
            if add_eos and self._eos_id is not None and (not len(ids) or ids[-1] != self._eos_id):
                eos = np.array([self._eos_id], dtype=np.int32)
                ids = np.concatenate([ids, eos])
                eos_label = eos if item.eos_trained else np.array([IGNORE_INDEX], dtype=np.int32)
                labels = np.concatenate([labels, eos_label])
            stats.samples_in += 1
            pieces = self._apply_max_len(item.record, ids, labels)
            for piece_ids, piece_labels in pieces:
                ids_parts.append(piece_ids)
                label_parts.append(piece_labels)
            files.extend([item.record.file_index] * len(pieces))
            lines.extend([item.record.line] * len(pieces))
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
        sources = np.array(files, dtype=np.int32), np.array(lines, dtype=np.int64)
        return (offsets, values, label_values, lengths, *sources)

    def _build_flat(self, chunk: List[_Prepared], flat: _Flat) -> Optional[_Arrays]:
        """The batch straight from the encoder's flat arrays when no sample needs an EOS or a
        max_len policy (the usual case); None otherwise (then :meth:`_build` handles it)."""
        lengths = np.diff(flat.offsets)
        if self.add_eos or (self.add_eos is None and any(p.spans is None for p in chunk)):
            return None
        if not len(lengths) or lengths.min() == 0:
            return None
        if self.max_len is not None and lengths.max() > self.max_len:
            return None
        if flat.offsets[-1] >= 2**31:
            raise ConfigError("batch_size too large: a batch holds more than 2**31 tokens")
        trained_mask = flat.labels != IGNORE_INDEX
        per_sample = np.add.reduceat(trained_mask, flat.offsets[:-1])
        stats = self.stats
        stats.samples_in += len(lengths)
        stats.samples_out += len(lengths)
        stats.tokens += int(flat.offsets[-1])
        stats.trained_tokens += int(np.count_nonzero(trained_mask))
        stats.untrained_samples += int(np.count_nonzero(per_sample == 0))
        files = np.fromiter((p.record.file_index for p in chunk), np.int32, len(chunk))
        lines = np.fromiter((p.record.line for p in chunk), np.int64, len(chunk))
        return flat.offsets, flat.ids, flat.labels, lengths, files, lines

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
                f"{where}: sample of {n} tokens, more than max_len={max_len}; {OVERLONG_HINT}"
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
        if self.threads > 1:
            return self._iter_processes()
        return self._iter_in_process()

    def _iter_in_process(self) -> Iterator[pa.RecordBatch]:
        """One process: parse and render here, encode on a worker thread meanwhile."""
        with _sequential_tokenizers(), ThreadPoolExecutor(1) as pool:
            pending: Optional[Tuple[int, List[_Prepared], List[Future]]] = None
            for records in self._record_chunks(decode=True):
                chunk = self._prepare_all(records)
                # Encoding of this chunk runs while the previous one is finished in Python.
                futures = [pool.submit(self._encode_chunk, chunk)] if chunk else []
                started = (len(records), chunk, futures)
                if pending is not None:
                    yield from self._finish(*pending)
                pending = started
            if pending is not None:
                yield from self._finish(*pending)

    def _iter_processes(self) -> Iterator[pa.RecordBatch]:
        """``threads`` worker processes decode, render and encode chunks of records (rendering
        is Python, so threads would share one core); this process reads, hands out chunks and
        takes the results back in input order."""
        import multiprocessing

        fork = _START_METHOD == "fork"
        context = multiprocessing.get_context(_START_METHOD)
        # A forked worker starts from a copy of this stream (tokenizer, template); a spawned
        # one builds its own from the options.
        global _WORKER
        _WORKER = self if fork else None
        pool = ProcessPoolExecutor(
            self.threads,
            mp_context=context,
            initializer=_worker_init,
            initargs=(None if fork else self._worker_options, os.getpid()),
        )
        window: Deque[Tuple[int, Future]] = deque()
        try:
            for records in self._record_chunks(decode=False):
                window.append((len(records), pool.submit(_worker_run, _pack_records(records))))
                if len(window) > 2 * self.threads:
                    yield from self._collect(*window.popleft())
            while window:
                yield from self._collect(*window.popleft())
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            _WORKER = None

    def _collect(self, n_records: int, future: Future) -> Iterator[pa.RecordBatch]:
        arrays, stats, rejected = future.result()
        self.stats.merge(stats)
        for rejection in rejected:
            self._on_reject(rejection)
        if self.progress is not None:
            self.progress.add_samples(n_records)
        if arrays is not None:
            yield _batch_from_arrays(arrays, self.sources)

    def _finish(
        self, n_records: int, chunk: List[_Prepared], futures: List[Future]
    ) -> Iterator[pa.RecordBatch]:
        arrays = self._batch_arrays(chunk, [future.result() for future in futures])
        if self.progress is not None:
            self.progress.add_samples(n_records)
        if arrays is not None:
            yield _batch_from_arrays(arrays, self.sources)

    def _batch_arrays(self, chunk: List[_Prepared], results: List[Any]) -> Optional[_Arrays]:
        """The chunk's batch as flat arrays (see :func:`_batch_from_arrays`); None if empty."""
        if not chunk:
            return None
        if len(results) == 1 and isinstance(results[0], _Flat):
            arrays = self._build_flat(chunk, results[0])
            if arrays is not None:
                return arrays
        encoded: List[Tuple[np.ndarray, np.ndarray]] = []
        for result in results:
            encoded.extend(result.pairs() if isinstance(result, _Flat) else result)
        return self._build(chunk, encoded)


# How worker processes start: fork where it is the platform's way (Linux: no re-import, the
# tokenizer and template are inherited), spawn elsewhere.
_START_METHOD = "fork" if sys.platform == "linux" else "spawn"

# The stream of a worker process, built once by the pool's initializer.
_WORKER: Optional[TokenStream] = None


def _worker_init(options: Optional[Dict[str, Any]], parent: int) -> None:
    global _WORKER
    _die_with_parent(parent)
    # Ctrl-C and SIGTERM are the parent's to handle: it stops handing out work and shuts the
    # pool down (a terminal or `kill -- -PGID` signals the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if options is not None:
        _WORKER = TokenStream([os.devnull], threads=1, **options)
    else:
        assert _WORKER is not None, "a forked worker inherits the stream"
        _WORKER.threads = 1


# prctl(2) option: the signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """A worker must not outlive the main process (kill -9 of it would leave workers of ~70 MB
    waiting forever under init). On Linux the kernel sends SIGKILL when the parent dies
    (PR_SET_PDEATHSIG; the pool starts its workers from the main thread, whose exit is what
    the kernel watches); elsewhere a daemon thread polls the parent pid. Either way a parent
    that died before this ran is caught by the first getppid check."""
    if sys.platform == "linux":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    else:
        import threading

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="tokpack-parent-watch", daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _pack_records(records: List[Record]) -> Any:
    """Records to send to a worker: undecoded JSONL lines of one file travel as two lists
    (a list of dataclasses costs several times more to pickle)."""
    first = records[0]
    if all(not r.decoded and r.file_index == first.file_index for r in records):
        return (first.path, first.file_index, [r.line for r in records], [r.raw for r in records])
    return records


def _unpack_records(packed: Any) -> List[Record]:
    if isinstance(packed, tuple):
        path, index, lines, raws = packed
        return [
            Record(path, n, False, raw, None, decoded=False, file_index=index)
            for n, raw in zip(lines, raws)
        ]
    return packed


def _from_numpy(values: np.ndarray, dtype: type) -> pa.Array:
    # From the buffer, not pa.array(ndarray): that one imports pandas on first use (seconds,
    # during which pyarrow swallows Ctrl-C).
    data = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(dtype), len(data), [None, pa.py_buffer(data)])


def _int32(values: np.ndarray) -> pa.Array:
    return _from_numpy(values, np.int32)


def _batch_from_arrays(arrays: _Arrays, sources: bool) -> pa.RecordBatch:
    """The token batch of flat arrays: sample ``i`` is ``ids[offsets[i]:offsets[i + 1]]``; with
    ``sources``, the source columns of :data:`SOURCE_SCHEMA` too."""
    offsets, ids, labels, lengths, files, lines = arrays
    off = _int32(offsets)
    columns = [
        pa.ListArray.from_arrays(off, _int32(ids)),
        pa.ListArray.from_arrays(off, _int32(labels)),
        _int32(lengths),
    ]
    if not sources:
        return pa.RecordBatch.from_arrays(columns, schema=TOKEN_SCHEMA)
    columns += [_int32(files), _from_numpy(lines, np.int64)]
    return pa.RecordBatch.from_arrays(columns, schema=SOURCE_SCHEMA)


def _worker_run(
    packed: Any,
) -> Tuple[Optional[_Arrays], TokenizeStats, List[Dict[str, Any]]]:
    """Decodes, renders and encodes one chunk; returns its batch as arrays (an Arrow batch
    would import pandas on both sides to be pickled), its counts (without ``records``, counted
    by the reader) and its rejected records."""
    stream = _WORKER
    assert stream is not None, "worker not initialised"
    stream.stats = TokenizeStats()
    rejected: List[Dict[str, Any]] = []
    stream._on_reject = rejected.append
    chunk = stream._prepare_all(_unpack_records(packed))
    arrays = stream._batch_arrays(chunk, [stream._encode_chunk(chunk)]) if chunk else None
    return arrays, stream.stats, rejected


def _ids(encoding: Any) -> np.ndarray:
    return np.array(encoding.ids, dtype=np.int32)


def _encode_part(tokenizer: Any, part: List[_Prepared]) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``tokenizers`` route: ids, and labels from the encoding's offsets."""
    chat = [p.text for p in part if p.spans is not None]
    plain = [p.text for p in part if p.spans is None]
    chat_encs = iter(tokenizer.encode_batch(chat, add_special_tokens=False) if chat else [])
    plain_encs = iter(tokenizer.encode_batch(plain, add_special_tokens=True) if plain else [])
    out = []
    for p in part:
        if p.spans is None:
            ids = _ids(next(plain_encs))
            out.append((ids, ids.copy()))
        else:
            enc = next(chat_encs)
            ids = _ids(enc)
            out.append((ids, labels_from_spans(enc, ids, p.spans)))
    return out


def tokenize_to_batches(
    inputs: Union[PathLike, Sequence[PathLike]],
    tokenizer: Union[PathLike, LoadedTokenizer],
    **options: Any,
) -> TokenStream:
    """Tokenize raw chat / instruction / text files into token ``RecordBatch``es without
    writing anything: the building block of ``tokenize_files`` and of one-step ``pack``.

    Args:
        inputs: JSONL, ``.jsonl.gz`` or Parquet files, directories or globs (as ``tokpack
            tokenize`` reads them).
        tokenizer: a ``tokenizer.json`` file or a directory holding it (and
            ``tokenizer_config.json``), or a loaded tokenizer.
        chat_template: a Jinja file overriding the tokenizer config's template.
        format: ``"auto"`` (per record), ``"messages"``, ``"sharegpt"``, ``"alpaca"``, ``"text"``.
        train_on: ``"assistant"`` (default), ``"last"`` or ``"all"``.
        max_len, overlong: over-long samples follow the packer's policies (``"error"``,
            ``"truncate"``, ``"drop"``, ``"split"``).
        add_eos: append the EOS token (None: to plain-text samples only).
        columns: column-name overrides, e.g. ``{"messages": "chat"}``.
        threads: worker processes that decode, render and encode (default
            ``TOKPACK_NUM_THREADS`` or all cores; 1: everything in this process); the output
            is identical for every value.
        skip_invalid: reject bad records (to ``on_reject`` or :attr:`TokenStream.rejected`)
            instead of raising :class:`tokpack.InvalidRecordError`.
        encoder: ``"auto"`` (default): tokpack's Rust byte-level BPE encoder when it
            reproduces the tokenizer exactly (byte-level BPE of the GPT-2, Llama 3 and Qwen2
            kinds), otherwise
            ``tokenizers``; ``"tokenizers"``: always ``tokenizers``. Same ids either way.
        sources: add the columns of :data:`SOURCE_SCHEMA` to every batch: each sample's input
            file (index into ``inputs``) and JSONL line (from 1) or Parquet row (from 0).

    Returns:
        A :class:`TokenStream`: iterate it for batches, then read ``.stats``.
    """
    return TokenStream(resolve_inputs(inputs, RAW_SUFFIXES), tokenizer, **options)
