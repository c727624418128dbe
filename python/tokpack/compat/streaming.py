"""``streaming_dataset_reader``: the token-packing guide's streaming generator.

Reads Parquet and Arrow IPC files record batch by record batch (never a whole file), so memory
stays bounded by one batch plus one decoded record batch whatever the corpus size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, List

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from .._checks import MAX_ROWS, check_int
from .._io.inputs import TOKEN_SUFFIXES, PathsLike, is_parquet, resolve_inputs
from ..errors import DataError

__all__ = ["streaming_dataset_reader"]


def _record_batches(path: Path, batch_size: int) -> Iterator[pa.RecordBatch]:
    if is_parquet(path):
        yield from pq.ParquetFile(path, memory_map=True).iter_batches(batch_size=batch_size)
        return
    source = pa.memory_map(str(path))
    try:
        reader = ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    except pa.ArrowInvalid:
        # HF datasets' cache files use the IPC stream format, not the file format.
        source.seek(0)
        yield from ipc.open_stream(source)


def streaming_dataset_reader(
    data_path: PathsLike, batch_size: int = 1000
) -> Iterator[Dict[str, List[Any]]]:
    """Yield ``{column: [values of batch_size rows]}`` from Parquet/Arrow files, in file order.

    ``data_path`` is a file, a directory (its ``*.parquet``/``*.pq``/``*.arrow``/``*.feather``/
    ``*.ipc`` files, recursively, sorted, skipping names starting with ``_`` or ``.``), a glob, or
    a list of them: the inputs of ``tokpack pack``. Batches span file boundaries, so
    every batch has exactly ``batch_size`` rows except the last. All files must share the first
    file's columns.

    >>> for batch in streaming_dataset_reader("data/", batch_size=100):  # doctest: +SKIP
    ...     buffer.extend(batch["input_ids"])
    """
    batch_size = check_int(batch_size, "batch_size", 1, MAX_ROWS)
    pending: List[pa.RecordBatch] = []
    pending_rows = 0
    columns = None
    for path in resolve_inputs(data_path, TOKEN_SUFFIXES):
        try:
            for rb in _record_batches(path, batch_size):
                if columns is None:
                    columns = rb.schema.names
                elif rb.schema.names != columns:
                    raise DataError(
                        f"{path}: columns {rb.schema.names} differ from the first file's {columns}"
                    )
                while rb.num_rows:
                    take = min(batch_size - pending_rows, rb.num_rows)
                    pending.append(rb.slice(0, take))
                    pending_rows += take
                    rb = rb.slice(take)
                    if pending_rows == batch_size:
                        yield _to_columns(pending, columns)
                        pending, pending_rows = [], 0
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: cannot read as Parquet/Arrow ({exc})") from None
    if pending_rows:
        yield _to_columns(pending, columns)  # type: ignore[arg-type]


def _to_columns(parts: List[pa.RecordBatch], columns: List[str]) -> Dict[str, List[Any]]:
    table = pa.Table.from_batches(parts)
    return {name: table.column(name).to_pylist() for name in columns}
