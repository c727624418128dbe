"""Shuffle quality of packed rows as a trainer reads them: the lag-1 autocorrelation, over one
epoch, of the per-batch mean number of segments per row (and of the per-batch mean segment
length), for batches of ``--batch-rows`` rows of ``PackedIterableDataset`` with its defaults.

An SFT-like corpus (``tokpack.synthetic.write_token_shards``, the corpus of the other benches)
is packed at ``--max-len`` twice, with ``row_order="plan"`` (best-fit decreasing's order,
longest samples first) and ``row_order="shuffled"`` (the default), and each order is measured:
in file order (a reader that does not shuffle: ``datasets``, a plain DataLoader over the
Parquet files), as ``PackedIterableDataset`` reads it (``shuffle_window`` row groups at a time;
each of ``--windows`` for the trade-off table), and as a full random permutation of the rows
(the reference: about 0, within ``±2/sqrt(batches)``). The figures come from the index side
files (``tokpack.shuffle_quality``); with ``--check-reader`` the dataset's default stream is
also iterated and its batches' figures compared with them. Prints Markdown tables.

    python benches/bench_shuffle.py --samples 200000 --work /tmp/tokpack-bench-shuffle
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from pathlib import Path

import numpy as np

import tokpack
from tokpack._io.tables import table
from tokpack.packed.reader import PackedDir
from tokpack.packed.shuffle_quality import (
    DEFAULT_SHUFFLE_WINDOW,
    lag1_autocorrelation,
    shuffle_quality,
)
from tokpack.synthetic import write_token_shards


def check_reader(path: Path, batch_rows: int, expected: float) -> float:
    """The lag-1 figure of the batches ``PackedIterableDataset`` (its defaults) really yields."""
    from torch.utils.data import DataLoader

    from tokpack.torch import PackedIterableDataset

    ds = PackedIterableDataset(path, batch_rows=batch_rows, tail="drop")
    means = [
        float(np.mean([len(s) for s in batch["seq_lengths"]]))
        for batch in DataLoader(ds, batch_size=None)
    ]
    got = lag1_autocorrelation(means)
    if not np.isclose(got, expected, atol=1e-9):
        raise SystemExit(f"{path}: the reader's batches give {got}, the index figure {expected}")
    return got


def group_megabytes(path: Path) -> float:
    """Mean bytes of one decoded row group (tokens and labels as int32), in MB."""
    packed = PackedDir(path)
    tokens = packed.manifest["figures"]["tokens"]
    per_token = 8 if packed.has_labels else 4
    return tokens * per_token / packed.num_groups / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--batch-rows", type=int, default=8)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--windows", default="1,2,4,8,16,32", help="shuffle_window values")
    parser.add_argument("--work", default="/tmp/tokpack-bench-shuffle")
    parser.add_argument("--check-reader", action="store_true", help="iterate the dataset too")
    parser.add_argument("--keep", action="store_true", help="keep the corpus and outputs")
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]

    work = Path(args.work)
    corpus = work / f"corpus-{args.samples}x{args.files}"
    if not corpus.exists():
        write_token_shards(corpus, args.samples, n_files=args.files, row_group_rows=8192)
    figures = {}
    for order in ("plan", "shuffled"):
        out = work / f"packed-{order}-{args.max_len}"
        t = time.perf_counter()
        m = tokpack.pack_files(corpus, out, args.max_len, overlong="split", row_order=order)
        print(f"packed {order}: {m['figures']['rows']:,} rows in {time.perf_counter() - t:.1f} s")
        figures[order] = shuffle_quality(out, batch_rows=args.batch_rows, windows=windows)
        if args.check_reader:
            key = f"reader, shuffle_window={DEFAULT_SHUFFLE_WINDOW}"
            check_reader(out, args.batch_rows, figures[order].orders[key][0])
            print(f"  the dataset's own batches give the index figure ({order})")
    q = figures["shuffled"]
    default = f"reader, shuffle_window={DEFAULT_SHUFFLE_WINDOW}"
    rows = [
        ["file order, row_order=plan", *figures["plan"].orders["file order"]],
        ["file order, row_order=shuffled", *q.orders["file order"]],
        ["PackedIterableDataset defaults, row_order=plan", *figures["plan"].orders[default]],
        ["PackedIterableDataset defaults, row_order=shuffled", *q.orders[default]],
        ["full random permutation", *q.orders["random permutation"]],
    ]
    rows = [[name, f"{seg:+.3f}", f"{length:+.3f}"] for name, seg, length in rows]
    packed = PackedDir(work / f"packed-shuffled-{args.max_len}")
    mb = group_megabytes(work / f"packed-shuffled-{args.max_len}")
    print(
        f"\n{args.samples:,} samples packed at {args.max_len} ({packed.num_rows:,} rows, "
        f"{packed.num_groups} row groups of 1024 rows), {q.batches:,} batches of "
        f"{args.batch_rows} rows; a random permutation stays within ±{q.noise:.3f}; "
        f"{os.cpu_count()} cores, {platform.machine()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )
    print(table(["order", "lag-1 mean segments", "lag-1 mean segment length"], rows))
    trade = []
    for w in windows:
        key = f"reader, shuffle_window={w}"
        trade.append(
            [
                str(w),
                f"{(w + 1) * mb:,.0f}",
                f"{3 * (w + 1) * mb:,.0f}",
                f"{figures['plan'].orders[key][0]:+.3f}",
                f"{figures['shuffled'].orders[key][0]:+.3f}",
            ]
        )
    print(
        f"\nshuffle_window against cache size (one decoded row group: {mb:.0f} MB of tokens and"
        " labels; a process keeps shuffle_window + 1 groups, DataLoader workers share up to"
        " 3 x (shuffle_window + 1)):\n"
    )
    print(
        table(
            [
                "shuffle_window",
                "cache per process MB",
                "shared by workers MB",
                "lag-1, row_order=plan",
                "lag-1, row_order=shuffled",
            ],
            trade,
        )
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
