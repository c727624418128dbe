"""Data-loading benchmark: packed rows delivered per second to a training loop, max_len 4096.

Compares, in the same run and over the same packed rows, tokpack's PackedDataset + PackedCollator
through a DataLoader (num_workers 0 and 2), PackedDataset(device="cpu") (in-memory mode) and
PackedIterableDataset, against a Hugging Face ``datasets`` Dataset of the rows with
``set_format("torch")`` and transformers' ``DataCollatorWithFlattening``. Every reader goes through
a full pass of the corpus in order (no shuffle for the map-style readers, the iterable dataset's
own windowed shuffle for it). Goal (issue 4): at least 3x the baseline's tokens/s. The
context-parallel rows (``PackedCollator(cp_size=2)``, rank 0's slice) must keep at least 0.9x the
rows/s of the plain PackedIterableDataset rows.

It also times decoding every row group of the corpus with and without the integrity checks (the
row group's bytes and the footer hashed with xxh3 and compared with the manifest before decoding),
the cost the readers pay for them.

    pip install -e ".[test,torch]" datasets && python benches/bench_torch.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from tokpack.packed_dir import PackedDir
from tokpack.report import table
from tokpack.synthetic import sft_lengths
from tokpack.torch import PackedCollator, PackedDataset, PackedIterableDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from packed_corpus import write_packed_dir  # noqa: E402

MAX_LEN = 4096


def build_corpus(out: Path, n_samples: int) -> int:
    rng = np.random.default_rng(0)
    lengths = sft_lengths(n_samples, seed=0, max_length=MAX_LEN)
    samples = [rng.integers(1, 32000, size=int(n), dtype=np.int32) for n in lengths]
    labels = []
    for s in samples:
        lab = s.copy()
        lab[: len(s) // 3] = -100
        labels.append(lab)
    manifest = write_packed_dir(
        out, samples, labels, max_len=MAX_LEN, rows_per_shard=1024, row_group_rows=256
    )
    return manifest["figures"]["tokens"]


def timed_pass(loader) -> tuple:
    """(seconds, rows, tokens) of one full pass after a warm-up pass (workers are persistent, as
    in a training run, so their start-up is not counted); tokens from the batch's input_ids."""
    for _ in loader:
        pass
    start = time.perf_counter()
    rows = tokens = 0
    for batch in loader:
        ids = batch["input_ids"]
        tokens += ids.numel()
        rows += batch["num_rows"] if "num_rows" in batch else 0
    return time.perf_counter() - start, rows, tokens


class Counting:
    """Wraps a collator to report the rows of each batch (the collators only report tokens)."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, rows):
        out = self.collate(rows)
        out["num_rows"] = len(rows)
        return out


def check_cost(path: Path) -> str:
    """Best of 3 passes decoding every row group, unchecked and checked (as the readers do)."""
    from tokpack import _tokpack

    packed = PackedDir(path)

    def one_pass(checked: bool) -> float:
        start = time.perf_counter()
        for g in range(packed.num_groups):
            shard = int(packed.group_shard[g])
            check = (packed.shard_sizes[shard], packed.shard_footers[shard], packed.group_bytes[g])
            _tokpack.read_row_group(
                packed.shard_paths[shard],
                int(packed.group_index[g]),
                list(packed.columns),
                check if checked else None,
            )
        return time.perf_counter() - start

    plain = min(one_pass(False) for _ in range(3))
    checked = min(one_pass(True) for _ in range(3))
    return (
        f"decoding all {packed.num_groups} row groups: {plain * 1e3:.1f} ms unchecked, "
        f"{checked * 1e3:.1f} ms with checksums ({checked / plain - 1:+.1%})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--batch-rows", type=int, default=8)
    args = parser.parse_args()

    import datasets
    from transformers import DataCollatorWithFlattening

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "packed"
        total_tokens = build_corpus(path, args.samples)
        ref = PackedDataset(path)
        n_rows = len(ref)
        hf = datasets.Dataset.from_parquet(
            [str(p) for p in sorted(path.glob("part-*.parquet"))],
            columns=["input_ids", "labels"],
            cache_dir=str(Path(tmp) / "hf_cache"),
        )
        hf.set_format("torch")
        print(
            f"{n_rows:,} packed rows, {total_tokens:,} tokens (max_len {MAX_LEN}),"
            f" batches of {args.batch_rows} rows; torch {torch.__version__},"
            f" datasets {datasets.__version__}\n"
        )
        b = args.batch_rows
        cases = []
        for workers in (0, 2):
            cases.append(
                (
                    f"HF Dataset + DataCollatorWithFlattening, workers={workers}",
                    workers,
                    DataLoader(
                        hf,
                        batch_size=b,
                        num_workers=workers,
                        persistent_workers=workers > 0,
                        collate_fn=Counting(DataCollatorWithFlattening()),
                    ),
                )
            )
        for workers in (0, 2):
            cases.append(
                (
                    f"PackedDataset + PackedCollator, workers={workers}",
                    workers,
                    DataLoader(
                        PackedDataset(path),
                        batch_size=b,
                        num_workers=workers,
                        persistent_workers=workers > 0,
                        collate_fn=Counting(PackedCollator("hf")),
                    ),
                )
            )
        cases.append(
            (
                "PackedDataset(device='cpu') + PackedCollator, workers=0",
                0,
                DataLoader(
                    PackedDataset(path, device="cpu"),
                    batch_size=b,
                    collate_fn=Counting(PackedCollator("hf")),
                ),
            )
        )
        for workers in (0, 2):
            ds = PackedIterableDataset(
                path, batch_rows=b, rank=0, world_size=1, collate_fn=Counting(PackedCollator("hf"))
            )
            cases.append(
                (
                    f"PackedIterableDataset (shuffled) + PackedCollator, workers={workers}",
                    workers,
                    DataLoader(
                        ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0
                    ),
                )
            )
        for workers in (0, 2):
            # Context parallelism: one rank's slice of every batch (rows/s compare, not tokens).
            ds = PackedIterableDataset(
                path,
                batch_rows=b,
                rank=0,
                world_size=1,
                collate_fn=Counting(PackedCollator("hf", cp_size=2, cp_rank=0)),
            )
            cases.append(
                (
                    f"PackedIterableDataset + PackedCollator(cp_size=2), workers={workers}",
                    workers,
                    DataLoader(
                        ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0
                    ),
                )
            )
        cost = check_cost(path)
        rows_out = []
        baseline = {}
        iterable_rps = {}
        ok = cp_ok = True
        for name, workers, loader in cases:
            seconds, rows, tokens = timed_pass(loader)
            cp = "cp_size" in name
            assert rows == n_rows and (cp or tokens == total_tokens), (name, rows, tokens)
            tps = tokens / seconds
            if name.startswith("HF"):
                baseline[workers] = tps
            elif name.startswith("PackedIterableDataset (shuffled)"):
                iterable_rps[workers] = rows / seconds
            ratio = tps / baseline[workers]
            if cp:
                cp_ok &= rows / seconds >= 0.9 * iterable_rps[workers]
            elif not name.startswith("HF"):
                ok &= ratio >= 3.0
            rows_out.append(
                [
                    name,
                    f"{seconds:.2f}",
                    f"{rows / seconds:,.0f}",
                    f"{tps / 1e6:,.1f}",
                    f"{ratio:.1f}x",
                ]
            )
    print(
        table(
            ["reader", "pass s", "rows/s", "Mtokens/s", "vs HF (same workers)"],
            rows_out,
        )
    )
    print(f"\n{cost}")
    print(
        f"\ngoal (>= 3x the baseline's tokens/s in every tokpack row): {'met' if ok else 'NOT met'}"
    )
    print(
        "goal (CP collation >= 0.9x the rows/s of PackedIterableDataset + PackedCollator, same"
        f" workers): {'met' if cp_ok else 'NOT met'}"
    )
    return 0 if ok and cp_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
