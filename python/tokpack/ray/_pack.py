"""``tokpack.ray.pack`` and ``tokpack.ray.read_packed``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from .. import _format, _tokpack
from .._format import DROPPED_NAME, MANIFEST_NAME, packed_manifest, write_dropped
from ..errors import ConfigError, CorruptOutputError
from ..pack_config import PackConfig, pack_config
from ..planning import check_int
from ..planning import plan as make_plan
from ._blocks import DATASET_SOURCE, Measured, measure, ordered_blocks, resolve_columns
from ._global import write_global
from ._local import Planning, pack_local
from ._shards import Layout, accounting, remove_attempts
from ._store import LocalOut, committed_output, read_manifest_at

MODES = ("global", "local")
# The PackConfig fields this path honours; the others are refused by name.
SUPPORTED = ("max_len", "strategy", "overlong", "seed", "tokens_column", "labels_column")
SUPPORTED += ("loss_mask_column", "rows_per_shard", "row_group_rows", "compression")


def pack(
    ds: Any,
    output_dir: Union[str, os.PathLike],
    max_len: Optional[int] = None,
    *,
    mode: str = "global",
    min_block_samples: int = 4096,
    filesystem: Any = None,
    config: Optional[PackConfig] = None,
    **fields: Any,
) -> Dict[str, Any]:
    """Pack a ``ray.data.Dataset`` of token lists into ``output_dir`` on the Ray cluster;
    returns the manifest as a dict.

    Args:
        ds: any dataset with a list-of-integers token column (``ray.data.read_parquet(...)``,
            :func:`tokpack.ray.tokenize`'s output, ...). Sample ``i`` is its ``i``-th row in
            order. With a ``path`` column (``read_parquet(..., include_paths=True)``) the
            dropped list names each sample's file and row, else its row in the dataset.
        output_dir: a directory on a file system every node sees, written atomically (absent
            or complete); or object storage (``s3://bucket/packed``, or a path on
            ``filesystem``), committed by writing the manifest last (readers refuse a prefix
            without one).
        filesystem: a ``pyarrow.fs.FileSystem`` or fsspec file system ``output_dir`` is on
            (default: from the URI, else local).
        mode: ``"global"`` plans the whole corpus on the driver (8 bytes a sample) and writes
            the shards ``tokpack pack`` writes for the same inputs, byte for byte; ``"local"``
            packs runs of consecutive blocks of at least ``min_block_samples`` samples on their
            own (the driver holds one number per block) at a small cost in rows (README).
        max_len, fields, config: the :class:`tokpack.PackConfig`, as in
            :func:`tokpack.pack_files`; the fields in ``SUPPORTED`` (not yet ``pair_layout``
            or ``carry``: refused by name).

    Raises:
        ConfigError, DataError, SchemaError, OverlongError: as :func:`tokpack.pack_files`, naming
        the dataset block and sample.
    """
    started = time.perf_counter()
    config = pack_config(max_len, config, fields)
    config.refuse_unsupported("tokpack.ray.pack", SUPPORTED)
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; expected one of {MODES}")
    min_block_samples = check_int(min_block_samples, "min_block_samples", 1, 2**62)
    recorded = config.to_dict()
    if mode == "local":
        recorded["ray"] = {"mode": mode, "min_block_samples": min_block_samples}
    max_len = config.max_len
    layout = Layout(max_len, config.row_group_rows, config.compression)
    with committed_output(output_dir, filesystem) as (out, local):
        clock = _Clock()
        names = (config.tokens_column, config.labels_column, config.loss_mask_column)
        if mode == "global":
            measured = measure(ds, names)
            columns, blocks = measured.columns, len(measured.flats)
            # Reading and measuring overlap (the blocks are measured as they stream in).
            clock.lap("read+measure")
            plan = make_plan(measured.lengths, config=config)
            clock.lap("plan")
            shards = write_global(measured, plan, out, layout, config.rows_per_shard)
            paths, rows = _sources(measured)
            report = accounting(plan, shards, rows, columns.labels is not None)
        else:
            refs = ordered_blocks(ds)
            columns, blocks = resolve_columns(refs, *names), len(refs)
            clock.lap("blocks")
            planning = Planning(
                max_len, config.strategy, config.overlong, config.seed, config.rows_per_shard
            )
            report = pack_local(refs, columns, planning, layout, out, min_block_samples)
            paths = [DATASET_SOURCE]
        clock.lap("write")
        if isinstance(out, LocalOut):
            remove_attempts(local)
        write_dropped(local / DROPPED_NAME, report, [Path(p) for p in paths])
        described: List[Dict[str, Any]] = [{"path": str(p)} for p in paths]
        # Never a cache hit (a Ray dataset has no cheap fingerprint), hence no cache key.
        manifest = {"tokpack_version": _tokpack.__version__, "cache_key": None}
        manifest.update(packed_manifest(recorded, described, report, time.perf_counter() - started))
        manifest["ray"] = {"mode": mode, "blocks": blocks, "stage_s": clock.stages}
        _format.write_manifest(local, manifest)
    return manifest


class _Clock:
    """Wall time of each stage, for the manifest's ``ray.stage_s`` (and the benchmark)."""

    def __init__(self) -> None:
        self.stages: Dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = round(now - self.last, 3)
        self.last = now


def _sources(measured: Measured) -> Any:
    if measured.files:
        return measured.files, measured.file_rows
    return [DATASET_SOURCE], [int(measured.bases[-1])]


def read_packed(
    output_dir: Union[str, os.PathLike], *, filesystem: Any = None, **read_parquet_args: Any
) -> Any:
    """A packed directory (or object-store prefix: ``s3://...``, or a path on ``filesystem``)
    as a ``ray.data.Dataset``, one row per packed row (``input_ids``, ``labels``,
    ``seq_lengths``, ``sample_ids``, ...), reading exactly the shards its manifest lists. An
    output without a manifest is refused: it is not complete (a run under way or that failed).

    For training: ``ds.iter_torch_batches(collate_fn=rows_collate(PackedCollator(...)))``,
    after ``ds.streaming_split(n)`` to feed ``n`` trainer workers (README, "Ray").
    """
    import ray.data

    manifest, fs, root = read_manifest_at(output_dir, filesystem)
    if manifest is None or not isinstance(manifest.get("shards"), list):
        raise CorruptOutputError(
            f"{output_dir}: no {MANIFEST_NAME}: not a complete tokpack output (a run that did not "
            "finish, or not a packed directory)"
        )
    shards = [s["file"] for s in manifest["shards"] if s.get("rows")]
    paths = [f"{root}/{name}" for name in shards or [manifest["shards"][0]["file"]]]
    if fs is not None:
        read_parquet_args.setdefault("filesystem", fs)
    return ray.data.read_parquet(paths, **read_parquet_args)


def rows_collate(collator: Callable[[List[Dict[str, Any]]], Any]) -> Callable[[Any], Any]:
    """A ``collate_fn`` for ``iter_torch_batches``: Ray hands it a batch as columns (a dict of
    numpy arrays), ``PackedCollator`` takes rows; this turns the one into the other."""

    def collate(batch: Dict[str, Any]) -> Any:
        names = list(batch)
        return collator([dict(zip(names, values)) for values in zip(*batch.values())])

    return collate


__all__ = ["pack", "read_packed", "rows_collate", "MODES"]
