"""``tokpack.ray.tokenize``: raw records to token rows as a Ray Data ``map_batches`` stage.

Each actor loads the tokenizer once and runs ``tokpack tokenize``'s own pipeline
(:func:`tokpack.tokenize_to_batches`) on every batch it receives, staged as a small Parquet
file, so a record gets exactly the ids and labels ``tokpack tokenize`` gives it. The format
(with ``"auto"``: from the dataset's first record, as ``tokpack tokenize`` takes it from its
first file's) is fixed for the run, so every batch has the columns of its kind (SFT,
preference or KTO). Rejected records (``skip_invalid=True``) are written to JSONL side files
under ``rejected_dir``, one per batch that had any, renamed into place when complete: counted,
never lost.
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
from ..kinds import KINDS, refuse_kind
from ..tokenize import tokenize_to_batches
from ..tokenize.formats import detect_format, resolve_columns
from ..tokenize.options import TokenizeOptions
from ..tokenize.pipeline import RecordEncoder
from ..tokenize.schema import token_schema
from ._blocks import DATASET_SOURCE, PATH_COLUMN


class _Tokenize:
    """The ``map_batches`` callable: the tokenizer is loaded once per actor."""

    def __init__(
        self, tokenizer: str, options: TokenizeOptions, rejected_dir: Optional[str]
    ) -> None:
        self.encoding = RecordEncoder(tokenizer, options)
        self.schema = token_schema(self.encoding.kind)
        self.rejected_dir = rejected_dir

    def __call__(self, batch: pa.Table) -> pa.Table:
        # Staged in a directory removed after each batch: an actor leaves nothing behind.
        with tempfile.TemporaryDirectory(prefix="tokpack-ray-tokenize-") as scratch:
            staged = Path(scratch) / "batch.parquet"
            pq.write_table(batch, staged)
            rejected: List[Dict[str, Any]] = []
            stream = tokenize_to_batches(
                [staged], self.encoding, threads=1, on_reject=rejected.append
            )
            out = pa.Table.from_batches(list(stream), schema=self.schema)
        if rejected:
            self._write_rejected(rejected, batch)
        return out

    def _write_rejected(self, rejected: List[Dict[str, Any]], batch: pa.Table) -> None:
        assert self.rejected_dir is not None  # checked by tokenize(): skip_invalid needs it
        paths = batch.column(PATH_COLUMN) if PATH_COLUMN in batch.column_names else None
        name = f"rejected-{secrets.token_hex(8)}.jsonl"
        tmp = Path(self.rejected_dir) / f".{name}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for r in rejected:
                # Its row in the batch means nothing outside it (Ray Data numbers no rows): the
                # record names its source by the dataset's path column, and by its content.
                row = r.pop("row", None)
                known = paths is not None and row is not None
                r["file"] = paths[row].as_py() if known else DATASET_SOURCE  # type: ignore[index]
                f.write(json.dumps(r, sort_keys=True) + "\n")
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
    chosen = TokenizeOptions.of(None, **options)
    if chosen.skip_invalid and rejected_dir is None:
        raise ConfigError("skip_invalid=True needs rejected_dir, where rejected records go")
    if chosen.format == "auto":
        first = ds.take(1)
        columns = resolve_columns(chosen.columns)
        chosen = chosen.for_first_format(detect_format(first[0], columns) if first else None)
    if KINDS[chosen.kind].trees:
        # A tree sample's group is its record's position in the run; a Ray dataset's blocks
        # number no records (tokpack tokenize --ray does: its records are read in one place).
        refuse_kind("ray", chosen.kind, "the dataset given to tokpack.ray.tokenize")
    if rejected_dir is not None:
        Path(rejected_dir).mkdir(parents=True, exist_ok=True)
    path = str(Path(tokenizer).resolve())
    RecordEncoder(path, chosen)  # a bad tokenizer or option fails here, not in every actor
    return ds.map_batches(
        _Tokenize,
        fn_constructor_args=(path, chosen, None if rejected_dir is None else str(rejected_dir)),
        batch_format="pyarrow",
        batch_size=batch_size,
        concurrency=concurrency,
        udf_modifying_row_count=True,
    )
