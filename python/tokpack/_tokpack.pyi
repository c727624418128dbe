"""Type stubs of the compiled module. The public API is the Python facade in ``tokpack``."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt

from .pack.plan import Plan as _PlanFields

__all__ = [
    "__version__",
    "MAX_THREADS",
    "IGNORE_INDEX",
    "FORMAT",
    "FORMAT_VERSION",
    "SIDE_DIR",
    "MANIFEST_NAME",
    "DROPPED_NAME",
    "REJECTED_NAME",
    "SHARD_COLUMNS",
    "INDEX_COLUMNS",
    "KTO_LABEL",
    "MAX_LEN",
    "MAX_ROWS",
    "SAMPLE_KINDS",
    "MEDIA_COLUMNS",
    "CUT_RULES",
    "ENTRY_POINTS",
    "KINDS",
    "shard_name",
    "index_name",
    "pair_layout_for",
    "OVERLONG_HINT",
    "STRATEGIES",
    "OVERLONG_POLICIES",
    "PAIR_LAYOUTS",
    "ROW_ORDERS",
    "PAIR_SEGMENT_ROLES",
    "SEGMENT_ROLES",
    "SPLIT_REGEXES",
    "PackConfig",
    "PackReport",
    "check_int",
    "plan",
    "safe_pieces",
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
    "file_fingerprint",
    "bytes_checksum",
    "write_held_shard",
    "PARTITION_METHODS",
    "MICRO_BATCH_ORDERS",
    "OVER_CAP_POLICIES",
    "ATTENTION_COST",
    "partition",
    "micro_batches",
    "MicroBatchParts",
    "input_columns",
    "tree_pack",
    "tree_step",
]

__version__: str
MAX_THREADS: int
IGNORE_INDEX: int
FORMAT: str
FORMAT_VERSION: int
SIDE_DIR: str
MANIFEST_NAME: str
DROPPED_NAME: str
REJECTED_NAME: str
SHARD_COLUMNS: Tuple[str, ...]
INDEX_COLUMNS: Tuple[str, ...]
KTO_LABEL: str
MAX_LEN: int
MAX_ROWS: int
SAMPLE_KINDS: Tuple[str, ...]
MEDIA_COLUMNS: Tuple[str, ...]
CUT_RULES: Tuple[str, ...]
ENTRY_POINTS: Tuple[str, ...]
# Per sample kind: "inputs", "outputs", "carried", "entries" (tuples of names) and "cut".
KINDS: Dict[str, Dict[str, Any]]
OVERLONG_HINT: str
STRATEGIES: Tuple[str, ...]
OVERLONG_POLICIES: Tuple[str, ...]
PAIR_LAYOUTS: Tuple[str, ...]
ROW_ORDERS: Tuple[str, ...]
PAIR_SEGMENT_ROLES: Dict[str, Tuple[int, ...]]
SEGMENT_ROLES: Tuple[str, ...]
SPLIT_REGEXES: Dict[str, str]

def shard_name(shard: int) -> str: ...
def index_name(shard: int) -> str: ...
def pair_layout_for(kind: str, pair_layout: Optional[str], inputs: str) -> Optional[str]: ...
def check_int(value: Any, name: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``lo..=hi``, else a ConfigError naming ``name``."""

@final
class PackConfig:
    """The pack options, checked once when made (``PackConfig(max_len, **fields)``); the
    fields, their defaults and choices are in ``FIELDS``."""

    FIELDS: Tuple[Tuple[str, Any, Tuple[str, ...], str], ...]
    def __new__(
        cls,
        max_len: int,
        *,
        strategy: str = "bfd",
        overlong: str = "error",
        seed: int = 0,
        row_order: str = "shuffled",
        max_segments_per_row: Optional[int] = None,
        align_segments: int = 1,
        tokens_column: str = "input_ids",
        labels_column: Optional[str] = "labels",
        loss_mask_column: Optional[str] = None,
        pair_layout: Optional[str] = None,
        tree_group: Optional[str] = None,
        tree_min_shared: int = 1,
        tree_max_path: Optional[int] = None,
        carry: Optional[Sequence[str]] = None,
        rows_per_shard: int = 16384,
        row_group_rows: int = 1024,
        compression: str = "zstd",
    ) -> PackConfig: ...
    max_len: int
    strategy: str
    overlong: str
    seed: int
    row_order: str
    max_segments_per_row: Optional[int]
    align_segments: int
    tokens_column: str
    labels_column: Optional[str]
    loss_mask_column: Optional[str]
    pair_layout: Optional[str]
    tree_group: Optional[str]
    tree_min_shared: int
    tree_max_path: Optional[int]
    carry: Tuple[str, ...]
    rows_per_shard: int
    row_group_rows: int
    compression: str
    def to_dict(self) -> Dict[str, Any]: ...
    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> PackConfig: ...
    def replace(self, **fields: Any) -> PackConfig: ...
    def for_kind(self, kind: str, inputs: str) -> PackConfig: ...
    def __reduce__(self) -> Any: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class PackReport:
    """What a pack job did; ``figures()`` are the manifest's figures. Made from the fields of
    ``tokpack_core::PackReport`` (keywords: counts, sample ids, shards; unknown ones refused)."""

    def __new__(cls, **fields: Any) -> PackReport: ...
    @staticmethod
    def merge(
        parts: Sequence[PackReport], shards: Sequence[Dict[str, Any]], input_rows: Sequence[int]
    ) -> PackReport: ...
    input_rows: List[int]
    input_fingerprints: List[str]
    has_labels: bool
    dropped: npt.NDArray[np.int64]
    no_safe_cut: npt.NDArray[np.int64]
    empty: npt.NDArray[np.int64]
    shards: List[Dict[str, Any]]
    def figures(self) -> Dict[str, Any]: ...
    def __reduce__(self) -> Any: ...

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
    config: PackConfig,
    threads: Optional[int],
) -> PlanParts: ...
def safe_pieces(
    *, length: int, max_len: int, overlong: str, blocks: List[Tuple[int, int]]
) -> List[Tuple[int, int]]: ...
def pack_tokens(
    *,
    input_ids: Any,
    labels: Any,
    config: PackConfig,
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
    config: PackConfig,
    batch_rows: int,
    threads: Optional[int] = None,
    progress: Optional[Progress] = None,
    kind: str = "sft",
) -> PackReport: ...
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
def file_fingerprint(path: str) -> Tuple[int, str]: ...
def bytes_checksum(data: bytes) -> str: ...
def write_held_shard(
    *,
    out_dir: str,
    shard: int,
    config: PackConfig,
    bin_offsets: np.ndarray,
    sample_ids: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    ids: np.ndarray,
    offsets: np.ndarray,
    tokens: np.ndarray,
    labels: Optional[np.ndarray],
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
def tree_pack(
    *,
    tokens: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    trained: Optional[npt.NDArray[np.bool_]],
    groups: Optional[npt.NDArray[np.int64]],
    max_tokens: int,
    min_shared: int,
    pad_to_multiple_of: int,
    pad_token_id: int,
    threads: Optional[int],
) -> Dict[str, Any]: ...
def tree_step(
    *,
    prompt_tokens: npt.NDArray[np.int64],
    prompt_starts: npt.NDArray[np.int64],
    prompt_lengths: npt.NDArray[np.int64],
    prompt_of: npt.NDArray[np.int64],
    tokens: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    trained: Optional[npt.NDArray[np.bool_]],
    max_tokens: int,
    min_shared: int,
    dp_size: int,
    rank: int,
    a: float,
    b: float,
    same_count: bool,
    min_micro_batches: int,
    divisible_by: int,
    order: str,
    pad_to_multiple_of: int,
    pad_token_id: int,
    threads: Optional[int],
) -> Dict[str, Any]: ...
def input_columns(*, paths: List[str], config: PackConfig) -> Optional[Tuple[str, bool]]: ...
