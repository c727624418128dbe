"""``tokpack.pack_files``: pack a tokenized corpus on disk (Parquet / Arrow IPC token shards)
into packed Parquet shards with a boundary index and a manifest.

The heavy lifting is in Rust (``tokpack_core::io``): units are read in parallel with only the
needed columns, tokens are spilled to flat files in the run's temporary directory (next to
OUT_DIR), the plan is made from lengths alone and shards are written in parallel, so memory
grows with the number of samples and the row-group size, not with the number of tokens. This
module resolves the inputs (``_io.inputs``), runs the cached-output skeleton
(``_io.store.cached_run``: a local directory or object storage) and writes the manifest and
the dropped-samples list.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
import pyarrow as pa

from .. import _tokpack
from .._checks import checked_threads
from .._contract import PAIR_LAYOUTS
from .._io.inputs import (
    RAW_SUFFIXES,
    TOKEN_SUFFIXES,
    PathsLike,
    is_parquet,
    resolve_inputs,
    shown_path,
)
from .._io.outdir import add_fingerprints, open_for_writing, writing
from .._io.progress import run_with_progress
from .._io.scratch import SPILL_PREFIX, check_work_dir, remove_dead, scratch_dir
from .._io.store import cached_run, destination
from .._tokpack import pair_layout_for
from ..errors import OverlongError
from ..kinds import KINDS, kind_of_shards, packing_kind
from ..multimodal.stats import packed_vision_figures
from ..packed.format import (
    DROPPED_NAME,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    NO_SAFE_CUT,
    packed_manifest,
    write_dropped,
)
from ..tokenize.encoder import RecordEncoder
from ..tokenize.options import TokenizeOptions
from ..tokenize.writer import REJECTED_NAME, stream_into, write_arrow
from .config import PackConfig, pack_config, refuse_unsupported
from .diskspace import check_disk_space

__all__ = ["pack_files", "read_lengths", "FORMAT", "FORMAT_VERSION", "PAIR_LAYOUTS"]

# The fields a one-step pack (``tokenizer=``) refuses: the tokenizer writes the columns.
ONE_STEP_REFUSED = dict.fromkeys(
    ("tokens_column", "labels_column", "loss_mask_column"), "the tokenizer writes the columns"
)
# Rows decoded at a time inside a row group: bounds reading memory to a few tens of MB per thread.
BATCH_ROWS = 4096


def read_lengths(
    inputs: PathsLike,
    tokens_column: str = "input_ids",
    *,
    pair_layout: str = "separate",
    threads: Optional[int] = None,
    progress: bool = False,
) -> np.ndarray:
    """Sample lengths (int64) of the token column across the inputs, read in Rust. Preference
    shards: each pair's footprint in ``pair_layout``, the tokens :func:`pack_files` plans it
    to take in a row (0 for a pair it drops as empty)."""
    threads = checked_threads(threads)
    paths = resolve_inputs(inputs, TOKEN_SUFFIXES)
    layout = pair_layout_for(kind_of_shards(paths), pair_layout, shown_path(paths[0]))
    lengths, _ = run_with_progress(
        lambda p: _tokpack.read_lengths(
            paths=[str(x) for x in paths],
            tokens_column=tokens_column,
            batch_rows=BATCH_ROWS,
            pair_layout=layout,
            threads=threads,
            progress=p,
        ),
        progress,
    )
    return lengths


def pack_files(
    inputs: PathsLike,
    output_dir: Union[str, os.PathLike],
    max_len: Optional[int] = None,
    *,
    config: Optional[PackConfig] = None,
    threads: Optional[int] = None,
    force: bool = False,
    progress: bool = False,
    tokenizer: Optional[Union[str, os.PathLike]] = None,
    tokenize: Optional[Union[TokenizeOptions, Dict[str, Any]]] = None,
    verify_cache: bool = False,
    spill_dir: Optional[Union[str, os.PathLike]] = None,
    filesystem: Any = None,
    **fields: Any,
) -> Dict[str, Any]:
    """Pack token shards on disk into ``output_dir``; returns the manifest as a dict.

    Args:
        inputs: Parquet / Arrow IPC (Feather v2) files, directories or globs. Sample ``i`` is
            the ``i``-th row across the files in the order given (directories and globs sorted;
            a file given twice is packed twice).
        output_dir: written atomically: absent or complete, even after kill -9. It must be
            absent, empty or a tokpack output holding only what tokpack wrote, and must not
            overlap the inputs (else ConfigError / OutputExistsError, and nothing is touched).
            A URI (``s3://bucket/packed``, ``gs://...``) or a path on ``filesystem`` (a
            ``pyarrow.fs`` or fsspec file system) is object storage: the output is built in a
            local temporary directory (in ``spill_dir`` if given) and uploaded object by
            object, the manifest last (a prefix without one is not an output), under the same
            ownership rule.
        max_len, fields: the :class:`tokpack.PackConfig` of the job (``strategy``,
            ``overlong``, ``seed``, ``tokens_column``, ``labels_column``, ``loss_mask_column``,
            ``pair_layout``, ``tree_group``, ``tree_min_shared``, ``carry``,
            ``rows_per_shard``, ``row_group_rows``, ``compression``), or ``config=`` (not
            both). Labels are carried along when every input has them; preference inputs are
            packed pair by pair in ``pair_layout``; KTO inputs carry ``label`` always. Tree
            token shards (``tokpack.kind = "tree"`` metadata), or any token shards given
            ``tree_group`` (the column grouping sequences that share prefixes), are packed as
            prefix trees: each packed row is a row of tree pieces (``docs/format.md``), each
            sequence's path in one row, its group carried.
        threads: as in :func:`tokpack.plan`; the output is byte-identical for every value.
        force: rebuild even when ``output_dir`` is already current (a cache hit).
        verify_cache: before trusting a cache hit, check every shard's checksum (always checked:
            every listed file is present with its recorded size). A damaged output is rebuilt.
        progress: draw progress bars on stderr (only when it is a terminal).
        tokenizer: one step from raw data: JSONL / ``.jsonl.gz`` / Parquet records tokenized
            with this tokenizer (``tokenizer.json`` or its directory) and packed in the same
            run; ``tokenize`` holds the options (a :class:`tokpack.TokenizeOptions` or a dict of
            its fields); rejected records go to ``__tokpack__/_rejected.jsonl``. The columns
            are then refused (the tokenizer writes them); ``carry`` names record fields.
        spill_dir: an existing directory (another disk, say) for the spill files, about 2.1
            bytes per token (default: the run's temporary next to ``output_dir``), checked
            before any work (ConfigError / OutputError). tokpack works in a subdirectory it
            creates there (``.tokpack-spill-*``, locked for the run's life) and removes it,
            whatever happens; one a killed run left is removed by the next run using
            ``spill_dir``. A run the disks cannot hold is refused before any work
            (DiskSpaceError).

    Returns:
        The manifest (``format``, ``config``, ``inputs``, ``shards``, ``figures``, ...) plus
        ``cache_hit``: True when ``output_dir`` was already current and nothing was done, and
        ``rebuilt_because``: why a current but damaged ``output_dir`` was rebuilt (else None).
    """
    started = time.perf_counter()
    config = pack_config(max_len, config, fields)
    threads = checked_threads(threads)
    if spill_dir is not None:  # before any work, whatever the output
        spill_dir = check_work_dir(spill_dir, "spill_dir (--spill-dir)")
        remove_dead(spill_dir)  # (a cache hit too: what killed runs left there goes)
    dest = destination(output_dir, filesystem)
    out = dest.local  # None on object storage
    encoding = None
    folders: List[str] = []  # (recorded: an export into one is refused)
    if tokenizer is not None:
        refuse_unsupported(config, "a one-step pack (tokenizer=)", ONE_STEP_REFUSED)
        paths = resolve_inputs(inputs, RAW_SUFFIXES, output_dir=dest.place, folders=folders)
        options = TokenizeOptions.of(tokenize).for_inputs(paths)
        if config.overlong == "error" and options.max_len is None:
            # Checked while tokenizing, where the sample's raw file and line are known.
            options = replace(options, max_len=config.max_len)
        # Carried columns are the records' fields, staged with the tokens (the kind's own, as
        # KTO's label, are there).
        kind = options.kind
        config = config.for_kind(kind, shown_path(paths[0]))
        carried = [c for c in config.carry if c not in KINDS[kind].carried]
        options = replace(options, carry=(*options.carry, *carried))
        encoding = RecordEncoder(tokenizer, options)
    else:
        paths = resolve_inputs(inputs, TOKEN_SUFFIXES, output_dir=dest.place, folders=folders)
        kind = packing_kind(kind_of_shards(paths), config.tree_group)
        config = config.for_kind(kind, shown_path(paths[0]))
    recorded = config.to_dict()
    if encoding is not None:
        recorded["tokenize"] = encoding.config()

    def build(tmp: Path, described: List[Dict[str, Any]]) -> Dict[str, Any]:
        with _spill_in(tmp, spill_dir) as spill:
            if encoding is None:
                preflight(tmp, spill)
            sources, staged, tokenized = paths, None, None
            if encoding is not None:
                # Tokenized into one uncompressed Arrow IPC file in the spill directory (removed
                # with it), with each sample's raw source (``token_schema(kind, sources=True)``):
                # the packer's input.
                staged = spill / "tokenized.arrow"
                sources = [staged]
                stream = stream_into(
                    tmp, paths, described, encoding, progress, threads=threads, sources=True
                )
                with stream as tokens, writing(staged), open_for_writing(staged) as sink:
                    write_arrow(sink, tokens)
                tokenized = {
                    "counts": tokens.stats.as_dict(),
                    "template": encoding.template_info,
                    "encoder": encoding.encoder_info,
                    "renderer": tokens.renderer_info,
                    "rejected_file": REJECTED_NAME if tokens.stats.rejected else None,
                }
            with _named_by_record(staged, paths, config, KINDS[kind].paired):
                report = run_with_progress(
                    lambda p: _tokpack.pack_files(
                        paths=[str(x) for x in sources],
                        out_dir=str(tmp),
                        spill_dir=str(spill),
                        config=config,
                        batch_rows=BATCH_ROWS,
                        threads=threads,
                        progress=p,
                        kind=kind,
                    ),
                    progress,
                )
            if encoding is None:  # taken while the inputs were read: no second pass over them
                add_fingerprints(described, paths, report.input_fingerprints)
            with writing(tmp / DROPPED_NAME):
                dropped = write_dropped(
                    tmp / DROPPED_NAME, report, paths, staged, reasons=_dropped_reasons(report)
                )
        wall = time.perf_counter() - started
        manifest = packed_manifest(recorded, described, report, wall, dropped)
        if KINDS[kind].cut == "safe-blocks":  # the vision-encoder cost of the rows
            shards = [tmp / shard["file"] for shard in report.shards]
            manifest["figures"].update(packed_vision_figures(shards))
        manifest["sample_kind"] = kind
        if folders:
            manifest["input_folders"] = folders
        if tokenized is not None:
            manifest["inputs"] = described
            manifest["tokenize"] = tokenized
        return manifest

    def preflight(tmp: Path, spill: Path) -> None:
        tokens, labels = _read_columns(config, KINDS[kind].paired)
        check_disk_space(paths, tokens, labels, config.compression != "none", tmp, spill)

    if out is not None and encoding is None and not (out / MANIFEST_NAME).exists():
        # Before any work: a run the disk cannot hold is refused first. An OUT with a manifest
        # may be a cache hit, which needs no space: checked again inside the run, where it is
        # known not to be.
        preflight(out, Path(spill_dir) / ".spill" if spill_dir is not None else out / ".spill")
    manifest, hit, rebuilt_because = cached_run(
        dest,
        "pack",
        paths,
        recorded,
        build,
        threads=threads,
        force=force,
        verify=verify_cache,
        staging=spill_dir,
        fingerprinted=encoding is None,
    )
    return {**manifest, "cache_hit": hit, "rebuilt_because": rebuilt_because}


@contextlib.contextmanager
def _spill_in(tmp: Path, spill_dir: Optional[Path]) -> Iterator[Path]:
    """A new directory for the spill files, removed when the block ends: in the run's
    temporary (an interrupt while it is removed leaves nothing behind), or a scratch directory
    of ``spill_dir`` owned by this run (``_io.scratch``: a killed run's is removed by the next
    run that works there)."""
    if spill_dir is not None:
        with scratch_dir(SPILL_PREFIX, spill_dir) as spill:
            yield spill
        return
    spill = tmp / ".spill"
    spill.mkdir()
    try:
        yield spill
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def _read_columns(config: PackConfig, paired: bool) -> Tuple[List[str], List[str]]:
    """The token and label (or loss mask) columns the packer reads (a pair's two sequences'
    when ``paired``)."""
    if paired:
        return ["chosen_input_ids", "rejected_input_ids"], ["chosen_labels", "rejected_labels"]
    labels = [c for c in (config.labels_column, config.loss_mask_column) if c is not None]
    return [config.tokens_column], labels


def _dropped_reasons(report: Any) -> Dict[str, Tuple[int, ...]]:
    """The dropped list's reasons besides the core's: multimodal samples with no safe cut."""
    found = tuple(int(s) for s in report.no_safe_cut)
    return {NO_SAFE_CUT: found} if found else {}


@contextlib.contextmanager
def _named_by_record(
    staged: Optional[Path], paths: List[Path], config: PackConfig, paired: bool
) -> Iterator[None]:
    """A one-step pack's over-long error names the raw record (its file and line), not the
    staged file's row: the staged file's ``source_file`` / ``source_line`` of that row, read
    alone. (The tokenizer checked each sequence; a pair's footprint in its row is the core's.)"""
    try:
        yield
    except OverlongError as exc:
        row = getattr(exc, "index", None)
        if staged is None or row is None:
            raise
        with pa.memory_map(os.fsencode(staged)) as source:
            table = pa.ipc.open_file(source).read_all().select(["source_file", "source_line"])
        file, line = (table.column(c)[row].as_py() for c in ("source_file", "source_line"))
        path = paths[file]
        where = f"{'row ' if is_parquet(path) else ''}{line}"
        what = f"pair of {exc.length} tokens in a row ({config.pair_layout} layout)"
        raise OverlongError(
            f"{shown_path(path)}:{where}: {what if paired else f'sample of {exc.length} tokens'},"
            f' more than max_len={exc.max_len}; pass overlong="truncate" or "drop"'
        ) from None
