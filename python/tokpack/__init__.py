"""tokpack: fast, deterministic sequence packing for LLM fine-tuning.

>>> import tokpack
>>> tokpack.plan([700, 300, 500, 500], max_len=1000).n_bins
2
"""

from __future__ import annotations

import importlib

from . import errors
from ._tokpack import __version__
from .errors import *  # noqa: F403 (the exception classes, listed in errors.__all__)

# The rest is imported on first use: `import tokpack` stays light (no numpy, pyarrow or torch
# yet), so the `tokpack` command is inside cli.main, where Ctrl-C is handled, within
# milliseconds of starting.
_LAZY = {
    "concatenate_and_pack": "compat",
    "export_megatron": "packed.export",
    "export_nemo_packed": "packed.export",
    "mixture_stats": "packed.mixture",
    "pack_sequences": "compat",
    "pack_files": "pack.files",
    "PackConfig": "pack.config",
    "PackReport": "pack.config",
    "pack_tokens": "pack.tokens",
    "Plan": "pack.plan",
    "plan": "pack.plan",
    "packing_stats": "stats",
    "streaming_dataset_reader": "compat",
    "tokenize_files": "tokenize",
    "tokenize_to_batches": "tokenize",
    "TokenizeOptions": "tokenize",
    "verify": "packed.integrity",
    "shuffle_quality": "packed.shuffle_quality",
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


# Reachable here (the guide shows ``tokpack.pack_sequences``) but not part of the listed surface:
# the token-packing guide's drop-ins (``tokpack.compat``) and ``tokpack.packed.shuffle_quality``.
_UNLISTED = {
    "concatenate_and_pack",
    "pack_sequences",
    "streaming_dataset_reader",
    "shuffle_quality",
}

# The lazy names but torch's (``from tokpack import *`` must not import torch) and the unlisted,
# and the errors.
__all__ = [
    "__version__",
    *(name for name, module in _LAZY.items() if module != "torch" and name not in _UNLISTED),
]
__all__ += errors.__all__
