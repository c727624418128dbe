"""Token inputs as the Rust core reads them: one flat int64 buffer with a start and a length
per sequence. Lists of lists are concatenated; a padded 2-D array or tensor is read in place,
its lengths from ``lengths`` or a 0/1 ``mask`` (ones contiguous, on the left or the right)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from .._contract import IGNORE_INDEX
from ..errors import DataError

#: ``(tokens, starts, lengths)``: sequence ``i`` is ``tokens[starts[i]:starts[i] + lengths[i]]``.
Flat = Tuple[np.ndarray, np.ndarray, np.ndarray]


def as_numpy(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, maybe on a GPU
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def _is_2d(values: Any) -> bool:
    return hasattr(values, "ndim") and values.ndim == 2


def flat_tokens(name: str, values: Any, lengths: Any = None, mask: Any = None) -> Flat:
    """``values`` (a list of token lists, or a padded 2-D array / tensor with ``lengths`` or
    ``mask``) as a flat buffer."""
    if _is_2d(values):
        arr = np.ascontiguousarray(as_numpy(values), dtype=np.int64)
        n, width = arr.shape
        rows = np.arange(n, dtype=np.int64) * width
        if mask is not None:
            m = as_numpy(mask).astype(bool)
            if m.shape != arr.shape:
                raise DataError(f"{name}'s mask has shape {m.shape}, its tokens {arr.shape}")
            lens = m.sum(axis=1).astype(np.int64)
            # Ones contiguous: each row's first one (argmax) followed by exactly `len` ones.
            first = np.where(lens > 0, m.argmax(axis=1), 0).astype(np.int64)
            cols = np.arange(width)[None, :]
            if not np.array_equal(m, (cols >= first[:, None]) & (cols < (first + lens)[:, None])):
                bad = int(
                    np.flatnonzero(
                        (m != ((cols >= first[:, None]) & (cols < (first + lens)[:, None]))).any(1)
                    )[0]
                )
                raise DataError(
                    f"{name}'s mask row {bad} is not one run of ones; pass lengths (and a "
                    "loss mask for tokens inside a sequence that are not trained)"
                )
            return arr.reshape(-1), rows + first, lens
        if lengths is None:
            return arr.reshape(-1), rows, np.full(n, width, dtype=np.int64)
        lens = np.ascontiguousarray(as_numpy(lengths), dtype=np.int64)
        if lens.shape != (n,) or (lens < 0).any() or (lens > width).any():
            raise DataError(
                f"{name}_lengths must be {n} numbers in 0..{width} (the padded width), "
                f"got shape {lens.shape}"
            )
        return arr.reshape(-1), rows, lens
    if lengths is not None or mask is not None:
        raise DataError(f"{name} as lists carry their own lengths: pass no lengths or mask")
    seqs = [as_numpy(s).reshape(-1) for s in values]
    lens = np.array([s.size for s in seqs], dtype=np.int64)
    for i, s in enumerate(seqs):
        if s.size and not np.issubdtype(s.dtype, np.integer):
            raise DataError(f"{name}[{i}] must be token ids (integers), got dtype {s.dtype}")
    tokens = np.concatenate(seqs).astype(np.int64, copy=False) if seqs else np.zeros(0, np.int64)
    starts = np.zeros(len(seqs), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    return np.ascontiguousarray(tokens), starts, lens


def trained_flags(name: str, values: Any, flat: Flat, *, labels: bool) -> Optional[np.ndarray]:
    """Per token of ``flat``'s buffer, whether it is trained: ``values`` shaped like the tokens
    (lists or padded 2-D), labels (``IGNORE_INDEX`` untrained) or a 0/1 loss mask."""
    if values is None:
        return None
    tokens, starts, lengths = flat
    if _is_2d(values):
        arr = as_numpy(values)
        if arr.size != tokens.size:
            raise DataError(f"{name} has {arr.size} entries, its tokens {tokens.size}")
        arr = arr.reshape(-1)
    else:
        parts = [as_numpy(v).reshape(-1) for v in values]
        got = np.array([p.size for p in parts], dtype=np.int64)
        if got.shape != lengths.shape or not np.array_equal(got, lengths):
            bad = next(
                (i for i, (g, n) in enumerate(zip(got.tolist(), lengths.tolist())) if g != n),
                len(parts),
            )
            raise DataError(f"{name}[{bad}] must have as many entries as its sequence's tokens")
        arr = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        if arr.size != tokens.size:
            # Lists were concatenated in order, so they align with a list-built buffer only.
            raise DataError(f"{name} given as lists needs its sequences given as lists too")
    flags = (arr != IGNORE_INDEX) if labels else arr.astype(bool)
    return np.ascontiguousarray(flags, dtype=bool)
