"""Export a packed directory (``tokpack pack``'s output) to the formats NVIDIA's trainers read
(README, "Export for Megatron-LM and NeMo", has both layouts in full).

**Megatron-LM indexed dataset**: ``PREFIX.bin`` + ``PREFIX.idx`` as ``_IndexWriter`` writes
them (``megatron/core/datasets/indexed_dataset.py``); one sequence per packed sample segment.
Labels are not exported: Megatron has no convention for them beside a GPT indexed dataset.

**Megatron-Bridge / NeMo packed-sequence Parquet** (``GPTSFTPackedParquetDataset``):
``loss_mask`` is shifted by one as Megatron-Bridge's ``fill_packing_strategy`` stores it and its
collator reads it: ``loss_mask[j]`` is ``labels[j + 1] != -100``, 0 at each sample's last token.

Both read the shards one row group at a time and write to temporary names renamed when
complete; memory grows with the number of samples (the Megatron index), not the tokens.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import _tokpack
from .._checks import check_choice
from .._contract import IGNORE_INDEX
from .._io.arrays import list_array
from .._io.inputs import TOKEN_SUFFIXES, shown_path
from .._io.manifest import read_json, write_json
from .._io.outdir import atomic_output_files, writing
from .._io.overlap import Place, check_apart, local_place, uri_place
from .._io.store import object_output_files
from .._io.uri import is_remote
from ..errors import ConfigError, CorruptOutputError, DataError
from ..kinds import refuse_kind
from .reader import PackedDir, segment_sums
from .remote import open_packed

__all__ = [
    "export_megatron",
    "export_nemo_packed",
    "check_megatron",
    "MEGATRON_DTYPES",
    "DOCUMENT_MODES",
]

PathLike = Union[str, os.PathLike]

_INDEX_HEADER = b"MMIDIDX\x00\x00"
_INDEX_VERSION = 1
# Megatron's DType codes of the two token dtypes its tools write.
MEGATRON_DTYPES = {"uint16": (np.uint16, 8), "int32": (np.int32, 4)}
# DType.optimal_dtype: uint16 when the vocabulary size is < 65,500.
_UINT16_VOCAB_LIMIT = 65500
DOCUMENT_MODES = ("sample", "row")
# Beside PREFIX.bin and PREFIX.idx: what tokpack wrote, with sizes and checksums.
MARKER_SUFFIX = ".tokpack.json"


class _Group:
    """One row group of a packed shard, decoded by the checked reader: flat numpy views and
    where each row starts."""

    def __init__(self, where: str, cols: Dict[str, Any], with_labels: bool) -> None:
        ids, self.token_offsets = cols["input_ids"]
        self.lengths, self.seg_offsets = cols["seq_lengths"]
        self.where = where
        self.tokens = np.asarray(ids)
        self.labels = np.asarray(cols["labels"][0]) if with_labels else None
        row_tokens = segment_sums(self.lengths, self.seg_offsets)
        # tokpack never writes empty samples (they are dropped and listed as such).
        if (self.lengths <= 0).any() or not np.array_equal(row_tokens, np.diff(self.token_offsets)):
            raise CorruptOutputError(
                f"{where}: seq_lengths are not positive or do not add up to the row's input_ids"
            )
        if self.labels is not None and self.labels.size != self.tokens.size:
            raise CorruptOutputError(f"{where}: labels and input_ids differ in length")


def _packed_dir(packed_dir: PathLike, target: str) -> PackedDir:
    """The packed directory an export reads, validated (shards present with their sizes, paths
    inside it), and refused when ``target`` cannot represent its samples: Megatron and NeMo
    datasets are sequences of independent documents, with no notion of a preference pair
    (chosen / rejected), of KTO's desirable / undesirable label or of images (multimodal rows:
    the ids alone would train on image pads without their images). On object storage (a URI) it
    is read through the readers' cache (``tokpack.remote``)."""
    packed = open_packed(packed_dir)
    refuse_kind("export", packed.kind, shown_path(packed_dir))
    return packed


def _outputs(shown: List[str], packed: PackedDir, force: bool, owned: Callable[..., bool]) -> Any:
    """Temporary paths for the files ``shown``, each put in place whole when the block ends:
    objects on object storage, else local files. An existing one is replaced only with
    ``force`` and when ``owned(path or key, fs)`` says tokpack wrote it. Refused first when
    one overlaps what :func:`_read_places` says the export reads."""
    places = [uri_place(name) if is_remote(name) else local_place(name) for name in shown]
    for place, name in zip(places, shown):
        check_apart(place, _read_places(packed, name), writes="file")
    write = object_output_files if is_remote(shown[0]) else atomic_output_files
    return write(shown, force=force, owned=owned)


def _read_places(packed: PackedDir, name: str) -> List[Tuple[Place, bool]]:
    """What an export to ``name`` must stay out of: the packed directory it reads, and, for a
    file `tokpack pack` would read (NeMo's ``.parquet``), the folders the pack listed its
    inputs from (the manifest's ``input_folders``: the next run of that pack would read it)."""
    root = uri_place(packed.shown) if packed.remote else local_place(packed.root)
    places = [(root, True)]
    if name.lower().endswith(TOKEN_SUFFIXES):
        for folder in packed.manifest.get("input_folders") or []:
            place = uri_place(folder) if is_remote(folder) else local_place(folder)
            places.append((place, True))
    return places


def _row_groups(packed: PackedDir, with_labels: bool) -> Iterator[_Group]:
    """Every row group, in order, through the checked reader (``PackedDir.decode``): a damaged
    shard raises :class:`CorruptOutputError` naming it instead of being exported."""
    columns = ["input_ids", "seq_lengths"] + (["labels"] if with_labels else [])
    for group in range(packed.num_groups):
        shard = int(packed.group_shard[group])
        g = int(packed.group_index[group])
        where = f"{shown_path(packed.shard_paths[shard])}: row group {g}"
        yield _Group(where, packed.decode(group, columns), with_labels)


def _write_bin(
    bin_tmp: Path, packed: PackedDir, dtype: str, auto: bool
) -> Optional[Tuple[List[np.ndarray], List[np.ndarray], int]]:
    """Writes the tokens as ``dtype``; returns the per-group sequence lengths and rows'
    sequence counts and the token count, or None when ``auto`` and an id is too large for
    Megatron's uint16 rule (the caller starts again in int32: one pass in the common case)."""
    np_dtype = MEGATRON_DTYPES[dtype][0]
    limit = _UINT16_VOCAB_LIMIT - 2 if auto and dtype == "uint16" else np.iinfo(np_dtype).max  # type: ignore[type-var]
    lengths: List[np.ndarray] = []
    row_counts: List[np.ndarray] = []
    n_tokens = 0
    with open(bin_tmp, "wb") as f:
        for group in _row_groups(packed, with_labels=False):
            if group.tokens.size and int(group.tokens.max()) > limit:
                if auto:
                    return None
                raise DataError(
                    f"{group.where}: token id {int(group.tokens.max())} does not fit {dtype}"
                )
            if group.tokens.size and int(group.tokens.min()) < 0:
                raise CorruptOutputError(f"{group.where}: negative token id")
            group.tokens.astype(np_dtype, copy=False).tofile(f)
            lengths.append(group.lengths)
            row_counts.append(np.diff(group.seg_offsets))
            n_tokens += group.tokens.size
    return lengths, row_counts, n_tokens


def _write_idx(
    idx_tmp: Path, dtype: str, lengths: np.ndarray, document_indices: np.ndarray
) -> None:
    np_dtype, code = MEGATRON_DTYPES[dtype]
    pointers = (np.cumsum(lengths, dtype=np.int64) - lengths) * np.dtype(np_dtype).itemsize
    with open(idx_tmp, "wb") as f:
        counts = struct.pack("<QBQQ", _INDEX_VERSION, code, lengths.size, document_indices.size)
        f.write(_INDEX_HEADER + counts)
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8", copy=False).tobytes())
        f.write(document_indices.astype("<i8", copy=False).tobytes())


def export_megatron(
    packed_dir: PathLike,
    prefix: PathLike,
    *,
    document: str = "sample",
    dtype: Optional[str] = None,
    force: bool = False,
) -> Dict[str, Any]:
    """Writes ``PREFIX.bin`` and ``PREFIX.idx``, a Megatron-LM indexed dataset of the packed
    directory's samples (one sequence per sample, in the packed order), and
    ``PREFIX.tokpack.json``, which names both with their sizes and checksums
    (:func:`check_megatron` checks the pair).

    ``document``: ``"sample"`` one document per sample, ``"row"`` one per packed row.
    ``dtype``: ``"uint16"`` or ``"int32"``; by default uint16 when every id < 65,499 (Megatron's
    rule for a vocabulary under 65,500), else int32. Existing files are replaced only with
    ``force``, and only when an earlier export wrote them. Preference and KTO directories are
    refused (ConfigError): Megatron's documents cannot represent pairs or KTO labels. Returns
    the figures: ``bin``, ``idx``, ``dtype``, ``sequences``, ``documents`` (without Megatron's
    leading 0), ``tokens``.
    """
    check_choice("document", document, DOCUMENT_MODES)
    if dtype is not None:
        check_choice("dtype", dtype, MEGATRON_DTYPES)
    prefix = os.fspath(prefix)
    if not os.path.basename(prefix):
        raise ConfigError(f"{shown_path(prefix)}: the prefix needs a file name (PREFIX.bin)")
    packed = _packed_dir(packed_dir, "a Megatron indexed dataset")
    shown = [prefix + suffix for suffix in (MARKER_SUFFIX, ".bin", ".idx")]
    # The marker first and the index last: Megatron opens a prefix by its .idx.
    with writing(prefix), _outputs(shown, packed, force, _marked) as (marker_tmp, bin_tmp, idx_tmp):
        chosen = dtype or "uint16"
        written = _write_bin(bin_tmp, packed, chosen, auto=dtype is None)
        if written is None:
            chosen = "int32"
            written = _write_bin(bin_tmp, packed, chosen, auto=True)
        assert written is not None  # int32 holds every id
        lengths_parts, row_counts, n_tokens = written
        lengths = np.concatenate([np.zeros(0, np.int32), *lengths_parts])
        if document == "row":
            per_document = np.concatenate([np.zeros(0, np.int64), *row_counts])
        else:
            per_document = np.ones(lengths.size, np.int64)
        document_indices = np.concatenate([[0], np.cumsum(per_document, dtype=np.int64)])
        _write_idx(idx_tmp, chosen, lengths, document_indices)
        names = [os.path.basename(name) for name in shown]
        _write_marker(marker_tmp, {names[1]: bin_tmp, names[2]: idx_tmp})
    return {
        "bin": shown[1],
        "idx": shown[2],
        "dtype": chosen,
        "sequences": int(lengths.size),
        "documents": int(per_document.size),
        "tokens": int(n_tokens),
    }


def _write_marker(path: Path, files: Dict[str, Path]) -> None:
    """``PREFIX.tokpack.json``: what tokpack wrote beside it (the ownership record that lets
    ``--force`` replace them) with each file's size and checksum (how a pair torn by a kill
    between its renames is told from a whole one)."""
    entries = {}
    for name, tmp in files.items():
        size, checksum = _tokpack.file_checksum(str(tmp))
        entries[name] = {"size": size, "checksum": checksum}
    # Straight into ``path``, itself a temporary of atomic_output_files (a temporary of it would
    # be a name the next run's clean-up does not know, left behind by a kill -9).
    write_json(
        path, {"tokpack_version": _tokpack.__version__, "format": "megatron", "files": entries}
    )


def _read_marker(marker: Any, fs: Any = None) -> Optional[Dict[str, Any]]:
    """The marker ``PREFIX.tokpack.json`` (a path, or a key of ``fs``), or None when it is
    missing or is not one."""
    try:
        data = read_json(marker, fs)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return None
    return data


def _marked(key: str, fs: Any = None) -> bool:
    """Whether tokpack wrote the file ``key`` (a path, or a key of ``fs``): it is the marker, or
    the marker beside it names it."""
    base = key[: -len(MARKER_SUFFIX)] if key.endswith(MARKER_SUFFIX) else key.rsplit(".", 1)[0]
    data = _read_marker(base + MARKER_SUFFIX, fs)
    return data is not None and (
        key.endswith(MARKER_SUFFIX) or key.rsplit("/", 1)[-1] in data["files"]
    )


def check_megatron(prefix: PathLike) -> Dict[str, Any]:
    """Checks that ``PREFIX.bin`` and ``PREFIX.idx`` are the pair ``export_megatron`` wrote:
    both present with the sizes and checksums ``PREFIX.tokpack.json`` records (a kill between
    the renames of ``--force`` leaves a pair that fails here). Returns the marker; raises
    :class:`CorruptOutputError` naming the file that does not match."""
    prefix = os.fspath(prefix)
    marker = Path(prefix + MARKER_SUFFIX)
    data = _read_marker(marker)
    if data is None:
        raise CorruptOutputError(f"{shown_path(marker)}: missing or unreadable")
    for suffix in (".bin", ".idx"):
        path = Path(prefix + suffix)
        want = data["files"].get(path.name)
        try:
            got = _tokpack.file_checksum(str(path))
        except OSError:
            got = None
        if not isinstance(want, dict) or got != (want.get("size"), want.get("checksum")):
            raise CorruptOutputError(
                f"{shown_path(path)}: does not match {shown_path(marker)} (missing, replaced, "
                "or left by an interrupted --force: export again)"
            )
    return data


_NEMO_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("seq_start_id", pa.list_(pa.int32())),
    ]
)


# The key of the Parquet key-value metadata that marks a NeMo file as tokpack's (its version).
_NEMO_MARK = "tokpack_version"


def _nemo_table(group: _Group) -> Tuple[pa.Table, int]:
    """The NeMo rows of one packed row group and their number of loss tokens."""
    n_rows = group.token_offsets.size - 1
    row_of_seg = np.repeat(np.arange(n_rows), np.diff(group.seg_offsets))
    seg_token_starts = np.cumsum(group.lengths, dtype=np.int64) - group.lengths
    starts = seg_token_starts - group.token_offsets[row_of_seg]
    trained = (
        np.ones(group.tokens.size, dtype=bool)
        if group.labels is None
        else group.labels != IGNORE_INDEX
    )
    # Shifted by one: position j holds whether token j + 1 is trained on; nothing follows a
    # sample's last token.
    mask = np.zeros(group.tokens.size, dtype=np.int8)
    mask[:-1] = trained[1:]
    mask[seg_token_starts + group.lengths - 1] = 0
    table = pa.table(
        [
            list_array(group.token_offsets, group.tokens, pa.int32()),
            list_array(group.token_offsets, mask, pa.int8()),
            list_array(group.seg_offsets, starts.astype(np.int32), pa.int32()),
        ],
        schema=_NEMO_SCHEMA,
    )
    return table, int(mask.sum(dtype=np.int64))


def export_nemo_packed(
    packed_dir: PathLike, dest: PathLike, *, force: bool = False, compression: str = "zstd"
) -> Dict[str, Any]:
    """Writes the packed directory as one Megatron-Bridge / NeMo packed-sequence Parquet file
    ``dest`` (``.parquet`` or ``.pq``; Megatron-Bridge's convention is ``NAME.idx.parquet``):
    ``input_ids``, ``loss_mask`` (``labels[j + 1] != -100``, shifted as Megatron-Bridge stores
    it) and ``seq_start_id`` per packed row, one row group per packed row group. An existing
    ``dest`` is replaced only with ``force``, and only when tokpack wrote it (its footer says
    so). Preference and KTO directories are refused (ConfigError). Returns the figures:
    ``file``, ``rows``, ``sequences``, ``tokens``, ``loss_tokens`` (the ones in ``loss_mask``).
    """
    shown = os.fspath(dest)
    if not Path(shown).name.lower().endswith((".parquet", ".pq")):
        raise ConfigError(
            f"{shown_path(shown)}: the file name must end with .parquet or .pq "
            "(Megatron-Bridge reads only those)"
        )
    packed = _packed_dir(packed_dir, "a NeMo packed-sequence file")
    counts = dict.fromkeys(("rows", "sequences", "tokens", "loss_tokens"), 0)
    schema = _NEMO_SCHEMA.with_metadata({_NEMO_MARK: _tokpack.__version__})
    with writing(shown), _outputs([shown], packed, force, _nemo_written) as (tmp,):
        with pq.ParquetWriter(tmp, schema, compression=compression) as writer:
            for group in _row_groups(packed, packed.has_labels):
                table, n_loss = _nemo_table(group)
                writer.write_table(table, row_group_size=max(table.num_rows, 1))
                for key, n in zip(
                    counts, (table.num_rows, group.lengths.size, group.tokens.size, n_loss)
                ):
                    counts[key] += int(n)
    return {"file": shown, **counts}


def _nemo_written(path: Any, fs: Any = None) -> bool:
    """Whether tokpack wrote the Parquet file ``path`` (a key of ``fs``, an object store: its
    footer only is read): its footer holds tokpack's key."""
    try:
        metadata = pq.read_schema(path, filesystem=fs).metadata or {}
    except (pa.ArrowException, OSError):
        return False
    return _NEMO_MARK.encode() in metadata
