"""Build packed directories in the PACKED_FORMAT layout for the torch tests and benchmark.

The one place that writes test corpora: it packs with the in-memory ``tokpack.pack_tokens`` and
writes shards, Arrow index files and ``_manifest.json`` exactly as ``tokpack pack`` does, so the
readers are tested against the agreed format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tokpack

IGNORE = -100


def random_samples(
    n: int, max_len: int, *, seed: int = 0, min_len: int = 1, vocab: int = 1000
) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """``n`` random samples (tokens, labels) with a random prompt masked to -100 in the labels."""
    rng = np.random.default_rng(seed)
    samples, labels = [], []
    for _ in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        tokens = rng.integers(1, vocab, size=length, dtype=np.int32)
        lab = tokens.copy()
        lab[: int(rng.integers(0, length))] = IGNORE
        samples.append(tokens)
        labels.append(lab)
    return samples, labels


def _list_column(arr: pa.ListArray) -> Tuple[np.ndarray, np.ndarray]:
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


def write_packed_dir(
    out_dir: Path,
    samples: Sequence[np.ndarray],
    labels: Optional[Sequence[np.ndarray]] = None,
    *,
    max_len: int,
    rows_per_shard: int = 1000,
    row_group_rows: int = 1024,
    compression: str = "zstd",
) -> dict:
    """Pack ``samples`` and write OUT_DIR; returns the manifest."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = tokpack.pack_tokens(
        list(samples), max_len, labels=None if labels is None else list(labels)
    )
    has_labels = labels is not None
    ids = table.column("input_ids").combine_chunks()
    lab = table.column("labels").combine_chunks() if has_labels else ids
    seqs = table.column("seq_lengths").combine_chunks()
    lab_values, row_offsets = _list_column(lab)
    seq_values, seq_offsets = _list_column(seqs)
    trained = (lab_values != IGNORE) if has_labels else np.ones(len(lab_values), bool)
    # Per-segment loss-token counts: cumulative trained count at segment ends.
    seg_ends = np.concatenate([[0], np.cumsum(seq_values.astype(np.int64))])
    cum = np.concatenate([[0], np.cumsum(trained)])
    seg_loss = (cum[seg_ends[1:]] - cum[seg_ends[:-1]]).astype(np.int32)
    num_tokens = np.diff(row_offsets).astype(np.int32)
    num_seqs = np.diff(seq_offsets).astype(np.int32)
    num_loss = (cum[row_offsets[1:]] - cum[row_offsets[:-1]]).astype(np.int32)
    full = pa.table(
        {
            "input_ids": ids,
            **({"labels": lab} if has_labels else {}),
            "seq_lengths": seqs,
            "sample_ids": table.column("sample_ids").combine_chunks(),
            "num_tokens": num_tokens,
            "num_seqs": num_seqs,
            "num_loss_tokens": num_loss,
            "seq_loss_tokens": pa.ListArray.from_arrays(
                pa.array(seq_offsets.astype(np.int32)), pa.array(seg_loss)
            ),
        }
    )
    shards = []
    for k, start in enumerate(range(0, max(full.num_rows, 1), rows_per_shard)):
        part = full.slice(start, rows_per_shard)
        name, index = f"part-{k:05d}.parquet", f"_index-part-{k:05d}.arrow"
        pq.write_table(part, out_dir / name, row_group_size=row_group_rows, compression=compression)
        n_tok = part.column("num_tokens").to_numpy()
        idx = pa.table(
            {
                "offset": np.concatenate([[0], np.cumsum(n_tok, dtype=np.int64)[:-1]]),
                "num_tokens": n_tok,
                "num_seqs": part.column("num_seqs").to_numpy(),
                "num_loss_tokens": part.column("num_loss_tokens").to_numpy(),
            }
        )
        with pa.ipc.new_file(out_dir / index, idx.schema) as w:
            w.write_table(idx)
        shards.append(
            {
                "file": name,
                "index": index,
                "rows": part.num_rows,
                "row_groups": pq.ParquetFile(out_dir / name).num_row_groups,
                "tokens": int(n_tok.sum()),
                "loss_tokens": int(part.column("num_loss_tokens").to_numpy().sum()),
                "checksum": "",
            }
        )
    manifest = {
        "format": "tokpack-packed",
        "format_version": 1,
        "tokpack_version": tokpack.__version__,
        "cache_key": "test",
        "config": {
            "max_len": max_len,
            "strategy": "bfd",
            "overlong": "error",
            "seed": 0,
            "tokens_column": "input_ids",
            "labels_column": "labels" if has_labels else None,
            "loss_mask_column": None,
            "rows_per_shard": rows_per_shard,
            "row_group_rows": row_group_rows,
            "compression": compression,
        },
        "inputs": [],
        "has_labels": has_labels,
        "shards": shards,
        "figures": {
            "samples_in": len(samples),
            "rows": full.num_rows,
            "tokens": int(num_tokens.sum()),
            "loss_tokens": int(num_loss.sum()),
        },
    }
    (out_dir / "_manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest
