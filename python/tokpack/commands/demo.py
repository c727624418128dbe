"""``tokpack demo``: write a synthetic SFT-like corpus as Parquet token shards, pack it with the
full ``pack`` pipeline, and print the summary and per-strategy figures."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from .._contract import STRATEGIES
from .._io.tables import table
from ..pack.files import pack_files, read_lengths
from ..pack.plan import plan
from ..synthetic import write_token_shards
from .pack import summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=100_000, help="corpus size (default 100000)")
    parser.add_argument("--max-len", type=int, default=4096, help="row capacity (default 4096)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--dir", default=None, help="keep the corpus and output here (default: a temp dir)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="tokpack-demo-") as tmp:
        base = Path(args.dir or tmp)
        start = time.perf_counter()
        files = write_token_shards(base / "corpus", args.samples, seed=args.seed)
        print(
            f"Synthetic SFT corpus: {args.samples:,} samples in {len(files)} Parquet token shards "
            f"under {base / 'corpus'} ({time.perf_counter() - start:.1f} s)"
        )
        out = base / "packed"
        print(
            f"tokpack pack {base / 'corpus'} -o {out} --max-len {args.max_len} --overlong split\n"
        )
        manifest = pack_files(
            files,
            out,
            args.max_len,
            overlong="split",
            threads=args.threads,
            progress=not args.quiet,
        )
        print(summary(manifest))
        lengths = read_lengths(files, threads=args.threads)
        print(
            f"\nEvery strategy on the same lengths (median {int(np.median(lengths))}, "
            f"max_len {args.max_len}):"
        )
        rows = []
        for strategy in STRATEGIES:
            p = plan(lengths, args.max_len, strategy=strategy, overlong="split", seed=args.seed)
            rows.append([strategy, f"{p.n_bins:,}", f"{p.efficiency:.4f}"])
        print(table(["strategy", "rows", "efficiency"], rows))
        print(f"\nlower bound: {p.lower_bound:,} rows")
    return 0
