"""``PackedIterableDataset``: the streaming reader; one global order split over ranks, workers."""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import numpy as np
import torch

from ..errors import ConfigError
from ..packed_dir import PackedDir
from ._rows import GroupCache
from ._workers import resolve_rank, worker_slot
from .order import TAILS, EpochOrder, RankSplit

__all__ = ["PackedIterableDataset"]


def _non_negative_int(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class PackedIterableDataset(torch.utils.data.IterableDataset):
    """Batches of packed rows in one deterministic global order per ``(seed, epoch)``.

    Use with ``DataLoader(ds, batch_size=None, num_workers=...)``: the dataset yields whole
    batches. Rank ``r`` of ``world_size`` (default: ``torch.distributed``, else the ``RANK`` /
    ``WORLD_SIZE`` environment variables, else 0 / 1) takes its slice of every round of
    ``world_size * batch_rows`` rows, and DataLoader worker ``w`` of ``n`` produces that rank's
    batches ``w, w + n, ...``, which the DataLoader hands out in order: the sequence of batches a
    rank sees does not depend on ``num_workers``. Every rank yields the same number of batches
    (``len(ds)``); see :mod:`tokpack.torch.order` for the ``tail`` policies (``"even"``: every row
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
        collate_fn: Optional[Callable[[List[Dict[str, torch.Tensor]]], Dict[str, Any]]] = None,
        tail: str = "even",
        shuffle_window: int = 4,
    ) -> None:
        self.batch_rows = _non_negative_int("batch_rows", batch_rows, 1)
        self.seed = _non_negative_int("seed", seed)
        self.shuffle_window = _non_negative_int("shuffle_window", shuffle_window, 1)
        if tail not in TAILS:
            raise ConfigError(f"tail must be one of {TAILS}, got {tail!r}")
        self.tail = tail
        self.shuffle = bool(shuffle)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.collate_fn = collate_fn
        self.packed = PackedDir(path)
        if self.packed.num_rows < self.world_size:
            raise ConfigError(
                f"{self.packed.root} has {self.packed.num_rows} rows, fewer than world_size="
                f"{self.world_size}"
            )
        self.epoch = 0
        self._start = 0
        # Batches of this rank's sequence (from _start) before the next one this process makes.
        self._next_batch = 0
        self._cache = GroupCache(self.packed, self.shuffle_window + 1)

    # -- order and state -------------------------------------------------------------------

    def _split(self) -> RankSplit:
        return RankSplit(
            self.packed.num_rows,
            self._start,
            batch_rows=self.batch_rows,
            world_size=self.world_size,
            tail=self.tail,
        )

    def __len__(self) -> int:
        """Batches this rank yields from the current state to the end of the epoch."""
        return self._split().num_batches

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's order; a new epoch starts from its first row."""
        epoch = _non_negative_int("epoch", epoch)
        if epoch != self.epoch:
            self.epoch, self._start, self._next_batch = epoch, 0, 0

    def state_dict(self, batches_consumed: Optional[int] = None) -> Dict[str, Any]:
        """The resumption state, in global rows consumed this epoch.

        ``batches_consumed``: batches this rank has trained on since iteration started from the
        current state (what the training loop counts). Without it, the batches handed out by this
        process's iterator are counted (exact with ``num_workers=0``). Inside a DataLoader worker
        (torchdata's ``StatefulDataLoader`` asks each worker) the state also records the worker's
        own next batch, which ``load_state_dict`` restores when the topology is unchanged.
        """
        split = self._split()
        if batches_consumed is None:
            n = self._next_batch
        else:
            n = _non_negative_int("batches_consumed", batches_consumed)
            if n > split.num_batches:
                raise ConfigError(f"batches_consumed={n} but this epoch has {split.num_batches}")
        state = {
            "epoch": self.epoch,
            "rows_consumed": split.round_end(min(n, split.num_batches) - 1),
            "num_rows": self.packed.num_rows,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
        }
        _, num_workers = worker_slot()
        if batches_consumed is None and num_workers > 1:
            state["worker"] = {
                "from_rows": self._start,
                "next_batch": n,
                "num_workers": num_workers,
                "world_size": self.world_size,
                "batch_rows": self.batch_rows,
                "tail": self.tail,
            }
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` or from a batch's ``position`` dict."""
        try:
            epoch = _non_negative_int("epoch", state["epoch"])
            rows = _non_negative_int("rows_consumed", state["rows_consumed"])
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"state needs 'epoch' and 'rows_consumed': {exc}") from None
        for key in ("num_rows", "seed", "shuffle", "shuffle_window"):
            mine = self.packed.num_rows if key == "num_rows" else getattr(self, key)
            if key in state and state[key] != mine:
                raise ConfigError(f"state was saved with {key}={state[key]!r}, this is {mine!r}")
        if rows > self.packed.num_rows:
            raise ConfigError(f"rows_consumed={rows} > the corpus's {self.packed.num_rows} rows")
        worker = state.get("worker")
        same = worker is not None and all(
            worker.get(k) == v
            for k, v in (
                ("world_size", self.world_size),
                ("batch_rows", self.batch_rows),
                ("tail", self.tail),
                ("num_workers", worker_slot()[1]),
            )
        )
        if same:
            # A worker's own state (StatefulDataLoader): resume at that worker's next batch.
            self.epoch, self._start = epoch, int(worker["from_rows"])
            self._next_batch = int(worker["next_batch"])
        else:
            self.epoch, self._start, self._next_batch = epoch, rows, 0

    # -- iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        worker, num_workers = worker_slot()
        split = self._split()
        if split.num_batches == 0 and split.start < self.packed.num_rows and self.tail == "even":
            warnings.warn(
                f"only {self.packed.num_rows - split.start} rows left in epoch {self.epoch}, fewer"
                f" than world_size={self.world_size}: they are skipped",
                stacklevel=2,
            )
        order = EpochOrder(
            self.packed.group_rows,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            window=self.shuffle_window,
        )
        if self._next_batch >= split.num_batches:
            self._next_batch = 0  # the previous pass finished: a new pass replays the epoch
        first = self._next_batch + (worker - self._next_batch) % num_workers
        for k in range(first, split.num_batches, num_workers):
            a, b = split.batch(self.rank, k)
            groups, rows = order.rows(a, b)
            batch_rows = [self._cache.get(int(g)).row(int(r)) for g, r in zip(groups, rows)]
            if self.collate_fn is not None:
                batch = self.collate_fn(batch_rows)
            else:
                batch = {name: [row[name] for row in batch_rows] for name in self.packed.columns}
            consumed = split.round_end(k)
            batch["position"] = {"epoch": self.epoch, "batch": k, "rows_consumed": consumed}
            self._next_batch = k + 1
            yield batch
        # This worker's share of the pass is done; in a worker, `_next_batch` only saw its own
        # batches, so mark the whole pass finished or a persistent worker's next pass would
        # resume mid-epoch instead of replaying it.
        self._next_batch = split.num_batches
