"""Drop-ins for ``verl.utils.seqlen_balancing``, with verl's signatures and return types.

One line before verl's workers start switches verl over (``prepare_dynamic_batch`` and
verl's own ``rearrange_micro_batches`` look both names up in that module)::

    import verl.utils.seqlen_balancing as sb, tokpack.balance.compat.verl as tv
    sb.get_seqlen_balanced_partitions, sb.rearrange_micro_batches = (
        tv.get_seqlen_balanced_partitions, tv.rearrange_micro_batches)

OpenRLHF's copy is ``openrlhf.utils.seqlen_balancing``: the same line with that module.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .. import micro_batches, partition

__all__ = ["get_reverse_idx", "get_seqlen_balanced_partitions", "rearrange_micro_batches"]


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> List[List[int]]:
    """verl's function: ``k_partitions`` lists of indices of ``seqlen_list``, each non-empty
    and sorted, with near-equal sums of ``seqlen_list`` (item counts equal, or differing by
    one when ``len(seqlen_list) % k_partitions``, with ``equal_size``; verl asserts instead).
    Errors are :class:`~tokpack.ConfigError` (too few items) / :class:`~tokpack.DataError`
    (negative values) where verl raises ``AssertionError``."""
    return [p.tolist() for p in partition(seqlen_list, k_partitions, equal_size=equal_size)]


def _lengths(batch: Any) -> Any:
    """Per-sample token counts of a batch: a 1-D tensor of lengths, a 2-D attention mask, or a
    mapping (dict, TensorDict) with ``attention_mask`` or nested ``input_ids``."""
    if hasattr(batch, "keys"):
        ids = batch["input_ids"] if "input_ids" in batch.keys() else None
        if ids is not None and getattr(ids, "is_nested", False):
            return ids.offsets().diff()
        return batch["attention_mask"].sum(dim=-1)
    if getattr(batch, "ndim", 1) == 2:
        return batch.sum(dim=-1)
    return batch


def _select(batch: Any, idx: List[int]) -> Any:
    import torch

    index = torch.tensor(idx, dtype=torch.long)
    if isinstance(batch, dict):
        return {k: v[index.to(v.device)] for k, v in batch.items()}
    return batch[index.to(batch.device) if hasattr(batch, "device") else index]


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Optional[Any] = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
    *,
    cost: Any = "attention",
    overlong: str = "error",
) -> Tuple[List[Any], List[List[int]]]:
    """verl's function on one rank's batch: ``(micro_batches, micro_bsz_idx)``, where
    ``micro_bsz_idx[m]`` lists the batch rows of micro-batch ``m`` (sorted) and
    ``micro_batches[m]`` is the batch indexed by them. ``batch``: a TensorDict or dict with
    ``attention_mask`` (or nested ``input_ids``), a 2-D attention mask or a 1-D tensor of
    lengths. Unlike verl's Karmarkar-Karp, no micro-batch ever holds more than
    ``max_token_len`` tokens (the count grows until best-fit decreasing fits).

    With ``dp_group`` and ``same_micro_num_in_dp``, the ranks agree on the largest count (one
    all-reduce, as verl). ``use_dynamic_bsz_balance`` orders the micro-batches as verl does
    (lightest at both ends, ``order="pp"``), else by first index. Undo the permutation with
    :func:`get_reverse_idx` of the concatenated ``micro_bsz_idx``.
    """
    lengths = _lengths(batch)
    order = "pp" if use_dynamic_bsz_balance else "input"
    options = dict(cost=cost, divisible_by=num_batches_divided_by, order=order, overlong=overlong)
    plan = micro_batches(lengths, max_token_len, min_micro_batches=min_num_micro_batch, **options)
    count = plan.num_micro_batches[0]
    import torch.distributed as dist

    if same_micro_num_in_dp and dp_group is not None and dist.is_initialized():
        import torch

        agreed = torch.tensor(
            [count], device=lengths.device if hasattr(lengths, "device") else "cpu"
        )
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=dp_group)
        if int(agreed.item()) != count:
            plan = micro_batches(
                lengths, max_token_len, min_micro_batches=int(agreed.item()), **options
            )
    idx = [mb.tolist() for mb in plan.ranks[0]]
    return [_select(batch, i) for i in idx], idx


def get_reverse_idx(idx_map: Sequence[int]) -> List[int]:
    """verl's function: the inverse permutation (``out[idx_map[i]] = i``)."""
    inverse = np.empty(len(idx_map), dtype=np.int64)
    inverse[np.asarray(idx_map, dtype=np.int64)] = np.arange(len(idx_map))
    return inverse.tolist()
