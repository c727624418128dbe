"""``tokpack stats``: length distribution of token shards and, for each ``max_len`` candidate,
what over-long samples would lose and the rows and efficiency of every strategy; advice on
packing and on the trade-off between candidates; optionally a plot and JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, List, Optional

from .._checks import checked_threads
from .._contract import STRATEGIES
from .._io.tables import table
from ..errors import ConfigError
from ..pack.files import PAIR_LAYOUTS, read_lengths
from ..stats.estimate import (
    STATS_OVERLONG,
    MaxLenFigures,
    PackingStats,
    check_options,
    checked_max_lens,
    packing_stats,
)

_DEFAULT_OVERLONG = "split"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="files, directories or globs")
    parser.add_argument(
        "--max-len",
        metavar="N[,N...]",
        help="row capacities to compare, comma-separated (default: powers of two from 1,024 up "
        "to the first reaching the 99th percentile, at least 8,192, capped at the longest sample)",
    )
    parser.add_argument(
        "--overlong",
        default=None,
        metavar="|".join(STATS_OVERLONG),
        help=f"how rows count over-long samples (default {_DEFAULT_OVERLONG})",
    )
    add_step_arguments(parser)
    parser.add_argument("--tokens-column", default="input_ids")
    parser.add_argument(
        "--pair-layout",
        choices=PAIR_LAYOUTS,
        default="separate",
        help="preference token shards: a sample is a pair, its length the tokens it takes in a "
        "row in this layout (as `pack --pair-layout` packs it)",
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="write the length distribution and rows / efficiency per max_len to FILE "
        "(.png or .svg; needs matplotlib: pip install 'tokpack[plot]')",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """``--batch-size`` and ``--world-size`` of ``stats`` and ``inspect``."""
    parser.add_argument("--batch-size", type=int, default=None, help="rows per optimizer step")
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="data-parallel ranks (with --batch-size): also show each step's compute imbalance "
        'with and without PackedBatchSampler(balance="compute")',
    )


def parse_max_lens(text: Optional[str]) -> Optional[List[int]]:
    """``"2048,4096"`` -> ``[2048, 4096]`` (None stays None: the defaults)."""
    if text is None:
        return None
    values = []
    for part in text.split(","):
        try:
            values.append(int(part.strip()))
        except ValueError:
            raise ConfigError(
                f"--max-len: {part.strip()!r} is not an integer (give N or N,N,...)"
            ) from None
    try:
        return checked_max_lens(values)
    except ConfigError as exc:
        raise ConfigError(f"--max-len: {exc}") from None


def _count(n: int, of: int) -> str:
    return f"{n:,} ({n / of:.1%})" if of else f"{n:,}"


def render(stats: PackingStats, overlong_default: bool) -> str:
    """The text report: distribution, over-long samples, rows / efficiency (/ steps), advice."""
    d = stats.distribution
    out = [
        table(
            ["samples", "tokens", "empty", "min", "median", "mean", "p90", "p99", "max"],
            [
                [f"{stats.samples:,}", f"{stats.tokens:,}", f"{stats.empty:,}"]
                + [f"{d[k]:,}" for k in ("min", "median")]
                + [f"{d['mean']:,.1f}"]
                + [f"{d[k]:,}" for k in ("p90", "p99", "max")]
            ],
        ),
        "",
        "Samples longer than max_len: drop loses their tokens, truncate the tokens past max_len, "
        "split cuts them into pieces.",
        _per_candidate(
            stats,
            ["over-long samples", "their tokens", "tokens past max_len", "split pieces"],
            lambda c: [
                _count(c.over_samples, stats.samples),
                _count(c.over_tokens, stats.tokens),
                _count(c.beyond_tokens, stats.tokens),
                f"{c.split_pieces:,}",
            ],
        ),
        "",
        f"Rows per strategy, over-long samples {stats.overlong}"
        + (" (the default; --overlong truncate|drop to change)" if overlong_default else "")
        + "; padding = one sample per row, random = shuffle, concatenate and cut (splits samples).",
        _per_candidate(
            stats,
            [*STRATEGIES, "bfd vs padding"],
            lambda c: [*(f"{c.rows[s]:,}" for s in STRATEGIES), f"{c.saving():.0%} fewer rows"],
        ),
        "",
        "Efficiency (tokens / row capacity):",
        _per_strategy(stats, lambda c, s: f"{c.efficiency[s]:.1%}"),
    ]
    caps = sorted(stats.candidates[0].capped_rows)
    out += [
        "",
        "bfd segments per row (rows in each bin), and the extra rows a max_segments_per_row cap "
        "costs (static-shape batches: fixed-capacity cu_seqlens):",
        _per_candidate(
            stats,
            ["max", *(f"segments {k}" for k in stats.candidates[-1].segments_histogram)]
            + [f"cap {cap}" for cap in caps],
            lambda c: (
                [f"{c.max_row_segments:,}"]
                + [
                    f"{c.segments_histogram.get(k, 0):,}"
                    for k in stats.candidates[-1].segments_histogram
                ]
                + [
                    f"+{c.capped_rows[cap] - c.rows['bfd']:,} ({c.cap_cost(cap):.2%})"
                    for cap in caps
                ]
            ),
        ),
    ]
    if stats.batch_size:
        out += [
            "",
            f"Optimizer steps at batch size {stats.batch_size:,} (rows / batch size, rounded up):",
            _per_strategy(stats, lambda c, s: f"{stats.steps(c.rows[s]):,}"),
        ]
    first = stats.candidates[0]
    out += [
        "",
        "bfd rows' compute per epoch (24576·L + L², relative to the first max_len's per-segment "
        "figure): attention per segment (document masking) and over whole rows (plain causal).",
        _per_candidate(
            stats,
            ["per segment", "whole rows"]
            + (["step imbalance", 'balance="compute"'] if stats.world_size else []),
            lambda c: (
                [
                    f"{c.compute / first.compute:.3f}x" if first.compute else "-",
                    f"{c.full_row_compute / first.compute:.3f}x" if first.compute else "-",
                ]
                + (
                    [f"{v:.4f}" for v in c.step_imbalance]
                    if c.step_imbalance
                    else ["-", "-"] * bool(stats.world_size)
                )
            ),
        ),
    ]
    if stats.world_size:
        out.append(
            f"Step imbalance: max / mean rank compute, mean over steps of {stats.batch_size:,} "
            f"shuffled rows over {stats.world_size} ranks."
        )
    out += ["", "Advice:"] + [f"- {line}" for line in stats.advice()]
    return "\n".join(out)


def _per_candidate(
    stats: PackingStats, headers: List[str], cells: Callable[[MaxLenFigures], List[str]]
) -> str:
    """A table of a row per candidate: its max_len, then its ``cells`` under ``headers``."""
    return table(["max_len", *headers], [[f"{c.max_len:,}", *cells(c)] for c in stats.candidates])


def _per_strategy(stats: PackingStats, cell: Callable[[MaxLenFigures, str], str]) -> str:
    """A table of one figure per candidate (rows) and strategy (columns)."""
    return _per_candidate(stats, list(STRATEGIES), lambda c: [cell(c, s) for s in STRATEGIES])


def run(args: argparse.Namespace) -> int:
    # Every argument is checked before any output or work (a bad value exits 2 with one line).
    max_lens = parse_max_lens(args.max_len)
    overlong = args.overlong or _DEFAULT_OVERLONG
    check_options(overlong, args.batch_size, args.world_size)
    checked_threads(args.threads)
    if args.plot:
        from ..stats.plot import check_plot_path

        check_plot_path(args.plot)
    lengths = read_lengths(
        args.inputs,
        args.tokens_column,
        pair_layout=args.pair_layout,
        threads=args.threads,
        progress=not args.quiet,
    )
    stats = packing_stats(
        lengths,
        max_lens,
        overlong=overlong,
        batch_size=args.batch_size,
        threads=args.threads,
        world_size=args.world_size,
    )
    from ..multimodal.stats import render_vision_stats, vision_stats

    vision = vision_stats(args.inputs)
    if args.json:
        print(json.dumps({**stats.as_dict(), **({"vision": vision} if vision else {})}, indent=2))
    else:
        print(render(stats, overlong_default=args.overlong is None))
        if vision:
            print("\nVision tokens (counted in the lengths above):")
            print(render_vision_stats(vision))
    if args.plot:
        from ..stats.plot import write_plot

        write_plot(stats, lengths, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0
