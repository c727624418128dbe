"""tokpack: fast, deterministic sequence packing for LLM fine-tuning.

>>> import tokpack
>>> tokpack.plan([700, 300, 500, 500], max_len=1000).n_bins
2
"""

from __future__ import annotations

import importlib

from ._tokpack import __version__
from .errors import (
    ConfigError,
    CorruptInputError,
    CorruptOutputError,
    DataError,
    InputNotFoundError,
    InputPermissionError,
    InvalidRecordError,
    OutputError,
    OutputExistsError,
    OverlongError,
    SchemaError,
    TokpackError,
)

# The rest is imported on first use: `import tokpack` stays light (no numpy, pyarrow or torch
# yet), so the `tokpack` command is inside cli.main, where Ctrl-C is handled, within
# milliseconds of starting.
_LAZY = {
    "concatenate_and_pack": "compat",
    "export_megatron": "export",
    "export_nemo_packed": "export",
    "mixture_stats": "mixture",
    "pack_sequences": "compat",
    "pack_files": "files",
    "pack_tokens": "packing",
    "Plan": "planning",
    "plan": "planning",
    "packing_stats": "stats",
    "streaming_dataset_reader": "streaming",
    "tokenize_files": "tokenize",
    "tokenize_to_batches": "tokenize",
    "TokenizeOptions": "tokenize",
    "verify": "integrity",
    "PackedDataset": "torch",
    "PackedIterableDataset": "torch",
    "PackedMixture": "torch",
    "PackedBatchSampler": "torch",
    "PackedCollator": "torch",
    "DeviceLoader": "torch",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
    # A submodule not imported yet (tokpack.torch, tokpack.tokenize, ...).
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "__version__",
    "Plan",
    "plan",
    "packing_stats",
    "pack_tokens",
    "pack_files",
    "pack_sequences",
    "concatenate_and_pack",
    "streaming_dataset_reader",
    "tokenize_files",
    "tokenize_to_batches",
    "TokenizeOptions",
    "export_megatron",
    "export_nemo_packed",
    "mixture_stats",
    "verify",
    "TokpackError",
    "ConfigError",
    "DataError",
    "OverlongError",
    "InputNotFoundError",
    "InputPermissionError",
    "CorruptOutputError",
    "CorruptInputError",
    "SchemaError",
    "OutputError",
    "OutputExistsError",
    "InvalidRecordError",
]
