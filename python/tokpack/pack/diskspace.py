"""The pre-flight disk check of ``pack_files``: before reading a token, estimate the disk a run
needs (its spill files and its output) from the inputs' metadata and refuse with one line when
the free space cannot hold it, instead of failing with ENOSPC minutes later.

The estimate is deliberately on the low side, so a run that would fit is never refused:

- tokens: the token columns' value counts (Parquet: ``num_values`` of the list child column in
  the footer; Arrow IPC: the list offsets of each record batch, through a memory map);
- spill: the compact spill's bytes per token (``rust/tokpack-core/src/io/spill.rs``): the id width
  the Parquet statistics allow (2 bytes when unknown), plus a bit per token for labels;
- output: the compressed size of the same columns in the inputs (Parquet), or the IPC files'
  size (halved when the output is compressed).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import DiskSpaceError

__all__ = ["check_disk_space", "estimate"]


def _id_bytes(max_id: Optional[int]) -> float:
    """Bytes per id in the spill (see spill.rs); 2 when the maximum is unknown."""
    if max_id is None or max_id < 1 << 17:
        return 2.125 if max_id is not None and max_id >= 1 << 16 else 2.0
    return 3.0 if max_id < 1 << 24 else 4.0


def _parquet(path: Path, tokens: Sequence[str], others: Sequence[str]) -> Tuple[int, float, int]:
    """(tokens, spill bytes of the ids, compressed bytes) of one Parquet file."""
    meta = pq.ParquetFile(path).metadata
    count, spill, stored = 0, 0.0, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            name = chunk.path_in_schema.split(".")[0]
            if name in tokens:
                stats = chunk.statistics
                known = stats is not None and stats.has_min_max
                count += chunk.num_values
                spill += chunk.num_values * _id_bytes(int(stats.max) if known else None)
            if name in tokens or name in others:
                stored += chunk.total_compressed_size
    return count, spill, stored


def _ipc(path: Path, tokens: Sequence[str], compressed: bool) -> Tuple[int, float, int]:
    with pa.memory_map(os.fsencode(path)) as source:
        reader = pa.ipc.open_file(source)
        count = 0
        for b in range(reader.num_record_batches):
            batch = reader.get_batch(b)
            for name in tokens:
                column = batch.column(name)
                if len(column):
                    count += column.offsets[-1].as_py() - column.offsets[0].as_py()
    size = path.stat().st_size
    return count, count * _id_bytes(None), size // 2 if compressed else size


def estimate(
    paths: Iterable[Path],
    tokens: Sequence[str],
    labels: Sequence[str],
    compressed: bool,
) -> Tuple[int, int]:
    """(spill bytes, output bytes) a run over ``paths`` needs at least: ``tokens`` are the token
    columns (two for preference pairs), ``labels`` the label / loss-mask columns read."""
    spill, output = 0.0, 0
    for path in paths:
        try:
            with open(path, "rb") as f:
                parquet = f.read(4) == b"PAR1"
            if parquet:
                names = pq.read_schema(path).names
                n, s, stored = _parquet(path, tokens, labels)
            else:
                with pa.memory_map(os.fsencode(path)) as source:
                    names = pa.ipc.open_file(source).schema.names
                n, s, stored = _ipc(path, tokens, compressed)
        except Exception:  # unreadable, or a column missing: the packer names the problem
            continue
        has_labels = any(c in names for c in labels)
        spill += s + (n / 8 if has_labels else 0)
        output += stored if compressed or not parquet else n * 4 * (1 + has_labels)
    return int(spill), output


def _free(path: Path) -> Tuple[int, int]:
    """(free bytes for an unprivileged writer, device) of the filesystem holding ``path``."""
    # The nearest existing directory: before the run, OUT and the spill may not exist yet.
    while not path.exists() and path.parent != path:
        path = path.parent
    stat = os.statvfs(path)
    if stat.f_blocks == 0:  # a pseudo file system (/proc, some FUSE): its free space says nothing
        return 1 << 62, os.stat(path).st_dev
    return stat.f_bavail * stat.f_frsize, os.stat(path).st_dev


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_disk_space(
    paths: List[Path],
    tokens: Sequence[str],
    labels: Sequence[str],
    compressed: bool,
    out: Path,
    spill: Path,
) -> None:
    """Raises DiskSpaceError when the filesystems of ``out`` (the run's temporary output) and
    ``spill`` cannot hold what the run needs."""
    need_spill, need_out = estimate(paths, tokens, labels, compressed)
    (free_out, dev_out), (free_spill, dev_spill) = _free(out), _free(spill)
    if dev_out == dev_spill:
        if need_spill + need_out > free_out:
            raise DiskSpaceError(
                f"not enough free disk for this run: it needs about {_gb(need_spill)} of spill"
                f" files and {_gb(need_out)} of output in {out.parent}, where"
                f" {_gb(free_out)} is free; free some space or put the spill on another disk"
                " (--spill-dir / spill_dir=)"
            )
        return
    for what, need, free, where in (
        ("spill files", need_spill, free_spill, spill.parent),
        ("output", need_out, free_out, out.parent),
    ):
        if need > free:
            raise DiskSpaceError(
                f"not enough free disk for this run: it needs about {_gb(need)} of {what} in"
                f" {where}, where {_gb(free)} is free"
            )
