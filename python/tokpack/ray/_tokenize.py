"""``tokpack.ray.tokenize``: raw records to token rows as a Ray Data ``map_batches`` stage.

Each actor loads the tokenizer once and runs ``tokpack tokenize``'s own pipeline
(:func:`tokpack.tokenize_to_batches`) on every batch it receives, staged as a small Parquet
file, so a record gets exactly the ids and labels ``tokpack tokenize`` gives it. Rejected
records (``skip_invalid=True``) are written to JSONL side files under ``rejected_dir``, one per
batch that had any, renamed into place when complete: counted, never lost.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import ConfigError
from ..tokenize import TOKEN_SCHEMA, load_tokenizer, tokenize_to_batches
from ._blocks import DATASET_SOURCE


class _Tokenize:
    """The ``map_batches`` callable: the tokenizer is loaded once per actor."""

    def __init__(
        self, tokenizer: str, options: Dict[str, Any], rejected_dir: Optional[str]
    ) -> None:
        self.tokenizer = load_tokenizer(tokenizer)
        self.options = options
        self.rejected_dir = rejected_dir

    def __call__(self, batch: pa.Table) -> pa.Table:
        # Staged in a directory removed after each batch: an actor leaves nothing behind.
        with tempfile.TemporaryDirectory(prefix="tokpack-ray-tokenize-") as scratch:
            staged = Path(scratch) / "batch.parquet"
            pq.write_table(batch, staged)
            rejected: List[Dict[str, Any]] = []
            stream = tokenize_to_batches(
                [staged], self.tokenizer, threads=1, on_reject=rejected.append, **self.options
            )
            out = pa.Table.from_batches(list(stream), schema=TOKEN_SCHEMA)
        if rejected:
            self._write_rejected(rejected)
        return out

    def _write_rejected(self, rejected: List[Dict[str, Any]]) -> None:
        assert self.rejected_dir is not None  # checked by tokenize(): skip_invalid needs it
        name = f"rejected-{secrets.token_hex(8)}.jsonl"
        tmp = Path(self.rejected_dir) / f".{name}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for r in rejected:  # the records of a batch have no file: the dataset stands in
                f.write(json.dumps({**r, "file": DATASET_SOURCE}, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, Path(self.rejected_dir) / name)


def tokenize(
    ds: Any,
    tokenizer: Union[str, os.PathLike],
    *,
    rejected_dir: Optional[Union[str, os.PathLike]] = None,
    concurrency: int = 1,
    batch_size: int = 2048,
    **options: Any,
) -> Any:
    """Tokenize a dataset of raw records (chat ``messages``, sharegpt, alpaca or ``text``
    columns) into rows ``input_ids``, ``labels``, ``length``, in the records' order when the
    dataset is consumed with ``preserve_order`` (as :func:`tokpack.ray.pack` does), with the
    ids and labels ``tokpack tokenize`` gives (lazy: a Ray Data ``map_batches`` stage).

    Args:
        tokenizer: a ``tokenizer.json`` file or its directory, readable on every node.
        rejected_dir: with ``skip_invalid=True``, the directory (on a file system every node
            sees) receiving the rejected records as ``rejected-*.jsonl`` (required then).
        concurrency: tokenizer actors.
        batch_size: records per ``map_batches`` call.
        options: those of :func:`tokpack.tokenize_to_batches` (format, chat_template,
            train_on, max_len, overlong, add_eos, columns, skip_invalid, encoder).
    """
    for name in ("threads", "on_reject", "sources", "progress"):
        if name in options:
            raise ConfigError(f"tokpack.ray.tokenize does not take {name!r}")
    if options.get("skip_invalid") and rejected_dir is None:
        raise ConfigError("skip_invalid=True needs rejected_dir, where rejected records go")
    if rejected_dir is not None:
        Path(rejected_dir).mkdir(parents=True, exist_ok=True)
    path = str(Path(tokenizer).resolve())
    load_tokenizer(path)  # a bad tokenizer fails here, not in every actor
    return ds.map_batches(
        _Tokenize,
        fn_constructor_args=(path, options, None if rejected_dir is None else str(rejected_dir)),
        batch_format="pyarrow",
        batch_size=batch_size,
        concurrency=concurrency,
        udf_modifying_row_count=True,
    )
