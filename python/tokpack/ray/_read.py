"""Reading a packed output with Ray: the dataset's input files (for the output's overlap
check), the files of a dataset that is a plain read of them (packed as those files), and a
packed directory, local or on object storage, as a ``ray.data.Dataset`` of rows
decoded by the checked reader."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray.data

from .._io.arrays import list_array
from .._io.store import MANIFEST_NAME
from ..errors import CorruptOutputError
from ..packed.reader import byte_range, decode_row_group


def dataset_inputs(ds: Any) -> List[str]:
    """The files and folders a dataset reads, from its plan (nothing is executed): its
    ``input_files()``, and the paths its read operators were given (Ray Data's Parquet reader
    lists its files only when it runs); empty when the plan cannot say."""
    found: List[str] = []
    with contextlib.suppress(Exception):
        found.extend(str(p) for p in ds.input_files())
    for op in plan_operators(ds):
        paths = getattr(op, "source_paths", None) or getattr(op, "paths", None)
        if isinstance(paths, (list, tuple)):
            found.extend(str(p) for p in paths)
    return found


def declared_schemas(ds: Any) -> Iterator[Any]:
    """The schemas Ray knows of a dataset without running it: the dataset's own, then its
    operators' (a read's: its files' schema, with their metadata)."""
    with contextlib.suppress(Exception):  # (a Ray whose schema() does not take the flag)
        declared = ds.schema(fetch_if_missing=False)
        yield getattr(declared, "base_schema", declared)
    for op in plan_operators(ds):
        yield getattr(op, "schema", None)


def plan_operators(ds: Any) -> List[Any]:
    """The operators of a dataset's logical plan, from the last; empty when the plan cannot
    be read (another Ray)."""
    found: List[Any] = []
    with contextlib.suppress(Exception):
        pending, seen = [ds._logical_plan.dag], set()
        while pending:
            op = pending.pop()
            if id(op) in seen:
                continue
            seen.add(id(op))
            found.append(op)
            pending.extend(getattr(op, "input_dependencies", None) or ())
    return found


# A Parquet read (``ray.data.read_parquet``) in Ray Data's logical plan: the listing of the paths
# given, then the read of the row groups listed. ``Repartition`` without a shuffle may follow:
# it only cuts the same rows into other blocks.
LIST_OP, READ_OP, REPARTITION_OP = "ListFiles", "ReadFiles", "Repartition"
PARQUET_READ = "ReadFilesParquet"  # the name of a read operator of Parquet files


def plain_read_files(ds: Any) -> Optional[List[str]]:
    """The paths a dataset reads when it is a plain read of local Parquet files, whose rows are
    exactly the files' rows (nothing filtered, projected, limited, shuffled or mapped; a
    ``path`` column of ``include_paths=True`` aside): ``ray.data.read_parquet(paths,
    include_paths=...)``, then ``repartition(n)`` without a shuffle. Else None: the plan is
    another, or not one this Ray writes as the read did (nothing is executed)."""
    try:
        op = ds._logical_plan.dag
        while type(op).__name__ == REPARTITION_OP:
            if op.shuffle or op.keys or op.sort:
                return None
            (op,) = op.input_dependencies
        if type(op).__name__ != READ_OP or not op.name.startswith(PARQUET_READ):
            return None
        scan = op.scanner
        (listing,) = op.input_dependencies
        if type(listing).__name__ != LIST_OP or listing.input_dependencies:
            return None
        local = isinstance(scan.filesystem, pafs.LocalFileSystem)
        unchanged = (
            scan.shuffle,
            scan.columns,
            scan.predicate,
            scan.limit,
            scan.partition_predicate,
            listing.partition_filter,
            listing.predicate,
            listing.limit,
            listing.projected_columns,
            op.block_udf,
        )
        added = {type(c).__name__ for c in scan.synthesized_columns} - {"PathColumn"}
        if not local or any(v is not None for v in unchanged) or added:
            return None
        return [str(p) for p in listing.paths]
    except Exception:  # another Ray's plan: not known to be a plain read
        return None


def read_checked_shards(
    shards: Sequence[Dict[str, Any]], root: str, fs: Any, columns: Optional[Sequence[str]]
) -> Any:
    """A ``ray.data.Dataset`` of the shards, one task per shard, each row group decoded by the
    checked reader (``packed_dir.decode_row_group``: its bytes and the footer against the
    manifest's checksums), so a damaged shard raises :class:`CorruptOutputError` naming it
    instead of yielding other tokens. A shard on object storage is downloaded whole first."""
    items = [{"shard": json.dumps(s)} for s in shards]
    return ray.data.from_items(items, override_num_blocks=max(len(items), 1)).map_batches(
        _read_shards,  # type: ignore[arg-type]
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={"root": root, "fs": fs, "columns": list(columns) if columns else None},
    )


def _read_shards(batch: Any, root: str, fs: Any, columns: Optional[List[str]]) -> Any:
    tables = [
        _read_shard(json.loads(text), root, fs, columns)
        for text in batch.column("shard").to_pylist()
    ]
    return pa.concat_tables(tables) if len(tables) != 1 else tables[0]


def _read_shard(shard: Dict[str, Any], root: str, fs: Any, columns: Optional[List[str]]) -> Any:
    name = shard["file"]
    try:
        size = int(shard["size"])
        footer = byte_range(shard["footer_bytes"])
        groups = [byte_range(r) for r in shard["row_group_bytes"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptOutputError(f"{root}/{MANIFEST_NAME}: shard {name}: field {exc}") from None
    with _local_copy(root, name, fs) as path:
        tables: List[Any] = []
        for g, group in enumerate(groups):
            decoded = decode_row_group(path, g, columns or _names(path), (size, footer, group))
            if not tables:  # the footer was checked with the first row group
                schema = pq.read_schema(path)
                names = list(decoded)
            arrays = []
            for col in names:
                field = schema.field(col)
                if isinstance(decoded[col], tuple):
                    values, offsets = decoded[col]
                    lists = list_array(offsets, values, field.type.value_type)
                    arrays.append(lists.cast(field.type))
                else:
                    arrays.append(pa.array(decoded[col], type=field.type))
            tables.append(pa.Table.from_arrays(arrays, names=names))
        if not tables:  # an empty shard (every sample dropped): its schema only
            schema = pq.read_schema(path)
            if columns:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables)


def _names(path: str) -> List[str]:
    try:
        return list(pq.read_schema(path).names)
    except Exception as exc:
        raise CorruptOutputError(f"{path}: not a readable shard ({exc})") from None


@contextlib.contextmanager
def _local_copy(root: str, name: str, fs: Any) -> Iterator[str]:
    """The shard as a local file: itself, or downloaded from the store into a temporary file."""
    if fs is None:
        yield os.path.join(root, name)
        return
    with tempfile.TemporaryDirectory(prefix="tokpack-ray-read-") as d:
        path = os.path.join(d, "shard.parquet")
        try:
            with fs.open_input_stream(f"{root}/{name}") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        except FileNotFoundError:
            raise CorruptOutputError(f"{root}/{name}: listed in the manifest but missing") from None
        yield path
