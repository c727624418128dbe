"""Conversions of user array-likes (lists, numpy, pyarrow, torch) to what the Rust core reads:
1-D integer numpy arrays (lengths), and list columns as Arrow data."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pyarrow as pa

from ..errors import DataError

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


def as_arrow_column(column: Any, name: str) -> Any:
    """Arrow data (anything with ``__arrow_c_stream__`` or ``__arrow_c_array__``) as it is;
    a sequence of 1-D arrays as a list array over their concatenated values. The core checks
    the values, by the same rules as for files."""
    if hasattr(column, "__arrow_c_stream__") or hasattr(column, "__arrow_c_array__"):
        return column
    parts = [to_numpy_1d(seq, f"{name}[{i}]") for i, seq in enumerate(column)]
    offsets = np.cumsum([0] + [p.size for p in parts], dtype=np.int64)
    # Empty rows are float64 (np.asarray([])): they must not decide the values' type.
    values = np.concatenate([p for p in parts if p.size] or [np.zeros(0, dtype=np.int64)])
    return list_array(offsets, values)


def list_array(offsets: np.ndarray, values: np.ndarray, value_type: Optional[pa.DataType] = None):
    """A pyarrow list array over numpy buffers without copying the values (large_list when the
    offsets do not fit in int32)."""
    vals = pa.array(values, type=value_type)
    if offsets.size and int(offsets[-1]) > INT32_MAX:
        return pa.LargeListArray.from_arrays(pa.array(offsets.astype(np.int64, copy=False)), vals)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), vals)
