"""Writing packed shards from Ray tasks, idempotently.

A shard task writes the shard and its index into a scratch directory of its own, then publishes
them into the output (:mod:`tokpack._io.store`: renamed into the run's temporary directory, or
uploaded to object storage), each file whole: a retried or duplicated task puts the same bytes
in place, a task killed half-way leaves only its scratch directory, which the driver removes
before the commit (:func:`remove_attempts`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from .. import _tokpack
from .._io.store import ATTEMPT_PREFIX, Out
from ..pack.config import PackConfig, PackReport

# A shard's samples: global ids (ascending), offsets from 0, int32 tokens, labels or None, and
# the carried columns (one row per sample) or None.
Held = Tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray], Optional[pa.Table]]


@dataclass(frozen=True)
class Rows:
    """The plan rows of one shard, as CSR arrays: ``bin_offsets`` from 0, global sample ids."""

    bin_offsets: np.ndarray
    sample_ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, plan: Any, first: int, end: int, id_base: int = 0) -> "Rows":
        """Rows ``first..end`` of ``plan``, sample ids shifted by ``id_base``."""
        a, b = int(plan.bin_offsets[first]), int(plan.bin_offsets[end])
        return cls(
            bin_offsets=plan.bin_offsets[first : end + 1] - a,
            sample_ids=plan.sample_ids[a:b] + id_base,
            starts=plan.starts[a:b],
            lengths=plan.lengths[a:b],
        )


def take(
    tokens: np.ndarray, offsets: np.ndarray, labels: Optional[np.ndarray], rows: np.ndarray
) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """The samples at ``rows`` (ascending) of flat columns, as new flat columns."""
    rows = np.asarray(rows, dtype=np.int64)
    sizes = offsets[rows + 1] - offsets[rows]
    out_offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    # One slice copy per run of consecutive rows: an index per token (a fancy-indexed gather)
    # costs ten times more than copying the runs whole.
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1] + 1
    last = np.ones(len(rows), dtype=bool)
    last[:-1] = first[1:]
    spans = list(zip(offsets[rows[first]].tolist(), offsets[rows[last] + 1].tolist()))

    def gather(values: np.ndarray) -> np.ndarray:
        return np.concatenate([values[a:b] for a, b in spans] or [values[:0]])

    return gather(tokens), out_offsets, None if labels is None else gather(labels)


def concat(pieces: Sequence[Held], has_labels: bool, carry: Optional[pa.Schema]) -> Held:
    """Pieces with ascending, disjoint id ranges, in order, as one held set (none: the empty
    shard of a run whose samples were all dropped)."""
    empty: Held = (
        np.zeros(0, np.int64),
        np.zeros(1, np.int64),
        np.zeros(0, np.int32),
        np.zeros(0, np.int32) if has_labels else None,
        None if carry is None else carry.empty_table(),
    )
    pieces = list(pieces) or [empty]
    ids = np.concatenate([p[0] for p in pieces])
    sizes = np.concatenate([np.diff(p[1]) for p in pieces])
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    tokens = np.concatenate([p[2] for p in pieces])
    labels = np.concatenate([p[3] for p in pieces]) if has_labels else None
    carried = None if carry is None else pa.concat_tables([p[4] for p in pieces])
    return ids, offsets, tokens, labels, carried


def write_shard(
    out: Out,
    shard: int,
    rows: Rows,
    held: Held,
    config: PackConfig,
    has_labels: bool,
    dest: str = "",
) -> Dict[str, Any]:
    """Writes ``part-<shard>.parquet`` and its index (in ``config``'s layout) and publishes them
    at ``dest`` of ``out``."""
    ids, offsets, tokens, labels, carried = held
    with out.scratch() as scratch:
        info = _tokpack.write_held_shard(
            out_dir=str(scratch),
            shard=shard,
            config=config,
            bin_offsets=np.ascontiguousarray(rows.bin_offsets, dtype=np.int64),
            sample_ids=np.ascontiguousarray(rows.sample_ids, dtype=np.int64),
            starts=np.ascontiguousarray(rows.starts, dtype=np.int64),
            lengths=np.ascontiguousarray(rows.lengths, dtype=np.int64),
            ids=np.ascontiguousarray(ids, dtype=np.int64),
            offsets=np.ascontiguousarray(offsets, dtype=np.int64),
            tokens=np.ascontiguousarray(tokens, dtype=np.int32),
            labels=np.ascontiguousarray(labels, dtype=np.int32) if has_labels else None,
            carried=[] if carried is None else list(zip(carried.column_names, carried.columns)),
        )
        out.publish(scratch, [info["index"], info["file"]], dest)
    return info


def accounting(
    plan: Any,
    config: PackConfig,
    shards: List[Dict[str, Any]],
    input_rows: List[int],
    has_labels: bool,
    id_base: int = 0,
) -> PackReport:
    """The report of a plan (made under ``config``) written as ``shards`` (sample ids +
    ``id_base``), with the static-shape figures of ``pack_files``' report when the config
    asks for a segment cap or aligned segments."""
    static: Dict[str, int] = {}
    if config.max_segments_per_row is not None:
        per_row = np.diff(plan.bin_offsets)
        static["max_row_segments"] = int(per_row.max()) if per_row.size else 0
    if config.align_segments > 1:
        static["alignment_padding_tokens"] = int((-plan.lengths % config.align_segments).sum())
    return PackReport(
        input_rows=input_rows,
        has_labels=has_labels,
        max_len=plan.max_len,
        n_samples=plan.n_samples,
        rows=plan.n_bins,
        segments=plan.n_segments,
        tokens=plan.total_tokens,
        input_tokens=plan.input_tokens,
        **{k: getattr(plan, k) + id_base for k in ("dropped", "empty", "truncated", "split")},
        shards=shards,
        **static,
    )


def remove_attempts(out_tmp: Path) -> None:
    """Removes what killed shard tasks left, so the output holds only listed files."""
    for entry in out_tmp.iterdir():
        if entry.name.startswith(ATTEMPT_PREFIX):
            shutil.rmtree(entry, ignore_errors=True)


def shard_ranges(n_rows: int, rows_per_shard: int) -> List[Tuple[int, int]]:
    """Plan rows of each shard, as ``pack_files`` cuts them (one empty shard when no rows)."""
    n_shards = max(1, -(-n_rows // rows_per_shard))
    return [
        (min(s * rows_per_shard, n_rows), min((s + 1) * rows_per_shard, n_rows))
        for s in range(n_shards)
    ]
