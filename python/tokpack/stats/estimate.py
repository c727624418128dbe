"""``tokpack.packing_stats``: what packing a corpus would cost at several ``max_len`` candidates
(rows and efficiency per strategy, and what over-long samples would lose), and advice that is a
pure function of those figures, so it can never contradict the table printed next to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .._checks import MAX_LEN, MAX_ROWS, check_choice, check_int
from .._contract import STRATEGIES
from .._io.arrays import as_lengths
from ..errors import ConfigError, DataError
from ..pack.config import PackConfig
from ..pack.plan import plan

__all__ = [
    "packing_stats",
    "advice",
    "default_max_lens",
    "PackingStats",
    "MaxLenFigures",
    "STATS_OVERLONG",
]

# "error" would make the figures unavailable for any candidate shorter than the longest sample.
STATS_OVERLONG = ("split", "truncate", "drop")

# Packing is advised when bfd needs at least this share fewer rows than one sample per row.
PACK_MIN_SAVING = 0.10
# A max_len "fits" the corpus when its over-long samples hold less than this share of the tokens.
FIT_TOKEN_SHARE = 0.01
# Default candidates: powers of two from here up, capped as ``default_max_lens`` says.
_SMALLEST_DEFAULT = 1024
_MOST_DEFAULTS = 5

# The ``max_segments_per_row`` candidates whose cost ``stats`` reports.
SEGMENT_CAPS = (8, 16, 32, 64)


@dataclass(frozen=True)
class MaxLenFigures:
    """The figures of one ``max_len`` candidate.

    ``over_samples`` samples are longer than ``max_len`` and hold ``over_tokens`` tokens: drop
    loses all of them, truncate and split cut those samples; truncate loses the
    ``beyond_tokens`` past ``max_len``; split cuts them into ``split_pieces`` pieces.
    ``rows[s]`` and ``efficiency[s]`` are the rows and efficiency of strategy ``s`` under the
    overlong policy of the ``PackingStats``."""

    max_len: int
    samples: int
    tokens: int
    over_samples: int
    over_tokens: int
    beyond_tokens: int
    split_pieces: int
    rows: Dict[str, int]
    efficiency: Dict[str, float]
    #: bfd rows' compute per epoch under ``COMPUTE_COST`` (``24576·L + L²``): attention per
    #: segment (document masking), and over whole rows (plain causal attention over a row).
    compute: float = 0.0
    full_row_compute: float = 0.0
    #: Mean over optimizer steps of max / mean rank compute, bfd rows shuffled, ``batch_size``
    #: rows per step over ``world_size`` ranks: as dealt (plain), and with balance="compute".
    step_imbalance: Optional[Tuple[float, float]] = None
    #: bfd rows by segments per row, in power-of-two bins (``"1"``, ``"2"``, ``"3-4"``, ...).
    segments_histogram: Dict[str, int] = field(default_factory=dict)
    #: The most segments of a bfd row.
    max_row_segments: int = 0
    #: Rows bfd needs with ``max_segments_per_row=cap``, per candidate cap.
    capped_rows: Dict[int, int] = field(default_factory=dict)

    def cap_cost(self, cap: int) -> float:
        """The extra rows a segment cap costs bfd, as a share of its uncapped rows."""
        rows = self.rows["bfd"]
        return (self.capped_rows[cap] - rows) / rows if rows else 0.0

    @property
    def over_sample_share(self) -> float:
        return self.over_samples / self.samples if self.samples else 0.0

    @property
    def over_token_share(self) -> float:
        return self.over_tokens / self.tokens if self.tokens else 0.0

    @property
    def beyond_token_share(self) -> float:
        return self.beyond_tokens / self.tokens if self.tokens else 0.0

    def saving(self, strategy: str = "bfd") -> float:
        """Share of padding's rows (one sample per row) that ``strategy`` does without."""
        padded = self.rows["padding"]
        return 1.0 - self.rows[strategy] / padded if padded else 0.0


# The figures of a candidate that ``PackingStats.as_dict`` gives as they are, in its order.
_PLAIN_FIGURES = (
    "max_len over_samples over_sample_share over_tokens over_token_share beyond_tokens"
    " beyond_token_share split_pieces compute full_row_compute"
).split()


@dataclass(frozen=True)
class PackingStats:
    """Length distribution of a corpus and the figures of each ``max_len`` candidate."""

    samples: int
    tokens: int
    empty: int
    distribution: Dict[str, float]
    overlong: str
    batch_size: Optional[int]
    candidates: Tuple[MaxLenFigures, ...]
    world_size: Optional[int] = None

    def steps(self, rows: int) -> Optional[int]:
        """Optimizer steps for ``rows`` rows at ``batch_size`` rows per step (None without one)."""
        return -(-rows // self.batch_size) if self.batch_size else None

    def advice(self) -> List[str]:
        return advice(self)

    def as_dict(self) -> Dict[str, Any]:
        """The figures as JSON-ready plain types (what ``tokpack stats --json`` prints)."""
        return {
            "samples": self.samples,
            "tokens": self.tokens,
            "empty": self.empty,
            "distribution": dict(self.distribution),
            "overlong": self.overlong,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "candidates": [
                {
                    **{name: getattr(c, name) for name in _PLAIN_FIGURES},
                    "step_imbalance": (
                        None
                        if c.step_imbalance is None
                        else dict(zip(("plain", "balanced"), c.step_imbalance))
                    ),
                    "segments_per_row": {
                        "histogram": dict(c.segments_histogram),
                        "max": c.max_row_segments,
                        "capped_rows": {str(k): v for k, v in c.capped_rows.items()},
                        "cap_cost": {str(k): c.cap_cost(k) for k in c.capped_rows},
                    },
                    "strategies": {
                        s: {
                            "rows": c.rows[s],
                            "efficiency": c.efficiency[s],
                            "steps": self.steps(c.rows[s]),
                            "rows_saved_vs_padding": c.saving(s),
                        }
                        for s in c.rows
                    },
                }
                for c in self.candidates
            ],
            "advice": self.advice(),
        }


def checked_max_lens(max_lens: Iterable[Any]) -> List[int]:
    """Sorted distinct candidates, each a valid ``max_len``."""
    values = sorted({PackConfig(m).max_len for m in max_lens})
    if not values:
        raise ConfigError("give at least one max_len")
    return values


def check_options(
    overlong: str, batch_size: Optional[int], world_size: Optional[int] = None
) -> None:
    check_choice("overlong", overlong, STATS_OVERLONG)
    if batch_size is not None:
        check_int(batch_size, "batch_size", 1, MAX_ROWS)
    if world_size is not None and (
        batch_size is None or batch_size % check_int(world_size, "world_size", 1, batch_size)
    ):
        raise ConfigError(
            f"world_size must divide batch_size, got {world_size!r} (batch_size {batch_size!r})"
        )


def default_max_lens(lengths: Any) -> List[int]:
    """Powers of two from 1,024 up to the first one reaching the 99th percentile (at least
    8,192, at most the first fitting the longest sample), the last five of them. A corpus whose
    samples all fit below 1,024 starts at the power of two fitting its longest sample and still
    gets 1,024 (rows that short are rarely wanted, and more room packs better).

    >>> default_max_lens([100] * 99 + [27_000])
    [1024, 2048, 4096, 8192]
    >>> default_max_lens([100] * 90 + [27_000] * 10)
    [2048, 4096, 8192, 16384, 32768]
    >>> default_max_lens([10, 300])
    [512, 1024]
    """
    arr = as_lengths(lengths)
    if arr.size == 0:
        raise DataError("lengths: no samples")
    fit_all = _pow2_at_least(int(arr.max()))
    p99 = int(np.percentile(arr, 99, method="inverted_cdf"))
    top = max(_SMALLEST_DEFAULT, min(fit_all, max(8192, _pow2_at_least(p99))))
    bottom = min(_SMALLEST_DEFAULT, fit_all)
    candidates = [2**k for k in range(63) if bottom <= 2**k <= top]
    return candidates[-_MOST_DEFAULTS:]


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def packing_stats(
    lengths: Any,
    max_lens: Optional[Sequence[int]] = None,
    *,
    overlong: str = "split",
    batch_size: Optional[int] = None,
    threads: Optional[int] = None,
    world_size: Optional[int] = None,
    segment_caps: Sequence[int] = SEGMENT_CAPS,
) -> PackingStats:
    """The figures ``tokpack stats`` prints: for each ``max_len`` candidate (default:
    ``default_max_lens(lengths)``), the rows and efficiency of every strategy when over-long
    samples are handled with ``overlong`` (``"split"``, ``"truncate"`` or ``"drop"``), and what
    the over-long samples are. ``batch_size`` (rows per optimizer step) adds step counts, and
    ``world_size`` (data-parallel ranks, dividing ``batch_size``) the per-step compute
    imbalance with and without ``PackedBatchSampler(balance="compute")``. Every candidate has
    its bfd rows' compute per epoch (``a·L + b·L²`` with ``COMPUTE_COST``), per segment and
    over whole rows. Each also has the bfd rows' segments per row (a histogram and the most)
    and the rows bfd would need under each ``max_segments_per_row`` of ``segment_caps``.

    >>> s = packing_stats([300, 500, 700, 1500], [1024])
    >>> c = s.candidates[0]
    >>> c.rows["bfd"], c.rows["padding"], c.over_samples, c.split_pieces
    (3, 5, 1, 2)
    """
    check_options(overlong, batch_size, world_size)
    caps = sorted({check_int(c, "segment_caps", 1, MAX_LEN) for c in segment_caps})
    arr = as_lengths(lengths)
    if arr.size == 0:
        raise DataError("lengths: no samples")
    if not arr.any():
        raise DataError(f"lengths: all {len(arr):,} samples are empty, nothing to pack")
    candidates = checked_max_lens(default_max_lens(arr) if max_lens is None else max_lens)
    ordered = np.sort(arr).astype(np.int64)
    total = int(ordered.sum())
    figures = []
    for m in candidates:
        over = ordered[np.searchsorted(ordered, m, side="right") :]
        over_tokens = int(over.sum())
        rows, efficiency = {}, {}
        for s in STRATEGIES:
            p = plan(arr, m, strategy=s, overlong=overlong, threads=threads)
            rows[s], efficiency[s] = p.n_bins, p.efficiency
            if s == "bfd":
                compute, full_rows, imbalance = _compute_figures(p, batch_size, world_size)
                per_row = np.diff(p.bin_offsets)
        capped = {
            cap: plan(arr, m, overlong=overlong, max_segments_per_row=cap, threads=threads).n_bins
            if per_row.size and cap < int(per_row.max())
            else rows["bfd"]
            for cap in caps
        }
        figures.append(
            MaxLenFigures(
                max_len=m,
                samples=len(arr),
                tokens=total,
                over_samples=len(over),
                over_tokens=over_tokens,
                beyond_tokens=over_tokens - m * len(over),
                split_pieces=int((-(-over // m)).sum()),
                rows=rows,
                efficiency=efficiency,
                compute=compute,
                full_row_compute=full_rows,
                step_imbalance=imbalance,
                segments_histogram=segments_histogram(per_row),
                max_row_segments=int(per_row.max()) if per_row.size else 0,
                capped_rows=capped,
            )
        )
    q50, q90, q99 = np.percentile(arr, [50, 90, 99], method="inverted_cdf")
    return PackingStats(
        samples=len(arr),
        tokens=total,
        empty=int(np.searchsorted(ordered, 0, side="right")),
        distribution={
            "min": int(ordered[0]),
            "median": int(q50),
            "mean": total / len(arr),
            "p90": int(q90),
            "p99": int(q99),
            "max": int(ordered[-1]),
        },
        overlong=overlong,
        batch_size=batch_size,
        candidates=tuple(figures),
        world_size=world_size,
    )


COMPUTE_COST = "attention"


def segments_histogram(per_row: np.ndarray) -> Dict[str, int]:
    """Rows by their segment count in power-of-two bins (``"1"``, ``"2"``, ``"3-4"``,
    ``"5-8"``, ...), up to the bin of the largest count; empty bins included.

    >>> segments_histogram(np.array([1, 3, 4, 9]))
    {'1': 1, '2': 0, '3-4': 2, '5-8': 0, '9-16': 1}
    """
    if per_row.size == 0:
        return {}
    bins = np.ceil(np.log2(per_row)).astype(np.int64)
    counts = np.bincount(bins)
    labels = ["1", "2"] + [f"{2 ** (k - 1) + 1}-{2**k}" for k in range(2, counts.size)]
    return {label: int(n) for label, n in zip(labels, counts)}


def _compute_figures(
    p: Any, batch_size: Optional[int], world_size: Optional[int]
) -> Tuple[float, float, Optional[Tuple[float, float]]]:
    """A plan's compute per epoch (per segment, over whole rows) and, with a world size, the
    mean step imbalance of its rows (``tokpack.balance.packed.step_imbalance``)."""
    from ..balance import cost_coefficients
    from ..balance.packed import segment_compute, step_imbalance

    per_row = segment_compute(p.lengths, p.bin_offsets, COMPUTE_COST)
    a, b = cost_coefficients(COMPUTE_COST)
    tokens = p.row_tokens().astype(np.float64)
    full_rows = float((a * tokens + b * tokens * tokens).sum())
    imbalance = (
        step_imbalance(per_row, batch_size, world_size) if batch_size and world_size else None
    )
    return float(per_row.sum()), full_rows, imbalance


# What each policy does to an over-long sample.
OVERLONG_DONE = {"split": "split", "truncate": "truncated", "drop": "dropped"}


def advice(stats: PackingStats) -> List[str]:
    """Advice lines derived only from ``stats``'s figures (each number quoted is in the table):
    whether bfd packing saves enough rows over one sample per row, the trade-off between the
    candidates (rows, steps, and the share of tokens in samples each would cut or drop), and
    the smallest candidate whose over-long samples hold under 1% of the tokens."""
    cands = stats.candidates
    return [_pack_or_pad(cands)] + [_trade_off(stats, c) for c in cands] + [_fit(stats, cands)]


def _pack_or_pad(cands: Sequence[MaxLenFigures]) -> str:
    worth = [c for c in cands if c.saving() >= PACK_MIN_SAVING]
    if len(cands) == 1:
        c = cands[0]
        head = "Pack" if worth else "Padding is fine"
        return (
            f"{head}: at max_len {c.max_len:,} bfd needs {_n(c.rows['bfd'], 'row')} where one "
            f"sample per row (padding) needs {c.rows['padding']:,}, {c.saving():.0%} fewer."
        )
    savings = ", ".join(f"{c.saving():.0%} fewer at {c.max_len:,}" for c in cands)
    if len(worth) == len(cands):
        return (
            "Pack: at every candidate bfd needs fewer rows than one sample per row (padding): "
            f"{savings}."
        )
    if not worth:
        return (
            f"Padding is fine: bfd saves under {PACK_MIN_SAVING:.0%} of the rows of one sample "
            f"per row at every candidate ({savings})."
        )
    at = ", ".join(f"{c.max_len:,}" for c in worth)
    return (
        f"Pack at max_len {at}, where bfd saves at least {PACK_MIN_SAVING:.0%} of the rows of "
        f"one sample per row (bfd vs padding: {savings})."
    )


def _trade_off(stats: PackingStats, c: MaxLenFigures) -> str:
    rows = _n(c.rows["bfd"], "bfd row")
    steps = stats.steps(c.rows["bfd"])
    if steps is not None:
        rows += f" ({_n(steps, 'step')} at batch size {stats.batch_size:,})"
    if not c.over_samples:
        return f"max_len {c.max_len:,}: {rows}, every sample fits."
    line = (
        f"max_len {c.max_len:,}: {rows}; {_n(c.over_samples, 'sample')} "
        f"({c.over_sample_share:.1%}) holding {c.over_token_share:.1%} of the tokens "
        f"are {OVERLONG_DONE[stats.overlong]}"
    )
    if stats.overlong == "truncate":
        line += f", losing {c.beyond_token_share:.1%} of the tokens"
    return line + "."


def _fit(stats: PackingStats, cands: Sequence[MaxLenFigures]) -> str:
    fitting = [c for c in cands if c.over_token_share < FIT_TOKEN_SHARE]
    if not fitting:
        last = cands[-1]
        return (
            f"At every candidate, over-long samples hold at least {FIT_TOKEN_SHARE:.0%} of the "
            f"tokens (at the largest, {last.max_len:,}: {last.over_token_share:.1%}): consider "
            "a larger max_len."
        )
    c = fitting[0]
    held = (
        f"{c.over_token_share:.1%} of the tokens in over-long samples"
        if c.over_samples
        else "every sample fits"
    )
    return (
        f"Smallest candidate whose over-long samples hold under {FIT_TOKEN_SHARE:.0%} of the "
        f"tokens: max_len {c.max_len:,} ({_n(c.rows['bfd'], 'bfd row')}, {held})."
    )


def _n(count: int, noun: str) -> str:
    """``3 rows``, ``1 row``."""
    return f"{count:,} {noun}{'s' * (count != 1)}"
