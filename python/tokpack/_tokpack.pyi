"""Type stubs of the compiled module. The public API is the Python facade in ``tokpack``."""

from typing import Optional, Tuple

import numpy as np
import numpy.typing as npt

__version__: str

PlanParts = Tuple[
    npt.NDArray[np.int64],  # bin_offsets
    npt.NDArray[np.int64],  # sample_ids
    npt.NDArray[np.int64],  # starts
    npt.NDArray[np.int64],  # lengths
    npt.NDArray[np.int64],  # dropped
    npt.NDArray[np.int64],  # empty
    npt.NDArray[np.int64],  # truncated
    npt.NDArray[np.int64],  # split
    int,  # n_samples
    int,  # input_tokens
    int,  # max_len
]

def plan(
    lengths: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    max_len: int,
    strategy: str,
    overlong: str,
    seed: int,
    threads: Optional[int] = None,
) -> PlanParts: ...
def pack_flat(
    values: npt.NDArray[np.int32],
    offsets: npt.NDArray[np.int64],
    label_values: Optional[npt.NDArray[np.int32]],
    label_offsets: Optional[npt.NDArray[np.int64]],
    max_len: int,
    strategy: str,
    overlong: str,
    seed: int,
    threads: Optional[int] = None,
) -> Tuple[
    PlanParts,
    npt.NDArray[np.int32],
    Optional[npt.NDArray[np.int32]],
    npt.NDArray[np.int64],
    Optional[npt.NDArray[np.int32]],
]: ...
def default_threads() -> int: ...
