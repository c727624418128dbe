"""Reading a packed directory (see ``tokpack pack``): the validated manifest, the row-group layout
and the single function that decodes shard data.

Every row group is decoded against the manifest: its bytes and the shard's footer are checked
against the xxh3-128 checksums recorded when the shard was written before they are decoded, so a
damaged shard raises :class:`CorruptOutputError` naming it and the row group instead of yielding
other tokens. The same check keeps a reader on the snapshot it opened: if OUT is rebuilt under an
open reader, the new bytes do not match the old manifest and the read fails with "changed since
the dataset was opened" (the identity of each shard file is recorded at open to tell the two
apart). Groups already decoded and cached stay the old snapshot's, so a reader never mixes two.

Nothing here imports torch, and nothing holds per-row Python objects: the layout is a few numpy
arrays and lists with one entry per row group, so datasets built on it are cheap to copy into
workers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import _tokpack
from .._io.manifest import member_path
from ..errors import ConfigError, CorruptOutputError, InputNotFoundError, TokpackError
from ..kinds import KINDS, kind_of_packed
from .format import FORMAT, FORMAT_VERSION, MANIFEST_NAME, ROW_COLUMNS

__all__ = ["PackedDir", "decode_row_group"]

Column = Union[Tuple[np.ndarray, np.ndarray], np.ndarray]
# (offset, length, "xxh3_128:<hex>") of a byte range of a shard.
Range = Tuple[int, int, str]
# What identifies a file on disk: a rebuilt OUT has new files even when their sizes are equal.
Identity = Tuple[int, int, int, int]


def decode_row_group(
    path: str,
    row_group: int,
    columns: Sequence[str],
    check: Optional[Tuple[int, Range, Range]] = None,
) -> Dict[str, Column]:
    """Decode one row group of a shard: list columns -> ``(values, offsets int64)``, primitive
    columns -> ndarray. With ``check = (file size, footer range, row group range)``, the bytes
    are checked against their checksums before they are decoded.

    Every shard read of ``tokpack.torch`` goes through here. Decoding runs in Rust (arrow-rs /
    parquet) with the GIL released, on the calling thread.
    """
    try:
        return _tokpack.read_row_group(
            path=str(path), row_group=int(row_group), columns=list(columns), check=check
        )
    except (TokpackError, OSError) as exc:
        raise CorruptOutputError(
            f"{path}: cannot decode row group {row_group} (columns {list(columns)}): {exc}"
        ) from None


def segment_sums(values: Any, offsets: Any) -> np.ndarray:
    """int64 per row of a list column's ``(values, offsets)``: its values summed."""
    cum = np.concatenate([[0], np.cumsum(np.asarray(values, dtype=np.int64))])
    offsets = np.asarray(offsets, dtype=np.int64)
    return cum[offsets[1:]] - cum[offsets[:-1]]


def identity(path: Union[str, os.PathLike]) -> Optional[Identity]:
    """(device, inode, size, mtime ns) of a file, None when it is missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def byte_range(value: Any) -> Range:
    """A manifest's ``{"offset", "length", "checksum"}`` as a :data:`Range`."""
    return (int(value["offset"]), int(value["length"]), str(value["checksum"]))


def _corrupt(root: Path, what: str) -> CorruptOutputError:
    return CorruptOutputError(f"{root / MANIFEST_NAME}: {what}")


def parse_manifest(text: Union[str, bytes], root: Path) -> Any:
    """The parsed manifest text of the packed directory ``root``."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _corrupt(root, f"invalid JSON ({exc})") from None


class PackedDir:
    """The manifest and row-group layout of a packed directory, validated against the shards.

    Attributes:
        root: the directory. ``max_len``, ``has_labels``: from the manifest.
        shard_paths: absolute path of every shard, in manifest order.
        shard_sizes, shard_footers, shard_identities: per shard, its size, footer byte range and
            file identity when opened.
        group_shard, group_index, group_rows: one entry per row group (all shards, in order).
        group_bytes: the byte range of each row group (all shards, in order).
        group_start: first global row of each row group (length n_groups + 1).
    """

    # Set by readers of object storage (``tokpack.remote``): shards are fetched on demand.
    remote = False

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
        self.root = root
        # How messages name the directory (a URI for one on object storage).
        self.shown = str(root)
        self.manifest = parse_manifest(text, root)
        self._validate(self.manifest)

    def _validate(self, m: Any) -> None:
        root = self.root
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise _corrupt(root, f"not a {FORMAT!r} manifest")
        if m.get("format_version") == 1:
            # Written before shards carried row-group checksums: nothing to check reads against.
            raise _corrupt(
                root,
                "format_version 1 has no row-group checksums; rebuild it with this tokpack"
                " (rerun `tokpack pack`: the new format is not a cache hit)",
            )
        if m.get("format_version") != FORMAT_VERSION:
            raise _corrupt(
                root,
                f"format_version {m.get('format_version')!r} is not supported"
                f" (this tokpack reads {FORMAT_VERSION})",
            )
        try:
            self.max_len = int(m["config"]["max_len"])
            # Preference outputs: how each pair's segments are laid out; None otherwise.
            self.pair_layout = m["config"].get("pair_layout")
            self.carried = [str(c) for c in m["config"].get("carry", ())]
            self.has_labels = bool(m["has_labels"])
            shards = list(m["shards"])
            total = int(m["figures"]["rows"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _corrupt(root, f"missing or invalid field {exc}") from None
        # The columns every shard must have.
        needed = [c for c in ROW_COLUMNS if c != "labels" or self.has_labels]
        # The kind of samples (``tokpack.kinds``): its own shard columns are needed too.
        self.kind = kind_of_packed(m, self.carried)
        needed += list(KINDS[self.kind].read) + self.carried
        self.needed_columns = needed
        self.shard_paths: List[str] = []
        self.shard_sizes: List[int] = []
        self.shard_footers: List[Range] = []
        self.shard_identities: List[Optional[Identity]] = []
        self.group_bytes: List[Range] = []
        g_shard: List[int] = []
        g_rows: List[int] = []
        g_index: List[int] = []
        for k, shard in enumerate(shards):
            try:
                name, rows, groups, size = self._shard_fields(k)
                footer = byte_range(shard["footer_bytes"])
                ranges = [byte_range(r) for r in shard["row_group_bytes"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise _corrupt(root, f"shard {k}: missing or invalid field {exc}") from None
            path = member_path(root, name, f"shard {k}")
            if "index" in shard:
                member_path(root, shard["index"], f"shard {k} index")
            if len(ranges) != groups:
                raise _corrupt(
                    root, f"shard {k}: {len(ranges)} byte ranges for {groups} row groups"
                )
            ident, group_rows = self._open_shard(k, path, rows, groups, size)
            self.shard_paths.append(str(path.resolve()))
            self.shard_sizes.append(size)
            self.shard_footers.append(footer)
            self.shard_identities.append(ident)
            self.group_bytes.extend(ranges)
            g_shard += [k] * groups
            g_index += range(groups)
            g_rows += group_rows
        if sum(g_rows) != total:
            raise _corrupt(root, f"figures.rows is {total} but the shards hold {sum(g_rows)} rows")
        self.group_shard = np.asarray(g_shard, dtype=np.int64)
        self.group_index = np.asarray(g_index, dtype=np.int64)
        self.group_rows = np.asarray(g_rows, dtype=np.int64)
        self.group_start = np.concatenate([[0], np.cumsum(self.group_rows)]).astype(np.int64)
        # What a row is made of: tokens and boundaries, then each segment's role (preference
        # outputs) and the carried per-sample columns (per segment).
        self.columns = tuple(c for c in needed if c != "num_pairs")

    def _shard_fields(self, k: int) -> Tuple[str, int, int, int]:
        """Shard ``k``'s file name, rows, row groups and size in bytes, from the manifest."""
        shard = self.manifest["shards"][k]
        return str(shard["file"]), int(shard["rows"]), int(shard["row_groups"]), int(shard["size"])

    def _open_shard(
        self, k: int, path: Path, rows: int, groups: int, size: int
    ) -> Tuple[Optional[Identity], List[int]]:
        """Checks shard ``k`` against its manifest entry: (its file identity, rows per row
        group)."""
        ident = identity(path)
        if ident is None:
            raise _corrupt(self.root, f"shard {k}: {path} is missing")
        if ident[2] != size:
            raise CorruptOutputError(
                f"{path}: the file has {ident[2]} bytes, the manifest says {size}"
                " (truncated or overwritten)"
            )
        try:
            meta = pq.ParquetFile(path).metadata
        except FileNotFoundError:
            raise _corrupt(self.root, f"shard {k}: {path} is missing") from None
        except (pa.ArrowException, OSError) as exc:
            raise CorruptOutputError(f"{path}: not a readable Parquet file ({exc})") from None
        return ident, self._check_footer(k, path, meta, rows, groups)

    def _check_footer(self, k: int, path: Any, meta: Any, rows: int, groups: int) -> List[int]:
        """Shard ``k``'s footer (``meta``) against the manifest: rows, row groups, the needed
        columns. Its rows per row group."""
        if meta.num_rows != rows or meta.num_row_groups != groups:
            raise _corrupt(
                self.root,
                f"shard {k} ({Path(str(path)).name}) says {rows} rows in {groups} row groups,"
                f" the file has {meta.num_rows} rows in {meta.num_row_groups} row groups",
            )
        names = set(meta.schema.to_arrow_schema().names)
        missing = [c for c in self.needed_columns if c not in names]
        if missing:
            raise CorruptOutputError(f"{path}: missing columns {missing}")
        return [meta.row_group(g).num_rows for g in range(groups)]

    # -- what readers of object storage override ------------------------------------------

    def side_path(self, name: Any, what: str = "file") -> Path:
        """The local path of a side file the manifest lists (an index, the dropped list)."""
        return member_path(self.root, name, what)

    def shard_columns(self, shard: int) -> List[str]:
        """The column names of shard ``shard`` (from its footer)."""
        return list(pq.read_schema(self.shard_paths[shard]).names)

    def prefetch(self, group: int) -> None:
        """Start fetching row group ``group`` ahead of its use (object storage only)."""

    def cancel_prefetch(self) -> None:
        """Drop the fetches :meth:`prefetch` queued and not started (object storage only)."""

    def changed(self, shard: int) -> bool:
        """Whether shard ``shard`` was replaced since the directory was opened."""
        return identity(self.shard_paths[shard]) != self.shard_identities[shard]

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

    def row_sums(self, column: str) -> np.ndarray:
        """int64 per row (global numbering) of a numeric per-segment column summed over the
        row's segments: ``row_sums("vision_patches")`` is each row's vision-encoder cost of a
        multimodal directory. Reads that column alone, checked."""
        if column not in self.carried:
            raise ConfigError(
                f"{self.shown}: no per-segment column {column!r} (carried: {self.carried})"
            )
        parts = [segment_sums(*self.decode(g, [column])[column]) for g in range(self.num_groups)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def decode(self, group: int, columns: Optional[Sequence[str]] = None) -> Dict[str, Column]:
        """Decode the row columns (or ``columns``) of one row group (global numbering), checking
        its bytes against the manifest's checksums and its row count."""
        shard = int(self.group_shard[group])
        path = self.shard_paths[shard]
        g = int(self.group_index[group])
        check = (self.shard_sizes[shard], self.shard_footers[shard], self.group_bytes[group])
        try:
            cols = decode_row_group(path, g, self.columns if columns is None else columns, check)
        except CorruptOutputError as exc:
            if self.changed(shard):
                raise CorruptOutputError(
                    f"{self.shown}: changed since the dataset was opened ({path} was replaced or"
                    f" removed, e.g. by `tokpack pack --force`): open it again; reading row group"
                    f" {g} failed with: {exc}"
                ) from None
            raise
        want = int(self.group_rows[group])
        for name, col in cols.items():
            n = len(col[1]) - 1 if isinstance(col, tuple) else len(col)
            if n != want:
                raise CorruptOutputError(
                    f"{path}: row group {g}, column {name!r} has {n} rows, expected {want}"
                )
        if "input_ids" not in cols:
            return cols
        ids_values, ids_offsets = cols["input_ids"]
        if ids_offsets[-1] != len(ids_values):
            raise CorruptOutputError(f"{path}: row group {g}, column 'input_ids' is malformed")
        if "labels" in cols and not np.array_equal(cols["labels"][1], ids_offsets):
            raise CorruptOutputError(
                f"{path}: row group {g}, column 'labels' does not match 'input_ids' row lengths"
            )
        return cols
