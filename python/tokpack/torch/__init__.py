"""PyTorch side of tokpack: datasets over packed directories, collators, attention masks and
device delivery. Needs the ``torch`` extra (``pip install tokpack[torch]``).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch installed
    raise ImportError("tokpack.torch needs PyTorch: pip install 'tokpack[torch]'") from exc

from .attention import document_ids, flex_block_mask, layer_type_masks, sdpa_block_causal_mask
from .batch_sampler import PackedBatchSampler
from .check import PackingReport, check_packing
from .collate import FORMATS, IGNORE_INDEX, PackedCollator
from .dataset import PackedDataset
from .device import DeviceLoader
from .iterable import PackedIterableDataset
from .mixture import PackedMixture
from .models import ModelPacking, model_inputs, packing_support
from .multimodal import MultimodalCollator
from .pairs import sequence_logps

__all__ = [
    "PackedDataset",
    "PackedIterableDataset",
    "PackedMixture",
    "PackedBatchSampler",
    "PackedCollator",
    "MultimodalCollator",
    "DeviceLoader",
    "FORMATS",
    "IGNORE_INDEX",
    "ModelPacking",
    "packing_support",
    "model_inputs",
    "document_ids",
    "sdpa_block_causal_mask",
    "flex_block_mask",
    "layer_type_masks",
    "sequence_logps",
    "check_packing",
    "PackingReport",
]
