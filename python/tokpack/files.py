"""``tokpack.pack_files``: pack a tokenized corpus on disk (Parquet / Arrow IPC token shards)
into packed Parquet shards with a boundary index and a manifest.

The heavy lifting is in Rust (``tokpack_core::io``): units are read in parallel with only the
needed columns, tokens are spilled to flat files in the run's temporary directory (next to
OUT_DIR), the plan is made from lengths alone and shards are written in parallel, so memory
grows with the number of samples and the row-group size, not with the number of tokens. This
module resolves the inputs (``_inputs``), runs the cached-output skeleton
(``_outdir.cached_run``) and writes the manifest and the dropped-samples list.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import _tokpack
from ._contract import (
    FORMAT,
    FORMAT_VERSION,
    OVERLONG_POLICIES,
    PAIR_LAYOUTS,
    RESERVED_COLUMNS,
    STRATEGIES,
)
from ._diskspace import check_disk_space
from ._inputs import (
    RAW_SUFFIXES,
    TOKEN_SUFFIXES,
    PathsLike,
    is_parquet,
    resolve_inputs,
    shown_path,
)
from ._outdir import MANIFEST_NAME, SIDE_DIR, cached_run, open_for_writing, output_target, writing
from ._progress import run_with_progress
from .errors import ConfigError, OverlongError
from .planning import (
    MAX_ROWS,
    check_int,
    checked_args,
    checked_threads,
)
from .tokenize.options import TokenizeOptions
from .tokenize.pipeline import RecordEncoder
from .tokenize.schema import kind_of_format, kind_of_schema
from .tokenize.writer import REJECTED_NAME, stream_into, write_arrow

__all__ = ["pack_files", "read_lengths", "FORMAT", "FORMAT_VERSION", "PAIR_LAYOUTS"]

# The options of pack_files that also apply to tokpack.ray.pack (a dataset's packing layout).
PACKING_OPTIONS = ("strategy", "overlong", "seed", "tokens_column", "labels_column")
PACKING_OPTIONS += ("loss_mask_column", "rows_per_shard", "row_group_rows", "compression")

# Arrow IPC, not Parquet: HF ``datasets`` reads every ``*.parquet`` under data_dir, ``_`` or not.
DROPPED_NAME = f"{SIDE_DIR}/_dropped.arrow"
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
    layout = _checked_layout(pair_layout, _sample_kind(paths), paths[0])
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


def _config(**kw: Any) -> Dict[str, Any]:
    if kw["strategy"] not in STRATEGIES:
        raise ConfigError(f"unknown strategy {kw['strategy']!r}; expected one of {STRATEGIES}")
    if kw["overlong"] not in OVERLONG_POLICIES:
        raise ConfigError(
            f"unknown overlong policy {kw['overlong']!r}; expected one of {OVERLONG_POLICIES}"
        )
    for name in ("rows_per_shard", "row_group_rows"):
        kw[name] = check_int(kw[name], name, 1, MAX_ROWS)
    if kw["loss_mask_column"] is not None and kw["labels_column"] not in (None, "labels"):
        raise ConfigError("pass either labels_column or loss_mask_column, not both")
    # Only where they apply, so the cache keys of SFT outputs stay what they were.
    for key, unset in (("pair_layout", None), ("carry", [])):
        if kw.get(key, unset) == unset:
            kw.pop(key, None)
    return {"format_version": FORMAT_VERSION, **kw}


def _checked_carry(carry: Optional[Sequence[str]], kind: str) -> List[str]:
    """The carried columns: KTO's ``label`` first (always), then ``carry`` in order."""
    if isinstance(carry, (str, bytes)):
        raise ConfigError(f"carry must be a list of column names, not {carry!r}")
    names = ["label"] if kind == "kto" else []
    for name in carry or ():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"carry: column names must be non-empty strings, got {name!r}")
        if name in RESERVED_COLUMNS and name not in names:
            raise ConfigError(
                f"carry: {name!r} is a column of packed shards (reserved: "
                f"{', '.join(RESERVED_COLUMNS)}); rename the input column to carry it"
            )
        if name not in names:
            names.append(name)
    return names


def _checked_layout(pair_layout: str, kind: str, where: Path) -> Optional[str]:
    """The pair layout of a preference run (None for other kinds, where only the default is
    accepted)."""
    if pair_layout not in PAIR_LAYOUTS:
        raise ConfigError(f"unknown pair_layout {pair_layout!r}; expected one of {PAIR_LAYOUTS}")
    if kind == "preference":
        return pair_layout
    if pair_layout != PAIR_LAYOUTS[0]:
        raise ConfigError(
            f"pair_layout {pair_layout!r} applies to preference pairs; {shown_path(where)} holds"
            f" {kind} samples"
        )
    return None


def pack_files(
    inputs: PathsLike,
    output_dir: Union[str, os.PathLike],
    max_len: int,
    *,
    strategy: str = "bfd",
    overlong: str = "error",
    seed: int = 0,
    tokens_column: str = "input_ids",
    labels_column: Optional[str] = "labels",
    loss_mask_column: Optional[str] = None,
    rows_per_shard: int = 16384,
    row_group_rows: int = 1024,
    compression: str = "zstd",
    threads: Optional[int] = None,
    force: bool = False,
    progress: bool = False,
    tokenizer: Optional[Union[str, os.PathLike]] = None,
    tokenize: Optional[Union[TokenizeOptions, Dict[str, Any]]] = None,
    verify_cache: bool = False,
    pair_layout: str = "separate",
    carry: Optional[Sequence[str]] = None,
    spill_dir: Optional[Union[str, os.PathLike]] = None,
) -> Dict[str, Any]:
    """Pack token shards on disk into ``output_dir``; returns the manifest as a dict.

    Args:
        inputs: Parquet / Arrow IPC (Feather v2) files, directories or globs. Sample ``i`` is
            the ``i``-th row across the files in the order given (directories and globs sorted;
            a file given twice is packed twice).
        output_dir: written atomically: absent or complete, even after kill -9. It must be
            absent, empty or a tokpack output holding only what tokpack wrote, and must not
            overlap the inputs (else ConfigError / OutputExistsError, and nothing is touched).
        max_len, strategy, overlong, seed, threads: as in :func:`tokpack.plan`; the output is
            byte-identical for every ``threads``.
        tokens_column: list of integers (int32, int64, uint32, ...; every id must fit in int32).
        labels_column: used when the inputs have it (-100 = not trained on): every input or
            none (a file without it among files with it is a SchemaError naming that file); a
            name other than the default ``"labels"`` must exist. ``None`` ignores labels.
        loss_mask_column: a 0/1 column instead of labels: labels = tokens where it is 1.
        rows_per_shard, row_group_rows: output layout (rows per ``part-NNNNN.parquet`` and per
            Parquet row group).
        compression: ``"zstd"``, ``"zstd:LEVEL"``, ``"snappy"``, ``"lz4"`` or ``"none"``.
        force: rebuild even when ``output_dir`` is already current (a cache hit).
        verify_cache: before trusting a cache hit, check every shard's checksum (always checked:
            every listed file is present with its recorded size). A damaged output is rebuilt.
        progress: draw progress bars on stderr (only when it is a terminal).
        tokenizer: one step from raw data: JSONL / ``.jsonl.gz`` / Parquet records tokenized
            with this tokenizer (``tokenizer.json`` or its directory) and packed in the same
            run; ``tokenize`` holds the options (a :class:`tokpack.TokenizeOptions` or a dict of
            its fields); rejected records go to ``__tokpack__/_rejected.jsonl``.
        pair_layout: preference inputs are packed pair by pair, both sequences in one row:
            ``"separate"`` or ``"shared-prompt"`` (README, "Packing preference and KTO data");
            the overlong policy applies to a pair's footprint, and the figures count pairs.
        carry: scalar per-sample columns written to each packed row as a list with one entry
            per segment. KTO inputs carry ``label`` always.
        spill_dir: an existing directory (another disk, say) for the spill files, about 2.1
            bytes per token (default: the run's temporary next to ``output_dir``). tokpack
            works in a subdirectory it creates there and removes it, whatever happens. A run
            the disks cannot hold is refused before any work (DiskSpaceError).

    Returns:
        The manifest (``format``, ``config``, ``inputs``, ``shards``, ``figures``, ...) plus
        ``cache_hit``: True when ``output_dir`` was already current and nothing was done, and
        ``rebuilt_because``: why a current but damaged ``output_dir`` was rebuilt (else None).
    """
    started = time.perf_counter()
    max_len, seed, threads = checked_args(max_len, seed, threads)
    out = output_target(output_dir)
    encoding = None
    if tokenizer is not None:
        paths = resolve_inputs(inputs, RAW_SUFFIXES, output_dir=out)
        options = TokenizeOptions.of(tokenize).for_inputs(paths)
        if overlong == "error" and options.max_len is None:
            # Checked while tokenizing, where the sample's raw file and line are known.
            options = replace(options, max_len=max_len)
        # Carried columns are the records' fields, staged with the tokens (KTO's label is there).
        kind = kind_of_format(options.format)
        fields = [c for c in _checked_carry(carry, kind) if (kind, c) != ("kto", "label")]
        options = replace(options, carry=(*options.carry, *fields))
        encoding = RecordEncoder(tokenizer, options)
        kind = encoding.kind
        tokens_column, labels_column, loss_mask_column = "input_ids", "labels", None
    else:
        paths = resolve_inputs(inputs, TOKEN_SUFFIXES, output_dir=out)
        kind = _sample_kind(paths)
    layout = _checked_layout(pair_layout, kind, paths[0])
    carried = _checked_carry(carry, kind)
    config = _config(
        max_len=max_len,
        strategy=strategy,
        overlong=overlong,
        seed=seed,
        tokens_column=tokens_column,
        labels_column=labels_column,
        loss_mask_column=loss_mask_column,
        rows_per_shard=rows_per_shard,
        row_group_rows=row_group_rows,
        compression=compression,
        pair_layout=layout,
        carry=carried,
    )
    if encoding is not None:
        config["tokenize"] = encoding.config()

    def build(tmp: Path, described: List[Dict[str, Any]]) -> Dict[str, Any]:
        # By default inside the run's temporary: an interrupt while it is removed leaves
        # nothing behind.
        spill = _spill_in(tmp, spill_dir)
        try:
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
                if layout is not None and overlong == "error":
                    _check_pairs_fit(staged, paths, max_len, layout)
            result = run_with_progress(
                lambda p: _tokpack.pack_files(
                    paths=[str(x) for x in sources],
                    out_dir=str(tmp),
                    spill_dir=str(spill),
                    tokens_column=tokens_column,
                    labels_column=labels_column,
                    labels_required=labels_column not in (None, "labels"),
                    loss_mask_column=loss_mask_column,
                    max_len=max_len,
                    strategy=strategy,
                    overlong=overlong,
                    seed=seed,
                    rows_per_shard=rows_per_shard,
                    row_group_rows=row_group_rows,
                    compression=compression,
                    batch_rows=BATCH_ROWS,
                    pair_layout=layout,
                    carry=carried,
                    threads=threads,
                    progress=p,
                ),
                progress,
            )
            dropped_entry = _write_dropped(tmp / DROPPED_NAME, result, paths, staged)
        finally:
            shutil.rmtree(spill, ignore_errors=True)
        manifest = _manifest(config, described, result, time.perf_counter() - started)
        manifest.update(dropped_entry)
        manifest["sample_kind"] = kind
        if tokenized is not None:
            manifest["inputs"] = described
            manifest["tokenize"] = tokenized
        return manifest

    def preflight(tmp: Path, spill: Path) -> None:
        tokens, labels = _read_columns(paths, layout, tokens_column, labels_column)
        labels = labels + [loss_mask_column] * (loss_mask_column is not None)
        check_disk_space(paths, tokens, labels, compression != "none", tmp, spill)

    if encoding is None and not (out / MANIFEST_NAME).exists():
        # Before the inputs are fingerprinted for the cache key (a minute at 10M samples): a
        # run the disk cannot hold is refused first. An OUT with a manifest may be a cache hit,
        # which needs no space: checked again inside the run, where it is known not to be.
        preflight(out, Path(spill_dir) / ".spill" if spill_dir is not None else out / ".spill")
    manifest, hit, rebuilt_because = cached_run(
        out, "pack", paths, config, build, threads=threads, force=force, verify=verify_cache
    )
    return {**manifest, "cache_hit": hit, "rebuilt_because": rebuilt_because}


def _spill_in(tmp: Path, spill_dir: Optional[Union[str, os.PathLike]]) -> Path:
    """A new directory for the spill files: in the run's temporary, or in ``spill_dir``."""
    if spill_dir is None:
        spill = tmp / ".spill"
        spill.mkdir()
        return spill
    if not Path(spill_dir).is_dir():
        raise ConfigError(f"spill_dir {str(spill_dir)!r} is not an existing directory")
    return Path(tempfile.mkdtemp(prefix=".tokpack-spill-", dir=spill_dir))


def _read_columns(
    paths: List[Path], layout: Optional[str], tokens: str, labels: Optional[str]
) -> Tuple[List[str], List[str]]:
    """The token and label columns the packer reads (labels: when the first input has them)."""
    if layout is not None:
        return ["chosen_input_ids", "rejected_input_ids"], ["chosen_labels", "rejected_labels"]
    return [tokens], [labels] if labels is not None else []


def _sample_kind(paths: List[Path]) -> str:
    """The kind of samples the token shards hold (``sft``, ``preference`` or ``kto``), one for
    all of them."""
    kinds: Dict[str, Path] = {}
    for path in paths:
        try:
            with pa.OSFile(os.fsencode(path)) as source:
                parquet = source.read(4) == b"PAR1"  # by its magic bytes, as the packer
                source.seek(0)
                schema = pq.read_schema(source) if parquet else pa.ipc.open_file(source).schema
        except Exception:  # unreadable or not Arrow: the packer reports it, naming the file
            continue
        found = kind_of_schema(schema)
        kinds.setdefault("sft" if found is None else found[0], path)
    if len(kinds) > 1:
        shown = ", ".join(f"{shown_path(p)} holds {k} samples" for k, p in kinds.items())
        raise ConfigError(f"the inputs mix kinds of samples ({shown}); pack each kind apart")
    return next(iter(kinds), "sft")


def _check_pairs_fit(staged: Path, paths: List[Path], max_len: int, layout: str) -> None:
    """One-step pack of preference records with ``overlong="error"``: the first pair whose row
    footprint exceeds ``max_len``, named by its raw record (the packer would name the staged
    file). The tokenizer checked each sequence alone."""
    with pa.memory_map(os.fsencode(staged)) as source:
        table = pa.ipc.open_file(source).read_all()
    lengths = [pc.list_value_length(table.column(f"{r}_input_ids")) for r in ("chosen", "rejected")]
    footprint = lengths[0].to_numpy().astype(np.int64) + lengths[1].to_numpy()
    if layout == "shared-prompt":
        footprint -= table.column("prompt_length").to_numpy()
    over = np.flatnonzero(footprint > max_len)
    if len(over):
        i = int(over[0])
        path = paths[table.column("source_file")[i].as_py()]
        where = f"{'row ' if is_parquet(path) else ''}{table.column('source_line')[i].as_py()}"
        raise OverlongError(
            f"{shown_path(path)}:{where}: pair of {footprint[i]} tokens in a row ({layout}"
            f' layout), more than max_len={max_len}; pass overlong="truncate" or "drop"'
        )


def _write_dropped(
    path: Path, result: Dict[str, Any], paths: List[Path], staged: Optional[Path]
) -> Dict[str, Any]:
    """Every sample that is not in the output, with its file, row (token shards, Parquet: from
    0) or line (JSONL: from 1) and reason. With ``staged`` (one-step pack) the sample ids are
    rows of that tokenized file, whose source columns lead back to the raw ``paths``. Returns
    the manifest's ``dropped_size`` and ``dropped_checksum`` of the file written (readers
    check them)."""
    dropped = np.asarray(result["dropped"], dtype=np.int64)
    if staged is None:
        bounds = np.cumsum([0] + list(result["input_rows"]))
        file_idx = np.searchsorted(bounds, dropped, side="right") - 1
        where = dropped - bounds[file_idx]
        is_line = np.zeros(len(dropped), dtype=bool)
    else:
        with pa.memory_map(os.fsencode(staged)) as source:
            table = pa.ipc.open_file(source).read_all()
            file_idx = table.column("source_file").take(dropped).to_numpy()
            where = table.column("source_line").take(dropped).to_numpy()
        is_line = np.array([not is_parquet(p) for p in paths], dtype=bool)[file_idx]
    reason = np.where(np.isin(dropped, result["empty"]), "empty", "overlong")
    table = pa.table(
        {
            "sample_id": pa.array(dropped, pa.int64()),
            "file": pa.array([shown_path(paths[i]) for i in file_idx], pa.string()),
            "row": pa.array(where, pa.int64(), mask=is_line),
            "line": pa.array(where, pa.int64(), mask=~is_line),
            "reason": pa.array(reason.tolist(), pa.string()),
        }
    )
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_for_writing(path) as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        size, checksum = _tokpack.file_checksum(str(path))
    return {"dropped_size": size, "dropped_checksum": checksum}


def _manifest(
    config: Dict[str, Any],
    described: List[Dict[str, Any]],
    result: Dict[str, Any],
    wall: float,
) -> Dict[str, Any]:
    n = result["n_samples"]
    dropped, truncated, split = (len(result[k]) for k in ("dropped", "truncated", "split"))
    rows, tokens, max_len = result["rows"], result["tokens"], result["max_len"]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": config,
        "inputs": [{**d, "rows": r} for d, r in zip(described, result["input_rows"])],
        "has_labels": result["has_labels"],
        "shards": result["shards"],
        "dropped_file": DROPPED_NAME,
        "figures": {
            "samples_in": n,
            "samples_packed": n - dropped - truncated - split,
            "samples_truncated": truncated,
            "samples_split": split,
            "samples_dropped": dropped,
            "samples_empty": len(result["empty"]),
            "input_tokens": result["input_tokens"],
            "rows": rows,
            "tokens": tokens,
            "loss_tokens": sum(s["loss_tokens"] for s in result["shards"]),
            "padding_tokens": rows * max_len - tokens,
            "padding_tokens_unpacked": result["segments"] * max_len - tokens,
            "efficiency": result["efficiency"],
            "lower_bound": result["lower_bound"],
            "wall_time_s": round(wall, 3),
        },
    }
