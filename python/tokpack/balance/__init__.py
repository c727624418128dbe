"""Balanced work for data-parallel training: :func:`partition` splits per-item costs into ``k``
parts of near-equal sums; :func:`micro_batches` splits samples into micro-batches of at most
``max_tokens`` tokens, spread over data-parallel ranks so that each rank's compute is even.

Both run in Rust with the GIL released, deterministically (ties are broken by index).
``tokpack.balance.compat.verl`` has drop-ins for verl's ``get_seqlen_balanced_partitions`` and
``rearrange_micro_batches``. See ``docs/balance.md``.

>>> from tokpack.balance import partition, micro_batches
>>> [p.tolist() for p in partition([8, 7, 6, 5, 4], 2)]
[[0, 1], [2, 3, 4]]
>>> plan = micro_batches([900, 700, 600, 500, 300, 200], max_tokens=1024, dp_size=2, cost="tokens")
>>> [[mb.tolist() for mb in rank] for rank in plan.ranks]
[[[0], [1]], [[2, 5], [3, 4]]]
>>> plan.rank_tokens.tolist()
[1600, 1600]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from .. import _tokpack
from .._checks import check_int
from .._contract import ATTENTION_COST
from ..errors import ConfigError, DataError

__all__ = [
    "ATTENTION_COST",
    "Cost",
    "MicroBatchPlan",
    "cost_coefficients",
    "micro_batches",
    "partition",
]

#: ``"tokens"`` (``L``), ``"attention"`` (``ATTENTION_COST``: ``24576·L + L²``) or ``(a, b)``
#: for ``a·L + b·L²``; the packed readers' balance also takes ``(a, b, c)``: plus ``c`` per
#: vision-encoder patch of a multimodal row (``tokpack.balance.packed.packed_cost``).
Cost = Union[str, Tuple[float, float], Tuple[float, float, float]]
# The counts' upper bound: the Rust side takes them as u64 / usize.
_MAX_INT = 2**63 - 1


def cost_coefficients(cost: Cost) -> Tuple[float, float]:
    """``(a, b)`` of a cost model: the compute of an ``L``-token sample is ``a·L + b·L²``.

    ``"attention"`` is ``24576·L + L²``: a transformer layer's ``24·h²·L + 4·h·L²`` FLOPs over
    ``4·h`` with hidden size ``h = 4096`` (verl's ``calculate_workload``); for another model
    pass ``(6 * hidden_size, 1)``.
    """
    if isinstance(cost, str):
        named = {"tokens": (1.0, 0.0), "attention": ATTENTION_COST}
        if cost not in named:
            raise ConfigError(f'unknown cost {cost!r}; expected "tokens", "attention" or (a, b)')
        return named[cost]
    try:
        a, b = (float(x) for x in cost)
    except (TypeError, ValueError):
        raise ConfigError(
            f'cost must be "tokens", "attention" or a pair of numbers (a, b), got {cost!r}'
        ) from None
    return a, b


def _vector(name: str, values: Any, dtype: type) -> np.ndarray:
    """``values`` as a contiguous 1-D array of ``dtype`` (torch tensors and lists too)."""
    if hasattr(values, "detach"):  # a torch tensor, maybe on a GPU
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise DataError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise DataError(f"{name} must be numbers, got dtype {arr.dtype}")
    if dtype is np.int64 and arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"{name} must be integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=dtype)


def partition(
    costs: Any,
    k: int,
    *,
    equal_size: bool = False,
    method: str = "best",
    threads: Optional[int] = None,
) -> List[np.ndarray]:
    """Splits items ``0..len(costs)`` into ``k`` non-empty parts whose cost sums are as even as
    ``method`` gets them: ``k`` int64 arrays, each ascending, heaviest part first.

    ``costs``: non-negative numbers (a list, numpy array or torch tensor; used as float64).
    ``equal_size``: item counts differ by at most one (verl requires ``len % k == 0``; here any
    length works). ``method``: ``"best"`` (the one of Karmarkar-Karp and LPT with the lower
    maximum, refined by single-item moves and swaps: never worse than either), ``"kk"``
    (verl's Karmarkar-Karp largest differencing) or ``"lpt"`` (largest first to the lightest
    part). ``threads`` is accepted for symmetry with tokpack's other calls and changes nothing:
    the work runs on the calling thread (a pool's wake-ups cost more than it on a busy host).
    """
    k = check_int(k, "k", 1, _MAX_INT)
    values = _vector("costs", costs, np.float64)
    indices, offsets = _tokpack.partition(
        costs=values, k=k, equal_size=bool(equal_size), method=method, threads=threads
    )
    return np.split(indices, offsets[1:-1])


@dataclass(frozen=True)
class MicroBatchPlan:
    """Micro-batches per data-parallel rank, with their token and compute sums.

    ``ranks[r][m]``: the sample indices (int64, ascending) of rank ``r``'s ``m``-th micro-batch;
    ``tokens[r][m]`` / ``compute[r][m]``: its tokens and compute (``a·L + b·L²`` summed).
    """

    ranks: List[List[np.ndarray]]
    tokens: List[np.ndarray]
    compute: List[np.ndarray]
    max_tokens: int
    cost: Tuple[float, float]

    @property
    def num_micro_batches(self) -> List[int]:
        """Micro-batches per rank."""
        return [len(r) for r in self.ranks]

    @property
    def rank_tokens(self) -> np.ndarray:
        return np.array([t.sum() for t in self.tokens], dtype=np.int64)

    @property
    def rank_compute(self) -> np.ndarray:
        return np.array([c.sum() for c in self.compute], dtype=np.float64)

    @property
    def imbalance(self) -> float:
        """Max over mean of the ranks' compute (1.0 is perfect balance)."""
        return _max_over_mean(self.rank_compute)

    @property
    def micro_batch_imbalance(self) -> float:
        """Max over mean of the micro-batches' compute, all ranks together."""
        return _max_over_mean(np.concatenate(self.compute))

    def indices(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s samples in micro-batch order (its permutation of the input)."""
        return np.concatenate(self.ranks[rank]) if self.ranks[rank] else np.zeros(0, np.int64)

    def metrics(self) -> Dict[str, Any]:
        """The plan's figures, JSON-ready."""
        return {
            "micro_batches_per_rank": self.num_micro_batches,
            "rank_tokens": self.rank_tokens.tolist(),
            "rank_compute": self.rank_compute.tolist(),
            "imbalance": self.imbalance,
            "micro_batch_imbalance": self.micro_batch_imbalance,
            "max_micro_batch_tokens": int(max((t.max() for t in self.tokens if t.size), default=0)),
            "max_tokens": self.max_tokens,
        }


def _max_over_mean(values: np.ndarray) -> float:
    mean = float(values.mean()) if values.size else 0.0
    return float(values.max()) / mean if mean > 0 else 1.0


def micro_batches(
    lengths: Any,
    max_tokens: int,
    *,
    dp_size: int = 1,
    cost: Cost = "attention",
    same_count_across_dp: bool = True,
    min_micro_batches: Optional[int] = None,
    divisible_by: Optional[int] = None,
    order: str = "descending",
    overlong: str = "error",
) -> MicroBatchPlan:
    """Splits samples of ``lengths`` tokens into micro-batches of at most ``max_tokens`` tokens
    each, over ``dp_size`` ranks, every sample exactly once, balancing the ranks' compute.

    The micro-batch count is the smallest that best-fit decreasing packs under the cap (never
    below ``ceil(sum(lengths) / max_tokens)``), at least ``min_micro_batches`` per rank, a
    multiple of ``divisible_by`` per rank (e.g. the virtual pipeline size) and, with
    ``same_count_across_dp`` (default), the same on every rank (else counts differ by at most
    one). Samples go largest first to the lightest micro-batch they fit in, then to ranks by a
    balanced partition, then single-sample moves and swaps even out the ranks, the cap checked
    on every change.

    ``cost``: ``"attention"`` (default, ``24576·L + L²``), ``"tokens"`` or ``(a, b)``; see
    :func:`cost_coefficients`. ``order`` of each rank's micro-batches: ``"descending"`` (the
    heaviest first on every rank, so the ranks' ``m``-th micro-batches cost about the same, as
    FSDP's per-micro-batch collectives want), ``"pp"`` (lightest at both ends, heaviest in the
    middle: pipeline parallelism's warm-up and cool-down bubbles scale with the first and last
    micro-batches; verl's order) or ``"input"`` (by smallest sample index). ``overlong``: a
    sample longer than ``max_tokens`` raises :class:`~tokpack.OverlongError` (``"error"``) or
    gets a micro-batch of its own (``"alone"``).
    """
    max_tokens = check_int(max_tokens, "max_tokens", 1, _MAX_INT)
    dp_size = check_int(dp_size, "dp_size", 1, _MAX_INT)
    min_mb = check_int(
        1 if min_micro_batches is None else min_micro_batches, "min_micro_batches", 1, _MAX_INT
    )
    divisible = 1 if divisible_by is None else check_int(divisible_by, "divisible_by", 1, _MAX_INT)
    a, b = cost_coefficients(cost)
    values = _vector("lengths", lengths, np.int64)
    parts = _tokpack.micro_batches(
        lengths=values,
        max_tokens=max_tokens,
        dp_size=dp_size,
        a=a,
        b=b,
        same_count=bool(same_count_across_dp),
        min_micro_batches=min_mb,
        divisible_by=divisible,
        order=order,
        overlong=overlong,
    )
    mbs = np.split(parts.indices, parts.mb_offsets[1:-1]) if len(parts.mb_tokens) else []
    cuts = parts.rank_offsets
    ranks = [mbs[cuts[r] : cuts[r + 1]] for r in range(dp_size)]
    tokens = [parts.mb_tokens[cuts[r] : cuts[r + 1]] for r in range(dp_size)]
    compute = [parts.mb_compute[cuts[r] : cuts[r + 1]] for r in range(dp_size)]
    return MicroBatchPlan(ranks, tokens, compute, max_tokens, (a, b))
