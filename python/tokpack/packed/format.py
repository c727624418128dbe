"""The packed-directory format on the Python side: its names (defined once, in tokpack-core's
``format`` module), a packed directory's manifest (read and written by ``_io.manifest``, the
manifest of every output) and the one writer of the dropped-samples list. ``docs/format.md``
specifies the format; ``manifest.schema.json`` (beside this module) is the manifest's JSON
Schema, versioned with ``FORMAT_VERSION``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa

from .._io.inputs import is_parquet, shown_path
from .._tokpack import (
    DROPPED_NAME,
    FORMAT,
    FORMAT_VERSION,
    INDEX_COLUMNS,
    KTO_LABEL,
    MANIFEST_NAME,
    MEDIA_COLUMNS,
    REJECTED_NAME,
    SHARD_COLUMNS,
    SIDE_DIR,
    PackReport,
    file_checksum,
)

__all__ = [
    "DROPPED_NAME",
    "FORMAT",
    "FORMAT_VERSION",
    "INDEX_COLUMNS",
    "KTO_LABEL",
    "MANIFEST_NAME",
    "PAIR_SHARD_COLUMNS",
    "MEDIA_COLUMNS",
    "NO_SAFE_CUT",
    "REJECTED_NAME",
    "ROW_COLUMNS",
    "SHARD_COLUMNS",
    "SIDE_DIR",
    "manifest_schema",
    "packed_manifest",
    "write_dropped",
]

# The dropped list's reason of a multimodal sample with no safe cut (the core's other reasons
# are its own).
NO_SAFE_CUT = "no_safe_cut"
SCHEMA_FILE = Path(__file__).with_name("manifest.schema.json")

# Groups of the core's SHARD_COLUMNS (in its order; tests/test_contract.py pins them): the
# per-segment lists every reader decodes (``input_ids``, ``labels``, ``seq_lengths``,
# ``sample_ids``), and what preference outputs add (``seq_roles``, ``num_pairs``; not the core's
# ``kind::PAIR_COLUMNS``, which are a preference *input*'s).
ROW_COLUMNS = SHARD_COLUMNS[:4]
PAIR_SHARD_COLUMNS = SHARD_COLUMNS[8:]


def manifest_schema() -> Dict[str, Any]:
    """The JSON Schema of a packed directory's manifest (``FORMAT_VERSION``)."""
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def packed_manifest(
    config: Dict[str, Any],
    described: List[Dict[str, Any]],
    report: PackReport,
    wall: float,
    dropped: Dict[str, Any],
) -> Dict[str, Any]:
    """A packed directory's manifest: ``config`` (``PackConfig.to_dict()`` and what the path
    adds), the inputs with their rows, the shards, the dropped list (``dropped``: what
    :func:`write_dropped` returns) and the report's figures."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": config,
        "inputs": [{**d, "rows": r} for d, r in zip(described, report.input_rows)],
        "has_labels": report.has_labels,
        "shards": report.shards,
        "dropped_file": DROPPED_NAME,
        **dropped,
        "figures": {**report.figures(), "wall_time_s": round(wall, 3)},
    }


def write_dropped(
    path: Path,
    report: PackReport,
    paths: List[Path],
    staged: Optional[Path] = None,
    reasons: Optional[Mapping[str, Sequence[int]]] = None,
) -> Dict[str, Any]:
    """Every sample that is not in the output, with its file, row (token shards, Parquet: from
    0) or line (JSONL: from 1) and reason (``"empty"``, ``"overlong"``, or a reason of
    ``reasons``, reason: sample ids, which the caller knows better: ``"no_safe_cut"``). With
    ``staged`` (one-step pack) the sample ids are rows of that tokenized file, whose source
    columns lead back to the raw ``paths``. Returns the manifest's ``dropped_size`` and
    ``dropped_checksum`` of the file written (readers check them)."""
    dropped = report.dropped
    if staged is None:
        bounds = np.cumsum([0] + list(report.input_rows))
        file_idx = np.searchsorted(bounds, dropped, side="right") - 1
        where = dropped - bounds[file_idx]
        is_line = np.zeros(len(dropped), dtype=bool)
    else:
        with pa.memory_map(os.fsencode(staged)) as source:
            table = pa.ipc.open_file(source).read_all()
            file_idx = table.column("source_file").take(dropped).to_numpy()
            where = table.column("source_line").take(dropped).to_numpy()
        is_line = np.array([not is_parquet(p) for p in paths], dtype=bool)[file_idx]
    reason = np.where(np.isin(dropped, report.empty), "empty", "overlong").astype(object)
    for why, ids in (reasons or {}).items():
        reason[np.isin(dropped, np.asarray(ids, dtype=np.int64))] = why
    table = pa.table(
        {
            "sample_id": pa.array(dropped, pa.int64()),
            "file": pa.array([shown_path(paths[i]) for i in file_idx], pa.string()),
            "row": pa.array(where, pa.int64(), mask=is_line),
            "line": pa.array(where, pa.int64(), mask=~is_line),
            "reason": pa.array(reason.tolist(), pa.string()),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(os.fsencode(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    size, checksum = file_checksum(str(path))
    return {"dropped_size": size, "dropped_checksum": checksum}
