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
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import _tokpack
from ._contract import PAIR_LAYOUTS
from ._format import DROPPED_NAME, FORMAT, FORMAT_VERSION, packed_manifest, write_dropped
from ._inputs import (
    RAW_SUFFIXES,
    TOKEN_SUFFIXES,
    PathsLike,
    is_parquet,
    resolve_inputs,
    shown_path,
)
from ._outdir import cached_run, open_for_writing, output_target, writing
from ._progress import run_with_progress
from .errors import ConfigError, OverlongError
from .pack_config import PackConfig, pack_config
from .planning import checked_threads
from .tokenize.options import TokenizeOptions
from .tokenize.pipeline import RecordEncoder
from .tokenize.schema import kind_of_schema, token_schema
from .tokenize.writer import REJECTED_NAME, stream_into

__all__ = ["pack_files", "read_lengths", "FORMAT", "FORMAT_VERSION", "PAIR_LAYOUTS"]

# What a one-step pack (``tokenizer=``) supports: the tokenizer writes the columns, and record
# fields are not carried through tokenizing.
ONE_STEP_FIELDS = ("max_len", "strategy", "overlong", "seed", "pair_layout", "rows_per_shard")
ONE_STEP_FIELDS += ("row_group_rows", "compression")
# Rows decoded at a time inside a row group: bounds reading memory to a few tens of MB per thread.
BATCH_ROWS = 4096


def read_lengths(
    inputs: PathsLike,
    tokens_column: str = "input_ids",
    *,
    threads: Optional[int] = None,
    progress: bool = False,
) -> np.ndarray:
    """Sample lengths (int64) of the token column across the inputs, read in Rust."""
    threads = checked_threads(threads)
    paths = resolve_inputs(inputs, TOKEN_SUFFIXES)
    lengths, _ = run_with_progress(
        lambda p: _tokpack.read_lengths(
            paths=[str(x) for x in paths],
            tokens_column=tokens_column,
            batch_rows=BATCH_ROWS,
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
    **fields: Any,
) -> Dict[str, Any]:
    """Pack token shards on disk into ``output_dir``; returns the manifest as a dict.

    Args:
        inputs: Parquet / Arrow IPC (Feather v2) files, directories or globs. Sample ``i`` is
            the ``i``-th row across the files in the order given (directories and globs sorted).
        output_dir: written atomically: absent or complete, even after kill -9. It must be
            absent, empty or a tokpack output holding only what tokpack wrote, and must not
            overlap the inputs (else ConfigError / OutputExistsError, and nothing is touched).
        max_len, fields: the :class:`tokpack.PackConfig` of the job (``strategy``,
            ``overlong``, ``seed``, ``tokens_column``, ``labels_column``, ``loss_mask_column``,
            ``pair_layout``, ``carry``, ``rows_per_shard``, ``row_group_rows``,
            ``compression``), or ``config=`` (not both). Labels are carried along when every
            input has them; preference inputs are packed pair by pair in ``pair_layout``; KTO
            inputs carry ``label`` always.
        threads: as in :func:`tokpack.plan`; the output is byte-identical for every value.
        force: rebuild even when ``output_dir`` is already current (a cache hit).
        verify_cache: before trusting a cache hit, check every shard's checksum (always checked:
            every listed file is present with its recorded size). A damaged output is rebuilt.
        progress: draw progress bars on stderr (only when it is a terminal).
        tokenizer: one step from raw data: JSONL / ``.jsonl.gz`` / Parquet records tokenized
            with this tokenizer (``tokenizer.json`` or its directory) and packed in the same
            run; ``tokenize`` holds the options (a :class:`tokpack.TokenizeOptions` or a dict of
            its fields); rejected records go to ``__tokpack__/_rejected.jsonl``. The columns and
            ``carry`` are then refused (the tokenizer writes the columns).

    Returns:
        The manifest (``format``, ``config``, ``inputs``, ``shards``, ``figures``, ...) plus
        ``cache_hit``: True when ``output_dir`` was already current and nothing was done, and
        ``rebuilt_because``: why a current but damaged ``output_dir`` was rebuilt (else None).
    """
    started = time.perf_counter()
    config = pack_config(max_len, config, fields)
    threads = checked_threads(threads)
    out = output_target(output_dir)
    encoding = None
    if tokenizer is not None:
        config.refuse_unsupported("a one-step pack (tokenizer=)", ONE_STEP_FIELDS)
        paths = resolve_inputs(inputs, RAW_SUFFIXES, output_dir=out)
        options = TokenizeOptions.of(tokenize).for_inputs(paths)
        if config.overlong == "error" and options.max_len is None:
            # Checked while tokenizing, where the sample's raw file and line are known.
            options = replace(options, max_len=config.max_len)
        encoding = RecordEncoder(tokenizer, options)
        kind = encoding.kind
    else:
        paths = resolve_inputs(inputs, TOKEN_SUFFIXES, output_dir=out)
        kind = _sample_kind(paths)
    config = config.for_kind(kind, shown_path(paths[0]))
    recorded = config.to_dict()
    if encoding is not None:
        recorded["tokenize"] = encoding.config()

    def build(tmp: Path, described: List[Dict[str, Any]]) -> Dict[str, Any]:
        # Inside the run's temporary: an interrupt while it is removed leaves nothing behind.
        spill = tmp / ".spill"
        spill.mkdir()
        try:
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
                schema = token_schema(kind, sources=True)
                with stream as tokens, writing(staged), open_for_writing(staged) as sink:
                    with pa.ipc.new_file(sink, schema) as writer:
                        for batch in tokens:
                            writer.write_batch(batch)
                tokenized = {
                    "counts": tokens.stats.as_dict(),
                    "template": encoding.template_info,
                    "encoder": encoding.encoder_info,
                    "renderer": tokens.renderer_info,
                    "rejected_file": REJECTED_NAME if tokens.stats.rejected else None,
                }
                if config.pair_layout is not None and config.overlong == "error":
                    _check_pairs_fit(staged, paths, config.max_len, config.pair_layout)
            report = run_with_progress(
                lambda p: _tokpack.pack_files(
                    paths=[str(x) for x in sources],
                    out_dir=str(tmp),
                    spill_dir=str(spill),
                    config=config,
                    batch_rows=BATCH_ROWS,
                    threads=threads,
                    progress=p,
                ),
                progress,
            )
            with writing(tmp / DROPPED_NAME):
                write_dropped(tmp / DROPPED_NAME, report, paths, staged)
        finally:
            shutil.rmtree(spill, ignore_errors=True)
        manifest = packed_manifest(recorded, described, report, time.perf_counter() - started)
        manifest["sample_kind"] = kind
        if tokenized is not None:
            manifest["inputs"] = described
            manifest["tokenize"] = tokenized
        return manifest

    manifest, hit, rebuilt_because = cached_run(
        out, "pack", paths, recorded, build, threads=threads, force=force, verify=verify_cache
    )
    return {**manifest, "cache_hit": hit, "rebuilt_because": rebuilt_because}


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
