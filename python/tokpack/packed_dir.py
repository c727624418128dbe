"""Reading a packed directory (see ``tokpack pack``): the validated manifest, the row-group layout
and the single function that decodes shard data.

Nothing here imports torch, and nothing holds per-row Python objects: the layout is a few numpy
arrays with one entry per row group, so datasets built on it are cheap to copy into workers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import _tokpack
from ._outdir import MANIFEST_NAME
from .errors import CorruptOutputError, InputNotFoundError, TokpackError

__all__ = ["PackedDir", "decode_row_group", "ROW_COLUMNS"]

FORMAT = "tokpack-packed"
FORMAT_VERSION = 1
ROW_COLUMNS = ("input_ids", "labels", "seq_lengths", "sample_ids")

Column = Union[Tuple[np.ndarray, np.ndarray], np.ndarray]


def decode_row_group(path: str, row_group: int, columns: Sequence[str]) -> Dict[str, Column]:
    """Decode one row group of a shard: list columns -> ``(values, offsets int64)``, primitive
    columns -> ndarray.

    Every shard read of ``tokpack.torch`` goes through here. Decoding runs in Rust (arrow-rs /
    parquet) with the GIL released, on the calling thread.
    """
    try:
        return _tokpack.read_row_group(str(path), int(row_group), list(columns))
    except (TokpackError, OSError) as exc:
        raise CorruptOutputError(
            f"{path}: cannot decode row group {row_group} (columns {list(columns)}): {exc}"
        ) from None


def _corrupt(root: Path, what: str) -> CorruptOutputError:
    return CorruptOutputError(f"{root / MANIFEST_NAME}: {what}")


class PackedDir:
    """The manifest and row-group layout of a packed directory, validated against the shards.

    Attributes:
        root: the directory. ``max_len``, ``has_labels``: from the manifest.
        shard_paths: absolute path of every shard, in manifest order.
        group_shard, group_index, group_rows: one entry per row group (all shards, in order).
        group_start: first global row of each row group (length n_groups + 1).
    """

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        root = Path(path)
        if not root.exists():
            raise InputNotFoundError(f"{root}: no such packed directory")
        if not root.is_dir():
            raise InputNotFoundError(f"{root}: not a directory (expected a packed directory)")
        try:
            text = (root / MANIFEST_NAME).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputNotFoundError(
                f"{root}: not a packed directory (no {MANIFEST_NAME}; run `tokpack pack`)"
            ) from None
        try:
            manifest = json.loads(text)
        except ValueError as exc:
            raise _corrupt(root, f"invalid JSON ({exc})") from None
        self.root = root
        self.manifest = manifest
        self._validate(manifest)

    def _validate(self, m: Any) -> None:
        root = self.root
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise _corrupt(root, f"not a {FORMAT!r} manifest")
        if m.get("format_version") != FORMAT_VERSION:
            raise _corrupt(
                root,
                f"format_version {m.get('format_version')!r} is not supported"
                f" (this tokpack reads {FORMAT_VERSION})",
            )
        try:
            self.max_len = int(m["config"]["max_len"])
            self.has_labels = bool(m["has_labels"])
            shards = list(m["shards"])
            total = int(m["figures"]["rows"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _corrupt(root, f"missing or invalid field {exc}") from None
        paths: List[str] = []
        g_shard: List[int] = []
        g_rows: List[int] = []
        g_index: List[int] = []
        for k, shard in enumerate(shards):
            try:
                name, rows, groups = (
                    str(shard["file"]),
                    int(shard["rows"]),
                    int(shard["row_groups"]),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise _corrupt(root, f"shard {k}: missing or invalid field {exc}") from None
            path = root / name
            try:
                meta = pq.ParquetFile(path).metadata
            except FileNotFoundError:
                raise _corrupt(root, f"shard {k}: {path} is missing") from None
            except (pa.ArrowException, OSError) as exc:
                raise CorruptOutputError(f"{path}: not a readable Parquet file ({exc})") from None
            if meta.num_rows != rows or meta.num_row_groups != groups:
                raise _corrupt(
                    root,
                    f"shard {k} ({name}) says {rows} rows in {groups} row groups, the file has"
                    f" {meta.num_rows} rows in {meta.num_row_groups} row groups",
                )
            names = set(meta.schema.to_arrow_schema().names)
            needed = [c for c in ROW_COLUMNS if c != "labels" or self.has_labels]
            missing = [c for c in needed if c not in names]
            if missing:
                raise CorruptOutputError(f"{path}: missing columns {missing}")
            paths.append(str(path.resolve()))
            for g in range(groups):
                g_shard.append(k)
                g_index.append(g)
                g_rows.append(meta.row_group(g).num_rows)
        if sum(g_rows) != total:
            raise _corrupt(root, f"figures.rows is {total} but the shards hold {sum(g_rows)} rows")
        self.shard_paths = paths
        self.group_shard = np.asarray(g_shard, dtype=np.int64)
        self.group_index = np.asarray(g_index, dtype=np.int64)
        self.group_rows = np.asarray(g_rows, dtype=np.int64)
        self.group_start = np.concatenate([[0], np.cumsum(self.group_rows)]).astype(np.int64)
        self.columns = tuple(c for c in ROW_COLUMNS if c != "labels" or self.has_labels)

    @property
    def num_rows(self) -> int:
        return int(self.group_start[-1])

    @property
    def num_groups(self) -> int:
        return len(self.group_rows)

    def locate(self, row: int) -> Tuple[int, int]:
        """(row group number, row within it) of a global row."""
        g = int(np.searchsorted(self.group_start, row, side="right")) - 1
        return g, row - int(self.group_start[g])

    def decode(self, group: int) -> Dict[str, Column]:
        """Decode the row columns of one row group (global numbering), checking its row count."""
        path = self.shard_paths[int(self.group_shard[group])]
        g = int(self.group_index[group])
        cols = decode_row_group(path, g, self.columns)
        want = int(self.group_rows[group])
        for name, col in cols.items():
            n = len(col[1]) - 1 if isinstance(col, tuple) else len(col)
            if n != want:
                raise CorruptOutputError(
                    f"{path}: row group {g}, column {name!r} has {n} rows, expected {want}"
                )
        ids_values, ids_offsets = cols["input_ids"]
        if ids_offsets[-1] != len(ids_values):
            raise CorruptOutputError(f"{path}: row group {g}, column 'input_ids' is malformed")
        if "labels" in cols and not np.array_equal(cols["labels"][1], ids_offsets):
            raise CorruptOutputError(
                f"{path}: row group {g}, column 'labels' does not match 'input_ids' row lengths"
            )
        return cols
