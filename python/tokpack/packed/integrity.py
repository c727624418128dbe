"""Integrity checks of output directories: ``tokpack.verify`` (``tokpack verify OUT``) checks a
packed directory end to end (README, "Integrity"); the check a rerun makes before it trusts an
existing output as a cache hit is ``_io.manifest.cache_problem``.

Quick: shards present with their recorded sizes, index side files consistent, the dropped list
and the figures adding up. Full, also: whole-file and per-row-group checksums, every row group
decoded and its counts checked against the index; preference rows hold whole pairs in the
layout's role order; carried columns have one entry per segment. The first problem found raises
:class:`CorruptOutputError` naming the file (and row group).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import _tokpack
from .._contract import PAIR_SEGMENT_ROLES
from .._io.manifest import cache_problem, member_path, read_manifest, side_file_problem
from .._io.uri import is_remote, local_path
from ..errors import CorruptOutputError
from ..kinds import KINDS
from .format import INDEX_COLUMNS
from .reader import PackedDir
from .remote import open_packed
from .tree_integrity import tree_problem

__all__ = ["verify"]


def read_side_file(path: Path, size: Any, checksum: Any, what: str) -> pa.Table:
    """An Arrow IPC side file, checked against its recorded size and checksum first."""
    problem = side_file_problem(path, size, checksum, True, what)
    if problem is not None:
        raise CorruptOutputError(problem)
    try:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
    except FileNotFoundError:
        raise CorruptOutputError(f"{path}: missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise CorruptOutputError(f"{path}: not a readable Arrow IPC file ({exc})") from None


def _check_figures(packed: PackedDir) -> None:
    m, root = packed.manifest, packed.root
    try:
        f = m["figures"]
        parts = [f[k] for k in ("samples_packed", "samples_truncated", "samples_split")]
        accounted = sum(parts) + f["samples_dropped"]
        samples_in, dropped = f["samples_in"], f["samples_dropped"]
        tokens, loss_tokens = f["tokens"], f["loss_tokens"]
        dropped_name = m["dropped_file"]
        shards = m["shards"]
    except (KeyError, TypeError) as exc:
        raise CorruptOutputError(f"{root}: manifest field {exc} is missing") from None
    if accounted != samples_in:
        raise CorruptOutputError(
            f"{root}: figures do not add up: samples_in is {samples_in}, packed + truncated +"
            f" split + dropped is {accounted}"
        )
    for key, want in (("tokens", tokens), ("loss_tokens", loss_tokens)):
        got = sum(int(s[key]) for s in shards)
        if got != want:
            raise CorruptOutputError(f"{root}: figures.{key} is {want}, the shards hold {got}")
    dropped_file = packed.side_path(dropped_name, "dropped_file")
    table = read_side_file(
        dropped_file, m.get("dropped_size"), m.get("dropped_checksum"), "dropped list"
    )
    if table.num_rows != dropped:
        raise CorruptOutputError(
            f"{dropped_file}: {table.num_rows} rows, figures.samples_dropped is {dropped}"
        )
    ids = table.column("sample_id").to_numpy() if "sample_id" in table.column_names else None
    if ids is None or len(np.unique(ids)) != len(ids) or (len(ids) and ids.max() >= samples_in):
        raise CorruptOutputError(f"{dropped_file}: sample_id missing, repeated or out of range")


def _read_index(packed: PackedDir, k: int) -> Dict[str, np.ndarray]:
    shard = packed.manifest["shards"][k]
    path = packed.side_path(shard["index"], f"shard {k} index")
    table = read_side_file(path, shard.get("index_size"), shard.get("index_checksum"), "index")
    names = INDEX_COLUMNS
    if table.num_rows != shard["rows"] or any(n not in table.column_names for n in names):
        raise CorruptOutputError(
            f"{path}: expected columns {list(names)} and {shard['rows']} rows, got"
            f" {table.column_names} and {table.num_rows} rows"
        )
    index = {n: table.column(n).to_numpy() for n in names}
    tokens = index["num_tokens"].astype(np.int64)
    if not np.array_equal(index["offset"], np.cumsum(tokens) - tokens) or tokens.sum() != int(
        shard["tokens"]
    ):
        raise CorruptOutputError(f"{path}: offsets and token counts do not add up")
    return index


def _check_group(
    packed: PackedDir, group: int, index: Dict[str, np.ndarray], first: int
) -> Dict[str, Any]:
    """Decode every column of a row group (its checksums are checked on the way) and compare the
    per-row counts with the list columns and with the index side file; a tree directory's rows
    are checked as trees (``tree_integrity``). The decoded columns."""
    shard = int(packed.group_shard[group])
    g = int(packed.group_index[group])
    path = packed.shard_paths[shard]
    names = packed.shard_columns(shard)
    cols = packed.decode(group, names)
    rows = slice(first, first + int(packed.group_rows[group]))
    lists = {"num_tokens": "input_ids", "num_seqs": "seq_lengths"}
    for name in INDEX_COLUMNS[1:]:  # the per-row counts (after the offset)
        got = np.asarray(cols[name], dtype=np.int64)
        if name in lists and not np.array_equal(got, np.diff(cols[lists[name]][1])):
            raise CorruptOutputError(
                f"{path}: row group {g}, column {name!r} disagrees with {lists[name]!r}"
            )
        if not np.array_equal(got, index[name][rows]):
            raise CorruptOutputError(
                f"{path}: row group {g}, column {name!r} disagrees with the index side file"
            )
    problem = pair_problem(cols, packed.pair_layout) if KINDS[packed.kind].paired else None
    for name in packed.carried:
        if not np.array_equal(cols[name][1], cols["seq_lengths"][1]):
            problem = f"carried column {name!r} does not have one entry per segment"
    if problem is not None:
        raise CorruptOutputError(f"{path}: row group {g}: {problem}")
    found = tree_problem(cols) if KINDS[packed.kind].trees else None
    if found is not None:
        row, column, what = found
        raise CorruptOutputError(
            f"{path}: row group {g}, row {first + row} of the shard: column {column!r} {what}"
        )
    return cols


def _check_tree_samples(packed: PackedDir, held: List[np.ndarray]) -> None:
    """A tree directory holds each sample whole, once: its rows' sample ids and the dropped
    list's are every input sample exactly once."""
    m = packed.manifest
    dropped_file = packed.side_path(m["dropped_file"], "dropped_file")
    table = read_side_file(
        dropped_file, m.get("dropped_size"), m.get("dropped_checksum"), "dropped list"
    )
    dropped = table.column("sample_id").to_numpy().astype(np.int64)
    ids = np.concatenate(held + [dropped]) if held else dropped
    count = np.bincount(ids[ids >= 0], minlength=int(m["figures"]["samples_in"]))
    n = int(m["figures"]["samples_in"])
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise CorruptOutputError(f"{packed.shown}: a sample id lies outside 0..{n - 1}")
    if (count != 1).any():
        s = int(np.argmax(count != 1))
        where = "held by no row nor the dropped list" if count[s] == 0 else "held more than once"
        raise CorruptOutputError(
            f"{packed.shown}: sample {s} is {where} (a tree directory holds each sample once)"
        )


def pair_problem(cols: Dict[str, Any], layout: str) -> Optional[str]:
    """What is wrong with the pairs of a decoded row group of a preference output, or None:
    every row holds whole pairs (``seq_roles`` in the layout's order per pair, one sample id per
    pair) and ``num_pairs`` counts them."""
    pattern = np.asarray(PAIR_SEGMENT_ROLES[layout], dtype=np.int64)
    width = len(pattern)
    roles, offsets = cols["seq_roles"]
    if not np.array_equal(offsets, cols["seq_lengths"][1]):
        return "column 'seq_roles' does not have one entry per segment"
    if np.any(offsets % width):
        return f"a row does not hold whole pairs ({width} segments each)"
    by_pair = np.asarray(roles, dtype=np.int64).reshape(-1, width)
    if not (by_pair == pattern).all():
        return f"column 'seq_roles' is not {pattern.tolist()} pair after pair"
    ids = np.asarray(cols["sample_ids"][0]).reshape(-1, width)
    if not (ids == ids[:, :1]).all():
        return "the segments of a pair have different sample ids"
    if not np.array_equal(np.asarray(cols["num_pairs"], dtype=np.int64), np.diff(offsets) // width):
        return "column 'num_pairs' disagrees with 'seq_roles'"
    return None


def _verify_token_shards(root: Path, manifest: Dict[str, Any], full: bool) -> Dict[str, Any]:
    """``verify`` of a ``tokpack tokenize`` output: every shard present with its size (and, full,
    checksum, and every row's ``length`` equal to its token and label lists), and the shards'
    rows and tokens adding up to the manifest's counts."""
    try:
        shards: List[Dict[str, Any]] = manifest["shards"]
        counts = manifest["counts"]
        want_rows, want_tokens = int(counts["samples_out"]), int(counts["tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptOutputError(f"{root}: manifest field {exc} is missing") from None
    problem = cache_problem(root, manifest, full=full)
    if problem is not None:
        raise CorruptOutputError(problem)
    rows = tokens = groups = 0
    for shard in shards:
        path = member_path(root, shard["file"], "shard")
        try:
            table = pq.read_table(path) if full else None
            meta = pq.read_metadata(path)
        except (pa.ArrowException, OSError) as exc:
            raise CorruptOutputError(f"{path}: not a readable Parquet file ({exc})") from None
        if meta.num_rows != shard["rows"]:
            raise CorruptOutputError(
                f"{path}: {meta.num_rows} rows, the manifest says {shard['rows']}"
            )
        if table is not None:
            length = table.column("length").to_numpy().astype(np.int64)
            for name in ("input_ids", "labels"):
                got = pc.list_value_length(table.column(name)).to_numpy()
                if not np.array_equal(got, length):
                    raise CorruptOutputError(f"{path}: column {name!r} disagrees with 'length'")
            if int(length.sum()) != int(shard["tokens"]):
                raise CorruptOutputError(
                    f"{path}: {length.sum()} tokens, the manifest says {shard['tokens']}"
                )
        rows += int(shard["rows"])
        tokens += int(shard["tokens"])
        groups += meta.num_row_groups
    if (rows, tokens) != (want_rows, want_tokens):
        raise CorruptOutputError(
            f"{root}: the shards hold {rows} samples and {tokens} tokens, the manifest's counts say"
            f" {want_rows} and {want_tokens}"
        )
    return {
        "ok": True,
        "path": str(root),
        "full": bool(full),
        "shards": len(shards),
        "row_groups": groups,
        "rows": rows,
        "bytes": sum(int(s.get("size", 0)) for s in shards),
    }


def verify(
    out_dir: Union[str, os.PathLike],
    full: bool = True,
    *,
    filesystem: Any = None,
    cache_dir: Optional[Union[str, os.PathLike]] = None,
    cache_limit: Optional[int] = None,
) -> Dict[str, Any]:
    """Check a directory written by ``tokpack pack`` (or ``tokpack tokenize``); raise on the
    first problem.

    Quick (``full=False``): the manifest, every shard's presence, size and footer, the index side
    files, the dropped list and the figures. Full (default) adds every shard's whole-file
    checksum and every row group's checksums, decoding and per-row counts.

    On object storage (a URI, or a path on ``filesystem``), the objects are read by byte range
    through the local cache of the torch readers (``cache_dir``, ``cache_limit``): the full
    check fetches every byte of every shard once, checks each row group and footer against its
    checksum (the ranges tile each shard after its 4-byte magic, which is checked too: together
    they are the whole-file check) and decodes it. Only packed directories are checked there.

    Returns:
        A report: ``ok`` (True), ``path``, ``full``, ``shards``, ``row_groups``, ``rows`` and
        ``bytes`` checked.

    Raises:
        CorruptOutputError: naming the damaged file (and row group); InputNotFoundError when
        ``out_dir`` is not a packed directory.
    """
    if is_remote(out_dir, filesystem):
        remote = open_packed(
            out_dir, filesystem=filesystem, cache_dir=cache_dir, cache_limit=cache_limit
        )
        with remote.naming():  # type: ignore[attr-defined]
            return _verify_packed(remote, full)
    out_dir = local_path(out_dir, filesystem) or out_dir
    manifest = read_manifest(out_dir) if Path(out_dir).is_dir() else None
    if isinstance(manifest, dict) and manifest.get("kind") == "tokenize":
        return _verify_token_shards(Path(out_dir), manifest, full)
    return _verify_packed(PackedDir(out_dir), full)


def _verify_packed(packed: PackedDir, full: bool) -> Dict[str, Any]:
    _check_figures(packed)
    shards: List[Dict[str, Any]] = packed.manifest["shards"]
    held: List[np.ndarray] = []  # a tree directory's sample ids
    for k, shard in enumerate(shards):
        index = _read_index(packed, k)
        if not full:
            continue
        first = 0
        for group in np.flatnonzero(packed.group_shard == k):
            cols = _check_group(packed, int(group), index, first)
            if KINDS[packed.kind].trees:
                held.append(np.asarray(cols["sample_ids"][0], dtype=np.int64))
            first += int(packed.group_rows[group])
        # The row groups and the footer cover all but the leading magic bytes; the whole-file
        # checksum covers those too.
        path = packed.shard_paths[k]
        if packed.remote:
            _check_tiling(packed, k)
            continue
        _, checksum = _tokpack.file_checksum(path)
        if checksum != shard["checksum"]:
            raise CorruptOutputError(
                f"{path}: does not match its checksum (it hashes to {checksum}, the manifest"
                f" says {shard['checksum']})"
            )
    if full and KINDS[packed.kind].trees:
        _check_tree_samples(packed, held)
    return {
        "ok": True,
        "path": packed.shown,
        "full": bool(full),
        "shards": len(shards),
        "row_groups": packed.num_groups,
        "rows": packed.num_rows,
        "bytes": sum(packed.shard_sizes),
    }


def _check_tiling(packed: PackedDir, k: int) -> None:
    """A remote shard's whole-file check without fetching it twice: its row groups and footer,
    each checked against its checksum when it was decoded, tile the object after the 4-byte
    Parquet magic, which is fetched and checked here."""
    ranges = [packed.group_bytes[int(g)] for g in np.flatnonzero(packed.group_shard == k)]
    ranges.append(packed.shard_footers[k])
    name = packed.manifest["shards"][k]["file"]
    at = 4
    for offset, length, _ in ranges:
        if offset != at:
            raise CorruptOutputError(
                f"{packed.shown}/{name}: the manifest's byte ranges leave bytes {at}..{offset}"
                " unchecked"
            )
        at = offset + length
    if at != packed.shard_sizes[k]:
        raise CorruptOutputError(
            f"{packed.shown}/{name}: the manifest's byte ranges end at {at}, the object has"
            f" {packed.shard_sizes[k]} bytes"
        )
    magic = packed.source.read_range(name, 0, 4)  # type: ignore[attr-defined]
    if magic != b"PAR1":
        raise CorruptOutputError(f"{packed.shown}/{name}: does not start with the Parquet magic")
