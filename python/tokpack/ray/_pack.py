"""``tokpack.ray.pack`` and ``tokpack.ray.read_packed``."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import ray.data

from .. import _tokpack
from .._checks import check_choice, check_int
from .._io import manifest as _manifest
from .._io.inputs import TOKEN_SUFFIXES, is_parquet, resolve_inputs
from .._io.manifest import member_path
from .._io.outdir import output_target, writing
from .._io.store import LocalOut, committed_output, read_manifest_at
from .._io.uri import is_remote, local_path
from ..errors import ConfigError, CorruptOutputError
from ..pack.config import PackConfig, pack_config, refuse_unsupported
from ..pack.plan import plan as make_plan
from ..packed.format import (
    DROPPED_NAME,
    MANIFEST_NAME,
    packed_manifest,
    write_dropped,
)
from ._blocks import (
    dataset_columns,
    file_columns,
    file_units,
    measure,
    ordered_blocks,
    streamed,
)
from ._global import write_global
from ._local import pack_local
from ._read import dataset_inputs, plain_read_files, read_checked_shards
from ._shards import accounting, remove_attempts

MODES = ("global", "local")
# What tokpack.ray.pack does not support, with why: refused by name before any work.
UNSUPPORTED = {
    "pair_layout": "preference pairs are not supported with --ray (tokpack.ray), use tokpack pack",
    "threads": "Ray runs one task per block and per shard, on one CPU each; size the cluster",
    "tokenizer": "--ray packs token shards; tokenize first (tokpack tokenize --ray, or "
    "tokpack.ray.tokenize), then pack them",
    "spill_dir": "Ray keeps the samples in its object store (spilled by Ray)",
}


def pack(
    ds: Any,
    output_dir: Union[str, os.PathLike],
    max_len: Optional[int] = None,
    *,
    mode: str = "global",
    min_block_samples: int = 4096,
    filesystem: Any = None,
    config: Optional[PackConfig] = None,
    threads: Optional[int] = None,
    tokenizer: Any = None,
    spill_dir: Any = None,
    **fields: Any,
) -> Dict[str, Any]:
    """Pack token files, or a ``ray.data.Dataset`` of token lists, into ``output_dir`` on the
    Ray cluster; returns the manifest as a dict.

    Args:
        ds: Parquet token files, directories or globs, as :func:`tokpack.pack_files` takes
            them (read by Ray tasks, one row group each, at the same path on every node):
            sample ``i`` is the ``i``-th row across the files in the order given, whatever
            order the tasks finish in (a file given twice is packed twice, as by ``tokpack
            pack``), and the dropped list names each sample's file and row. A dataset that is
            a plain read of local Parquet files (``ray.data.read_parquet(paths,
            include_paths=...)``, maybe then ``repartition(n)`` without a shuffle) is packed
            as those paths are, with ``tokpack pack``'s bytes. Or any other dataset with a
            list-of-integers token column (:func:`tokpack.ray.tokenize`'s output, ...):
            sample ``i`` is its ``i``-th row in the dataset's order (``preserve_order``), and
            messages and the dropped list name that row of ``<ray.data.Dataset>``.
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
            :func:`tokpack.pack_files` (KTO samples carry ``label``), but ``pair_layout``
            (preference pairs are not supported). It, ``threads``, ``tokenizer`` and
            ``spill_dir`` are refused (ConfigError naming the option) unless left at their
            default.

    Raises:
        ConfigError, DataError, SchemaError, OverlongError: as :func:`tokpack.pack_files`, naming
        the file (or the dataset block) and the sample.
    """
    started = time.perf_counter()
    config = pack_config(max_len, config, fields)
    run_args = dict(threads=threads, tokenizer=tokenizer, spill_dir=spill_dir)
    refuse_unsupported(config, "Ray", UNSUPPORTED, **run_args)
    check_choice("mode", mode, MODES)
    min_block_samples = check_int(min_block_samples, "min_block_samples", 1, 2**62)
    # A dataset that is a plain read of files is packed as those files (tokpack pack's bytes).
    read = plain_read_files(ds) if isinstance(ds, ray.data.Dataset) else ds
    paths = None if read is None else _input_files(read, output_dir, filesystem)
    refs: List[Any] = []
    files: Optional[Tuple[List[str], List[int]]] = None  # the input files and their rows
    if paths is not None:  # (checked before the output is touched)
        kind, config, columns = file_columns(paths, config)
        refs, file_rows = file_units(paths)
        files = ([str(p) for p in paths], file_rows)
    inputs = dataset_inputs(ds) if files is None else files[0]
    with committed_output(output_dir, filesystem, inputs) as (out, local):
        clock = _Clock()
        if paths is None and mode == "local":
            refs = ordered_blocks(ds)
            kind, config, columns = dataset_columns(ds, refs, config)
        elif paths is None:
            blocks = streamed(ds)
            head = list(itertools.islice(blocks, 1))
            kind, config, columns = dataset_columns(ds, head, config)
            blocks = itertools.chain(head, blocks)
            del head
        recorded = config.to_dict()
        if mode == "local":
            recorded["ray"] = {"mode": mode, "min_block_samples": min_block_samples}
        if mode == "global":
            measured = measure(blocks if files is None else refs, columns, files)
            n_blocks = len(measured.flats)
            # Reading and measuring overlap (the blocks are measured as they stream in).
            clock.lap("read+measure")
            plan = make_plan(measured.lengths, config=config)
            clock.lap("plan")
            shards = write_global(measured, plan, out, config)
            has_labels = columns.labels is not None
            report = accounting(plan, config, shards, measured.file_rows, has_labels)
            shown = measured.files
        else:
            n_blocks = len(refs)
            clock.lap("blocks")
            report, shown = pack_local(refs, columns, config, out, min_block_samples, files)
        clock.lap("write")
        if isinstance(out, LocalOut):
            remove_attempts(local)
        with writing(local / DROPPED_NAME):
            dropped = write_dropped(local / DROPPED_NAME, report, [Path(p) for p in shown])
        described: List[Dict[str, Any]] = [{"path": str(p)} for p in shown]
        # Never a cache hit (a Ray run has no cheap fingerprint of its inputs), hence no key.
        manifest: Dict[str, Any] = {"tokpack_version": _tokpack.__version__, "cache_key": None}
        wall = time.perf_counter() - started
        manifest.update(packed_manifest(recorded, described, report, wall, dropped))
        manifest["sample_kind"] = kind
        manifest["ray"] = {"mode": mode, "blocks": n_blocks, "stage_s": clock.stages}
        _manifest.write_manifest(local, manifest)  # looked up at the call (the suite checks it)
    return manifest


def _input_files(inputs: Any, output_dir: Any, filesystem: Any) -> List[Path]:
    """The Parquet files of ``inputs`` (``tokpack pack``'s resolver), not overlapping a local
    ``output_dir``."""
    # An object-store OUT (s3://..., or on a filesystem=) cannot overlap local inputs.
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    remote = [str(i) for i in items if is_remote(i)]
    if remote:  # the copies would be on the driver only, not on the nodes that read them
        raise ConfigError(
            f"{remote[0]}: --ray reads input files from a path every node sees; for objects,"
            f" pass a dataset: tokpack.ray.pack(ray.data.read_parquet({remote[0]!r}), ...)"
        )
    local = local_path(output_dir, filesystem)
    out = None if local is None else output_target(local)
    paths = resolve_inputs(inputs, TOKEN_SUFFIXES, output_dir=out)
    others = [str(p) for p in paths if not is_parquet(p)]
    if others:
        raise ConfigError(f"--ray reads Parquet token shards only, not {others[0]}")
    return paths


class _Clock:
    """Wall time of each stage, for the manifest's ``ray.stage_s`` (and the benchmark)."""

    def __init__(self) -> None:
        self.stages: Dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = round(now - self.last, 3)
        self.last = now


def read_packed(
    output_dir: Union[str, os.PathLike],
    *,
    filesystem: Any = None,
    columns: Optional[Sequence[str]] = None,
) -> Any:
    """A packed directory (or object-store prefix: ``s3://...``, or a path on ``filesystem``)
    as a ``ray.data.Dataset``, one row per packed row (``input_ids``, ``labels``,
    ``seq_lengths``, ``sample_ids``, ... or ``columns``), reading exactly the shards its
    manifest lists, one task per shard, through the checked reader: every row group's bytes and
    the footer are checked against the manifest's checksums (a damaged shard raises
    :class:`CorruptOutputError`, never yields other tokens). An output without a manifest is
    refused: it is not complete (a run under way or that failed); so is a manifest naming a file
    outside the output.

    For training: ``ds.iter_torch_batches(collate_fn=rows_collate(PackedCollator(...)))``,
    after ``ds.streaming_split(n)`` to feed ``n`` trainer workers (README, "Ray").
    """
    manifest, fs, root = read_manifest_at(output_dir, filesystem)
    if manifest is None or not isinstance(manifest.get("shards"), list):
        raise CorruptOutputError(
            f"{output_dir}: no {MANIFEST_NAME}: not a complete tokpack output (a run that did not "
            "finish, or not a packed directory)"
        )
    shards = [s for s in manifest["shards"] if isinstance(s, dict) and s.get("rows")]
    shards = shards or manifest["shards"][:1]
    for k, shard in enumerate(shards):
        member_path(root, shard.get("file"), f"shard {k}")
    return read_checked_shards(shards, root, fs, columns)


def rows_collate(collator: Callable[[List[Dict[str, Any]]], Any]) -> Callable[[Any], Any]:
    """A ``collate_fn`` for ``iter_torch_batches``: Ray hands it a batch as columns (a dict of
    numpy arrays), ``PackedCollator`` takes rows; this turns the one into the other."""

    def collate(batch: Dict[str, Any]) -> Any:
        names = list(batch)
        return collator([dict(zip(names, values)) for values in zip(*batch.values())])

    return collate


__all__ = ["pack", "read_packed", "rows_collate", "MODES"]
