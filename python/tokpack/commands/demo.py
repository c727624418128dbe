"""``tokpack demo``: generate a synthetic SFT-like corpus, plan it with every strategy and print
rows, padding share and efficiency per strategy."""

from __future__ import annotations

import argparse
import time

from ..planning import STRATEGIES, plan
from ..report import table
from ..synthetic import sft_lengths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=100_000, help="corpus size (default 100000)")
    parser.add_argument("--max-len", type=int, default=4096, help="row capacity (default 4096)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    lengths = sft_lengths(args.samples, seed=args.seed)
    print(
        f"Synthetic SFT corpus: {len(lengths):,} samples, {int(lengths.sum()):,} tokens, "
        f"median length {int(sorted(lengths)[len(lengths) // 2]) if len(lengths) else 0}, "
        f"max_len {args.max_len} (over-long samples are split)\n"
    )
    rows = []
    for strategy in STRATEGIES:
        start = time.perf_counter()
        p = plan(
            lengths,
            args.max_len,
            strategy=strategy,
            overlong="split",
            seed=args.seed,
            threads=args.threads,
        )
        ms = (time.perf_counter() - start) * 1e3
        capacity = max(p.n_bins * p.max_len, 1)
        rows.append(
            [
                strategy,
                f"{p.n_bins:,}",
                f"{p.padding_tokens / capacity:.1%}",
                f"{p.efficiency:.4f}",
                f"{len(p.split):,}",
                f"{ms:.1f}",
            ]
        )
    print(table(["strategy", "rows", "padding", "efficiency", "samples split", "plan ms"], rows))
    print(f"\nlower bound: {p.lower_bound:,} rows")
    return 0
