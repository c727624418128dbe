"""Sequences into rows of prefix trees, in memory: :func:`pack_trees` and the DataLoader
collator :class:`TreeCollator` built on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from .. import _tokpack
from .._checks import check_int, checked_threads
from ..errors import ConfigError, DataError, OverlongError
from ._inputs import Flat, as_numpy, flat_tokens, trained_flags
from .batch import as_tensors

_MAX_INT = 2**63 - 1


@dataclass(frozen=True)
class TreeStats:
    """What packing trees saved. ``forward_tokens``: the rows' tokens (without alignment
    padding); ``flat_tokens``: the same sequences packed flat; ``unique_tokens``: each distinct
    prefix once (what the trees would cost if no tree were cut); ``padded_tokens``: rows x width."""

    sequences: int
    trees: int
    nodes: int
    pieces: int
    split_trees: int
    rows: int
    forward_tokens: int
    flat_tokens: int
    unique_tokens: int
    padded_tokens: int

    @property
    def ratio(self) -> float:
        """Flat tokens over forward tokens: how many times fewer tokens the trees compute."""
        return self.flat_tokens / self.forward_tokens if self.forward_tokens else 1.0

    @property
    def ideal_ratio(self) -> float:
        """Flat tokens over unique tokens: the ratio with no tree cut."""
        return self.flat_tokens / self.unique_tokens if self.unique_tokens else 1.0


def stats_of(out: Mapping[str, Any], lengths: np.ndarray, width: int) -> TreeStats:
    """The figures of ``tree_pack``'s result ``out`` (one batch of every sequence)."""
    n_rows = int(out["rows"])
    return TreeStats(
        sequences=int(lengths.size),
        trees=int(out["trees"]),
        nodes=int(out["nodes"]),
        pieces=int(out["pieces"]),
        split_trees=int(out["split_trees"]),
        rows=n_rows,
        forward_tokens=int(out["forward_tokens"]),
        flat_tokens=int(lengths.sum()),
        unique_tokens=int(out["unique_tokens"]),
        padded_tokens=n_rows * width,
    )


def check_lengths(lengths: np.ndarray, max_tokens: int, max_path: Optional[int]) -> None:
    """Every sequence (a root-to-leaf path) fits a row and the model's context."""
    for cap, name in ((max_tokens, "max_tokens"), (max_path, "max_path")):
        if cap is not None and lengths.size and int(lengths.max()) > cap:
            i = int(np.argmax(lengths > cap))
            raise OverlongError(
                f"sequence {i} has {int(lengths[i])} tokens, more than {name}={cap}; raise "
                f"{name} or leave the sequence out"
            )


def check_caps(
    max_tokens: int, max_path: Optional[int], pad_to_multiple_of: int, min_shared: int
) -> tuple:
    max_tokens = check_int(max_tokens, "max_tokens", 1, _MAX_INT)
    if max_path is not None:
        max_path = check_int(max_path, "max_path", 1, _MAX_INT)
    multiple = check_int(pad_to_multiple_of, "pad_to_multiple_of", 1, max_tokens)
    if max_tokens % multiple:
        raise ConfigError(
            f"max_tokens={max_tokens} must be a multiple of pad_to_multiple_of={multiple}, so "
            "that an aligned row still fits"
        )
    return max_tokens, max_path, multiple, check_int(min_shared, "min_shared", 1, _MAX_INT)


def pack_trees(
    sequences: Any,
    labels: Any = None,
    *,
    max_tokens: int,
    lengths: Any = None,
    mask: Any = None,
    loss_mask: Any = None,
    groups: Any = None,
    max_path: Optional[int] = None,
    min_shared: int = 1,
    pad_to_multiple_of: int = 1,
    pad_token_id: int = 0,
    threads: Optional[int] = None,
) -> Dict[str, Any]:
    """Packs ``sequences`` into rows of prefix trees: a batch dict (``tokpack.tree.batch``'s
    keys) with ``"tree_stats"`` (:class:`TreeStats`).

    ``sequences``: token lists, or a padded 2-D array / tensor with ``lengths`` or a 0/1
    ``mask``. Trained tokens: ``labels`` shaped like them (``IGNORE_INDEX`` untrained, as
    transformers' labels) or a 0/1 ``loss_mask``; neither: all tokens but the first. Shared
    prefixes are found on the token ids (within each of ``groups``, one id per sequence, when
    given), shorter than ``min_shared`` tokens not shared. Rows hold at most ``max_tokens``
    tokens (a larger tree is cut at subtrees, each piece carrying its path), are padded to a
    multiple of ``pad_to_multiple_of``; each sequence must fit ``max_path`` (the context).
    """
    max_tokens, max_path, multiple, min_shared = check_caps(
        max_tokens, max_path, pad_to_multiple_of, min_shared
    )
    flat = flat_tokens("sequences", sequences, lengths, mask)
    check_lengths(flat[2], max_tokens, max_path)
    trained = _trained(flat, labels, loss_mask)
    group_ids = None
    if groups is not None:
        group_ids = np.ascontiguousarray(as_numpy(groups), dtype=np.int64)
        if group_ids.shape != flat[2].shape:
            raise DataError(
                f"groups must have one id per sequence ({flat[2].size}), "
                f"got shape {group_ids.shape}"
            )
    out = _tokpack.tree_pack(
        tokens=flat[0],
        starts=flat[1],
        lengths=flat[2],
        trained=trained,
        groups=group_ids,
        max_tokens=max_tokens,
        min_shared=min_shared,
        pad_to_multiple_of=multiple,
        pad_token_id=check_int(pad_token_id, "pad_token_id", -_MAX_INT - 1, _MAX_INT),
        threads=checked_threads(threads),
    )
    batch = as_tensors(out["batch"])
    batch["tree_stats"] = stats_of(out, flat[2], batch["input_ids"].shape[1])
    return batch


def _trained(flat: Flat, labels: Any, loss_mask: Any) -> Optional[np.ndarray]:
    if labels is not None and loss_mask is not None:
        raise ConfigError("pass labels or loss_mask, not both")
    if labels is not None:
        return trained_flags("labels", labels, flat, labels=True)
    return trained_flags("loss_mask", loss_mask, flat, labels=False)


class TreeCollator:
    """A DataLoader ``collate_fn``: a list of samples (dicts with ``input_ids`` and optional
    ``labels``, or token lists) into one batch of prefix-tree rows (:func:`pack_trees`); the
    trees are found on the batch's token ids. Picklable, so DataLoader workers build batches."""

    def __init__(
        self,
        max_tokens: int,
        *,
        max_path: Optional[int] = None,
        min_shared: int = 1,
        pad_to_multiple_of: int = 1,
        pad_token_id: int = 0,
        threads: Optional[int] = None,
    ) -> None:
        check_caps(max_tokens, max_path, pad_to_multiple_of, min_shared)
        self.options: Dict[str, Any] = dict(
            max_tokens=max_tokens,
            max_path=max_path,
            min_shared=min_shared,
            pad_to_multiple_of=pad_to_multiple_of,
            pad_token_id=pad_token_id,
            threads=threads,
        )

    def __call__(self, samples: Sequence[Any]) -> Dict[str, Any]:
        ids: List[Any] = []
        labels: List[Any] = []
        for s in samples:
            if isinstance(s, Mapping):
                ids.append(s["input_ids"])
                labels.append(s.get("labels"))
            else:
                ids.append(s)
                labels.append(None)
        given = [x is not None for x in labels]
        if any(given) and not all(given):
            raise DataError("every sample of a batch needs labels, or none")
        return pack_trees(ids, labels if all(given) else None, **self.options)
