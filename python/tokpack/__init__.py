"""tokpack: fast, deterministic sequence packing for LLM fine-tuning.

>>> import tokpack
>>> tokpack.plan([700, 300, 500, 500], max_len=1000).n_bins
2
"""

from __future__ import annotations

from ._tokpack import __version__
from .compat import concatenate_and_pack, pack_sequences
from .errors import (
    ConfigError,
    CorruptOutputError,
    DataError,
    InputNotFoundError,
    InvalidRecordError,
    OverlongError,
    TokpackError,
)
from .packing import pack_tokens
from .planning import Plan, plan
from .tokenize import tokenize_files, tokenize_to_batches

__all__ = [
    "__version__",
    "Plan",
    "plan",
    "pack_tokens",
    "pack_sequences",
    "concatenate_and_pack",
    "tokenize_files",
    "tokenize_to_batches",
    "TokpackError",
    "ConfigError",
    "DataError",
    "OverlongError",
    "InputNotFoundError",
    "CorruptOutputError",
    "InvalidRecordError",
]
