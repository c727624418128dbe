"""The deterministic global row order of one epoch, and how it is split into batches per rank.

Order: the row groups are permuted with ``(seed, epoch)``, cut into windows of ``window`` row
groups, and the rows of each window are permuted. Readers therefore decode a few row groups at a
time, yet rows written longest-first by BFD end up well mixed. Nothing per row is stored: a
window's permutation is derived on demand from ``(seed, epoch, window)``.

Split: from ``start`` (global rows already consumed this epoch), rows go out in rounds of
``world_size * batch_rows`` consecutive positions; within a round rank ``r`` takes the ``r``-th
contiguous slice. Every rank therefore gets the same number of batches. ``tail="even"`` splits
the last, short round evenly across ranks (a round shorter than ``world_size`` rows is merged
into the previous one, so some last batches hold ``batch_rows + 1`` rows): every row exactly
once. ``tail="drop"`` keeps only full rounds: all batches hold ``batch_rows`` rows (static
shapes) and up to ``world_size * batch_rows - 1`` rows of the epoch are skipped.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

TAILS = ("even", "drop")
# Windows whose permutation an EpochOrder keeps.
_WINDOWS_KEPT = 4


def _rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, stream]))


class EpochOrder:
    """Maps global positions ``[0, num_rows)`` of one epoch to (row group, row in group)."""

    def __init__(
        self, group_rows: np.ndarray, *, seed: int, epoch: int, shuffle: bool, window: int
    ) -> None:
        n_groups = len(group_rows)
        groups = _rng(seed, epoch, 0).permutation(n_groups) if shuffle else np.arange(n_groups)
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.group_rows = group_rows
        self.window_groups = [groups[i : i + window] for i in range(0, n_groups, window)]
        sizes = [int(group_rows[w].sum()) for w in self.window_groups]
        self.window_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        # The last few windows' permutations: a reader's current batch and its fetch-ahead
        # (a window further) alternate between two windows.
        self._cached: Dict[int, Tuple[Optional[np.ndarray], np.ndarray]] = {}

    @property
    def num_rows(self) -> int:
        return int(self.window_start[-1])

    def _window(self, w: int) -> Tuple[np.ndarray, np.ndarray]:
        """(permutation of the window's rows, cumulative row starts of its groups)."""
        cached = self._cached.get(w)
        if cached is None:
            groups = self.window_groups[w]
            starts = np.concatenate([[0], np.cumsum(self.group_rows[groups])])
            n = int(starts[-1])
            perm = _rng(self.seed, self.epoch, w + 1).permutation(n) if self.shuffle else None
            if len(self._cached) >= _WINDOWS_KEPT:
                del self._cached[next(iter(self._cached))]  # the oldest
            cached = self._cached[w] = (perm, starts)
        return cached  # type: ignore[return-value]

    def rows(self, a: int, b: int) -> Tuple[np.ndarray, np.ndarray]:
        """Row groups and rows-in-group of global positions ``[a, b)``, in order."""
        out_g, out_r = [], []
        pos = a
        while pos < b:
            w = int(np.searchsorted(self.window_start, pos, side="right")) - 1
            end = min(b, int(self.window_start[w + 1]))
            local = np.arange(pos - self.window_start[w], end - self.window_start[w])
            perm, starts = self._window(w)
            if perm is not None:
                local = perm[local]
            k = np.searchsorted(starts, local, side="right") - 1
            out_g.append(self.window_groups[w][k])
            out_r.append(local - starts[k])
            pos = end
        if not out_g:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(out_g), np.concatenate(out_r)


class RankSplit:
    """Which global positions each (rank, local batch) covers, from ``start`` to ``num_rows``."""

    def __init__(
        self, num_rows: int, start: int, *, batch_rows: int, world_size: int, tail: str
    ) -> None:
        self.start, self.world_size = start, world_size
        self.round_rows = batch_rows * world_size
        remaining = num_rows - start
        if tail == "drop":
            self.num_batches = remaining // self.round_rows
            self.end = start + self.num_batches * self.round_rows
        elif remaining < world_size:
            # Fewer rows left than ranks: nothing can be split evenly; they are skipped.
            self.num_batches, self.end = 0, start
        else:
            k = -(-remaining // self.round_rows)
            if remaining - (k - 1) * self.round_rows < world_size:
                k -= 1
            self.num_batches, self.end = k, num_rows

    def round_end(self, k: int) -> int:
        """Global rows consumed once every rank has taken local batch ``k`` (-1: none yet)."""
        if k < 0:
            return self.start
        if k >= self.num_batches - 1:
            return self.end
        return self.start + (k + 1) * self.round_rows

    def batch(self, rank: int, k: int) -> Tuple[int, int]:
        """Global positions ``[a, b)`` of local batch ``k`` of ``rank``."""
        a0, b0 = self.round_end(k - 1), self.round_end(k)
        size = b0 - a0
        base, extra = divmod(size, self.world_size)
        a = a0 + rank * base + min(rank, extra)
        return a, a + base + (1 if rank < extra else 0)
