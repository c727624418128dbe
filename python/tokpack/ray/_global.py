"""``mode="global"``: the whole corpus planned at once on the driver, shards written by tasks.

1. One task per block, as the dataset streams it in, measures its samples (lengths, values
   checked) and keeps them flattened in the store in place of the block; the driver keeps the
   lengths only (8 bytes a sample) and plans them with the Rust planner, exactly as
   ``tokpack pack`` does.
2. One scatter task per block sends each shard the samples of that block its rows use (one
   object per block and shard touched: a map-reduce exchange through Ray's object store).
3. One task per shard gathers its pieces and writes the shard with tokpack's own Rust writer
   (``write_held_shard``), so the bytes are ``tokpack pack``'s for the same plan rows.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import ray

from .._io.store import Out
from ..pack.config import PackConfig
from ..pack.plan import Plan
from ._blocks import Columns, Measured, cancelling
from ._shards import Rows, concat, shard_ranges, take, write_shard


@ray.remote
def _scatter(flat: Any, base: int, rows: np.ndarray, cuts: np.ndarray) -> Any:
    """The pieces of one block: piece ``i`` holds block rows ``rows[cuts[i]:cuts[i+1]]``."""
    tokens, offsets, labels, carried = flat
    pieces = []
    for i in range(len(cuts) - 1):
        part = rows[cuts[i] : cuts[i + 1]]
        t, o, lab = take(tokens, offsets, labels, part)
        pieces.append((part + base, o, t, lab, None if carried is None else carried.take(part)))
    return pieces[0] if len(pieces) == 1 else tuple(pieces)


@ray.remote
def _gather_write(
    out: Out, shard: int, rows: Rows, config: PackConfig, columns: Columns, *pieces: Any
) -> Dict[str, Any]:
    has_labels = columns.labels is not None
    held = concat(pieces, has_labels, columns.carry)
    return write_shard(out, shard, rows, held, config, has_labels)


def write_global(
    measured: Measured, plan: Plan, target: Out, config: PackConfig
) -> List[Dict[str, Any]]:
    """Writes every shard of ``plan`` into ``target``; returns their manifest entries in
    order. On failure or interrupt, the tasks still running are cancelled.

    Drops ``measured.flats`` block by block as their scatter tasks are submitted (a task holds
    its block until it is done), so each block leaves the store once scattered."""
    flats, bases = measured.flats, measured.bases
    rows_per_shard = config.rows_per_shard
    ranges = shard_ranges(plan.n_bins, rows_per_shard)
    n_shards = len(ranges)
    # Segment -> shard, then the distinct (block, shard, sample) triples.
    row_of_segment = np.repeat(np.arange(plan.n_bins), np.diff(plan.bin_offsets))
    shard_of_segment = row_of_segment // rows_per_shard
    ids = plan.sample_ids
    block_of_segment = np.searchsorted(bases, ids, side="right") - 1
    key = block_of_segment * n_shards + shard_of_segment
    order = np.lexsort((ids, key))
    key, ids = key[order], ids[order]
    keep = np.ones(len(key), dtype=bool)
    keep[1:] = (key[1:] != key[:-1]) | (ids[1:] != ids[:-1])
    key, ids = key[keep], ids[keep]
    block_of, shard_of = key // n_shards, key % n_shards

    pieces: List[List[Any]] = [[] for _ in range(n_shards)]
    with cancelling([]) as pending:  # type: ignore[var-annotated]
        block_starts = np.searchsorted(block_of, np.arange(len(flats) + 1))
        for j, flat in enumerate(flats):
            flats[j] = None
            lo, hi = block_starts[j], block_starts[j + 1]
            if lo == hi:
                continue
            shards = shard_of[lo:hi]
            firsts = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]])
            cuts = np.r_[firsts, hi - lo]
            out = _scatter.options(num_returns=len(firsts)).remote(
                flat, int(bases[j]), ids[lo:hi] - bases[j], cuts
            )
            del flat
            out = [out] if len(firsts) == 1 else out  # type: ignore[assignment]
            pending.extend(out)  # type: ignore[arg-type]
            for f, piece in zip(firsts, out):  # type: ignore[call-overload]
                pieces[int(shards[f])].append(piece)
        writes = [
            _gather_write.remote(target, s, Rows.of(plan, a, b), config, measured.columns, *p)
            for s, ((a, b), p) in enumerate(zip(ranges, pieces))
        ]
        pending.extend(writes)
        return ray.get(writes)
