"""How well mixed the batches of a packed directory are: the lag-1 autocorrelation of a per-batch
figure over one epoch, from the index side files alone (no token is decoded).

Best-fit decreasing plans rows longest-first: its first rows hold one long sample each, its last
rows many short ones. Read in that order, or shuffled only within a few row groups, consecutive
batches share their composition (their number of segments, hence their attention cost and
their number of loss terms). The figure that shows it: take the per-batch mean number of
segments per row (and the per-batch mean segment length, tokens over segments) along the epoch's
batches, and correlate each batch's value with the next one's. A full random permutation of the
rows gives about 0 (within ``±2/sqrt(batches)``); rows in plan order give about 1.

>>> x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
>>> round(lag1_autocorrelation(x), 3)
0.625
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._checks import check_int
from .integrity import _read_index
from .mixture import MAX_STREAM_ROWS
from .order import EpochOrder
from .reader import PackedDir

__all__ = [
    "ShuffleQuality",
    "lag1_autocorrelation",
    "batch_figures",
    "shuffle_quality",
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_SHUFFLE_WINDOW",
]

# The figure's defaults: batches of 8 rows, PackedIterableDataset's shuffle_window.
DEFAULT_BATCH_ROWS = 8
DEFAULT_SHUFFLE_WINDOW = 4


def lag1_autocorrelation(values: Sequence[float]) -> float:
    """``sum((x[t] - m)(x[t+1] - m)) / sum((x[t] - m)^2)`` (the usual estimator, ``m`` the
    mean); NaN for fewer than 3 values or values that do not vary."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 3:
        return math.nan
    d = x - x.mean()
    denominator = float(d @ d)
    if denominator <= 1e-12 * max(1.0, float(x @ x)):
        return math.nan
    return float(d[:-1] @ d[1:]) / denominator


def batch_figures(
    tokens: np.ndarray, segments: np.ndarray, order: np.ndarray, batch_rows: int
) -> Tuple[np.ndarray, np.ndarray]:
    """Per full batch of ``batch_rows`` consecutive rows of ``order`` (global row numbers): the
    mean number of segments per row, and the mean segment length (tokens over segments)."""
    n = len(order) // batch_rows * batch_rows
    rows = np.asarray(order[:n], dtype=np.int64).reshape(-1, batch_rows)
    seg = segments[rows].sum(axis=1).astype(np.float64)
    tok = tokens[rows].sum(axis=1).astype(np.float64)
    return seg / batch_rows, tok / np.maximum(seg, 1.0)


@dataclass(frozen=True)
class ShuffleQuality:
    """Lag-1 autocorrelations of the per-batch mean segment count (``segments``) and mean
    segment length (``length``), per order; ``batches`` is the number of full batches, and
    ``noise`` (``2/sqrt(batches)``) the band a random permutation stays within (about 95%)."""

    batch_rows: int
    shuffle_window: int
    batches: int
    orders: Dict[str, Tuple[float, float]]

    @property
    def noise(self) -> float:
        return 2.0 / math.sqrt(self.batches) if self.batches else math.nan

    def lines(self) -> List[str]:
        """The figures as lines of text (``tokpack inspect``)."""
        if self.batches < 3:
            return [f"shuffle quality: fewer than 3 batches of {self.batch_rows} rows, no figure"]
        head = (
            f"shuffle quality: lag-1 autocorrelation over one epoch of {self.batches:,} batches"
            f" of {self.batch_rows} rows (0 = well mixed, 1 = neighbours alike; a random"
            f" permutation stays within ±{self.noise:.3f})"
        )
        width = max(len(k) for k in self.orders)
        out = [head, f"  {'order':<{width}}  mean segments  mean segment length"]
        for name, (seg, length) in self.orders.items():
            out.append(f"  {name:<{width}}  {_fmt(seg):>13}  {_fmt(length):>19}")
        return out


def _fmt(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.3f}"


def reader_order(
    packed: PackedDir, *, shuffle_window: int, seed: int = 0, epoch: int = 0
) -> np.ndarray:
    """The global rows of one epoch of ``PackedIterableDataset(shuffle=True)`` with this
    ``shuffle_window``, ``seed`` and ``epoch``, in stream order (one rank)."""
    order = EpochOrder(
        packed.group_rows, seed=seed, epoch=epoch, shuffle=True, window=shuffle_window
    )
    groups, rows = order.rows(0, order.num_rows)
    return packed.group_start[groups] + rows


def shuffle_quality(
    path: Union[str, os.PathLike, PackedDir],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
    seed: int = 0,
    windows: Optional[Sequence[int]] = None,
) -> ShuffleQuality:
    """The mixing figures of a packed directory, from its index side files: for the file order
    (what a reader without shuffling, ``datasets`` included, gets), for the order of
    ``PackedIterableDataset(batch_rows=batch_rows, shuffle_window=shuffle_window, seed=seed)``
    (epoch 0, one rank; each of ``windows`` too when given) and for a full random permutation
    of the rows (the reference, seeded by ``seed``)."""
    batch_rows = check_int(batch_rows, "batch_rows", 1, MAX_STREAM_ROWS)
    shuffle_window = check_int(shuffle_window, "shuffle_window", 1, MAX_STREAM_ROWS)
    packed = path if isinstance(path, PackedDir) else PackedDir(path)
    parts = [_read_index(packed, k) for k in range(len(packed.shard_paths))]
    tokens = np.concatenate([p["num_tokens"] for p in parts]).astype(np.int64)
    segments = np.concatenate([p["num_seqs"] for p in parts]).astype(np.int64)
    n = len(tokens)
    orders: Dict[str, np.ndarray] = {"file order": np.arange(n)}
    for window in [shuffle_window, *(w for w in windows or () if w != shuffle_window)]:
        key = f"reader, shuffle_window={window}"
        orders[key] = reader_order(packed, shuffle_window=window, seed=seed)
    orders["random permutation"] = np.random.default_rng(seed).permutation(n)
    figures = {}
    for name, order in orders.items():
        seg, length = batch_figures(tokens, segments, order, batch_rows)
        figures[name] = (lag1_autocorrelation(seg), lag1_autocorrelation(length))  # type: ignore[arg-type]
    return ShuffleQuality(batch_rows, shuffle_window, n // batch_rows, figures)
