"""``PackedIterableDataset``: the streaming reader; one global order split over ranks, workers."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ..balance import Cost
from ..packed.order import EpochOrder
from ..packed.row_counts import RowCounts, row_counts
from ..remote import open_packed
from ._stream import Collate, RowStream

__all__ = ["PackedIterableDataset"]


class PackedIterableDataset(RowStream):
    """Batches of packed rows in one deterministic global order per ``(seed, epoch)``.

    Use with ``DataLoader(ds, batch_size=None, num_workers=...)``: the dataset yields whole
    batches. Rank ``r`` of ``world_size`` (default: ``torch.distributed``, else the ``RANK`` /
    ``WORLD_SIZE`` environment variables, else 0 / 1) takes its slice of every round of
    ``world_size * batch_rows`` rows, and DataLoader worker ``w`` of ``n`` produces that rank's
    batches ``w, w + n, ...``, which the DataLoader hands out in order: the sequence of batches a
    rank sees does not depend on ``num_workers``. Every rank yields the same number of batches
    (``len(ds)``); see :mod:`tokpack.packed.order` for the ``tail`` policies (``"even"``: every row
    exactly once, the last batch may be smaller; ``"drop"``: full batches only).

    Each batch is ``collate_fn(rows)`` (for example a :class:`PackedCollator`), or without one a
    dict of per-row tensor lists (``input_ids``, ``labels``, ``seq_lengths``, ``sample_ids``).
    Either way it carries ``batch["position"] = {"epoch", "batch", "rows_consumed"}``: the
    number of global rows consumed once every rank has taken this batch.

    Resuming: save ``batch["position"]`` of the last batch trained on (or
    ``ds.state_dict(batches_consumed=n)``), then ``ds.load_state_dict(state)`` before building the
    DataLoader of the resumed run; the rest of the epoch is delivered exactly once, for any
    ``num_workers`` and any ``world_size``. torchdata's ``StatefulDataLoader`` works too (same
    topology). Call ``set_epoch(e)`` before each epoch; keep ``persistent_workers=False`` so
    workers see the new epoch and state. Iterating again after a finished pass replays the epoch;
    after an interrupted in-process pass it continues where that pass stopped.

    ``grad_accum_steps=G``: every batch also carries ``global_num_loss_tokens`` and
    ``global_num_samples``, the loss terms and samples of its whole optimizer step (local
    batches ``[m G, (m + 1) G)`` of every rank, counted from the epoch's start or the resumed
    position), from the index side files (see :mod:`tokpack.packed.row_counts`), with no collective.

    ``balance="compute"`` deals each optimizer step's rows (``grad_accum_steps`` rounds, one
    without it) out again among the ranks, the same number to each, so that their compute,
    ``Σ a·L + b·L²`` over the segments of their rows (``cost``: ``"attention"``, ``"tokens"``
    or ``(a, b)``, see :func:`tokpack.balance.cost_coefficients`), is even, and within a rank
    among its batches of the step, heaviest first (never dealt worse than the plain split). The
    step's rows, batch sizes and global normalisers do not change; the epoch's last round, when
    short, keeps its plain split. A step's rows are not a prefix of the stream until the step
    is over, so a ``position`` inside one carries ``mid_step`` (the batches taken of it and the
    deal's settings): resuming there needs the same ``world_size``, ``batch_rows``,
    ``grad_accum_steps``, ``tail`` and ``cost`` (any ``num_workers``); a position at a step's
    end resumes with any topology, as without balancing.

    Object storage: ``path``, ``filesystem``, ``cache_dir`` and ``cache_limit`` as in
    :class:`PackedDataset`. Resuming from a state reads nothing before its position: only the
    row groups the rest of the epoch needs are fetched.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        *,
        batch_rows: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        collate_fn: Optional[Collate] = None,
        tail: str = "even",
        shuffle_window: int = 4,
        grad_accum_steps: Optional[int] = None,
        balance: Optional[str] = None,
        cost: Cost = "attention",
        filesystem: Any = None,
        cache_dir: Optional[Union[str, os.PathLike]] = None,
        cache_limit: Optional[int] = None,
    ) -> None:
        self.shuffle = bool(shuffle)
        self.packed = open_packed(
            path, filesystem=filesystem, cache_dir=cache_dir, cache_limit=cache_limit
        )
        self.sources = [self.packed]
        self._order: Optional[EpochOrder] = None
        self._setup(
            batch_rows=batch_rows,
            seed=seed,
            rank=rank,
            world_size=world_size,
            collate_fn=collate_fn,
            tail=tail,
            shuffle_window=shuffle_window,
            grad_accum_steps=grad_accum_steps,
            balance=balance,
            cost=cost,
        )

    def _stream_rows(self) -> int:
        return self.packed.num_rows

    def _fingerprint(self) -> Dict[str, Any]:
        return {
            "num_rows": self.packed.num_rows,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
        }

    def _row_counts(self) -> List[RowCounts]:
        return [row_counts(self.packed)]

    def _locate(self, a: int, b: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        order = self._order
        if order is None or order.epoch != self.epoch:
            order = self._order = EpochOrder(
                self.packed.group_rows,
                seed=self.seed,
                epoch=self.epoch,
                shuffle=self.shuffle,
                window=self.shuffle_window,
            )
        groups, rows = order.rows(a, b)
        return np.zeros(len(groups), dtype=np.int64), groups, rows
