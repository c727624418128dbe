"""``tokenize_files``: raw inputs to a directory of Parquet token shards (``part-NNNNN.parquet``,
columns of :mod:`tokpack.tokenize.schema`) with a manifest, written atomically and skipped when
the manifest's cache key (inputs, tokenizer and template hashes, config) is unchanged."""

from __future__ import annotations

import contextlib
import json
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, TextIO, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import _tokpack
from .._checks import MAX_ROWS, check_int, checked_threads
from .._io.inputs import RAW_SUFFIXES, resolve_inputs
from .._io.outdir import open_for_writing, writing
from .._io.progress import Progress
from .._io.store import cached_run, destination
from ..packed.format import REJECTED_NAME
from .options import TokenizeOptions
from .pipeline import ChunkRunner, PathLike, RecordEncoder, TokenStream
from .schema import describe
from .tokenizer import LoadedTokenizer

__all__ = ["tokenize_files", "stream_into", "write_arrow", "REJECTED_NAME", "DEFAULT_SHARD_ROWS"]

DEFAULT_SHARD_ROWS = 100_000


class _ShardWriter:
    """Cuts the batch stream into shards of ``shard_rows`` samples (by count only, so shard
    boundaries never depend on the thread count). Parquet encoding and compression run on a
    background thread, in order, while the caller prepares the next batches (pyarrow releases
    the GIL); at most two batches wait."""

    def __init__(self, directory: Path, shard_rows: int, schema: pa.Schema) -> None:
        self.directory = directory
        self.schema = schema
        self.shard_rows = shard_rows
        self.shards: List[Dict[str, Any]] = []
        # Used on the background thread only.
        self._file: Optional[pq.ParquetWriter] = None
        self._sink: Optional[pa.NativeFile] = None
        self._path = directory
        self._io = ThreadPoolExecutor(1, thread_name_prefix="tokpack-shards")
        self._pending: Deque[Future] = deque()

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._pending.append(self._io.submit(fn, *args))
        while len(self._pending) > 2:
            self._pending.popleft().result()

    def _open_file(self, path: Path) -> None:
        self._path = path
        with writing(path):
            self._sink = open_for_writing(path)
            self._file = pq.ParquetWriter(self._sink, self.schema, compression="zstd")

    def _write_part(self, part: pa.RecordBatch) -> None:
        assert self._file is not None
        with writing(self._path):
            self._file.write_batch(part)

    def _close_file(self) -> None:
        file, sink, self._file, self._sink = self._file, self._sink, None, None
        with writing(self._path):
            try:
                if file is not None:
                    file.close()
            finally:
                if sink is not None:
                    sink.close()
        # Size and checksum let cache hits and `tokpack verify` vouch for the shard.
        size, checksum = _tokpack.file_checksum(str(self._path))
        shard = next(s for s in self.shards if s["file"] == self._path.name)
        shard["size"], shard["checksum"] = size, checksum

    def _open(self) -> None:
        name = f"part-{len(self.shards):05d}.parquet"
        self.shards.append({"file": name, "rows": 0, "tokens": 0})
        self._submit(self._open_file, self.directory / name)

    def write(self, batch: pa.RecordBatch) -> None:
        # The stream's schema, with each carried field's type (known from its first batch).
        self.schema = batch.schema
        while batch.num_rows:
            if not self.shards or self.shards[-1]["rows"] == self.shard_rows:
                if self.shards:
                    self._submit(self._close_file)
                self._open()
            take = min(batch.num_rows, self.shard_rows - self.shards[-1]["rows"])
            part = batch.slice(0, take)
            self._submit(self._write_part, part)
            self.shards[-1]["rows"] += take
            self.shards[-1]["tokens"] += pc.sum(part.column("length")).as_py() or 0
            batch = batch.slice(take)

    def write_all(self, batches: Iterable[pa.RecordBatch]) -> List[Dict[str, Any]]:
        """Writes ``batches`` and closes the last shard: every file is complete when this
        returns the shards' manifest entries; or, after a failure, :meth:`abort` has run and the
        first error (of the background writes too) is raised."""
        try:
            for batch in batches:
                self.write(batch)
            if not self.shards:  # an empty result still has one (empty) shard with the schema
                self._open()
            self._submit(self._close_file)
            for future in self._pending:
                future.result()
            self._io.shutdown(wait=True)
        except BaseException:
            self.abort()
            raise
        return self.shards

    def abort(self) -> None:
        """Stops after a failure without raising: queued writes are cancelled and the errors of
        the ones under way ignored (after a first failure the rest fail too, differently; the
        caller reports the first and removes the files)."""
        while self._pending:
            self._pending.popleft().cancel()
        self._io.shutdown(wait=True)
        with contextlib.suppress(Exception):
            self._close_file()


class _RejectedFile:
    """``__tokpack__/_rejected.jsonl`` of an output directory, created at the first record."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / REJECTED_NAME
        self._file: Optional[TextIO] = None

    def __call__(self, rejection: Dict[str, Any]) -> None:
        with writing(self.path):
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "w", encoding="utf-8")
            self._file.write(json.dumps(rejection, ensure_ascii=False, sort_keys=True) + "\n")

    def close(self) -> None:
        if self._file is not None:
            with writing(self.path):
                self._file.close()


@contextlib.contextmanager
def stream_into(
    out_tmp: Path,
    inputs: List[Path],
    described: List[Dict[str, Any]],
    encoding: RecordEncoder,
    progress: bool,
    **stream_options: Any,
) -> Iterator[TokenStream]:
    """The token stream of a run that writes the output directory ``out_tmp`` (of
    ``tokenize`` or one-step ``pack``): rejected records go to its ``_rejected.jsonl``, and
    progress (``progress=True``) is shown as the tokenize phase over the ``described`` sizes."""
    display = Progress(progress, total_bytes=sum(d["size"] for d in described))
    rejected = _RejectedFile(out_tmp)
    try:
        yield TokenStream(inputs, encoding, on_reject=rejected, progress=display, **stream_options)
    finally:
        display.close()
        rejected.close()


def write_arrow(sink: pa.NativeFile, stream: TokenStream) -> None:
    """The batches of ``stream`` as one Arrow IPC file (one-step pack's staged tokens), with
    the stream's schema (a carried field's type comes with the first batch)."""
    batches = iter(stream)
    first = next(batches, None)
    with pa.ipc.new_file(sink, stream.schema if first is None else first.schema) as writer:
        if first is not None:
            writer.write_batch(first)
        for batch in batches:
            writer.write_batch(batch)


def tokenize_files(
    inputs: Union[PathLike, Sequence[PathLike]],
    output_dir: PathLike,
    tokenizer: Union[PathLike, LoadedTokenizer],
    *,
    threads: Optional[int] = None,
    force: bool = False,
    shard_rows: int = DEFAULT_SHARD_ROWS,
    progress: bool = False,
    options: Optional[TokenizeOptions] = None,
    runner: Optional[ChunkRunner] = None,
    filesystem: Any = None,
    **option_values: Any,
) -> Dict[str, Any]:
    """Tokenize chat / instruction / text files into Parquet token shards in ``output_dir``
    (a local directory, or object storage as in :func:`tokpack.pack_files`: a URI or a path on
    ``filesystem``).

    Options are those of :func:`tokpack.tokenize.tokenize_to_batches` (the fields of
    :class:`TokenizeOptions`, ``threads``), plus ``force`` (rebuild even when the output is
    current), ``shard_rows`` (samples per shard) and ``progress`` (a progress bar on stderr
    when it is a terminal). ``runner``: where chunks are encoded instead of local worker
    processes (``tokpack.ray.RayRunner``, ``tokpack tokenize --ray``); the output is the same.

    Returns:
        The manifest (also in ``output_dir/__tokpack__/_manifest.json``), with
        ``"cache_hit": True`` added when the existing output was current and nothing was done.
    """
    shard_rows = check_int(shard_rows, "shard_rows", 1, MAX_ROWS)
    threads = checked_threads(threads)
    dest = destination(output_dir, filesystem)
    inputs = resolve_inputs(inputs, RAW_SUFFIXES, output_dir=dest.place)
    chosen = TokenizeOptions.of(options, **option_values).for_inputs(inputs)
    encoding = RecordEncoder(tokenizer, chosen)
    config = {**encoding.config(), "shard_rows": shard_rows}

    def build(tmp: Path, described: List[Dict[str, Any]]) -> Dict[str, Any]:
        with stream_into(
            tmp, inputs, described, encoding, progress, threads=threads, runner=runner
        ) as stream:
            shards = _ShardWriter(tmp, shard_rows, encoding.schema()).write_all(stream)
        return {
            "kind": "tokenize",
            "sample_kind": encoding.kind,
            "inputs": described,
            "tokenizer": {"path": str(encoding.tokenizer.path.resolve()), **config["tokenizer"]},
            "template": encoding.template_info,
            "encoder": encoding.encoder_info,
            "renderer": stream.renderer_info,
            "config": config,
            "counts": stream.stats.as_dict(),
            "shards": shards,
            "rejected_file": REJECTED_NAME if stream.stats.rejected else None,
            "columns": describe(stream.schema),
        }

    manifest, hit, _ = cached_run(
        dest, "tokenize", inputs, config, build, threads=threads, force=force
    )
    return {**manifest, "cache_hit": True} if hit else manifest
