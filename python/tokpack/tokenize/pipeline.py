"""Raw records to token batches: read -> parse -> render (main thread, compiled template) ->
encode + labels (in Rust with the GIL released, overlapping the render of the next chunk) ->
over-long policy -> ``pyarrow.RecordBatch``. The encoding of a chunk is
:mod:`tokpack.tokenize.encoder`'s; the shapes it passes around are in
:mod:`tokpack.tokenize.samples`.

Chunks have a fixed number of records and results are put back in input order, so the batches
are identical for any number of threads. A :class:`RecordEncoder` turns one chunk into
:class:`Tokens`, in this process or in worker processes; :class:`TokenStream` reads, hands out
the chunks and puts the results together.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import (
    Any,
    Callable,
    ContextManager,
    Deque,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
)

import pyarrow as pa

from .. import _tokpack
from .._checks import checked_threads
from .._io.inputs import RAW_SUFFIXES, is_parquet, resolve_inputs, shown_path
from .._io.progress import Progress
from ..errors import ConfigError, InvalidRecordError
from .encoder import RecordEncoder
from .formats import PER_COMPLETION, Record, read_records
from .options import TokenizeOptions
from .samples import (
    ChunkResult,
    PathLike,
    RejectSink,
    TokenizeStats,
    Tokens,
)
from .schema import SOURCE_SCHEMA, TOKEN_SCHEMA
from .tokenizer import ENCODERS, LoadedTokenizer

__all__ = [
    "TokenizeStats",
    "TokenStream",
    "RecordEncoder",
    "tokenize_to_batches",
    "TOKEN_SCHEMA",
    "SOURCE_SCHEMA",
    "ENCODERS",
]


@contextlib.contextmanager
def _sequential_tokenizers() -> Iterator[None]:
    # Each worker encodes its chunk sequentially; tokpack's own workers are the only
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
    """An iterable of token ``RecordBatch``es (``input_ids``, ``labels``, ``length``; for
    preference and KTO records the columns of :mod:`tokpack.tokenize.schema`) from raw inputs,
    with the accounting in :attr:`stats` (complete once iteration has finished) and the rejected
    records sent to ``on_reject`` in input order (default: kept in :attr:`rejected`). ``sources``
    adds the columns of :data:`SOURCE_SCHEMA`. Iterate once. Built by
    :func:`tokenize_to_batches`, whose arguments it takes (``tokenizer`` may also be a
    :class:`RecordEncoder`, which brings its options)."""

    def __init__(
        self,
        inputs: Union[PathLike, Sequence[PathLike]],
        tokenizer: Union[PathLike, LoadedTokenizer, RecordEncoder],
        *,
        threads: Optional[int] = None,
        on_reject: Optional[RejectSink] = None,
        progress: Optional[Progress] = None,
        sources: bool = False,
        options: Optional[Union[TokenizeOptions, Mapping[str, Any]]] = None,
        runner: Optional["ChunkRunner"] = None,
        **option_values: Any,
    ) -> None:
        self.inputs = resolve_inputs(inputs, RAW_SUFFIXES)
        self.runner = runner
        threads = checked_threads(threads)
        self.threads = threads if threads is not None else _tokpack.default_threads()
        if isinstance(tokenizer, RecordEncoder):
            if options is not None or option_values:
                raise ConfigError("a RecordEncoder brings its own options")
            self.encoding = tokenizer
        else:
            chosen = TokenizeOptions.of(options, **option_values).for_inputs(self.inputs)
            self.encoding = RecordEncoder(tokenizer, chosen)
        self.tokenizer = self.encoding.tokenizer
        self.template_info = self.encoding.template_info
        self.encoder_info = self.encoding.encoder_info
        self._jsonl_in_rust = runner is None and self.encoding.jsonl_in_rust(self.inputs)
        # Which renderer runs, and where JSONL records are parsed when it is Rust's (manifest).
        self.renderer_info = dict(self.encoding.renderer_info)
        if self._jsonl_in_rust:
            self.renderer_info["records"] = "rust"
        self.progress = progress
        self.sources = sources
        self.stats = TokenizeStats()
        self.rejected: List[Dict[str, Any]] = []
        self._on_reject = on_reject if on_reject is not None else self.rejected.append
        self._used = False
        # Each carried field's type, and where it was first seen, once a sample has it (a GRPO
        # run's per-completion column: float64, or null when its first record gives none).
        self._carried: Dict[str, Tuple[pa.DataType, str]] = {}

    def config(self) -> Dict[str, Any]:
        """Everything besides the input bytes that determines the output (for the cache key)."""
        return self.encoding.config()

    @property
    def schema(self) -> pa.Schema:
        """The batches' schema (a carried field's type is known once a sample has it: null
        before, and for good when none has)."""
        types = {n: t for n, (t, _) in self._carried.items() if t != pa.null()}
        return self.encoding.schema(self.sources, types)

    def _carried_types(self, tokens: Tokens) -> List[Tuple[str, pa.DataType]]:
        """Each carried field with its type in this run: the type of its first value, which
        every later value must have (else an InvalidRecordError naming both records); first,
        the per-completion columns of a GRPO run that its records give: as its first record
        does, every record or none."""
        out = []
        for name in (*self.encoding.optional, *self.encoding.options.carry):
            values = (tokens.carried or {})[name]
            if name in self.encoding.optional:
                types = [pa.null() if v is None else pa.float64() for v in values]
            else:
                types = [
                    next(t for kind, t in _CARRIED_TYPES if isinstance(v, kind)) for v in values
                ]
            if name not in self._carried:
                path, line, row = self._source(tokens, 0)
                self._carried[name] = (types[0], f"{path}:{'row ' * row}{line}")
            first, where = self._carried[name]
            odd = next((j for j, t in enumerate(types) if t != first), None)
            if odd is not None:
                path, line, row = self._source(tokens, odd)
                raise InvalidRecordError(
                    path, line, self._odd(name, types[odd], first, where), row=row
                )
            if first != pa.null():
                out.append((name, first))
        return out

    def _odd(self, name: str, odd: pa.DataType, first: pa.DataType, where: str) -> str:
        """Why a sample's ``odd`` type of carried column ``name`` is refused (``first``: the
        type of the run's first record, at ``where``)."""
        if name not in self.encoding.optional:
            return (
                f"carried field {name!r} is of type {odd}, not {first} as at {where}: a carried"
                " field has one type in a run"
            )
        field = next(f for f, c in PER_COMPLETION.items() if c == name)
        field = (self.encoding.options.columns or {}).get(field, field)
        has = first != pa.null()
        return (
            f"{'no ' if has else ''}{field!r} {'field' if has else 'given'}, unlike the run's "
            f"first record ({where}): the records of a run all give {field!r} or none does"
        )

    def _source(self, tokens: Tokens, j: int) -> Tuple[str, int, bool]:
        """The file (as shown), line or row, and whether it is a row, of sample ``j``."""
        assert tokens.files is not None and tokens.lines is not None
        path = self.inputs[int(tokens.files[j])]
        return shown_path(path), int(tokens.lines[j]), is_parquet(path)

    def _record_chunks(self, decode: bool) -> Iterator[List[Record]]:
        """``batch_size`` records at a time: batch boundaries depend on the input only."""
        return chunked(self._records(decode), self.encoding.options.batch_size)

    def _records(self, decode: bool) -> Iterator[Record]:
        on_bytes = self.progress.advance if self.progress is not None else None
        for index, path in enumerate(self.inputs):
            for record in read_records(path, on_bytes, decode=decode):
                record.file_index = index
                record.index = self.stats.records
                self.stats.records += 1
                yield record

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._used:
            raise ConfigError("a TokenStream can be iterated only once")
        self._used = True
        if self.runner is not None:
            return self._iter_runner(self.runner)
        if self.threads > 1 and not self._jsonl_in_rust:
            return self._iter_processes()
        return self._iter_in_process()

    def _iter_runner(self, runner: "ChunkRunner") -> Iterator[pa.RecordBatch]:
        """Chunks encoded wherever ``runner`` sends them (Ray actors), taken back in order."""
        with runner.session(self.encoding) as (submit, ahead):
            chunks = self._record_chunks(decode=False)
            yield from self._in_order(chunks, lambda records: submit(_pack_records(records)), ahead)

    def _iter_in_process(self) -> Iterator[pa.RecordBatch]:
        """One process: parse and render here, encode on a worker thread meanwhile. JSONL chat
        records in Rust (``_jsonl_in_rust``) are parsed, rendered and encoded there on
        ``threads`` threads (one call a chunk, from the worker thread, the GIL released) while
        this thread reads the next chunk and finishes the previous one (records Rust leaves go
        through the Python stages here)."""
        encoding, rust = self.encoding, self._jsonl_in_rust
        with _sequential_tokenizers(), ThreadPoolExecutor(1) as pool:

            def start(records: List[Record]) -> Callable[[], ChunkResult]:
                stats, rejected = TokenizeStats(), []  # type: TokenizeStats, List[Any]
                if rust:
                    jsonl = pool.submit(encoding.encode_jsonl, records, self.threads)
                    return lambda: (
                        encoding.finish_jsonl(records, jsonl.result(), stats, rejected.append),
                        stats,
                        rejected,
                    )
                prepared = encoding.prepare(records, stats, rejected.append)
                # Encoding of this chunk runs while the previous one is finished.
                encoded = pool.submit(encoding.encode, prepared)
                return lambda: (encoding.finish(prepared, encoded.result(), stats), stats, rejected)

            yield from self._in_order(self._record_chunks(decode=not rust), start, ahead=1)

    def _iter_processes(self) -> Iterator[pa.RecordBatch]:
        """``threads`` worker processes decode, render and encode chunks of records (rendering
        is Python, so threads would share one core); this process reads, hands out chunks and
        takes the results back in input order."""
        import multiprocessing

        # A forked worker inherits this stream's encoder (tokenizer, template); a spawned one
        # loads its own.
        fork = _START_METHOD == "fork"
        encoding = self.encoding
        pool = ProcessPoolExecutor(
            self.threads,
            mp_context=multiprocessing.get_context(_START_METHOD),
            initializer=_worker_init,
            initargs=(
                encoding if fork else (str(encoding.tokenizer.path), encoding.options),
                os.getpid(),
            ),
        )

        def start(records: List[Record]) -> Callable[[], ChunkResult]:
            return pool.submit(_worker_run, _pack_records(records)).result

        try:
            chunks = self._record_chunks(decode=False)
            yield from self._in_order(chunks, start, ahead=2 * self.threads)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _in_order(
        self,
        chunks: Iterator[List[Record]],
        start: Callable[[List[Record]], Callable[[], ChunkResult]],
        ahead: int,
    ) -> Iterator[pa.RecordBatch]:
        """Starts each chunk (up to ``ahead`` before the one being finished) and finishes them
        in input order: counts merged, rejections passed on, the batch yielded."""
        window: Deque[Tuple[int, Callable[[], ChunkResult]]] = deque()
        for records in chunks:
            window.append((len(records), start(records)))
            if len(window) > ahead:
                yield from self._take(*window.popleft())
        while window:
            yield from self._take(*window.popleft())

    def _take(self, n_records: int, result: Callable[[], ChunkResult]) -> Iterator[pa.RecordBatch]:
        tokens, stats, rejected = result()
        self.stats.merge(stats)
        for rejection in rejected:
            self._on_reject(rejection)
        if self.progress is not None:
            self.progress.add_samples(n_records)
        if tokens is not None:
            yield tokens.to_batch(self.sources, self._carried_types(tokens))


def chunked(items: Iterator[Any], n: int) -> Iterator[List[Any]]:
    """``items`` ``n`` at a time (the last chunk may be shorter): chunks until an empty one."""
    return iter(lambda: list(itertools.islice(items, n)), [])


class ChunkRunner(Protocol):
    """Encodes chunks of records outside this process's own workers (``tokpack.ray``): a
    ``session`` for an encoder yields ``(submit, ahead)``; ``submit(packed)`` starts one chunk
    (records as :func:`_pack_records` packs them, to be run by :func:`run_packed`) and returns
    the call that waits for its result; ``ahead`` chunks may be under way at once."""

    def session(
        self, encoding: RecordEncoder
    ) -> ContextManager[Tuple[Callable[[Any], Callable[[], ChunkResult]], int]]: ...


def run_packed(encoding: RecordEncoder, packed: Any) -> ChunkResult:
    """One chunk of packed records, wherever it runs (a worker process, a Ray actor)."""
    return encoding.run(_unpack_records(packed))


# How worker processes start: fork where it is the platform's way (Linux: no re-import, the
# tokenizer and template are inherited), spawn elsewhere.
_START_METHOD = "fork" if sys.platform == "linux" else "spawn"

# The encoder of a worker process, set once by the pool's initializer (in the worker only).
_ENCODER: Optional[RecordEncoder] = None


def _worker_init(encoding: Union[RecordEncoder, Tuple[str, TokenizeOptions]], parent: int) -> None:
    """``encoding``: the parent's encoder (fork: inherited, not pickled), or the tokenizer path
    and options to load one from (spawn)."""
    global _ENCODER
    _die_with_parent(parent)
    # Ctrl-C and SIGTERM are the parent's to handle: it stops handing out work and shuts the
    # pool down (a terminal or `kill -- -PGID` signals the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _ENCODER = encoding if isinstance(encoding, RecordEncoder) else RecordEncoder(*encoding)


def _worker_run(packed: Any) -> ChunkResult:
    """One chunk in a worker process (its counts leave ``records`` to the reader)."""
    assert _ENCODER is not None, "worker not initialised"
    return run_packed(_ENCODER, packed)


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
    (a list of dataclasses costs several times more to pickle), with the first one's position
    in the run (the chunk's records are consecutive)."""
    first = records[0]
    if all(not r.decoded and r.file_index == first.file_index for r in records):
        lines, raws = [r.line for r in records], [r.raw for r in records]
        return (first.path, first.file_index, lines, raws, first.index)
    return records


def _unpack_records(packed: Any) -> List[Record]:
    if isinstance(packed, tuple):
        path, index, lines, raws, at = packed
        return [
            Record(path, n, False, raw, None, decoded=False, file_index=index, index=at + i)
            for i, (n, raw) in enumerate(zip(lines, raws))
        ]
    return packed


# The Arrow type of a carried value, by its Python type (bool before int: a bool is an int).
_CARRIED_TYPES = ((bool, pa.bool_()), (int, pa.int64()), (float, pa.float64()), (str, pa.string()))


def tokenize_to_batches(
    inputs: Union[PathLike, Sequence[PathLike]],
    tokenizer: Union[PathLike, LoadedTokenizer, RecordEncoder],
    **options: Any,
) -> TokenStream:
    """Tokenize raw chat / instruction / text files into token ``RecordBatch``es without
    writing anything: the building block of ``tokenize_files`` and of one-step ``pack``.

    Args:
        inputs: JSONL, ``.jsonl.gz`` or Parquet files, directories or globs (as ``tokpack
            tokenize`` reads them).
        tokenizer: a ``tokenizer.json`` file or a directory holding it (and
            ``tokenizer_config.json``), or a loaded tokenizer.
        options: the fields of :class:`TokenizeOptions` (or ``options=TokenizeOptions(...)``),
            and ``threads``: worker processes that decode, render and encode (default
            ``TOKPACK_NUM_THREADS`` or all cores; 1: everything in this process); the output
            is identical for every value.
        on_reject: called with each rejected record (default: kept in ``.rejected``).
        progress: a :class:`tokpack._io.progress.Progress`, told the input bytes read and the
            records done.
        sources: add the columns of :data:`SOURCE_SCHEMA` (each sample's input file and line
            or row) to every batch.

    Returns:
        A :class:`TokenStream`: iterate it for batches, then read ``.stats``.
    """
    return TokenStream(inputs, tokenizer, **options)
