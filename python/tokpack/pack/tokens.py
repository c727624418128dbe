"""``tokpack.pack_tokens``: token lists in, a pyarrow Table of packed rows out."""

from __future__ import annotations

import json
from typing import Any, Optional, Tuple, Union

import numpy as np
import pyarrow as pa

from .. import _tokpack
from .._checks import checked_threads
from .._io.arrays import as_arrow_column, list_array
from ..kinds import KINDS, kind_of_columns, kind_of_schema, refuse_kind
from ..packed.format import SHARD_COLUMNS
from .config import PackConfig, pack_config
from .plan import Plan

INPUT_IDS, LABELS, SEQ_LENGTHS, SAMPLE_IDS = SHARD_COLUMNS[:4]

__all__ = ["pack_tokens", "packed_table"]


def pack_tokens(
    input_ids: Any,
    max_len: Optional[int] = None,
    *,
    labels: Any = None,
    strategy: Optional[str] = None,
    overlong: Optional[str] = None,
    seed: Optional[int] = None,
    row_order: Optional[str] = None,
    threads: Optional[int] = None,
    return_plan: bool = False,
    config: Optional[PackConfig] = None,
) -> Union[pa.Table, Tuple[pa.Table, Plan]]:
    """Pack token sequences into rows of at most ``max_len`` tokens.

    Args:
        input_ids: a list column of integers (list or large_list; int32, int64, uint32, ...)
            as any Arrow array, chunked array or table that exports the Arrow C interface
            (pyarrow, polars, duckdb, nanoarrow ...), or a sequence of 1-D integer arrays /
            lists / tensors. From a table (or data frame), its ``input_ids`` column, and its
            ``labels`` column too when it has one and ``labels`` is not given.
        labels: optional, same shape as ``input_ids``: -100 (not trained on) or a token id,
            the same rule as :func:`tokpack.pack_files`.
        max_len, strategy, overlong, seed, row_order, config, threads: as in
            :func:`tokpack.plan` (the table's rows are the plan's, in its row order).
        return_plan: also return the :class:`tokpack.Plan` (to see dropped / truncated samples).

    Returns:
        A ``pyarrow.Table`` with one row per packed row, its columns named and typed as the
        packed shards' first columns: ``input_ids`` (list<int32>, unpadded), ``labels``
        (list<int32>, when labels were given), ``seq_lengths`` (list<int32>, the length of
        each packed segment in order) and ``sample_ids`` (list<int64>). The schema
        metadata ``tokpack`` holds the plan's figures as JSON.

    >>> t = pack_tokens([[1, 2, 3], [4, 5], [6, 7, 8, 9]], max_len=5)
    >>> t.column("seq_lengths").to_pylist()
    [[3, 2], [4]]
    >>> planned = pack_tokens([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 5, row_order="plan")
    >>> planned.column("seq_lengths").to_pylist()
    [[4], [3, 2]]
    """
    fields = dict(strategy=strategy, overlong=overlong, seed=seed, row_order=row_order)
    config = pack_config(max_len, config, fields)
    refuse_kind("pack_tokens", _kind_of(input_ids, config), "the table")
    rows = _tokpack.pack_tokens(
        input_ids=as_arrow_column(input_ids, INPUT_IDS),
        labels=None if labels is None else as_arrow_column(labels, LABELS),
        config=config,
        threads=checked_threads(threads),
    )
    plan = Plan._from_rust(rows.plan)
    table = packed_table(plan, rows.tokens, rows.labels, rows.row_offsets)
    return (table, plan) if return_plan else table


def _kind_of(data: Any, config: PackConfig) -> str:
    """The kind of samples of ``data``: a pyarrow table's by its metadata or columns
    (``kind_of_schema``), others' by their column names; prefix trees when ``config`` groups
    the sequences (``tree_group``)."""
    if config.tree_group is not None or config.tree_max_path is not None:
        return "tree"  # (the options of prefix trees)
    schema = getattr(data, "schema", None)
    if isinstance(schema, pa.Schema):
        # By its metadata only with the columns that make it a tree (a table whose media
        # columns were selected away keeps a multimodal shard's metadata: SFT by its columns).
        found = kind_of_schema(schema)
        if found is not None and found[0] == "tree" and KINDS["tree"].carried[0] in schema.names:
            return "tree"
    return kind_of_columns(_column_names(data))


def _column_names(data: Any) -> list:
    """A table's (pyarrow, polars, pandas) column names; none for a column or a sequence."""
    names = getattr(getattr(data, "schema", None), "names", None)
    if names is None:
        names = getattr(data, "columns", None)
    return [] if names is None else [str(n) for n in names]


def packed_table(
    plan: Plan, tokens: np.ndarray, labels: Optional[np.ndarray], row_offsets: np.ndarray
) -> pa.Table:
    """The in-memory packed-rows table, built over the Rust buffers without copying tokens."""
    columns = {INPUT_IDS: list_array(row_offsets, tokens, pa.int32())}
    if labels is not None:
        columns[LABELS] = list_array(row_offsets, labels, pa.int32())
    columns[SEQ_LENGTHS] = list_array(plan.bin_offsets, plan.lengths.astype(np.int32), pa.int32())
    columns[SAMPLE_IDS] = list_array(plan.bin_offsets, plan.sample_ids, pa.int64())
    scalars = (
        "strategy",
        "row_order",
        "max_len",
        "n_samples",
        "n_bins",
        "total_tokens",
        "lower_bound",
    )
    figures = {name: getattr(plan, name) for name in (*scalars, "efficiency")}
    figures.update((name, len(getattr(plan, name))) for name in ("dropped", "truncated", "split"))
    return pa.table(columns).replace_schema_metadata({"tokpack": json.dumps(figures)})
