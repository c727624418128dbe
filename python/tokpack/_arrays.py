"""Conversions of user array-likes (lists, numpy, pyarrow, torch) to the flat numpy layout the
Rust core reads: 1-D integer arrays, and list columns as ``(values, offsets)``."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
import pyarrow as pa

from .errors import DataError

INT32_MAX = np.iinfo(np.int32).max


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "numpy")


def to_numpy_1d(x: Any, what: str) -> np.ndarray:
    """Any 1-D array-like as a numpy array, without copying when it already is one."""
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    if isinstance(x, pa.Array):
        if x.null_count:
            first = int(np.flatnonzero(x.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(f"{what}: row {first} is null")
        return x.to_numpy(zero_copy_only=False)
    if is_torch_tensor(x):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise DataError(f"{what} must be 1-D, got an array of shape {arr.shape}")
    return arr


def as_lengths(lengths: Any) -> np.ndarray:
    """A contiguous int32 or int64 array of lengths (zero-copy for those two dtypes)."""
    arr = to_numpy_1d(lengths, "lengths")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iu":
        raise DataError(f"lengths must be integers, got dtype {arr.dtype}")
    if arr.dtype in (np.int32, np.int64):
        return np.ascontiguousarray(arr)
    if arr.dtype == np.uint64 and arr.max() > np.iinfo(np.int64).max:
        raise DataError("lengths: a value does not fit in int64")
    return arr.astype(np.int64)


def _int32_values(values: np.ndarray, offsets: np.ndarray, column: str) -> np.ndarray:
    """The values as int32. Only the int32 range is checked here; which values a column may
    hold (token ids >= 0, labels -100 or a token id) is checked by the core, with the same rule
    as for files."""
    if values.dtype == np.bool_ or values.dtype.kind not in "iu":
        raise DataError(f"column {column!r}: token values must be integers, got {values.dtype}")
    if values.size and values.dtype.itemsize * 8 > (32 if values.dtype.kind == "i" else 31):
        outside = (values > INT32_MAX) | (values < np.iinfo(np.int32).min)
        if outside.any():
            bad = int(np.argmax(outside))
            row = int(np.searchsorted(offsets, bad, side="right")) - 1
            raise DataError(
                f"column {column!r}, row {row}: value {int(values[bad])} is out of range "
                "(not an int32)"
            )
    return np.ascontiguousarray(values, dtype=np.int32)


def as_flat_column(column: Any, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """A list column (pyarrow list array, or a sequence of 1-D arrays) as int32 values plus
    int64 offsets into them."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.Array):
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            raise DataError(f"column {name!r} must be a list array, got {column.type}")
        if column.null_count:
            first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(f"column {name!r}, row {first} is null")
        offsets = column.offsets.to_numpy().astype(np.int64, copy=False)
        child = column.values
        if child.null_count:
            flat = column.flatten()
            if flat.null_count:
                first = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
                row = int(np.searchsorted(offsets - offsets[0], first, side="right")) - 1
                raise DataError(f"column {name!r}, row {row} holds a null value")
            child = child.fill_null(0)
        values = child.to_numpy(zero_copy_only=False)
        return _int32_values(values, offsets, name), offsets
    parts = [to_numpy_1d(seq, f"{name}[{i}]") for i, seq in enumerate(column)]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    if parts:
        np.cumsum([p.size for p in parts], out=offsets[1:])
        values = np.concatenate(parts) if offsets[-1] else np.zeros(0, dtype=np.int64)
    else:
        values = np.zeros(0, dtype=np.int64)
    return _int32_values(values, offsets, name), offsets


def list_array(offsets: np.ndarray, values: np.ndarray, value_type: Optional[pa.DataType] = None):
    """A pyarrow list array over numpy buffers without copying the values (large_list when the
    offsets do not fit in int32)."""
    vals = pa.array(values, type=value_type)
    if offsets.size and int(offsets[-1]) > INT32_MAX:
        return pa.LargeListArray.from_arrays(pa.array(offsets.astype(np.int64, copy=False)), vals)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), vals)
