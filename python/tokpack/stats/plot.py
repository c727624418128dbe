"""The ``tokpack stats --plot`` figure: the length distribution with the ``max_len`` candidates
marked, and rows (or steps) and efficiency against ``max_len``. Every number drawn comes from a
``PackingStats``, so the picture shows the table's figures. Needs matplotlib (``tokpack[plot]``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, OutputError
from .estimate import OVERLONG_DONE, PackingStats

__all__ = ["PLOT_STRATEGIES", "PLOT_FORMATS", "check_plot_path", "stats_figure", "write_plot"]

PLOT_STRATEGIES = ("bfd", "next_fit", "padding")
PLOT_FORMATS = ("png", "svg")
_COLORS = {"bfd": "#228833", "next_fit": "#ccbb44", "padding": "#aa3377"}
_SAMPLES_COLOR, _TOKENS_COLOR, _HIST_COLOR, _MARK_COLOR = "#4477aa", "#ee6677", "#bbccee", "#555555"


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'tokpack[plot]'") from None
    return plt


def check_plot_path(path: str) -> str:
    """The format of ``path`` (from its suffix), after checking that it can be written and that
    matplotlib is installed: all before any work, so a bad ``--plot`` fails at once."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        raise ConfigError(f"--plot {path}: the file name must end in .png or .svg")
    parent = Path(path).parent
    if not parent.is_dir():
        raise OutputError(f"--plot {path}: directory {str(parent)!r} does not exist")
    _pyplot()
    return fmt


def stats_figure(stats: PackingStats, lengths: Any) -> Any:
    """A matplotlib Figure of ``stats`` (computed from ``lengths``)."""
    plt = _pyplot()
    from matplotlib.ticker import (
        FixedLocator,
        LogLocator,
        NullFormatter,
        NullLocator,
        StrMethodFormatter,
    )

    ordered = np.sort(np.asarray(lengths, dtype=np.int64))
    fig = plt.figure(figsize=(11, 8.5), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=(1.25, 1))
    d = stats.distribution
    fig.suptitle(
        f"{stats.samples:,} samples, {stats.tokens:,} tokens "
        f"(median {d['median']:,}, p99 {d['p99']:,}, max {d['max']:,})",
        fontsize=13,
    )
    _distribution(fig.add_subplot(grid[0, :]), stats, ordered)
    cands = [c.max_len for c in stats.candidates]
    ax_rows, ax_eff = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    what = "optimizer steps" if stats.batch_size else "rows"
    for s in PLOT_STRATEGIES:
        rows = [c.rows[s] for c in stats.candidates]
        ys = [stats.steps(r) for r in rows] if stats.batch_size else rows
        ax_rows.plot(cands, ys, "o-", color=_COLORS[s], label=s, gid=f"{what}:{s}")
        if s != "next_fit":  # next_fit's figures sit just above bfd's: they would overlap
            label = {"textcoords": "offset points", "ha": "center", "fontsize": 8}
            offset = (0, -14 if s == "bfd" else 7)
            for x, y in zip(cands, ys):
                ax_rows.annotate(f"{y:,}", (x, y), xytext=offset, color=_COLORS[s], **label)
        effs = [c.efficiency[s] for c in stats.candidates]
        ax_eff.plot(cands, effs, "o-", color=_COLORS[s], label=s, gid=f"efficiency:{s}")
    per_step = f" at batch size {stats.batch_size:,}" if stats.batch_size else ""
    done = OVERLONG_DONE[stats.overlong]
    ax_rows.set_title(f"{what.capitalize()}{per_step} (over-long samples {done})")
    ax_rows.set_ylabel(f"{what} (log scale)")
    # A log scale shows the ratio between strategies; room below bfd's and above padding's labels.
    low = min(min(line.get_ydata()) for line in ax_rows.get_lines())
    high = max(max(line.get_ydata()) for line in ax_rows.get_lines())
    ax_rows.set_yscale("log")
    ax_rows.set_ylim(max(low, 1) / 2.5, high * 2.5)
    ax_rows.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax_rows.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax_rows.yaxis.set_minor_formatter(NullFormatter())
    ax_eff.set_title("Efficiency (tokens / row capacity)")
    ax_eff.set_ylabel("efficiency")
    ax_eff.set_ylim(0, 1.05)
    ax_eff.yaxis.set_major_formatter(StrMethodFormatter("{x:.0%}"))
    for ax in (ax_rows, ax_eff):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(cands))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.set_xlabel("max_len (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(title="strategy", loc="best")
    return fig


def _distribution(ax: Any, stats: PackingStats, ordered: np.ndarray) -> None:
    """Log-binned histogram, cumulative shares of samples and tokens, candidates marked."""
    from matplotlib.ticker import StrMethodFormatter

    positive = ordered[ordered > 0]
    top = max(int(ordered[-1]), max(c.max_len for c in stats.candidates))
    edges = np.unique(np.rint(np.geomspace(1, top + 1, 60)).astype(np.int64))
    counts, _ = np.histogram(positive, bins=edges)
    ax.stairs(counts, edges, fill=True, color=_HIST_COLOR, label="samples per bin")
    ax.set_ylim(0, max(int(counts.max()), 1) * 1.3)  # room for the legend above the bars
    ax.set_xscale("log")
    ax.set_xlim(1, top * 1.15)
    ax.set_xlabel("sample length (tokens, log scale)")
    ax.set_ylabel("samples per bin (log-spaced bins)")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    empty = f"; {stats.empty:,} empty samples not shown" if stats.empty else ""
    ax.set_title(
        "Length distribution; dashed: max_len candidates, with the share of tokens in samples "
        f"longer than each{empty}"
    )

    share = ax.twinx()
    xs = np.unique(ordered)
    # Share of samples / tokens in samples of at most x tokens, at every distinct length x.
    upto = np.searchsorted(ordered, xs, side="right")
    cum_tokens = np.concatenate([[0], np.cumsum(ordered)])
    total = max(int(cum_tokens[-1]), 1)
    for ys, color, what in (
        (upto / len(ordered), _SAMPLES_COLOR, "samples"),
        (cum_tokens[upto] / total, _TOKENS_COLOR, "tokens"),
    ):
        share.step(xs, ys, where="post", color=color, lw=2, label=f"cumulative share of {what}")
    share.set_ylim(0, 1.02)
    share.set_ylabel("cumulative share (length at most x)")
    share.yaxis.set_major_formatter(StrMethodFormatter("{x:.0%}"))
    for c in stats.candidates:
        ax.axvline(c.max_len, color=_MARK_COLOR, ls="--", lw=1)
        # The token curve at max_len is 1 - the share of tokens in longer samples.
        share.plot([c.max_len], [1 - c.over_token_share], "o", color=_TOKENS_COLOR, ms=6)
        share.text(
            c.max_len / 1.04,
            0.03,
            f"{c.max_len:,}: {c.over_token_share:.1%} of tokens in longer samples",
            rotation=90,
            ha="right",
            va="bottom",
            fontsize=9,
            color="#333333",
            gid=f"mark:{c.max_len}",
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1.5},
        )
    handles = ax.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
    share.legend(handles=handles, loc="upper left", framealpha=0.95)


def write_plot(stats: PackingStats, lengths: Any, path: str) -> None:
    """Writes the figure to ``path`` (PNG or SVG by suffix) through a temporary file renamed
    into place, so ``path`` is never left half-written."""
    fmt = check_plot_path(path)
    plt = _pyplot()
    fig = stats_figure(stats, lengths)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            fig.savefig(out, format=fmt, dpi=110)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        plt.close(fig)
