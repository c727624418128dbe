"""``PackedBatchSampler``: one rank's batches of a map-style :class:`PackedDataset`, each carrying
the exact global normalisers of its optimizer step.

A rank's DataLoader sees only its own rows, so the sampler replays every rank's deterministic
sampler and sums the index side files' per-row counts (:func:`tokpack.packed.row_counts.row_counts`)
over each step's batches of all ranks; :meth:`PackedDataset.__getitems__` passes the counts on
and :class:`PackedCollator` puts them in the batch, so no collective is needed.

With ``balance="compute"`` the rows of each optimizer step (all ranks' batches of the step) are
dealt out again so that every rank's compute is even, see :class:`PackedBatchSampler`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Callable, Iterable, Iterator, List, Optional

import numpy as np
import torch

from .._checks import MAX_SEED, check_int
from ..balance import Cost
from ..balance.packed import checked_balance, deal_batches, packed_cost, row_compute
from ..errors import ConfigError
from ..packed.mixture import MAX_STREAM_ROWS
from ..packed.row_counts import row_counts
from ._workers import resolve_rank
from .dataset import PackedDataset, StepBatch

__all__ = ["PackedBatchSampler"]


class PackedBatchSampler(torch.utils.data.Sampler):
    """Batches of ``batch_rows`` rows of rank ``rank`` for ``DataLoader(ds, batch_sampler=...,
    collate_fn=PackedCollator(...))``, each batch with ``global_num_loss_tokens`` and
    ``global_num_samples``: the loss terms and samples of its optimizer step, i.e. local
    batches ``[m G, (m + 1) G)`` of every data-parallel rank (``G = grad_accum_steps``), as
    :class:`PackedIterableDataset` gives them.

    ``sampler``: a function ``rank -> sampler`` giving each rank's row order (it must return the
    same order for a rank wherever it is called: ``set_epoch`` is passed on to every rank's
    sampler). Default: ``DistributedSampler(dataset, num_replicas=world_size, rank=r,
    shuffle=shuffle, seed=seed)``, which pads the ranks to equal length by repeating rows (those
    repeats are trained, so they are counted). ``drop_last`` drops each rank's last short batch.
    ``rank`` / ``world_size`` default as for the streaming datasets (``torch.distributed``, else
    ``RANK`` / ``WORLD_SIZE``). Every rank computes the counts of all ranks: one pass over each
    rank's sampler per epoch (a ``randperm`` of the rows per rank for ``DistributedSampler``).

    ``balance="compute"`` re-deals each optimizer step's rows (the same rows, each as often as
    before) among the ranks so that their compute, ``Σ a·L + b·L²`` over the segments of their
    rows (``cost``: ``"attention"``, ``"tokens"`` or ``(a, b)``, see
    :func:`tokpack.balance.cost_coefficients`; ``(a, b, c)`` adds ``c`` per vision-encoder patch
    of a multimodal row), is as even as a balanced partition with equal
    row counts gets it, and within a rank among its ``grad_accum_steps`` batches, heaviest
    first. The step's normalisers do not change; every rank computes the same deal, so the
    order is still a pure function of the epoch (resume by skipping batches, as before). Only
    the batches of ``batch_rows`` rows that every rank has in the step are re-dealt: a short
    last batch, and the batches of a step some rank has fewer of (the epoch's last), keep their
    rows, as :class:`PackedIterableDataset`'s tail does.
    :meth:`step_imbalance` gives each step's max / mean rank compute.
    """

    def __init__(
        self,
        dataset: PackedDataset,
        batch_rows: int,
        *,
        grad_accum_steps: int = 1,
        sampler: Optional[Callable[[int], Iterable[int]]] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        balance: Optional[str] = None,
        cost: Cost = "attention",
    ) -> None:
        if not isinstance(dataset, PackedDataset):
            raise ConfigError(
                f"PackedBatchSampler needs a tokpack PackedDataset, got {type(dataset).__name__}"
            )
        self.batch_rows = check_int(batch_rows, "batch_rows", 1, MAX_STREAM_ROWS)
        self.grad_accum_steps = check_int(grad_accum_steps, "grad_accum_steps", 1, MAX_STREAM_ROWS)
        self._step_rows = self.batch_rows * self.grad_accum_steps
        self.drop_last = bool(drop_last)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        if sampler is None:
            seed = check_int(seed, "seed", 0, MAX_SEED)

            def sampler(r: int) -> Iterable[int]:
                return torch.utils.data.DistributedSampler(
                    dataset, num_replicas=self.world_size, rank=r, shuffle=shuffle, seed=seed
                )

        self.balance = checked_balance(balance)
        self._samplers = [sampler(r) for r in range(self.world_size)]
        self._cost = packed_cost(cost)
        counts = row_counts(dataset.packed)
        self._terms, self._samples = counts.loss_terms, counts.samples
        self._num_rows = len(dataset)
        self._packed = dataset.packed

    @cached_property
    def _compute(self) -> np.ndarray:
        """Each row's compute (its ``seq_lengths`` read on first use)."""
        return row_compute(self._packed, self._cost)

    def set_epoch(self, epoch: int) -> None:
        """Passed on to every rank's sampler that has ``set_epoch``."""
        for s in self._samplers:
            if hasattr(s, "set_epoch"):
                s.set_epoch(epoch)

    def _rank_rows(self, r: int) -> np.ndarray:
        rows = np.fromiter((int(i) for i in self._samplers[r]), dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self._num_rows):
            bad = int(rows[(rows < 0) | (rows >= self._num_rows)][0])
            raise ConfigError(
                f"the sampler of rank {r} gave row {bad} of a packed directory of"
                f" {self._num_rows} rows"
            )
        if self.drop_last:
            rows = rows[: len(rows) - len(rows) % self.batch_rows]
        return rows

    def _batches(self, n_rows: int) -> int:
        return -(-n_rows // self.batch_rows)

    def __len__(self) -> int:
        return self._batches(len(self._rank_rows(self.rank)))

    def _n_steps(self, per_rank: List[np.ndarray]) -> int:
        return max((-(-len(rows) // self._step_rows) for rows in per_rank), default=0)

    def _step_sums(self, per_row: np.ndarray, rows: np.ndarray, n_steps: int) -> np.ndarray:
        """``per_row`` summed over each optimizer step's part of ``rows`` (a rank's rows, cut at
        its step boundaries: a rank with fewer batches adds less)."""
        ends = np.minimum(np.arange(n_steps + 1) * self._step_rows, len(rows))
        return np.diff(np.concatenate([[0], np.cumsum(per_row[rows])])[ends])

    def _steps(self) -> List[np.ndarray]:
        """Every rank's rows in order, re-dealt per step with ``balance="compute"``."""
        per_rank = [self._rank_rows(r) for r in range(self.world_size)]
        if self.balance is None:
            return per_rank
        out: List[List[np.ndarray]] = [[] for _ in per_rank]
        cuts = np.arange(self.batch_rows, self._step_rows, self.batch_rows)
        for m in range(self._n_steps(per_rank)):
            step = [rows[m * self._step_rows : (m + 1) * self._step_rows] for rows in per_rank]
            # Cut into the batches __iter__ yields: the deal keeps each batch's size.
            batches = [[b for b in np.split(rows, cuts) if len(b)] for rows in step]
            for r, dealt in enumerate(deal_batches(batches, self._compute, self.batch_rows)):
                out[r].extend(dealt)
        return [np.concatenate(parts) if parts else rows for parts, rows in zip(out, per_rank)]

    def step_imbalance(self) -> np.ndarray:
        """Max over mean of the ranks' compute in each optimizer step of this epoch."""
        per_rank = self._steps()
        n_steps = self._n_steps(per_rank)
        loads = np.stack([self._step_sums(self._compute, rows, n_steps) for rows in per_rank], 1)
        mean = loads.mean(axis=1)
        return np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)

    def __iter__(self) -> Iterator[List[int]]:
        per_rank = self._steps()
        n_steps = self._n_steps(per_rank)
        terms = sum(self._step_sums(self._terms, rows, n_steps) for rows in per_rank)
        samples = sum(self._step_sums(self._samples, rows, n_steps) for rows in per_rank)
        own = per_rank[self.rank]
        for k in range(self._batches(len(own))):
            m = k // self.grad_accum_steps
            rows = own[k * self.batch_rows : (k + 1) * self.batch_rows].tolist()
            yield StepBatch(rows, (int(terms[m]), int(samples[m])))  # type: ignore[index]

    def __repr__(self) -> str:
        return (
            f"PackedBatchSampler(batch_rows={self.batch_rows},"
            f" grad_accum_steps={self.grad_accum_steps}, rank={self.rank},"
            f" world_size={self.world_size}, drop_last={self.drop_last},"
            f" balance={self.balance!r})"
        )
