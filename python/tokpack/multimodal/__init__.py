"""Multimodal packing (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): image and video chats tokenized with
their vision tokens expanded from the image headers, packed with their media carried per
segment, and collated with per-segment mRoPE positions, the images' ``pixel_values`` and the
videos' ``pixel_values_videos``.

``tokpack.multimodal`` imports neither torch nor transformers; the collator is
``tokpack.torch.MultimodalCollator`` (the torch side, which stands above this package).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "VisionRules": "vision",
    "smart_resize": "vision",
    "image_size": "vision",
    "MultimodalEncoder": "tokenize",
    "tokenize_files": "tokenize",
    "pack_files": ".pack.files",  # tokpack.pack_files: it carries the media of multimodal shards
    "sample_positions": "positions",
    "packed_positions": "positions",
    "row_vision_patches": "stats",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
