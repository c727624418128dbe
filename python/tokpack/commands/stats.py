"""``tokpack stats``: length distribution of token shards, the efficiency every strategy would
reach at ``--max-len``, and whether packing pays."""

from __future__ import annotations

import argparse

import numpy as np

from ..errors import ConfigError
from ..files import read_lengths
from ..planning import STRATEGIES, plan
from ..report import table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="files, directories or globs")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--tokens-column", default="input_ids")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--plot", metavar="PNG", help="write a length histogram (matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def recommendation(lengths: np.ndarray, max_len: int, efficiencies: dict) -> str:
    """Packing pays when samples are well below max_len; otherwise padding wastes little."""
    mean = float(lengths.mean())
    padded = efficiencies["padding"]
    if mean < 0.5 * max_len and efficiencies["bfd"] > padded + 0.1:
        return (
            f"Pack: the mean length ({mean:,.0f}) is well below max_len ({max_len:,}); "
            f"one sample per row would be only {padded:.0%} tokens, bfd packing reaches "
            f"{efficiencies['bfd']:.1%} ({efficiencies['bfd'] / padded:.1f}x fewer rows)."
        )
    return (
        f"Padding is fine: the mean length ({mean:,.0f}) is close to max_len ({max_len:,}), "
        f"so one sample per row already uses {padded:.0%} of the row capacity."
    )


def plot(lengths: np.ndarray, max_len: int, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'tokpack[plot]'") from None
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.hist(lengths, bins=100, color="#4477aa")
    ax.axvline(max_len, color="#cc3311", linestyle="--", label=f"max_len = {max_len}")
    ax.set_xlabel("sample length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title(f"{len(lengths):,} samples")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    lengths = read_lengths(
        args.inputs, args.tokens_column, threads=args.threads, progress=not args.quiet
    )
    q = np.percentile(lengths, [50, 90, 99])
    print(
        table(
            ["samples", "tokens", "min", "median", "mean", "p90", "p99", "max"],
            [
                [
                    f"{len(lengths):,}",
                    f"{int(lengths.sum()):,}",
                    int(lengths.min()),
                    int(q[0]),
                    f"{lengths.mean():.1f}",
                    int(q[1]),
                    int(q[2]),
                    int(lengths.max()),
                ]
            ],
        )
    )
    rows, eff = [], {}
    for strategy in STRATEGIES:
        p = plan(lengths, args.max_len, strategy=strategy, overlong="split", threads=args.threads)
        eff[strategy] = p.efficiency
        rows.append([strategy, f"{p.n_bins:,}", f"{p.efficiency:.4f}"])
    over = int((lengths > args.max_len).sum())
    print(f"\nat max_len={args.max_len} ({over:,} samples longer, counted as split):")
    print(table(["strategy", "rows", "efficiency"], rows))
    print("\n" + recommendation(lengths, args.max_len, eff))
    if args.plot:
        plot(lengths, args.max_len, args.plot)
        print(f"histogram written to {args.plot}")
    return 0
