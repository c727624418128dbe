"""``PackedMixture``: a weighted, resumable stream over several packed directories."""

from __future__ import annotations

import os
from functools import partial
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from ..balance import Cost
from ..packed.mixture import Mixture, Number
from ..packed.row_counts import RowCounts
from ..remote import open_packed
from ._stream import Collate, RowStream

__all__ = ["PackedMixture"]


class PackedMixture(RowStream):
    """Batches mixed from several packed directories by weight, split over ranks and workers as
    :class:`PackedIterableDataset` splits one directory (same ``batch_rows``, ``rank``,
    ``world_size``, ``tail``, ``collate_fn``, ``position``, ``state_dict`` / ``load_state_dict``,
    ``set_epoch``, ``grad_accum_steps`` and ``balance`` / ``cost``).

    ``PackedMixture({"code": "packed/code", "chat": "packed/chat"}, {"code": 0.3, "chat": 0.7},
    batch_rows=8, seed=0)``: a fixed periodic schedule keeps every source within one row of its
    share after any number of rows from the epoch's start; a source that runs out restarts with
    its next epoch and the epoch ends as ``stop`` says (``"first"``, ``"all"``, ``"never"``: see
    :class:`tokpack.packed.mixture.Mixture` and the README). ``weight_unit="tokens"`` takes the
    weights as shares of tokens.

    Every batch also carries ``sources``: the source index of each row (a list of ints, names in
    ``ds.names``), for per-source loss logging.

    Sources may be on object storage (URIs, or paths on ``filesystem``), each read through its
    own local cache of at most ``cache_limit`` bytes (see :class:`PackedIterableDataset`).
    """

    def __init__(
        self,
        sources: Mapping[str, Union[str, os.PathLike]],
        weights: Mapping[str, Number],
        *,
        batch_rows: int,
        seed: int = 0,
        epochs_per_source: Union[Number, Mapping[str, Number]] = 1,
        stop: str = "first",
        weight_unit: str = "rows",
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        collate_fn: Optional[Collate] = None,
        tail: str = "even",
        shuffle: bool = True,
        shuffle_window: int = 4,
        grad_accum_steps: Optional[int] = None,
        balance: Optional[str] = None,
        cost: Cost = "attention",
        filesystem: Any = None,
        cache_dir: Optional[Union[str, os.PathLike]] = None,
        cache_limit: Optional[int] = None,
    ) -> None:
        self.mixture = Mixture(
            sources,
            weights,
            weight_unit=weight_unit,
            epochs_per_source=epochs_per_source,
            stop=stop,
            seed=seed,
            shuffle=shuffle,
            shuffle_window=shuffle_window,
            open_dir=partial(
                open_packed, filesystem=filesystem, cache_dir=cache_dir, cache_limit=cache_limit
            ),
        )
        self.names = self.mixture.names
        self.sources = self.mixture.packed
        self.shuffle = self.mixture.shuffle
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

    @property
    def shares(self) -> Dict[str, float]:
        """Each source's share of the rows, as scheduled."""
        return self.mixture.shares

    def _stream_rows(self) -> Optional[int]:
        return self.mixture.num_rows

    def _fingerprint(self) -> Dict[str, Any]:
        return self.mixture.fingerprint()

    def _row_counts(self) -> List[RowCounts]:
        return self.mixture.row_counts()

    def _locate(self, a: int, b: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.mixture.locate(self.epoch, a, b)

    def _batch(self, src: np.ndarray, groups: np.ndarray, rows: np.ndarray) -> Dict[str, Any]:
        batch = super()._batch(src, groups, rows)
        # A list of ints, as documented (per-source logging reads it on the host).
        batch["sources"] = src.tolist()
        return batch
