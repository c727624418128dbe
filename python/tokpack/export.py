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

import contextlib
import os
import secrets
import struct
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ._arrays import list_array
from ._contract import IGNORE_INDEX
from ._inputs import input_error, shown_path
from ._outdir import make_parent, read_packed_manifest, writing
from .errors import ConfigError, CorruptOutputError, DataError, OutputExistsError

__all__ = ["export_megatron", "export_nemo_packed", "MEGATRON_DTYPES", "DOCUMENT_MODES"]

PathLike = Union[str, os.PathLike]

_INDEX_HEADER = b"MMIDIDX\x00\x00"
_INDEX_VERSION = 1
# Megatron's DType codes of the two token dtypes its tools write.
MEGATRON_DTYPES = {"uint16": (np.uint16, 8), "int32": (np.int32, 4)}
# DType.optimal_dtype: uint16 when the vocabulary size is < 65,500.
_UINT16_VOCAB_LIMIT = 65500
DOCUMENT_MODES = ("sample", "row")
_TMP_TAG = ".tmp-"


class _Group:
    """One row group of a packed shard: flat numpy views and where each row starts."""

    def __init__(self, where: str, table: pa.Table, with_labels: bool) -> None:
        ids = table.column("input_ids").combine_chunks()
        segs = table.column("seq_lengths").combine_chunks()
        self.where = where
        self.token_offsets = _offsets(ids)
        self.tokens = ids.flatten().to_numpy()
        self.seg_offsets = _offsets(segs)
        self.lengths = segs.flatten().to_numpy()
        self.labels = None
        if with_labels:
            self.labels = table.column("labels").combine_chunks().flatten().to_numpy()
        ends = np.zeros(self.lengths.size + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=ends[1:])
        row_tokens = ends[self.seg_offsets[1:]] - ends[self.seg_offsets[:-1]]
        # tokpack never writes empty samples (they are dropped and listed as such).
        if (self.lengths <= 0).any() or not np.array_equal(row_tokens, np.diff(self.token_offsets)):
            raise CorruptOutputError(
                f"{where}: seq_lengths are not positive or do not add up to the row's input_ids"
            )
        if self.labels is not None and self.labels.size != self.tokens.size:
            raise CorruptOutputError(f"{where}: labels and input_ids differ in length")


def _offsets(array: Union[pa.ListArray, pa.LargeListArray]) -> np.ndarray:
    offsets = array.offsets.to_numpy().astype(np.int64)
    return offsets - offsets[0]


def _packed_shards(packed_dir: PathLike) -> Tuple[List[Path], bool]:
    """The shard files of a packed directory, in order, and whether they hold labels."""
    manifest = read_packed_manifest(packed_dir)
    shards = [Path(packed_dir) / shard["file"] for shard in manifest["shards"]]
    return shards, bool(manifest["has_labels"])


def _row_groups(shards: Sequence[Path], with_labels: bool) -> Iterator[_Group]:
    columns = ["input_ids", "seq_lengths"] + (["labels"] if with_labels else [])
    for path in shards:
        try:
            pf = pq.ParquetFile(path)
        except FileNotFoundError:
            raise CorruptOutputError(
                f"{shown_path(path)}: listed in the manifest but missing"
            ) from None
        except OSError as exc:
            raise input_error(path, exc) from None
        except pa.ArrowException as exc:
            raise CorruptOutputError(f"{shown_path(path)}: not a readable shard ({exc})") from None
        for g in range(pf.num_row_groups):
            where = f"{shown_path(path)}: row group {g}"
            try:
                table = pf.read_row_group(g, columns=columns)
            except (pa.ArrowException, KeyError) as exc:
                raise CorruptOutputError(f"{where}: unreadable ({exc})") from None
            yield _Group(where, table, with_labels)


@contextlib.contextmanager
def _temporary(final: Path) -> Iterator[Path]:
    """A temporary file next to ``final``, removed unless the caller renamed it."""
    tmp = final.with_name(f".{final.name}{_TMP_TAG}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _refuse_existing(paths: Sequence[Path], force: bool) -> None:
    for path in paths:
        if not force and os.path.lexists(path):
            raise OutputExistsError(
                f"{shown_path(path)}: exists (pass force=True / --force to replace it)"
            )
        if os.path.isdir(path):
            raise OutputExistsError(f"{shown_path(path)}: is a directory")


def _write_bin(
    bin_tmp: Path, shards: Sequence[Path], dtype: str, auto: bool
) -> Optional[Tuple[List[np.ndarray], List[np.ndarray], int]]:
    """Writes the tokens as ``dtype``; returns the per-group sequence lengths and rows'
    sequence counts and the token count, or None when ``auto`` and an id is too large for
    Megatron's uint16 rule (the caller starts again in int32: one pass in the common case)."""
    np_dtype = MEGATRON_DTYPES[dtype][0]
    limit = _UINT16_VOCAB_LIMIT - 2 if auto and dtype == "uint16" else np.iinfo(np_dtype).max
    lengths: List[np.ndarray] = []
    row_counts: List[np.ndarray] = []
    n_tokens = 0
    with open(bin_tmp, "wb") as f:
        for group in _row_groups(shards, with_labels=False):
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
    pointers = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= np.dtype(np_dtype).itemsize
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
    directory's samples (one sequence per sample, in the packed order).

    ``document``: ``"sample"`` one document per sample, ``"row"`` one per packed row.
    ``dtype``: ``"uint16"`` or ``"int32"``; by default uint16 when every id < 65,499 (Megatron's
    rule for a vocabulary under 65,500), else int32. Existing files are replaced only with
    ``force``. Returns the figures: ``bin``, ``idx``, ``dtype``, ``sequences``, ``documents``
    (without Megatron's leading 0), ``tokens``.
    """
    if document not in DOCUMENT_MODES:
        raise ConfigError(f"document must be one of {', '.join(DOCUMENT_MODES)}, not {document!r}")
    if dtype is not None and dtype not in MEGATRON_DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(MEGATRON_DTYPES)}, not {dtype!r}")
    shards, _ = _packed_shards(packed_dir)
    prefix = os.fspath(prefix)
    if not os.path.basename(prefix):
        raise ConfigError(f"{shown_path(prefix)}: the prefix needs a file name (PREFIX.bin)")
    bin_path, idx_path = Path(prefix + ".bin"), Path(prefix + ".idx")
    _refuse_existing([bin_path, idx_path], force)
    make_parent(bin_path)
    with writing(prefix):
        with _temporary(bin_path) as bin_tmp, _temporary(idx_path) as idx_tmp:
            chosen = dtype or "uint16"
            written = _write_bin(bin_tmp, shards, chosen, auto=dtype is None)
            if written is None:
                chosen = "int32"
                written = _write_bin(bin_tmp, shards, chosen, auto=True)
            assert written is not None  # int32 holds every id
            lengths_parts, row_counts, n_tokens = written
            lengths = np.concatenate([np.zeros(0, np.int32), *lengths_parts])
            if document == "row":
                per_document = np.concatenate([np.zeros(0, np.int64), *row_counts])
            else:
                per_document = np.ones(lengths.size, np.int64)
            document_indices = np.zeros(per_document.size + 1, dtype=np.int64)
            np.cumsum(per_document, out=document_indices[1:])
            _write_idx(idx_tmp, chosen, lengths, document_indices)
            # Checked again: another program may have created them while we wrote.
            _refuse_existing([bin_path, idx_path], force)
            # The index last: Megatron opens a prefix by its .idx.
            os.replace(bin_tmp, bin_path)
            os.replace(idx_tmp, idx_path)
    return {
        "bin": str(bin_path),
        "idx": str(idx_path),
        "dtype": chosen,
        "sequences": int(lengths.size),
        "documents": int(per_document.size),
        "tokens": int(n_tokens),
    }


_NEMO_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("seq_start_id", pa.list_(pa.int32())),
    ]
)


def _nemo_table(group: _Group) -> Tuple[pa.Table, int]:
    """The NeMo rows of one packed row group and their number of loss tokens."""
    n_rows = group.token_offsets.size - 1
    row_of_seg = np.repeat(np.arange(n_rows), np.diff(group.seg_offsets))
    seg_token_starts = np.zeros(group.lengths.size, dtype=np.int64)
    np.cumsum(group.lengths[:-1], dtype=np.int64, out=seg_token_starts[1:])
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
    ``dest`` is replaced only with ``force``. Returns the figures: ``file``, ``rows``,
    ``sequences``, ``tokens``, ``loss_tokens`` (the ones in ``loss_mask``).
    """
    dest_path = Path(dest)
    if not dest_path.name.lower().endswith((".parquet", ".pq")):
        raise ConfigError(
            f"{shown_path(dest_path)}: the file name must end with .parquet or .pq "
            "(Megatron-Bridge reads only those)"
        )
    shards, has_labels = _packed_shards(packed_dir)
    _refuse_existing([dest_path], force)
    make_parent(dest_path)
    figures = {"file": str(dest_path), "rows": 0, "sequences": 0, "tokens": 0, "loss_tokens": 0}
    with writing(dest_path):
        with _temporary(dest_path) as tmp:
            with pq.ParquetWriter(tmp, _NEMO_SCHEMA, compression=compression) as writer:
                for group in _row_groups(shards, has_labels):
                    table, n_loss = _nemo_table(group)
                    writer.write_table(table, row_group_size=max(table.num_rows, 1))
                    figures["rows"] += table.num_rows
                    figures["sequences"] += int(group.lengths.size)
                    figures["tokens"] += int(group.tokens.size)
                    figures["loss_tokens"] += n_loss
            _refuse_existing([dest_path], force)
            os.replace(tmp, dest_path)
    return figures
