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
    CorruptInputError,
    CorruptOutputError,
    DataError,
    InputNotFoundError,
    InvalidRecordError,
    OutputError,
    OverlongError,
    SchemaError,
    TokpackError,
)
from .files import pack_files
from .packing import pack_tokens
from .planning import Plan, plan
from .streaming import streaming_dataset_reader
from .tokenize import tokenize_files, tokenize_to_batches
from .verify import verify  # the function (``from tokpack.verify import ...`` still works)

# The PyTorch side is imported on first use, so `import tokpack` works without torch.
_TORCH_EXPORTS = ("PackedDataset", "PackedIterableDataset", "PackedCollator", "DeviceLoader")


def __getattr__(name: str):
    if name in _TORCH_EXPORTS or name == "torch":
        import importlib

        module = importlib.import_module(".torch", __name__)
        return module if name == "torch" else getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    "Plan",
    "plan",
    "pack_tokens",
    "pack_files",
    "pack_sequences",
    "concatenate_and_pack",
    "streaming_dataset_reader",
    "tokenize_files",
    "tokenize_to_batches",
    "verify",
    "TokpackError",
    "ConfigError",
    "DataError",
    "OverlongError",
    "InputNotFoundError",
    "CorruptOutputError",
    "CorruptInputError",
    "SchemaError",
    "OutputError",
    "InvalidRecordError",
]
