"""Weighted mixtures of packed directories: which source each row of the mixed stream comes from.

Nothing here imports torch: ``tokpack.torch.PackedMixture`` streams a :class:`Mixture`, and
``tokpack mix-stats`` / :func:`mixture_stats` reports what one epoch of it delivers. README,
"Mixtures of packed directories", states the schedule's guarantee and the stream's rules; here, how.

**Schedule.** One period of ``T = sum(W)`` rows (integer row weights ``W_s``) is scheduled
earliest deadline first: at stream row ``n`` (from 1), a source with ``c_s`` rows may take the
next one if ``c_s < n W_s / T`` (its upper quota) and the one whose lower quota is due soonest
(``ceil((c_s + 1) T / W_s)``, ties to the first source) takes it. A schedule within every quota
exists (Balinski and Young's quota method; Tijdeman's chairman assignment theorem) and EDF is
optimal for unit jobs with integer release times and deadlines, so every prefix of an epoch is
within one row of each share; at ``n = T`` every count is exact, so the period repeats and the
count of any row is closed-form.

**Stream.** Source ``s``'s ``j``-th row in mixture epoch ``e`` is row ``j mod N_s`` of that
source's own epoch ``j div N_s``, in :class:`tokpack.packed.order.EpochOrder`'s order seeded by
``(seed, e, s)``; ``stop`` ends the epoch on the sources' budgets (``epochs_per_source x N_s``).
"""

from __future__ import annotations

import heapq
import math
import os
from fractions import Fraction
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .._checks import MAX_SEED, check_choice, check_int
from ..errors import ConfigError, TokpackError
from .order import EpochOrder
from .reader import PackedDir
from .row_counts import RowCounts, row_counts

__all__ = [
    "Mixture",
    "Schedule",
    "mixture_stats",
    "STOPS",
    "WEIGHT_UNITS",
    "MAX_PERIOD",
    "MAX_STREAM_ROWS",
]

STOPS = ("first", "all", "never")
WEIGHT_UNITS = ("rows", "tokens")
MAX_PERIOD = 1 << 16
# Rows of a mixed stream's epoch, a source's budget and --rows (positions stay in int64, and an
# endless stream counts 2**62 rows).
MAX_STREAM_ROWS = (1 << 62) - 1

Number = Union[int, float]


def _positive(name: str, value: Any) -> Fraction:
    """A positive finite int or float as an exact fraction (a float by its shortest decimal:
    0.3 is 3/10)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
    if isinstance(value, (int, np.integer)):
        return Fraction(int(value))
    return Fraction(repr(float(value)))


def integer_weights(names: Sequence[str], shares: Sequence[Fraction]) -> List[int]:
    """Integer row weights proportional to ``shares`` (reduced), exact when their period fits in
    ``MAX_PERIOD`` rows, else the largest-remainder apportionment of ``MAX_PERIOD`` rows."""
    total = sum(shares)
    p = [s / total for s in shares]
    period = math.lcm(*(x.denominator for x in p))
    if period <= MAX_PERIOD:
        weights = [int(x * period) for x in p]
    else:
        quotas = [x * MAX_PERIOD for x in p]
        weights = [math.floor(q) for q in quotas]
        by_remainder = sorted(range(len(p)), key=lambda i: (-(quotas[i] - weights[i]), i))
        for i in by_remainder[: MAX_PERIOD - sum(weights)]:
            weights[i] += 1
    small = [n for n, w in zip(names, weights) if w == 0]
    if small:
        raise ConfigError(
            f"the weight of {small} is below 1/{MAX_PERIOD} of the total: drop the source"
        )
    g = math.gcd(*weights)
    return [w // g for w in weights]


class Schedule:
    """The periodic earliest-deadline-first row schedule of integer weights (module docstring)."""

    def __init__(self, weights: Sequence[int]) -> None:
        self.weights = np.asarray(weights, dtype=np.int64)
        self.period = int(self.weights.sum())
        self.table = _edf_period([int(w) for w in weights])
        # For each row of the period: how many rows of its source come before it in the period.
        self.rank_in_period = np.zeros(self.period, dtype=np.int64)
        self.positions = []
        for s, w in enumerate(weights):
            where = np.flatnonzero(self.table == s)
            self.rank_in_period[where] = np.arange(w)
            self.positions.append(where)

    def counts(self, n: int) -> np.ndarray:
        """Rows of each source among the first ``n`` rows of the stream."""
        full, rest = divmod(int(n), self.period)
        in_part = np.array([np.searchsorted(p, rest) for p in self.positions], dtype=np.int64)
        return full * self.weights + in_part

    def position(self, s: int, j: int) -> int:
        """Stream row of source ``s``'s ``j``-th row (from 0)."""
        full, rest = divmod(int(j), int(self.weights[s]))
        return full * self.period + int(self.positions[s][rest])

    def locate(self, a: int, b: int) -> Tuple[np.ndarray, np.ndarray]:
        """For stream rows ``[a, b)``: their source and their number within that source."""
        pos = np.arange(a, b, dtype=np.int64)
        t = pos % self.period
        src = self.table[t]
        return src, (pos // self.period) * self.weights[src] + self.rank_in_period[t]


def _edf_period(weights: List[int]) -> np.ndarray:
    period = sum(weights)
    count = [0] * len(weights)
    # Sources waiting for their next release (n, s) and released ones by deadline (d, s).
    waiting = [(1, s) for s in range(len(weights))]
    ready: List[Tuple[int, int]] = []
    table = np.empty(period, dtype=np.int32)
    for n in range(1, period + 1):
        while waiting and waiting[0][0] <= n:
            _, s = heapq.heappop(waiting)
            heapq.heappush(ready, (-(-(count[s] + 1) * period // weights[s]), s))
        _, s = heapq.heappop(ready)
        table[n - 1] = s
        count[s] += 1
        if count[s] < weights[s]:
            # The next row may come once c_s < n W_s / T, i.e. from n = floor(c_s T / W_s) + 1.
            heapq.heappush(waiting, (count[s] * period // weights[s] + 1, s))
    return table


def _no_rows(packed: PackedDir) -> str:
    """Why a packed directory has no rows, from its figures."""
    figures = packed.manifest.get("figures", {})
    samples, dropped = figures.get("samples_in"), figures.get("samples_dropped")
    if samples and samples == dropped:
        return f"it has no rows (all {samples:,} of its samples were dropped when packed)"
    return "it has no rows"


def _per_source(name: str, value: Any, names: Sequence[str]) -> List[Fraction]:
    if isinstance(value, Mapping):
        _check_names(name, value, names)
        return [_positive(f"{name}[{n!r}]", value[n]) for n in names]
    return [_positive(name, value)] * len(names)


def _check_names(what: str, given: Mapping[str, Any], names: Sequence[str]) -> None:
    unknown = [n for n in given if n not in names]
    if unknown:
        raise ConfigError(f"{what} names unknown sources {unknown} (sources: {list(names)})")
    missing = [n for n in names if n not in given]
    if missing:
        raise ConfigError(f"{what} has no value for sources {missing}")


class Mixture:
    """A weighted mixture of packed directories: its schedule, epoch length and row order.

    Args:
        sources: name -> packed directory.
        weights: name -> positive number, in ``weight_unit`` ("rows" or "tokens": a source's
            row weight is then its token weight divided by its mean tokens per row).
        epochs_per_source: a source's budget in one mixture epoch, in its own epochs (a number,
            or name -> number; fractions allowed).
        stop: "first" (end the epoch before any source exceeds its budget), "all" (once every
            source has delivered it) or "never".
        seed, shuffle, shuffle_window: the per-source order, as ``PackedIterableDataset``'s.
        open_dir: opens each source's directory (``PackedDir``; ``PackedMixture`` passes one
            that reads object storage too).
    """

    def __init__(
        self,
        sources: Mapping[str, Union[str, os.PathLike]],
        weights: Mapping[str, Number],
        *,
        weight_unit: str = "rows",
        epochs_per_source: Union[Number, Mapping[str, Number]] = 1,
        stop: str = "first",
        seed: int = 0,
        shuffle: bool = True,
        shuffle_window: int = 4,
        open_dir: Callable[[Union[str, os.PathLike]], PackedDir] = PackedDir,
    ) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise ConfigError("sources must be a non-empty mapping of name -> packed directory")
        if not isinstance(weights, Mapping):
            raise ConfigError(
                f"weights must be a mapping of source name -> number, got {weights!r}"
            )
        check_choice("weight_unit", weight_unit, WEIGHT_UNITS)
        check_choice("stop", stop, STOPS)
        self.names = [str(n) for n in sources]
        _check_names("weights", weights, self.names)
        # Before any directory is read: the same checks and messages for PackedMixture and
        # mix-stats (which take their options from here).
        seed = check_int(seed, "seed", 0, MAX_SEED)
        shuffle_window = check_int(shuffle_window, "shuffle_window", 1, MAX_STREAM_ROWS)
        shares = [_positive(f"weights[{n!r}]", weights[n]) for n in self.names]
        epochs = _per_source("epochs_per_source", epochs_per_source, self.names)
        self.packed = []
        for name, path in sources.items():
            try:
                packed = open_dir(path)
            except TokpackError as exc:
                raise type(exc)(f"source {name!r}: {exc}") from None
            if packed.num_rows == 0:
                raise ConfigError(f"source {name!r}: {_no_rows(packed)}; leave it out")
            self.packed.append(packed)
        self.num_rows_per_source = [p.num_rows for p in self.packed]
        if weight_unit == "tokens":
            tokens = [int(p.manifest["figures"]["tokens"]) for p in self.packed]
            shares = [w * p.num_rows / t for w, p, t in zip(shares, self.packed, tokens)]
        self.row_weights = integer_weights(self.names, shares)
        self.schedule = Schedule(self.row_weights)
        self.budget = [math.floor(e * n) for e, n in zip(epochs, self.num_rows_per_source)]
        for name, budget, rows in zip(self.names, self.budget, self.num_rows_per_source):
            if not 1 <= budget <= MAX_STREAM_ROWS:
                amount = (
                    "less than one row"
                    if budget < 1
                    else f"{budget:,} rows, more than {MAX_STREAM_ROWS:,},"
                )
                raise ConfigError(
                    f"epochs_per_source gives source {name!r} ({rows:,} rows) {amount} in an epoch"
                )
        self.stop, self.seed, self.shuffle = stop, seed, bool(shuffle)
        self.shuffle_window = shuffle_window
        self.num_rows = self._epoch_rows()
        if self.num_rows is not None and self.num_rows > MAX_STREAM_ROWS:
            raise ConfigError(
                f"one epoch of the mixture would have {self.num_rows:,} rows, more than"
                f" {MAX_STREAM_ROWS:,}: lower epochs_per_source"
            )
        self._orders: Dict[Tuple[int, int, int], EpochOrder] = {}
        self._counts: Optional[List[RowCounts]] = None

    @property
    def shares(self) -> Dict[str, float]:
        """Each source's share of the rows (the integer weights normalised)."""
        total = self.schedule.period
        return {n: w / total for n, w in zip(self.names, self.row_weights)}

    def _epoch_rows(self) -> Optional[int]:
        """Rows of the mixed stream in one epoch, None when it never ends."""
        ends = [self.schedule.position(s, b) for s, b in enumerate(self.budget)]
        if self.stop == "first":
            return min(ends)  # the first row over a budget is not delivered
        if self.stop == "all":
            return max(self.schedule.position(s, b - 1) + 1 for s, b in enumerate(self.budget))
        return None

    def fingerprint(self) -> Dict[str, Any]:
        """What a resumption state must match."""
        return {
            # In order: a source's index picks its place in the schedule and its seed.
            "sources": [[n, r] for n, r in zip(self.names, self.num_rows_per_source)],
            "num_rows": self.num_rows,
            "row_weights": list(self.row_weights),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
        }

    def order(self, s: int, epoch: int, sub_epoch: int) -> EpochOrder:
        """Source ``s``'s row order in its ``sub_epoch``-th epoch of mixture epoch ``epoch``."""
        key = (s, epoch, sub_epoch)
        order = self._orders.get(key)
        if order is None:
            seed = np.random.SeedSequence([self.seed, epoch, s]).generate_state(1)[0]
            order = EpochOrder(
                self.packed[s].group_rows,
                seed=int(seed),
                epoch=sub_epoch,
                shuffle=self.shuffle,
                window=self.shuffle_window,
            )
            # One order per source at a time: a source's rows are asked for in stream order.
            self._orders = {k: v for k, v in self._orders.items() if k[0] != s}
            self._orders[key] = order
        return order

    def locate(self, epoch: int, a: int, b: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, row group, row in group) of stream rows ``[a, b)`` of ``epoch``, in order."""
        src, j = self.schedule.locate(a, b)
        groups = np.zeros(len(src), dtype=np.int64)
        rows = np.zeros(len(src), dtype=np.int64)
        for s in np.unique(src):
            mask = src == s
            js = j[mask]  # consecutive: the stream takes a source's rows in order
            n = self.num_rows_per_source[s]
            g_parts, r_parts = [], []
            lo = int(js[0])
            while lo <= int(js[-1]):
                sub, q = divmod(lo, n)
                hi = min(int(js[-1]) + 1, (sub + 1) * n)
                g, r = self.order(int(s), epoch, sub).rows(q, q + hi - lo)
                g_parts.append(g)
                r_parts.append(r)
                lo = hi
            groups[mask] = np.concatenate(g_parts)
            rows[mask] = np.concatenate(r_parts)
        return src, groups, rows

    def row_counts(self) -> List[RowCounts]:
        """Each source's per-row counts (read once, see :mod:`tokpack.packed.row_counts`)."""
        if self._counts is None:
            self._counts = [row_counts(p) for p in self.packed]
        return self._counts


def mixture_stats(
    sources: Mapping[str, Union[str, os.PathLike]],
    weights: Mapping[str, Number],
    *,
    epoch: int = 0,
    rows: Optional[int] = None,
    **options: Any,
) -> Dict[str, Any]:
    """What one epoch of a mixture delivers (``rows``: the first ``rows`` rows of the stream
    instead, needed with ``stop="never"``). ``options``: those of :class:`Mixture`.

    Returns ``{"rows", "tokens", "loss_terms", "samples", "period", "sources": {name: {"rows",
    "tokens", "loss_terms", "samples", "epochs", "row_share", "token_share", "weight"}}}``;
    ``loss_terms`` counts what the collators train on (each sample's first label is masked),
    ``epochs`` is how many of the source's epochs the rows amount to. Exact for the given
    ``epoch`` and seed (partial source epochs are summed over the rows the order picks).
    """
    epoch = check_int(epoch, "epoch", 0, MAX_STREAM_ROWS)
    if rows is not None:
        rows = check_int(rows, "rows", 0, MAX_STREAM_ROWS)
    mix = Mixture(sources, weights, **options)
    if rows is None:
        if mix.num_rows is None:
            raise ConfigError("stop='never' has no epoch end: give rows=N (--rows)")
        rows = mix.num_rows
    counts = mix.schedule.counts(rows)
    per: Dict[str, Dict[str, Any]] = {}
    for s, (name, packed, c) in enumerate(zip(mix.names, mix.packed, counts)):
        rc = mix.row_counts()[s]
        full, part = divmod(int(c), packed.num_rows)
        g, r = mix.order(s, epoch, full).rows(0, part)
        picked = packed.group_start[g] + r
        per[name] = {"rows": int(c)}
        for key in ("tokens", "loss_terms", "samples"):  # whole epochs, then the rows picked
            values = getattr(rc, key)
            per[name][key] = full * int(values.sum()) + int(values[picked].sum())
        per[name].update(epochs=int(c) / packed.num_rows, weight=mix.shares[name])
    totals = {
        k: sum(v[k] for v in per.values()) for k in ("rows", "tokens", "loss_terms", "samples")
    }
    for v in per.values():
        v["row_share"] = v["rows"] / totals["rows"] if totals["rows"] else 0.0
        v["token_share"] = v["tokens"] / totals["tokens"] if totals["tokens"] else 0.0
    return {**totals, "period": mix.schedule.period, "sources": per}
