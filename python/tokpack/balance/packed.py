"""Balanced optimizer steps of packed rows: the compute of a packed directory's rows
(``Σ a·L + b·L²`` over each row's segments: the attention of a packed row is per segment, read
from its ``seq_lengths`` column only; with a cost ``(a, b, c)``, plus ``c`` per vision-encoder
patch of the row's images, read from its ``vision_patches`` column; a prefix-tree row's
tokens each by their position, :func:`tree_compute`) and the deal of one
step's rows to ranks and batches that ``PackedBatchSampler(balance="compute")`` and ``tokpack
stats`` share."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import ConfigError
from ..kinds import KINDS
from ..packed.reader import PackedDir
from . import Cost, _max_over_mean, cost_coefficients, partition

__all__ = [
    "checked_balance",
    "deal_batches",
    "deal_step",
    "packed_cost",
    "row_compute",
    "segment_compute",
    "step_imbalance",
]

# The per-segment column the third cost coefficient weighs (multimodal directories).
VISION_PATCHES = "vision_patches"


def checked_balance(balance: Any) -> Optional[str]:
    """The ``balance`` option of the torch readers: None or ``"compute"``."""
    if balance not in (None, "compute"):
        raise ConfigError(f'balance must be None or "compute", got {balance!r}')
    return balance


def packed_cost(cost: Any) -> Tuple[float, ...]:
    """The coefficients of a packed rows' cost: ``(a, b)`` as :func:`cost_coefficients` gives
    them, or ``(a, b, c)`` for a cost ``(a, b, c)``: ``c`` per vision-encoder patch of a row
    (a multimodal directory's second cost, ``vision_patches``)."""
    if not isinstance(cost, str):
        try:
            parts = tuple(cost)
        except TypeError:
            parts = ()
        if len(parts) == 3:
            try:
                c = float(parts[2])
            except (TypeError, ValueError):
                c = float("nan")
            if not np.isfinite(c) or c < 0:
                raise ConfigError(
                    f"cost (a, b, c): c, the cost of a vision-encoder patch, must be a number"
                    f" >= 0, got {parts[2]!r}"
                )
            return (*cost_coefficients(parts[:2]), c)
    return cost_coefficients(cost)


def row_compute(packed: PackedDir, cost: Any = "attention") -> np.ndarray:
    """float64 compute of every row of ``packed`` (global numbering) under ``cost`` (a
    :data:`Cost`, or ``(a, b, c)``: see :func:`packed_cost`)."""
    a, b, *vision = packed_cost(cost)
    parts = []
    for g in range(packed.num_groups):
        if KINDS[packed.kind].trees:
            parts.append(tree_compute(packed.decode(g, ["tree_node_depth", "tree_node_len"]), a, b))
            continue
        lengths, offsets = packed.decode(g, ["seq_lengths"])["seq_lengths"]
        parts.append(segment_compute(lengths, offsets, (a, b)))
    compute = np.concatenate(parts) if parts else np.zeros(0, np.float64)
    if vision and vision[0]:
        if VISION_PATCHES not in packed.carried:
            raise ConfigError(
                f"{packed.shown}: cost (a, b, c) weighs the rows' vision-encoder patches, and"
                f" this directory has no {VISION_PATCHES!r} column (not multimodal): pass (a, b)"
            )
        compute += vision[0] * packed.row_sums(VISION_PATCHES)
    return compute


def tree_compute(cols: Dict[str, Any], a: float, b: float) -> np.ndarray:
    """Per-row compute of prefix-tree rows: ``a`` per token and ``b`` per (2 x position + 1) of
    each token, what a flat segment's ``b L^2`` counts for its tokens; a node of ``n`` tokens
    from position ``d`` counts ``n^2 + 2 n d`` (a tree's shared tokens are computed once)."""
    depth, offsets = cols["tree_node_depth"]
    n = np.asarray(cols["tree_node_len"][0], dtype=np.float64)
    per_node = a * n + b * (n * n + 2.0 * n * np.asarray(depth, dtype=np.float64))
    cum = np.concatenate([[0.0], np.cumsum(per_node)])
    return cum[offsets[1:]] - cum[offsets[:-1]]


def segment_compute(
    seq_lengths: np.ndarray, row_offsets: np.ndarray, cost: Cost = "attention"
) -> np.ndarray:
    """Per-row compute of rows whose segments are
    ``seq_lengths[row_offsets[r]:row_offsets[r + 1]]``."""
    a, b = cost_coefficients(cost)
    seg = np.asarray(seq_lengths, dtype=np.float64)
    cum = np.concatenate([[0.0], np.cumsum(a * seg + b * seg * seg)])
    return cum[row_offsets[1:]] - cum[row_offsets[:-1]]


def deal_step(ranks: List[np.ndarray], compute: np.ndarray, batches: int = 1) -> List[np.ndarray]:
    """One optimizer step's rows, ``ranks[r]`` those of rank ``r`` (``compute[row]`` the
    compute of a row), dealt again with the same count per rank and even compute, each rank's
    rows ordered as ``batches`` equal batches of even compute, heaviest first. ``ranks`` back
    when the ranks' counts differ, or when the new deal's heaviest rank would not be lighter or
    as light (a partition heuristic is not optimal)."""
    if len({len(r) for r in ranks}) != 1 or not len(ranks[0]):
        return ranks
    rows = np.concatenate(ranks)
    out = []
    for part in partition(compute[rows], len(ranks), equal_size=True, threads=1):
        mine = rows[part]
        if batches > 1:
            split = partition(compute[mine], batches, equal_size=True, threads=1)
            mine = np.concatenate([mine[b] for b in split])
        out.append(mine)
    heaviest = [max(float(compute[r].sum()) for r in x) for x in (out, ranks)]
    return out if heaviest[0] <= heaviest[1] else ranks


def deal_batches(
    batches: List[List[np.ndarray]], compute: np.ndarray, batch_rows: int
) -> List[List[np.ndarray]]:
    """One optimizer step's batches, ``batches[r]`` those of rank ``r`` in order (arrays of
    rows, ``compute[row]`` a row's compute), with the leading batches that hold ``batch_rows``
    rows on every rank dealt by :func:`deal_step`: the tail rule of both torch readers. The
    batches past those (a short last batch, the batches some rank does not have: the epoch's
    last step) keep their rows, so a balanced step holds the batches of the plain one, each of
    the same size. The plain batches back when the deal would make the heaviest rank of the
    whole step heavier."""
    full = min(_leading_full(b, batch_rows) for b in batches)
    if full == 0:
        return batches
    dealt = deal_step([np.concatenate(b[:full]) for b in batches], compute, full)
    out = [np.split(mine, full) + b[full:] for mine, b in zip(dealt, batches)]
    heaviest = [max(sum(float(compute[x].sum()) for x in b) for b in s) for s in (out, batches)]
    return out if heaviest[0] <= heaviest[1] else batches


def _leading_full(batches: List[np.ndarray], batch_rows: int) -> int:
    """How many of ``batches``, from the first, hold ``batch_rows`` rows."""
    for k, batch in enumerate(batches):
        if len(batch) != batch_rows:
            return k
    return len(batches)


def step_imbalance(
    compute: np.ndarray, batch_size: int, world_size: int, seed: int = 0
) -> Optional[Tuple[float, float]]:
    """Mean over optimizer steps of max / mean rank compute when rows of ``compute`` are
    shuffled (``seed``) into steps of ``batch_size`` rows, each dealt to ``world_size`` ranks
    (rank ``r`` takes every ``world_size``-th row, as ``DistributedSampler``): as dealt, and
    re-dealt by :func:`deal_step`. None without a whole step."""
    if len(compute) < batch_size:
        return None
    order = np.random.default_rng(seed).permutation(len(compute))
    plain: List[float] = []
    balanced: List[float] = []
    for m in range(len(order) // batch_size):
        step = order[m * batch_size : (m + 1) * batch_size]
        dealt = [step[r::world_size] for r in range(world_size)]
        for out, ranks in ((plain, dealt), (balanced, deal_step(dealt, compute))):
            out.append(_max_over_mean(np.array([compute[r].sum() for r in ranks])))
    return float(np.mean(plain)), float(np.mean(balanced))
