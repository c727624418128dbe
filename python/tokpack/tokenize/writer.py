"""``tokenize_files``: raw inputs to a directory of Parquet token shards (``part-NNNNN.parquet``:
``input_ids`` list<int32>, ``labels`` list<int32>, ``length`` int32) with a manifest, written
atomically and skipped when the manifest's cache key (inputs, tokenizer and template hashes,
config) is unchanged."""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, TextIO, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import _tokpack
from .._inputs import RAW_SUFFIXES, resolve_inputs, shown_path
from .._outdir import (
    MANIFEST_NAME,
    SIDE_DIR,
    atomic_output_dir,
    cache_key,
    describe_inputs,
    is_cache_hit,
    output_target,
    write_json_atomic,
)
from ..errors import OutputError, TokpackError
from ..integrity import cache_problem
from ..planning import MAX_ROWS, check_int
from .pipeline import TOKEN_SCHEMA, PathLike, TokenStream
from .progress import Progress
from .tokenizer import LoadedTokenizer

__all__ = ["tokenize_files", "writing", "open_for_writing", "REJECTED_NAME", "DEFAULT_SHARD_ROWS"]

REJECTED_NAME = f"{SIDE_DIR}/_rejected.jsonl"
DEFAULT_SHARD_ROWS = 100_000


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turns an OSError while writing ``path`` (disk full, permissions; pyarrow raises OSError
    too) into an :class:`OutputError` naming it, so the CLI reports one line, not a traceback."""
    try:
        yield
    except TokpackError:
        raise
    except OSError as exc:
        raise OutputError(f"{shown_path(path)}: cannot write ({exc.strerror or exc})") from None


def open_for_writing(path: Path) -> pa.NativeFile:
    """A new file for pyarrow to write, opened by its bytes: pyarrow cannot open a name that is
    not valid UTF-8 itself."""
    return pa.OSFile(os.fsencode(path), "wb")


class _ShardWriter:
    """Cuts the batch stream into shards of ``shard_rows`` samples (by count only, so shard
    boundaries never depend on the thread count). Parquet encoding and compression run on a
    background thread, in order, while the caller prepares the next batches (pyarrow releases
    the GIL); at most two batches wait."""

    def __init__(self, directory: Path, shard_rows: int) -> None:
        self.directory = directory
        self.shard_rows = shard_rows
        self.shards: List[Dict[str, Any]] = []
        self._is_open = False
        self._rows = 0
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
            self._file = pq.ParquetWriter(self._sink, TOKEN_SCHEMA, compression="zstd")

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
        assert self._path is not None
        size, checksum = _tokpack.file_checksum(self._path)
        shard = next(s for s in self.shards if s["file"] == self._path.name)
        shard["size"], shard["checksum"] = size, checksum

    def _open(self) -> None:
        name = f"part-{len(self.shards):05d}.parquet"
        self.shards.append({"file": name, "rows": 0, "tokens": 0})
        self._rows = 0
        self._is_open = True
        self._submit(self._open_file, self.directory / name)

    def write(self, batch: pa.RecordBatch) -> None:
        while batch.num_rows:
            if not self._is_open or self._rows == self.shard_rows:
                self._close_shard()
                self._open()
            take = min(batch.num_rows, self.shard_rows - self._rows)
            part = batch.slice(0, take)
            self._submit(self._write_part, part)
            self._rows += take
            self.shards[-1]["rows"] += take
            self.shards[-1]["tokens"] += pc.sum(part.column("length")).as_py() or 0
            batch = batch.slice(take)

    def _close_shard(self) -> None:
        if self._is_open:
            self._is_open = False
            self._submit(self._close_file)

    def finish(self) -> None:
        """Writes the last shard; every file is complete when this returns (raises the first
        error of the background writes; then call :meth:`abort`)."""
        if not self.shards:  # an empty result still has one (empty) shard with the schema
            self._open()
        self._close_shard()
        while self._pending:
            self._pending[0].result()
            self._pending.popleft()
        self._io.shutdown(wait=True)

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
    """``__tokpack__/_rejected.jsonl``, created at the first rejected record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Optional[TextIO] = None

    def __call__(self, rejection: Dict[str, Any]) -> None:
        with writing(self.path):
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "w", encoding="utf-8")
            self._file.write(json.dumps(rejection, ensure_ascii=False, sort_keys=True) + "\n")

    def close(self) -> bool:
        if self._file is None:
            return False
        with writing(self.path):
            self._file.close()
        return True


def tokenize_files(
    inputs: Union[PathLike, Sequence[PathLike]],
    output_dir: PathLike,
    tokenizer: Union[PathLike, LoadedTokenizer],
    *,
    chat_template: Optional[PathLike] = None,
    format: str = "auto",
    train_on: str = "assistant",
    max_len: Optional[int] = None,
    overlong: str = "error",
    add_eos: Optional[bool] = None,
    columns: Optional[Dict[str, str]] = None,
    threads: Optional[int] = None,
    skip_invalid: bool = False,
    force: bool = False,
    shard_rows: int = DEFAULT_SHARD_ROWS,
    progress: bool = False,
    encoder: str = "auto",
) -> Dict[str, Any]:
    """Tokenize chat / instruction / text files into Parquet token shards in ``output_dir``.

    Options are those of :func:`tokpack.tokenize.tokenize_to_batches`, plus ``force`` (rebuild
    even when the output is current), ``shard_rows`` (samples per shard) and ``progress`` (a
    progress bar on stderr when it is a terminal).

    Returns:
        The manifest (also in ``output_dir/__tokpack__/_manifest.json``), with
        ``"cache_hit": True`` added when the existing output was current and nothing was done.
    """
    shard_rows = check_int(shard_rows, "shard_rows", 1, MAX_ROWS)
    output_dir = output_target(output_dir)
    inputs = resolve_inputs(inputs, RAW_SUFFIXES, output_dir=output_dir)
    input_desc = describe_inputs(inputs)
    stream = TokenStream(
        inputs,
        tokenizer,
        chat_template=chat_template,
        format=format,
        train_on=train_on,
        max_len=max_len,
        overlong=overlong,
        add_eos=add_eos,
        columns=columns,
        threads=threads,
        skip_invalid=skip_invalid,
        encoder=encoder,
        progress=Progress.for_terminal(
            sum(d["size"] for d in input_desc), "tokenize", quiet=not progress
        ),
    )
    config = {**stream.config(), "shard_rows": shard_rows}
    key = cache_key("tokenize", input_desc, config)
    if not force:
        hit = is_cache_hit(output_dir, key)
        if hit is not None and cache_problem(output_dir, hit) is None:  # else: damaged, rebuild
            return {**hit, "cache_hit": True}

    with atomic_output_dir(output_dir) as tmp:
        rejected = _RejectedFile(tmp / REJECTED_NAME)
        stream._on_reject = rejected
        shards = _ShardWriter(tmp, shard_rows)
        try:
            for batch in stream:
                shards.write(batch)
            shards.finish()
        except BaseException:
            shards.abort()
            raise
        finally:
            had_rejections = rejected.close()
            assert stream.progress is not None
            stream.progress.close()
        manifest = {
            "kind": "tokenize",
            "tokpack_version": _tokpack.__version__,
            "cache_key": key,
            "inputs": input_desc,
            "tokenizer": {"path": str(stream.tokenizer.path.resolve()), **config["tokenizer"]},
            "template": stream.template_info,
            "encoder": stream.encoder_info,
            "config": config,
            "counts": stream.stats.as_dict(),
            "shards": shards.shards,
            "rejected_file": REJECTED_NAME if had_rejections else None,
            "columns": {"input_ids": "list<int32>", "labels": "list<int32>", "length": "int32"},
        }
        with writing(tmp / MANIFEST_NAME):
            write_json_atomic(tmp / MANIFEST_NAME, manifest)
    return manifest
