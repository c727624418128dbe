"""Build packed directories in the PACKED_FORMAT layout for the torch tests and benchmark.

The one place that writes test corpora: samples go to a token shard that ``tokpack.pack_files``
packs, so the readers are tested against what ``tokpack pack`` really writes.
"""

from __future__ import annotations

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
    """Write ``samples`` as a token shard beside ``out_dir`` and pack it there with
    ``tokpack.pack_files``; returns the manifest."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    columns = {"input_ids": pa.array([np.asarray(s) for s in samples], type=pa.list_(pa.int32()))}
    if labels is not None:
        columns["labels"] = pa.array([np.asarray(x) for x in labels], type=pa.list_(pa.int32()))
    source = out_dir.parent / f"{out_dir.name}-tokens.parquet"
    pq.write_table(pa.table(columns), source)
    return tokpack.pack_files(
        [source],
        out_dir,
        max_len,
        rows_per_shard=rows_per_shard,
        row_group_rows=row_group_rows,
        compression=compression,
        force=True,
    )


def small_packed_dir(
    tmp_path_factory, name: str, n: int, *, seed: int, rows_per_shard: int, longest: int = 30
) -> Path:
    """A module's packed corpus: ``n`` random samples of at most ``longest`` tokens packed at
    max_len 48 in row groups of 8 rows (several shards and row groups for small ``n``)."""
    out = tmp_path_factory.mktemp(name)
    samples, labels = random_samples(n, longest, seed=seed)
    write_packed_dir(
        out, samples, labels, max_len=48, rows_per_shard=rows_per_shard, row_group_rows=8
    )
    return out


def batch_bytes(batches):
    """Each batch's tensors as bytes and its other values (``position`` counts batches from
    where the iteration started, so it is left out): batches compared exactly."""
    return [
        {
            k: v.numpy().tobytes() if hasattr(v, "numpy") else v
            for k, v in b.items()
            if k != "position"
        }
        for b in batches
    ]
