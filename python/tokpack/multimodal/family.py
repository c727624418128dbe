"""The model families tokpack's multimodal layer knows, and the one place their rules differ.

=============  ===========================================================================
``qwen2-vl``   Qwen2-VL: patch 14, merge 2, pixels in ``[56*56, 28*28*1280]``; a video's
               frames each resized as an image (``Qwen2VLVideoProcessor``), its temporal
               patches at time positions 0, 1, 2, ...
``qwen2.5-vl`` Qwen2.5-VL: Qwen2-VL's rules (same processors, same placeholders), but a
               video's temporal patches ``tokens_per_second * second_per_grid_t`` apart.
``qwen3-vl``   Qwen3-VL: transformers' ``Qwen2VLImageProcessor`` with patch 16, merge 2,
               pixels in ``[65536, 16777216]`` (its ``preprocessor_config.json``); the same
               chat placeholder ``<|vision_start|><|image_pad|><|vision_end|>`` and, for a
               still image, the same mRoPE positions (``Qwen3VLModel.get_rope_index``: the
               image's ``h, w`` grid from where it starts, the text after it resuming at
               ``start + max(h, w) / merge``). A video's pixel bounds hold for the whole clip
               (``Qwen3VLVideoProcessor``), and each temporal patch is a block
               ``<t seconds><|vision_start|>pads<|vision_end|>`` placed like a still image.
=============  ===========================================================================

The family is read from the model's ``preprocessor_config.json`` (its ``processor_class``) or
given by name; a config naming no known processor is ``qwen2-vl`` (the defaults before
families existed). The processor config's own values always win over the family defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from .._checks import check_choice

__all__ = ["Family", "FAMILIES", "family", "detect_family"]


@dataclass(frozen=True)
class Family:
    """One model family: its name and the image processor defaults the model ships with."""

    name: str
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    # The video processor's pixel bounds (per frame) when its config gives none.
    video_min_pixels: int
    video_max_pixels: int
    # How a video's temporal patches are placed: "index" (Qwen2-VL: 0, 1, 2, ... on the mRoPE
    # time axis), "seconds" (Qwen2.5-VL: ``tokens_per_second * second_per_grid_t`` apart),
    # "timestamps" (Qwen3-VL: each temporal patch its own block of pads after a
    # ``<t seconds>`` text, at time position 0 like a still image).
    video_time: str

    def rule_defaults(self, video: bool = False) -> Dict[str, int]:
        """The :class:`VisionRules` fields a processor config leaves out (``video``: the video
        processor's)."""
        return {
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
            "min_pixels": self.video_min_pixels if video else self.min_pixels,
            "max_pixels": self.video_max_pixels if video else self.max_pixels,
        }


FAMILIES: Dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "qwen2-vl", 14, 2, 2, 56 * 56, 28 * 28 * 1280, 128 * 28 * 28, 28 * 28 * 768, "index"
        ),
        Family(
            "qwen2.5-vl", 14, 2, 2, 56 * 56, 28 * 28 * 1280, 128 * 28 * 28, 28 * 28 * 768, "seconds"
        ),
        Family("qwen3-vl", 16, 2, 2, 65536, 16777216, 128 * 32 * 32, 32 * 32 * 768, "timestamps"),
    )
}

# transformers' processor classes (``processor_class`` of preprocessor_config.json) and model
# types, to the family.
_BY_CLASS = {
    "qwen2vlprocessor": "qwen2-vl",
    "qwen2_vl": "qwen2-vl",
    "qwen2_5_vlprocessor": "qwen2.5-vl",
    "qwen2_5_vl": "qwen2.5-vl",
    "qwen3vlprocessor": "qwen3-vl",
    "qwen3_vl": "qwen3-vl",
    "qwen3_vl_moe": "qwen3-vl",
}


def family(name: str) -> Family:
    """The family of that name (``ConfigError`` listing the names otherwise)."""
    key = str(name).lower().replace("_", "-").replace("qwen2-5", "qwen2.5")
    if key not in FAMILIES:
        check_choice("multimodal family", name, FAMILIES)
    return FAMILIES[key]


def detect_family(config: Mapping[str, Any], name: Optional[str] = None) -> Family:
    """``name`` when given (other than ``"auto"``), else the family a ``preprocessor_config.json``
    dict names (``processor_class`` or ``model_type``), else ``qwen2-vl``."""
    if name is not None and name != "auto":
        return family(name)
    for key in ("processor_class", "model_type"):
        value = config.get(key)
        if isinstance(value, str) and value.lower() in _BY_CLASS:
            return FAMILIES[_BY_CLASS[value.lower()]]
    return FAMILIES["qwen2-vl"]
