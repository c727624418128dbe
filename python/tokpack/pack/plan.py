"""``tokpack.plan``: sample lengths in, a packing plan out (computed in Rust)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Tuple

import numpy as np

from .. import _tokpack
from .._checks import checked_threads
from .._contract import OVERLONG_POLICIES, STRATEGIES
from .._io.arrays import as_lengths
from ..packed.reader import segment_sums
from .config import PackConfig, pack_config

__all__ = ["Plan", "plan", "STRATEGIES", "OVERLONG_POLICIES"]


@dataclass(frozen=True, repr=False, eq=False)
class Plan:
    """How samples are packed into rows.

    Row ``r`` holds segments ``bin_offsets[r]:bin_offsets[r+1]``; segment ``k`` is tokens
    ``starts[k]:starts[k]+lengths[k]`` of input sample ``sample_ids[k]``. Samples not packed at
    all are in ``dropped`` (over-long ones with ``overlong="drop"`` and zero-length ones, the
    latter also in ``empty``); ``truncated`` and ``split`` list samples packed only in part or in
    pieces. Every input sample is in exactly one of: packed whole, ``truncated``, ``split``,
    ``dropped``.

    ``total_tokens`` counts the tokens placed in rows (after truncation and dropping),
    ``lower_bound`` is ``ceil(total_tokens / max_len)`` (no packing can use fewer rows) and
    ``efficiency`` is packed tokens over the capacity of the rows used (1.0 means no padding).
    ``row_order`` is the order the rows are listed in: ``"shuffled"`` (a permutation of the
    planned rows seeded by ``seed``, the order packed shards are written in) or ``"plan"``
    (the planner's own order: longest samples first with ``bfd`` / ``ffd``).
    """

    bin_offsets: np.ndarray
    sample_ids: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    dropped: np.ndarray
    empty: np.ndarray
    truncated: np.ndarray
    split: np.ndarray
    n_samples: int
    input_tokens: int
    max_len: int
    strategy: str
    row_order: str
    total_tokens: int
    lower_bound: int
    efficiency: float

    @classmethod
    def _from_rust(cls, parts: _tokpack.PlanParts) -> "Plan":
        return cls(**{f.name: getattr(parts, f.name) for f in fields(cls)})

    @property
    def n_bins(self) -> int:
        """Number of packed rows."""
        return len(self.bin_offsets) - 1

    @property
    def n_segments(self) -> int:
        return len(self.sample_ids)

    @property
    def padding_tokens(self) -> int:
        """Padding a layout with every row padded to ``max_len`` would need."""
        return self.n_bins * self.max_len - self.total_tokens

    def row_tokens(self) -> np.ndarray:
        """Tokens in every row (int64, one per row)."""
        return segment_sums(self.lengths, self.bin_offsets)

    def row(self, r: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(sample_ids, starts, lengths)`` of the segments of row ``r``."""
        if not -self.n_bins <= r < self.n_bins:
            raise IndexError(f"row {r} out of range for a plan of {self.n_bins} rows")
        r %= self.n_bins
        a, b = self.bin_offsets[r], self.bin_offsets[r + 1]
        return self.sample_ids[a:b], self.starts[a:b], self.lengths[a:b]

    def __len__(self) -> int:
        return self.n_bins

    def __repr__(self) -> str:
        return (
            f"Plan(strategy={self.strategy!r}, row_order={self.row_order!r}, "
            f"max_len={self.max_len}, "
            f"n_samples={self.n_samples:,}, n_bins={self.n_bins:,}, "
            f"total_tokens={self.total_tokens:,}, lower_bound={self.lower_bound:,}, "
            f"efficiency={self.efficiency:.4f}, dropped={len(self.dropped):,}, "
            f"truncated={len(self.truncated):,}, split={len(self.split):,})"
        )


def plan(
    lengths: Any,
    max_len: Optional[int] = None,
    *,
    strategy: Optional[str] = None,
    overlong: Optional[str] = None,
    seed: Optional[int] = None,
    row_order: Optional[str] = None,
    max_segments_per_row: Optional[int] = None,
    align_segments: Optional[int] = None,
    threads: Optional[int] = None,
    config: Optional[PackConfig] = None,
) -> Plan:
    """Plan how to pack samples of the given lengths into rows of at most ``max_len`` tokens.

    Args:
        lengths: 1-D integer array-like (numpy, list, pyarrow array, torch tensor); int32 and
            int64 numpy arrays are read without copying.
        max_len: row capacity in tokens.
        strategy: ``"bfd"`` best-fit decreasing (default), ``"ffd"`` first-fit decreasing,
            ``"next_fit"`` input order, ``"padding"`` one sample per row, ``"random"`` shuffle,
            concatenate and cut (samples may be split).
        overlong: samples longer than ``max_len``: ``"error"`` (default), ``"truncate"``,
            ``"drop"`` or ``"split"`` (pieces of ``max_len`` tokens, each packed on its own).
        seed: seed of the shuffled row order and of the ``"random"`` strategy (default 0).
        row_order: ``"shuffled"`` (default: the planned rows in a permutation seeded by
            ``seed``, so that consecutive rows do not share their composition) or ``"plan"``
            (the planner's order; best-fit decreasing lists the longest samples first).
        max_segments_per_row: the most segments a row may hold (default: no cap), a hard
            constraint of every strategy (static-shape batches: fixed-capacity ``cu_seqlens``).
        align_segments: plan each segment as its length rounded up to a multiple of this
            (default 1; ``max_len`` must be a multiple of it): the collators then place every
            segment at an aligned offset of its row (``tokpack.torch.static``). The plan's
            ``lengths`` stay the real ones.
        config: a :class:`tokpack.PackConfig` instead of the seven above (its plan options).
        threads: worker threads (default: ``TOKPACK_NUM_THREADS`` or all cores). The plan is
            identical for every value.

    >>> p = plan([3, 2, 4, 3], max_len=8)
    >>> p.n_bins, p.lower_bound
    (2, 2)
    """
    fields = dict(
        strategy=strategy,
        overlong=overlong,
        seed=seed,
        row_order=row_order,
        max_segments_per_row=max_segments_per_row,
        align_segments=align_segments,
    )
    config = pack_config(max_len, config, fields)
    threads = checked_threads(threads)
    return Plan._from_rust(
        _tokpack.plan(lengths=as_lengths(lengths), config=config, threads=threads)
    )
