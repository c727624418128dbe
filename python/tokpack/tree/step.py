"""One RL step's rollouts as prefix-tree micro-batches, in memory: :func:`pack_step`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _tokpack
from .._checks import check_int, checked_threads
from ..balance import Cost, cost_coefficients
from ..errors import ConfigError, DataError
from ._inputs import flat_tokens, trained_flags
from .batch import MODEL_KEYS, as_tensors
from .pack import TreeStats, check_caps, check_lengths

_MAX_INT = 2**63 - 1


@dataclass(frozen=True)
class TreeStep:
    """This rank's micro-batches of a step (one row of trees each, :func:`pack_step`).

    ``micro_batches[m]``: a tree batch (``tokpack.tree.batch``'s keys, and the ``extras``
    given); its sequences are the rollouts ``rollout_index[m]`` (ascending), the order of its
    per-sequence results.
    ``stats``: the whole step's figures (every rank); ``rank_tokens``: each rank's forward
    tokens."""

    micro_batches: List[Dict[str, Any]]
    rollout_index: List[np.ndarray]
    stats: TreeStats
    rank_tokens: np.ndarray

    @property
    def imbalance(self) -> float:
        """Max over mean of the ranks' forward tokens (1.0 is perfect balance)."""
        mean = float(self.rank_tokens.mean()) if self.rank_tokens.size else 0.0
        return float(self.rank_tokens.max()) / mean if mean > 0 else 1.0

    def gather(self, values: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per-micro-batch results (first dimension: its sequences) back in rollout order:
        ``(rollout indices ascending, values)`` for this rank's rollouts."""
        if len(values) != len(self.micro_batches):
            raise ConfigError(
                f"values must hold one tensor per micro-batch ({len(self.micro_batches)}), "
                f"got {len(values)}"
            )
        if not values:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0)
        index = torch.from_numpy(np.concatenate(self.rollout_index))
        order = torch.argsort(index)
        return index[order], torch.cat(list(values))[order.to(values[0].device)]


def _prompt_of(n_prompts: int, n_rollouts: int) -> np.ndarray:
    """Rollout ``i``'s prompt: ``i`` when each rollout has its prompt (as verl and TRL hold
    them, repeated), else ``i // G`` for ``G`` completions per prompt, listed group by group."""
    if n_prompts == n_rollouts:
        return np.arange(n_rollouts, dtype=np.int64)
    if n_prompts and n_rollouts % n_prompts == 0:
        return np.arange(n_rollouts, dtype=np.int64) // (n_rollouts // n_prompts)
    raise DataError(
        f"{n_rollouts} completions for {n_prompts} prompts: pass one prompt per completion, or "
        "the same number of completions for every prompt, listed prompt by prompt"
    )


def _carried(extras: Optional[Mapping[str, Any]], n_rollouts: int) -> Dict[str, torch.Tensor]:
    """``extras`` as tensors of one entry per rollout (first dimension), names checked to
    stay clear of the batch's own keys (``MODEL_KEYS`` and ``tree_*``)."""
    out: Dict[str, torch.Tensor] = {}
    for name, values in (extras or {}).items():
        if not isinstance(name, str) or name in MODEL_KEYS or name.startswith("tree_"):
            raise ConfigError(
                f"extras name {name!r} must be a string that is not a tree batch's key "
                f"({', '.join(MODEL_KEYS)} or tree_*)"
            )
        t = values if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))
        if t.ndim == 0 or t.shape[0] != n_rollouts:
            raise DataError(
                f"extras[{name!r}] must have one entry per rollout ({n_rollouts}) along its "
                f"first dimension, got shape {tuple(t.shape)}"
            )
        out[name] = t
    return out


def pack_step(
    prompts: Any,
    completions: Any,
    *,
    max_tokens: int,
    world_size: int = 1,
    rank: int = 0,
    prompt_lengths: Any = None,
    prompt_mask: Any = None,
    completion_lengths: Any = None,
    completion_mask: Any = None,
    loss_mask: Any = None,
    max_path: Optional[int] = None,
    min_shared: int = 1,
    cost: Cost = "attention",
    same_count_across_dp: bool = True,
    min_micro_batches: Optional[int] = None,
    divisible_by: Optional[int] = None,
    order: str = "descending",
    pad_to_multiple_of: int = 1,
    pad_token_id: int = 0,
    extras: Optional[Mapping[str, Any]] = None,
    threads: Optional[int] = None,
) -> TreeStep:
    """A step's rollouts as rank ``rank``'s micro-batches of prefix trees.

    ``prompts`` and ``completions``: token lists, or padded 2-D arrays / tensors with
    ``*_lengths`` or 0/1 ``*_mask`` (a prompt mask may be left-padded, as verl and TRL hold
    them). One prompt per completion (repeated prompts are found equal and shared), or ``G``
    completions per prompt listed prompt by prompt. ``loss_mask`` (shaped like the
    completions): which completion tokens are trained (default: all; e.g. not a tool's output).
    Each prompt's completions form a tree, their common prefixes shared too; pieces go into
    micro-batches of at most ``max_tokens`` tokens, balanced over ``world_size`` ranks by
    :func:`tokpack.balance.micro_batches` (``cost``, ``same_count_across_dp``,
    ``min_micro_batches``, ``divisible_by``, ``order`` as there). Every rank computes the same
    plan and lays out only its own micro-batches. ``extras``: per-rollout values to carry
    (``{"advantages": [n], "rewards": [n], ...}``: arrays or tensors whose first dimension is
    the rollouts), each micro-batch holding its rollouts' entries under the same names, in its
    sequence order (``tree_seq_index``).
    """
    max_tokens, max_path, multiple, min_shared = check_caps(
        max_tokens, max_path, pad_to_multiple_of, min_shared
    )
    world_size = check_int(world_size, "world_size", 1, _MAX_INT)
    rank = check_int(rank, "rank", 0, world_size - 1)
    min_mb = check_int(
        1 if min_micro_batches is None else min_micro_batches, "min_micro_batches", 1, _MAX_INT
    )
    divisible = 1 if divisible_by is None else check_int(divisible_by, "divisible_by", 1, _MAX_INT)
    a, b = cost_coefficients(cost)
    p_flat = flat_tokens("prompts", prompts, prompt_lengths, prompt_mask)
    c_flat = flat_tokens("completions", completions, completion_lengths, completion_mask)
    prompt_of = _prompt_of(p_flat[2].size, c_flat[2].size)
    lengths = p_flat[2][prompt_of] + c_flat[2]
    check_lengths(lengths, max_tokens, max_path)
    carried = _carried(extras, int(lengths.size))
    out = _tokpack.tree_step(
        prompt_tokens=p_flat[0],
        prompt_starts=p_flat[1],
        prompt_lengths=p_flat[2],
        prompt_of=prompt_of,
        tokens=c_flat[0],
        starts=c_flat[1],
        lengths=c_flat[2],
        trained=trained_flags("loss_mask", loss_mask, c_flat, labels=False),
        max_tokens=max_tokens,
        min_shared=min_shared,
        dp_size=world_size,
        rank=rank,
        a=a,
        b=b,
        same_count=bool(same_count_across_dp),
        min_micro_batches=min_mb,
        divisible_by=divisible,
        order=order,
        pad_to_multiple_of=multiple,
        pad_token_id=check_int(pad_token_id, "pad_token_id", -_MAX_INT - 1, _MAX_INT),
        threads=checked_threads(threads),
    )
    batches = [as_tensors(arrays) for arrays in out["micro_batches"]]
    for batch in batches:
        for name, values in carried.items():
            batch[name] = values[batch["tree_seq_index"].to(values.device)]
    mb_tokens = out["mb_tokens"]
    # Each rank's tokens: differences of the running total at the ranks' cuts.
    running = np.concatenate([np.zeros(1, np.int64), np.cumsum(mb_tokens, dtype=np.int64)])
    cuts = out["rank_offsets"]
    rank_tokens = running[cuts[1:]] - running[cuts[:-1]]
    stats = TreeStats(
        sequences=int(lengths.size),
        trees=int(out["trees"]),
        nodes=int(out["nodes"]),
        pieces=int(out["pieces"]),
        split_trees=int(out["split_trees"]),
        rows=int(len(mb_tokens)),
        forward_tokens=int(mb_tokens.sum()),
        flat_tokens=int(lengths.sum()),
        unique_tokens=int(out["unique_tokens"]),
        padded_tokens=int((-(-mb_tokens // multiple) * multiple).sum()),
    )
    return TreeStep(
        micro_batches=batches,
        rollout_index=[b["tree_seq_index"].numpy() for b in batches],
        stats=stats,
        rank_tokens=rank_tokens,
    )
