"""The blocks of a Ray dataset in input order, and the samples inside them.

Sample ``i`` is the ``i``-th row of the dataset in its order (for ``ray.data.read_parquet``:
the ``i``-th row across the files, as ``tokpack pack`` numbers them). The blocks are taken with
``preserve_order`` on, so their order is the dataset's whatever the cluster or the scheduling;
they (global mode: their flattened samples) stay in Ray's object store (spilled to disk when
large), the distributed counterpart of ``tokpack pack``'s spill files.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import ray
from ray.data.block import BlockAccessor

from .. import _tokpack
from ..errors import ConfigError, DataError, SchemaError, TokpackError
from ..tokenize.schema import kind_of_schema

# A dataset made with ``ray.data.read_parquet(..., include_paths=True)`` names each row's file:
# the dropped-samples list then gives the file and row, as ``tokpack pack`` does.
PATH_COLUMN = "path"
# Without it, the dataset stands for the input file: the dropped list and the rejected records
# then give each sample's row in the dataset.
DATASET_SOURCE = "<ray.data.Dataset>"


@dataclass(frozen=True)
class Columns:
    """Which columns hold the tokens and the labels (or the 0/1 loss mask)."""

    tokens: str
    labels: Optional[str]
    mask: bool = False

    def names(self) -> List[str]:
        return [self.tokens] + ([self.labels] if self.labels else [])


def ordered_blocks(ds: Any) -> List[Any]:
    """The dataset's blocks as Arrow tables in the object store, in the dataset's order."""
    with _in_order(ds):
        return ds.to_arrow_refs()


def _streamed(ds: Any) -> Iterator[Any]:
    """The dataset's blocks in its order, as its execution yields them: unlike
    :func:`ordered_blocks`, the dataset keeps none of them, so a block leaves the store once
    its consumers are done, and the first blocks are used while the last are read."""
    with _in_order(ds):
        bundles = ds.iter_internal_ref_bundles()
    for bundle in bundles:
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


def sample_arrays(
    table: pa.Table, columns: Columns
) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """The block's samples as checked flat int32 tokens, int64 offsets from 0 and labels
    (made from the loss mask when there is one), by the core's rules for files. Raises
    DataError / SchemaError naming the block-relative row and the column."""
    for name in columns.names():
        if name not in table.column_names:
            raise SchemaError(f"no column {name!r} (columns: {', '.join(table.column_names)})")
    return _tokpack.flatten_samples(
        table=table.select(columns.names()),
        tokens_column=columns.tokens,
        labels_column=None if columns.mask else columns.labels,
        mask_column=columns.labels if columns.mask else None,
    )


@dataclass
class Measured:
    """What a pass over the blocks learns, in order: every sample's length, the first sample
    of every block (and the total at the end), the rows of each named source file, the
    columns read, and where each block's samples are."""

    lengths: np.ndarray
    bases: np.ndarray
    files: List[str]
    file_rows: List[int]
    columns: Columns
    # Each block's flattened samples (tokens, offsets, labels) in the object store.
    flats: List[Any]


@ray.remote(num_returns=2)
def _measure(block: Any, columns: Columns) -> Any:
    """Lengths of a block's samples (values checked) and its run-length encoded source paths;
    then the block's flattened samples, kept in the store for the write (so the samples are
    flattened once). A TokpackError is returned, not raised, so the driver can name the
    block's samples."""
    table = _arrow(block)
    try:
        flat = sample_arrays(table, columns)
    except TokpackError as exc:
        return exc, None
    paths = table.column(PATH_COLUMN).to_pylist() if PATH_COLUMN in table.column_names else []
    return (np.diff(flat[1]), _runs((path, 1) for path in paths)), flat


def _runs(counted: Iterable[Tuple[Any, int]]) -> List[Tuple[Any, int]]:
    """``(value, count)`` pairs with the counts of consecutive equal values added up."""
    out: List[Tuple[Any, int]] = []
    for value, count in counted:
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + count)
        else:
            out.append((value, count))
    return out


def block_error(exc: TokpackError, block: int, base: int) -> TokpackError:
    """``exc`` from inside block ``block`` (first sample ``base``), as the driver raises it."""
    return type(exc)(f"ray dataset block {block} (samples from {base}): {exc}")


@contextlib.contextmanager
def cancelling(tasks: List[Any]) -> Iterator[List[Any]]:
    """Cancels ``tasks`` (as they stand then) when the block fails or is interrupted."""
    try:
        yield tasks
    except BaseException:
        for ref in tasks:
            ray.cancel(ref, force=True)
        raise


def measure(ds: Any, names: Tuple[str, Optional[str], Optional[str]]) -> Measured:
    """Lengths of every sample in order (8 bytes a sample on the driver), with the columns
    ``names`` (tokens, labels, loss mask) resolve to. Each block is measured as the dataset
    streams it in, and then dropped: what stays in the store is its flattened samples."""
    blocks = _streamed(ds)
    first = next(blocks, None)
    head = [] if first is None else [first]
    columns = resolve_columns(head, *names)
    measured = [_measure.remote(ref, columns) for ref in itertools.chain(head, blocks)]
    del first, head
    results = ray.get([m[0] for m in measured])
    bases = np.zeros(len(results) + 1, dtype=np.int64)
    for j, result in enumerate(results):
        if isinstance(result, TokpackError):
            raise block_error(result, j, int(bases[j]))
        bases[j + 1] = bases[j] + len(result[0])
    base = int(bases[-1])
    if base == 0:
        raise DataError("the ray dataset holds no samples")
    runs = _runs(run for _, block_runs in results for run in block_runs)
    files = [r[0] for r in runs]
    if len(set(files)) != len(files) or (runs and sum(r[1] for r in runs) != base):
        raise ConfigError(
            f"the dataset's {PATH_COLUMN!r} column does not name whole files in order; "
            "read the files with ray.data.read_parquet(..., include_paths=True) and no shuffle"
        )
    return Measured(
        lengths=np.concatenate([r[0] for r in results]).astype(np.int64, copy=False),
        bases=bases,
        files=files,
        file_rows=[r[1] for r in runs],
        columns=columns,
        flats=[m[1] for m in measured],
    )


def resolve_columns(
    refs: List[Any],
    tokens_column: str,
    labels_column: Optional[str],
    loss_mask_column: Optional[str],
) -> Columns:
    """The columns to read, with ``pack_files``' rule: a loss mask when given; else the labels
    column when the dataset has it (a name other than ``"labels"`` must exist). Preference
    pairs (by the first block's schema, as ``tokpack pack`` tells them) are refused."""
    schema = ray.get(_schema.remote(refs[0])) if refs else pa.schema([])
    found = kind_of_schema(schema)
    if found is not None and found[0] == "preference":
        raise ConfigError(
            f"the ray dataset holds preference pairs ({found[1]}): pairs are not supported "
            "with --ray, use tokpack pack"
        )
    if loss_mask_column is not None:
        return Columns(tokens_column, loss_mask_column, mask=True)
    if labels_column in schema.names or labels_column not in (None, "labels"):
        return Columns(tokens_column, labels_column)
    return Columns(tokens_column, None)


def _arrow(block: Any) -> pa.Table:
    """A block as an Arrow table (a dataset's blocks may be pandas frames)."""
    return block if isinstance(block, pa.Table) else BlockAccessor.for_block(block).to_arrow()


@ray.remote
def _schema(block: Any) -> pa.Schema:
    return _arrow(block).schema
