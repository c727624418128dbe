"""The samples of a Ray pack, block by block, each with its identity.

Token files given by path (what ``tokpack pack --ray`` reads), or a dataset that is a plain read
of them (:func:`tokpack.ray._read.plain_read_files`), are read by Ray tasks one row group (a
:class:`Unit`) at a time, and sample ``i`` is the ``i``-th row across the files in the order
given, as ``tokpack pack`` numbers them: a unit's first sample comes from the files' footers,
never from the order in which tasks finish (``ray.data.read_parquet`` bin-packs row groups into
read tasks as their footers arrive, so its order of a file's rows differs between clusters and
runs). Any other ``ray.data.Dataset`` has no other identity than its order: sample ``i`` is its
``i``-th row, its blocks taken with ``preserve_order`` on, and messages and the dropped list name
that row of the dataset, never a file (a ``path`` column says which file a row came from, not
which row of it).

Blocks (global mode: their flattened samples) stay in Ray's object store (spilled to disk when
large), the distributed counterpart of ``tokpack pack``'s spill files.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Iterator, List, Optional, Tuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray.data.block import BlockAccessor

from .. import _tokpack
from .._io.inputs import shown_path
from ..errors import CorruptInputError, DataError, SchemaError, TokpackError
from ..kinds import KIND_KEY, KINDS, kind_of_schema, kind_of_shards, refuse_kind
from ..pack.config import PackConfig
from ._read import declared_schemas

# A dataset made with ``ray.data.read_json(..., include_paths=True)`` names each row's file
# (:func:`tokpack.ray.tokenize`'s rejected records give it).
PATH_COLUMN = "path"
# A dataset that is not a plain read of files stands for one input: the dropped list and the
# rejected records give each sample's row in the dataset.
DATASET_SOURCE = "<ray.data.Dataset>"


@dataclass(frozen=True)
class Columns:
    """Which columns hold the tokens and the labels (or the 0/1 loss mask), and the carried
    columns (with their types: an empty shard still has them)."""

    tokens: str
    labels: Optional[str]
    mask: bool = False
    carry: Optional[pa.Schema] = None

    def carried(self) -> List[str]:
        return self.carry.names if self.carry is not None else []

    def names(self) -> List[str]:
        return [self.tokens] + ([self.labels] if self.labels else []) + self.carried()


@dataclass(frozen=True)
class Unit:
    """One row group of an input file, read by one task: rows ``first_row ..`` of file
    ``path``, samples ``first_sample ..`` of the run."""

    path: str
    row_group: int
    first_row: int
    rows: int
    first_sample: int

    def read(self, columns: Columns) -> pa.Table:
        return pq.ParquetFile(self.path).read_row_group(self.row_group, columns=columns.names())

    def where(self) -> str:
        return f"{shown_path(self.path)}, row group {self.row_group} (rows from {self.first_row})"


def file_units(paths: List[Any]) -> Tuple[List[Unit], List[int]]:
    """The row groups of the Parquet files ``paths`` in order (a file given twice is read
    twice, as by ``tokpack pack``), and each file's rows, from their footers."""
    units: List[Unit] = []
    file_rows: List[int] = []
    first = 0
    for path in paths:
        meta = pq.read_metadata(path)
        row = 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            units.append(Unit(str(path), g, row, n, first))
            row, first = row + n, first + n
        file_rows.append(row)
    return units, file_rows


def ordered_blocks(ds: Any) -> List[Any]:
    """The dataset's blocks as Arrow tables in the object store, in the dataset's order."""
    with _in_order(ds):
        return ds.to_arrow_refs()


def streamed(ds: Any) -> Iterator[Any]:
    """The dataset's blocks in its order, as its execution yields them: unlike
    :func:`ordered_blocks`, the dataset keeps none of them, so a block leaves the store once
    its consumers are done, and the first blocks are used while the last are read."""
    # The execution starts at the first block: preserve_order must hold until the last.
    with _in_order(ds):
        for bundle in ds.iter_internal_ref_bundles():
            yield from bundle.block_refs


@contextlib.contextmanager
def _in_order(ds: Any) -> Iterator[None]:
    """Executes the dataset with ``preserve_order`` on (blocks in the dataset's order)."""
    options = ds.context.execution_options
    kept = options.preserve_order
    options.preserve_order = True
    try:
        yield
    finally:
        options.preserve_order = kept


# A block's samples: flat int32 tokens, int64 offsets from 0, labels or None, and the carried
# columns (a table, one row per sample) or None.
Flat = Tuple[np.ndarray, np.ndarray, Optional[np.ndarray], Optional[pa.Table]]


def sample_arrays(table: pa.Table, columns: Columns) -> Flat:
    """The block's samples as checked flat int32 tokens, int64 offsets from 0 and labels
    (made from the loss mask when there is one), and its carried columns, by the core's rules
    for files. Raises DataError / SchemaError naming the block-relative row and the column."""
    for name in columns.names():
        if name not in table.column_names:
            raise SchemaError(f"no column {name!r} (columns: {', '.join(table.column_names)})")
    tokens, offsets, labels = _tokpack.flatten_samples(
        table=table.select(columns.names()),
        tokens_column=columns.tokens,
        labels_column=None if columns.mask else columns.labels,
        mask_column=columns.labels if columns.mask else None,
        carry=columns.carried(),
    )
    carried = table.select(columns.carried()) if columns.carry is not None else None
    return tokens, offsets, labels, carried


@dataclass
class Measured:
    """What a pass over the blocks learns, in order: every sample's length, the first sample
    of every block (and the total at the end), the inputs and their rows (the files, or the
    dataset as one input), the columns read, and where each block's samples are."""

    lengths: np.ndarray
    bases: np.ndarray
    files: List[str]
    file_rows: List[int]
    columns: Columns
    # Each block's flattened samples (tokens, offsets, labels) in the object store.
    flats: List[Any]


@ray.remote(num_returns=2)
def _measure(block: Any, columns: Columns) -> Any:
    """Lengths of a block's (or a :class:`Unit`'s) samples (values checked); then the block's
    flattened samples, kept in the store for the write (so the samples are flattened once). A
    TokpackError is returned, not raised, so the driver can name the block's samples."""
    table = read_block(block, columns)
    try:
        flat = sample_arrays(table, columns)
    except TokpackError as exc:
        return exc, None
    return np.diff(flat[1]), flat


def read_block(block: Any, columns: Columns) -> pa.Table:
    """A dataset's block, or a unit of a file read, as an Arrow table."""
    return block.read(columns) if isinstance(block, Unit) else _arrow(block)


def block_error(exc: TokpackError, block: Any, j: int, base: int) -> TokpackError:
    """``exc`` from inside block ``j`` (a :class:`Unit` or a dataset's block; first sample
    ``base``), as the driver raises it."""
    if isinstance(block, Unit):
        return type(exc)(f"{block.where()}: {exc}")
    return type(exc)(f"ray dataset block {j} (samples from {base}): {exc}")


Tasks = TypeVar("Tasks", bound=Collection[Any])


@contextlib.contextmanager
def cancelling(tasks: Tasks) -> Iterator[Tasks]:
    """Cancels ``tasks`` (as they stand then) when the block fails or is interrupted."""
    try:
        yield tasks
    except BaseException:
        for ref in tasks:
            ray.cancel(ref, force=True)
        raise


def measure(
    blocks: Iterable[Any], columns: Columns, files: Optional[Tuple[List[str], List[int]]] = None
) -> Measured:
    """Lengths of every sample in order (8 bytes a sample on the driver). Each block (a ref
    of a dataset streaming in, or a :class:`Unit` of ``files``: paths and their rows) is
    measured as it comes, and then dropped: what stays in the store is its flattened samples."""
    measured, units = [], []
    for block in blocks:
        measured.append(_measure.remote(block, columns))
        units.append(block if isinstance(block, Unit) else None)
        del block  # (a dataset's block is held by its task alone)
    results = ray.get([m[0] for m in measured])  # type: ignore[index]
    bases = np.zeros(len(results) + 1, dtype=np.int64)
    for j, result in enumerate(results):
        if isinstance(result, TokpackError):
            raise block_error(result, units[j], j, int(bases[j]))
        unit = units[j]
        if unit is not None and (len(result), bases[j]) != (unit.rows, unit.first_sample):
            raise CorruptInputError(f"{unit.where()}: its footer says {unit.rows} rows")
        bases[j + 1] = bases[j] + len(result)
    if int(bases[-1]) == 0:
        raise DataError("the inputs hold no samples")
    files = files or dataset_source(int(bases[-1]))
    return Measured(
        lengths=np.concatenate(results).astype(np.int64, copy=False),
        bases=bases,
        files=files[0],
        file_rows=files[1],
        columns=columns,
        flats=[m[1] for m in measured],  # type: ignore[index]
    )


def dataset_source(total: int) -> Tuple[List[str], List[int]]:
    """A dataset that is not a plain read of files, as the one input of ``total`` rows."""
    return [DATASET_SOURCE], [total]


def file_columns(paths: List[Any], config: PackConfig) -> Tuple[str, PackConfig, Columns]:
    """The kind of samples of the token files ``paths``, ``config`` for that kind, and the
    columns to read, by ``tokpack pack``'s rules and with its errors (one kind; labels used when
    the inputs have them, a file without them among files with them named; KTO's ``label``
    carried)."""
    kind = kind_of_shards(paths)
    refuse_kind("ray", kind, shown_path(paths[0]))
    config = config.for_kind(kind, shown_path(paths[0]))
    labels = _tokpack.input_columns(paths=[str(p) for p in paths], config=config)
    schema = pq.read_schema(paths[0])
    carry = pa.schema([schema.field(c) for c in config.carry]) if config.carry else None
    label, mask = labels or (None, False)
    return kind, config, Columns(config.tokens_column, label, mask=mask, carry=carry)


def dataset_columns(
    ds: Any, refs: List[Any], config: PackConfig
) -> Tuple[str, PackConfig, Columns]:
    """The kind of samples of a dataset, ``config`` for that kind, and the columns to read, by
    ``pack_files``' rules on the dataset's schema: the kind by :func:`kind_of_schema`; a loss
    mask when given; else the labels column when the dataset has it (a name other than
    ``"labels"`` must exist); KTO's ``label`` carried. Preference pairs are refused."""
    schema = dataset_schema(ds, refs)
    found = kind_of_schema(schema)
    kind = "sft" if found is None else found[0]
    refuse_kind("ray", kind, "the ray dataset")
    config = config.for_kind(kind, DATASET_SOURCE)
    for name in config.carry:
        if name not in schema.names:
            raise SchemaError(f"no column {name!r} to carry (columns: {', '.join(schema.names)})")
    carry = pa.schema([schema.field(c) for c in config.carry]) if config.carry else None
    tokens, labels, mask = config.tokens_column, config.labels_column, config.loss_mask_column
    if mask is not None:
        return kind, config, Columns(tokens, mask, mask=True, carry=carry)
    if labels in schema.names or labels not in (None, "labels"):
        return kind, config, Columns(tokens, labels, carry=carry)
    return kind, config, Columns(tokens, None, carry=carry)


def dataset_schema(ds: Any, refs: List[Any]) -> pa.Schema:
    """The columns of the dataset's first block (``refs[0]``), with the kind of samples (the
    ``tokpack.kind`` metadata of KTO and preference shards) its sources declare when the block
    has lost it but still has every column of that kind: Ray's Parquet reader drops the files'
    metadata from its blocks, and a ``map_batches`` from the dataset's schema, while the read
    operator keeps the files' schema."""
    schema = ray.get(_schema.remote(refs[0])) if refs else pa.schema([])
    if KIND_KEY in (schema.metadata or {}):
        return schema
    for declared in declared_schemas(ds):
        if not isinstance(declared, pa.Schema):
            continue
        kind = (declared.metadata or {}).get(KIND_KEY, b"").decode(errors="replace")
        if kind in KINDS and set(KINDS[kind].inputs) <= set(schema.names):
            return schema.with_metadata({**(schema.metadata or {}), KIND_KEY: kind.encode()})
    return schema


def _arrow(block: Any) -> pa.Table:
    """A block as an Arrow table (a dataset's blocks may be pandas frames)."""
    return block if isinstance(block, pa.Table) else BlockAccessor.for_block(block).to_arrow()


@ray.remote
def _schema(block: Any) -> pa.Schema:
    return _arrow(block).schema
