"""Vision-token counts without decoding pixels: an image's size from its header, then the
Qwen2-VL / Qwen2.5-VL resize rule (``smart_resize``) to the patch grid ``(t, h, w)`` the model's
image processor produces and the number of ``<|image_pad|>`` tokens the language model sees.

The rule is transformers' ``Qwen2VLImageProcessor`` (shared by Qwen2.5-VL and Qwen3-VL, whose
settings differ: :mod:`tokpack.multimodal.family`): both sides of the
image are rounded to a multiple of ``patch_size * merge_size``, then scaled down (or up) so the
pixel count lies in ``[min_pixels, max_pixels]``; a still image is one temporal patch
(``t = 1``, the frame repeated ``temporal_patch_size`` times inside the patch), and every
``merge_size x merge_size`` patches become one token.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Dict, Mapping, Optional, Tuple, Union

from ..errors import ConfigError, DataError, InputNotFoundError

__all__ = [
    "VisionRules",
    "smart_resize",
    "image_size",
    "read_preprocessor_config",
    "MAX_ASPECT_RATIO",
]

# transformers refuses images whose long side exceeds 200 times the short one.
MAX_ASPECT_RATIO = 200
# EXIF orientations that swap width and height (rotated by 90 or 270 degrees).
_TRANSPOSED = frozenset({5, 6, 7, 8})
_EXIF_ORIENTATION = 0x0112


def smart_resize(
    height: int,
    width: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
    frames: Optional[int] = None,
    temporal_factor: int = 1,
) -> Tuple[int, int]:
    """``(height, width)`` after the Qwen2-VL resize: multiples of ``factor``, pixel count in
    ``[min_pixels, max_pixels]``, aspect ratio kept as closely as possible (transformers'
    ``smart_resize``, including Python's round-half-to-even). With ``frames``, of a video's
    frames after Qwen3-VL's video resize (transformers'
    ``qwen3_vl.video_processing_qwen3_vl.smart_resize``): sides under ``factor`` scaled up
    first, then the pixel bounds applied to the whole clip (``frames`` rounded to a multiple
    of ``temporal_factor`` times the frame's pixels)."""
    what = "image" if frames is None else "video frames"
    if frames is not None and frames < temporal_factor:
        raise DataError(
            f"a video of {frames} frame(s): Qwen3-VL's video processor needs at least"
            f" {temporal_factor} (temporal_patch_size)"
        )
    if height < 1 or width < 1:
        raise DataError(f"{what} of {width}x{height} pixels: no area")
    if frames is not None and (height < factor or width < factor):
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise DataError(
            f"{what} of {width}x{height} pixels: the aspect ratio must be smaller than"
            f" {MAX_ASPECT_RATIO} (got {max(height, width) / min(height, width):.1f})"
        )
    clip = 1 if frames is None else frames
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = 1 if frames is None else round(frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((clip * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (clip * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class VisionRules:
    """The image processor settings that decide an image's patch grid (Qwen2-VL defaults).

    Build it from a model directory's ``preprocessor_config.json`` (:meth:`from_pretrained`),
    from that file's dict (:meth:`from_dict`), or from an image processor object
    (:meth:`from_processor`).
    """

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"vision rule {name} must be a positive int, got {value!r}")
        if self.min_pixels > self.max_pixels:
            raise ConfigError(
                f"min_pixels ({self.min_pixels}) is larger than max_pixels ({self.max_pixels})"
            )

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this (``patch_size * merge_size``)."""
        return self.patch_size * self.merge_size

    def video_grid(
        self, frames: int, width: int, height: int, clip_pixels: bool = False
    ) -> Tuple[int, int, int]:
        """The patch grid ``(t, h, w)`` of a video of ``frames`` frames of ``width x height``
        pixels, as the video processor's ``video_grid_thw`` for a frame list (every frame kept;
        the last one repeated up to a multiple of ``temporal_patch_size``). The pixel bounds
        hold per frame (Qwen2-VL's ``Qwen2VLVideoProcessor``), or with ``clip_pixels`` for
        the whole clip, frames counted (Qwen3-VL's ``Qwen3VLVideoProcessor``, which also
        needs ``temporal_patch_size`` frames at least)."""
        if frames < 1:
            raise DataError("a video needs at least one frame")
        h, w = smart_resize(
            height,
            width,
            self.factor,
            self.min_pixels,
            self.max_pixels,
            frames if clip_pixels else None,
            self.temporal_patch_size,
        )
        t = -(-frames // self.temporal_patch_size)
        return t, h // self.patch_size, w // self.patch_size

    def grid(self, width: int, height: int) -> Tuple[int, int, int]:
        """The patch grid ``(t, h, w)`` of a still image of ``width x height`` pixels, as the
        image processor's ``image_grid_thw``."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return 1, h // self.patch_size, w // self.patch_size

    def tokens(self, grid: Tuple[int, int, int]) -> int:
        """Vision tokens the language model sees for a grid (``t * h * w / merge_size**2``)."""
        t, h, w = grid
        return t * h * w // (self.merge_size * self.merge_size)

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(
        cls, config: Mapping[str, Any], family: Optional[str] = None, video: bool = False
    ) -> "VisionRules":
        """From a ``preprocessor_config.json`` dict: ``patch_size``, ``merge_size``,
        ``temporal_patch_size`` and the pixel bounds, given as ``min_pixels`` / ``max_pixels``
        or as ``size = {"shortest_edge", "longest_edge"}`` (the explicit keys win, as in
        transformers). Keys it leaves out take the family's defaults (``family``, or the one
        the dict names: :func:`tokpack.multimodal.family.detect_family`; ``video``: the
        family's video processor defaults)."""
        from .family import detect_family

        defaults = detect_family(config, family).rule_defaults(video)
        size = config.get("size") or {}
        if not isinstance(size, Mapping):
            raise ConfigError(f"preprocessor config 'size' must be a mapping, got {size!r}")
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            defaults[key] = size.get(edge, defaults[key])
        return cls(**{key: config.get(key, default) for key, default in defaults.items()})

    @classmethod
    def from_pretrained(
        cls, path: Union[str, os.PathLike], family: Optional[str] = None
    ) -> "VisionRules":
        """From ``path/preprocessor_config.json`` (or that file given directly)."""
        return cls.from_dict(read_preprocessor_config(path), family)

    @classmethod
    def from_processor(cls, processor: Any) -> "VisionRules":
        """From a transformers image processor (or a processor holding one)."""
        image_processor = getattr(processor, "image_processor", processor)
        size = getattr(image_processor, "size", None) or {}
        get = size.get if hasattr(size, "get") else lambda k, d=None: getattr(size, k, d)
        return cls.from_dict(
            {
                "patch_size": image_processor.patch_size,
                "merge_size": image_processor.merge_size,
                "temporal_patch_size": image_processor.temporal_patch_size,
                "size": {edge: get(edge) for edge in ("shortest_edge", "longest_edge")},
            }
        )


def read_preprocessor_config(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The dict of ``path/preprocessor_config.json`` (or of that file given directly)."""
    from ..tokenize.tokenizer import read_json_object

    file = Path(path)
    return read_json_object(file / "preprocessor_config.json" if file.is_dir() else file)


def _orientation(im: Any) -> Any:
    """The EXIF orientation read from the header. PNG's ``getexif`` would decode the pixels
    to look for an eXIf chunk after the image data: only one before it (where the PNG
    specification puts it) is read."""
    from PIL import Image

    try:
        if im.format == "PNG":
            raw = im.info.get("exif")
            if raw is None:
                return None
            exif = Image.Exif()
            exif.load(raw)
            return exif.get(_EXIF_ORIENTATION)
        return im.getexif().get(_EXIF_ORIENTATION)
    except Exception:  # a damaged EXIF block: PIL's exif_transpose ignores it too
        return None


def image_size(source: Union[str, os.PathLike, BinaryIO], name: str = "") -> Tuple[int, int]:
    """``(width, height)`` of an image as the model sees it, from its header only (PIL opens
    lazily and reads pixels only on ``load()``): PNG, JPEG, WebP, GIF and every format PIL
    knows. An EXIF orientation that rotates by 90 or 270 degrees swaps the sides, as
    transformers' ``load_image`` applies it. ``name`` names the image in errors (default: the
    path)."""
    from PIL import Image, UnidentifiedImageError

    shown = name or str(source)
    try:
        with Image.open(source) as im:
            width, height = im.size
            orientation = _orientation(im)
    except FileNotFoundError:
        raise InputNotFoundError(f"{shown}: no such image file") from None
    except UnidentifiedImageError:
        raise DataError(f"{shown}: not an image PIL can read") from None
    except OSError as exc:
        raise DataError(f"{shown}: cannot read the image header ({exc})") from None
    if orientation in _TRANSPOSED:
        width, height = height, width
    return width, height
