"""Prefix trees: sequences that share a prefix (a prompt's completions, a chat's turns each
repeating the history) packed as trees, every shared prefix computed once, exactly.

The shared prefixes are found on the token ids (a trie in Rust, deterministic, the GIL
released). :func:`pack_trees` packs sequences into rows of trees (``TreeCollator`` for a
DataLoader); :func:`pack_step` packs one RL step's rollouts into balanced micro-batches per
data-parallel rank. A batch carries the tree attention as intervals (``tree_tout``: key ``k``
is visible from query ``q`` iff ``k <= q < tree_tout[k]``), as a dense mask
(:func:`dense_mask`) or a FlexAttention ``BlockMask`` (:func:`block_mask`);
:func:`sequence_logps`, :func:`token_logps` and :func:`tree_loss` give each sequence's result
as if it ran alone. A packed tree directory (``tokpack pack`` of tree token shards) is read by
``tokpack.torch.PackedDataset`` with :class:`PackedTreeCollator`, into the same batches. See
``docs/guide/trees.md``.

>>> from tokpack.tree import pack_trees
>>> batch = pack_trees([[1, 2, 3, 4, 5], [1, 2, 3, 6]], max_tokens=16)
>>> batch["input_ids"].tolist(), batch["position_ids"].tolist()
([[1, 2, 3, 4, 5, 6]], [[0, 1, 2, 3, 4, 3]])
>>> batch["tree_tout"].tolist()
[[6, 6, 6, 5, 5, 6]]
>>> batch["tree_stats"].flat_tokens, batch["tree_stats"].forward_tokens
(9, 6)
"""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch installed
    raise ImportError("tokpack.tree needs PyTorch: pip install 'tokpack[torch]'") from exc

from .batch import attention_pairs, block_mask, dense_mask
from .loss import prediction_logps, sequence_logps, token_logps, tree_loss
from .models import check_tree_model, model_inputs, tree_refusal
from .pack import TreeCollator, TreeStats, pack_trees
from .packed import PackedTreeCollator
from .step import TreeStep, pack_step

__all__ = [
    "PackedTreeCollator",
    "TreeCollator",
    "TreeStats",
    "TreeStep",
    "attention_pairs",
    "block_mask",
    "check_tree_model",
    "dense_mask",
    "model_inputs",
    "pack_step",
    "pack_trees",
    "prediction_logps",
    "sequence_logps",
    "token_logps",
    "tree_loss",
    "tree_refusal",
]
