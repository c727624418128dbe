"""Type stubs of the compiled module. The public API is the Python facade in ``tokpack``."""

from typing import Any, Dict, List, Optional, Tuple, Union, final

import numpy as np
import numpy.typing as npt

from .planning import Plan as _PlanFields

__all__ = [
    "__version__",
    "MAX_THREADS",
    "IGNORE_INDEX",
    "FORMAT",
    "FORMAT_VERSION",
    "SIDE_DIR",
    "RESERVED_COLUMNS",
    "OVERLONG_HINT",
    "STRATEGIES",
    "OVERLONG_POLICIES",
    "PAIR_LAYOUTS",
    "PAIR_SEGMENT_ROLES",
    "SEGMENT_ROLES",
    "SPLIT_REGEXES",
    "plan",
    "pack_tokens",
    "flatten_samples",
    "PlanParts",
    "PackedRows",
    "default_threads",
    "BpeEncoder",
    "ChatRenderer",
    "Progress",
    "pack_files",
    "read_lengths",
    "read_row_group",
    "file_checksum",
    "write_held_shard",
    "PARTITION_METHODS",
    "MICRO_BATCH_ORDERS",
    "OVER_CAP_POLICIES",
    "ATTENTION_COST",
    "partition",
    "micro_batches",
    "MicroBatchParts",
    "input_columns",
]

__version__: str
MAX_THREADS: int
IGNORE_INDEX: int
FORMAT: str
FORMAT_VERSION: int
SIDE_DIR: str
RESERVED_COLUMNS: Tuple[str, ...]
OVERLONG_HINT: str
STRATEGIES: Tuple[str, ...]
OVERLONG_POLICIES: Tuple[str, ...]
PAIR_LAYOUTS: Tuple[str, ...]
PAIR_SEGMENT_ROLES: Dict[str, Tuple[int, ...]]
SEGMENT_ROLES: Tuple[str, ...]
SPLIT_REGEXES: Dict[str, str]

@final
class PlanParts(_PlanFields):
    """A plan's arrays and figures: the fields of ``tokpack.Plan``, typed and documented there
    (``Plan._from_rust`` builds a Plan from them by name); none of its methods."""

@final
class PackedRows:
    """Packed rows: row ``r`` is ``tokens[row_offsets[r]:row_offsets[r + 1]]``."""

    plan: PlanParts
    tokens: npt.NDArray[np.int32]
    labels: Optional[npt.NDArray[np.int32]]
    row_offsets: npt.NDArray[np.int64]

def plan(
    *,
    lengths: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    max_len: int,
    strategy: str,
    overlong: str,
    seed: int,
    threads: Optional[int],
) -> PlanParts: ...
def pack_tokens(
    *,
    input_ids: Any,
    labels: Any,
    max_len: int,
    strategy: str,
    overlong: str,
    seed: int,
    threads: Optional[int],
) -> PackedRows: ...
def flatten_samples(
    *,
    table: Any,
    tokens_column: str,
    labels_column: Optional[str],
    mask_column: Optional[str],
    carry: List[str] = ...,
) -> Tuple[npt.NDArray[np.int32], npt.NDArray[np.int64], Optional[npt.NDArray[np.int32]]]: ...
def default_threads() -> int: ...

# An encoded batch: (ids, labels, offsets, fallback).
_Batch = Tuple[
    npt.NDArray[np.int32],
    npt.NDArray[np.int32],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]

@final
class BpeEncoder:
    """tokpack's exact encoder for byte-level BPE ``tokenizer.json`` files (GPT-2, Llama 3 and
    Qwen2 kinds)."""

    @staticmethod
    def load(json: str) -> Tuple[Optional[BpeEncoder], Optional[str]]:
        """``(encoder, None)``, or ``(None, reason)`` for a tokenizer it does not reproduce."""
    post_processor_adds_tokens: bool
    def encode(self, text: str) -> Optional[List[int]]: ...
    def encode_batch(
        self,
        *,
        texts: List[str],
        span_offsets: npt.NDArray[np.int64],
        span_starts: npt.NDArray[np.int64],
        span_ends: npt.NDArray[np.int64],
        threads: Optional[int] = None,
    ) -> _Batch: ...

@final
class ChatRenderer:
    """A chat template compiled for rendering in Rust (transformers' Jinja semantics)."""

    @staticmethod
    def compile(
        *,
        source: str,
        variables: List[Tuple[str, str]],
        special_tokens: List[str],
        utc_offset: int,
        tools: Optional[List[Dict[str, Any]]] = None,
    ) -> Tuple[Optional[ChatRenderer], Optional[str]]:
        """``(renderer, None)``, or ``(None, reason)`` when it cannot take the template."""
    has_generation: bool
    def render_batch(
        self,
        *,
        conversations: List[List[Dict[str, Any]]],
        mode: str,
        add_generation_prompt: bool = False,
        threads: Optional[int] = None,
    ) -> Tuple[
        List[Optional[str]],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        List[Optional[str]],
    ]: ...
    def tokenize_jsonl(
        self,
        *,
        encoder: BpeEncoder,
        lines: List[str],
        mode: str,
        messages_key: str,
        system_key: str,
        detect_keys: Optional[List[str]] = None,
        threads: Optional[int] = None,
    ) -> Tuple[_Batch, npt.NDArray[np.bool_]]:
        """JSONL ``messages`` records parsed, rendered and encoded: ``((ids, labels, offsets,
        fallback), last_assistant)``; the lines in ``fallback`` are left to the Python path."""

@final
class Progress:
    """Counters of running file work, polled by the caller; ``cancel()`` stops the work."""

    def __init__(self) -> None: ...
    def snapshot(self) -> Tuple[str, int, int, int]: ...
    def cancel(self) -> None: ...

def pack_files(
    *,
    paths: List[str],
    out_dir: str,
    spill_dir: str,
    tokens_column: str,
    labels_column: Optional[str],
    labels_required: bool,
    loss_mask_column: Optional[str],
    max_len: int,
    strategy: str,
    overlong: str,
    seed: int,
    rows_per_shard: int,
    row_group_rows: int,
    compression: str,
    batch_rows: int,
    pair_layout: Optional[str] = None,
    carry: List[str] = ...,
    threads: Optional[int] = None,
    progress: Optional[Progress] = None,
) -> Dict[str, Any]: ...
def read_lengths(
    *,
    paths: List[str],
    tokens_column: str,
    batch_rows: int,
    pair_layout: Optional[str] = None,
    threads: Optional[int] = None,
    progress: Optional[Progress] = None,
) -> Tuple[npt.NDArray[np.int64], List[int]]: ...
def read_row_group(
    *,
    path: str,
    row_group: int,
    columns: List[str],
    check: Optional[Tuple[int, Tuple[int, int, str], Tuple[int, int, str]]] = None,
) -> Dict[str, Union[npt.NDArray[Any], Tuple[npt.NDArray[Any], npt.NDArray[np.int64]]]]: ...
def file_checksum(path: str) -> Tuple[int, str]: ...
def write_held_shard(
    *,
    out_dir: str,
    shard: int,
    max_len: int,
    bin_offsets: np.ndarray,
    sample_ids: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    ids: np.ndarray,
    offsets: np.ndarray,
    tokens: np.ndarray,
    labels: Optional[np.ndarray],
    row_group_rows: int,
    compression: str,
    carried: List[Tuple[str, Any]] = ...,
) -> Dict[str, Any]: ...

PARTITION_METHODS: Tuple[str, ...]
MICRO_BATCH_ORDERS: Tuple[str, ...]
OVER_CAP_POLICIES: Tuple[str, ...]
ATTENTION_COST: Tuple[float, float]

def partition(
    *,
    costs: npt.NDArray[np.float64],
    k: int,
    equal_size: bool,
    method: str,
    threads: Optional[int],
) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...

@final
class MicroBatchParts:
    """A micro-batch plan's flat arrays (``tokpack.balance.micro_batches`` cuts them)."""

    @property
    def indices(self) -> npt.NDArray[np.int64]: ...
    @property
    def mb_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def rank_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def mb_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def mb_compute(self) -> npt.NDArray[np.float64]: ...

def micro_batches(
    *,
    lengths: npt.NDArray[np.int64],
    max_tokens: int,
    dp_size: int,
    a: float,
    b: float,
    same_count: bool,
    min_micro_batches: int,
    divisible_by: int,
    order: str,
    overlong: str,
) -> MicroBatchParts: ...
def input_columns(
    *,
    paths: List[str],
    tokens_column: str,
    labels_column: Optional[str],
    labels_required: bool,
    loss_mask_column: Optional[str],
    carry: List[str] = ...,
) -> Optional[Tuple[str, bool]]: ...
