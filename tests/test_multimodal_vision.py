"""Vision-token counts from image headers against transformers' Qwen2-VL image processor."""

from __future__ import annotations

import io
import random

import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

from PIL import Image, ImageFile  # noqa: E402

from tests._vl_factory import PREPROCESSOR, image_processor, write_image  # noqa: E402
from tokpack import ConfigError, DataError, InputNotFoundError  # noqa: E402
from tokpack.multimodal import VisionRules, image_size, smart_resize  # noqa: E402
from tokpack.multimodal.family import detect_family, family  # noqa: E402
from tokpack.multimodal.vision import MAX_ASPECT_RATIO  # noqa: E402

# Qwen3-VL's published preprocessor_config.json (transformers' Qwen2VLImageProcessor, patch 16).
QWEN3_VL = {
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}

CONFIGS = [
    {},  # the processor's defaults
    PREPROCESSOR,
    {"min_pixels": 1000, "max_pixels": 200_000, "patch_size": 16, "merge_size": 2},
    {"size": {"shortest_edge": 3136, "longest_edge": 50_000}, "merge_size": 1},
    QWEN3_VL,
]


def _sizes(n: int, seed: int):
    rng = random.Random(seed)
    sizes = [(1, 1), (1, 199), (199, 1), (28, 28), (27, 29), (14, 42), (3000, 2000), (56, 56)]
    for _ in range(n):
        w = rng.choice([rng.randint(1, 64), rng.randint(20, 900), rng.randint(500, 4000)])
        h = max(1, min(int(w * rng.uniform(0.02, 50)), 5000))
        if max(w, h) / min(w, h) <= MAX_ASPECT_RATIO:
            sizes.append((w, h))
    return sizes


@pytest.mark.parametrize("config", CONFIGS)
def test_grid_equals_the_image_processor(config):
    processor = image_processor(config)
    rules = VisionRules.from_dict(config)
    assert rules == VisionRules.from_processor(processor)
    merge = rules.merge_size
    for width, height in _sizes(150, seed=len(config)):
        grid = rules.grid(width, height)
        expected = processor.get_number_of_image_patches(height, width)
        assert grid[0] * grid[1] * grid[2] == expected, (width, height)
        assert rules.tokens(grid) == expected // (merge * merge)


def test_grid_equals_processed_pixels():
    """The full processor run (resize + patchify) on real images: image_grid_thw and the
    number of patch rows."""
    processor = image_processor()
    rules = VisionRules.from_dict(PREPROCESSOR)
    sizes = _sizes(40, seed=7)[:40]
    images = [Image.new("RGB", (w, h)) for w, h in sizes if max(w, h) <= 1200]
    out = processor(images=images, return_tensors="np")
    grids = [rules.grid(*im.size) for im in images]
    assert out["image_grid_thw"].tolist() == [list(g) for g in grids]
    assert out["pixel_values"].shape[0] == sum(t * h * w for t, h, w in grids)


@pytest.mark.parametrize("suffix", ["png", "jpg", "webp", "gif", "bmp"])
def test_image_size_from_the_header_only(tmp_path, monkeypatch, suffix):
    path = write_image(tmp_path / f"a.{suffix}", (123, 45), seed=1)

    def no_decoding(self, *args, **kwargs):
        raise AssertionError("pixels decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    assert image_size(path) == (123, 45)
    assert image_size(io.BytesIO(path.read_bytes())) == (123, 45)


def test_exif_rotation_swaps_the_sides(tmp_path):
    """A JPEG rotated by its EXIF orientation: the size transformers' load_image sees."""
    from transformers.image_utils import load_image

    im = Image.new("RGB", (40, 100))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90
    path = tmp_path / "rot.jpg"
    im.save(path, exif=exif)
    assert image_size(path) == load_image(str(path)).size == (100, 40)


def test_smart_resize_rounds_half_to_even():
    # 42 / 28 = 1.5 -> 2 (round half to even), 70 / 28 = 2.5 -> 2, as transformers' rule.
    assert smart_resize(42, 70, 28, 1, 10**9) == (56, 56)


def test_errors(tmp_path):
    with pytest.raises(DataError, match="aspect ratio"):
        VisionRules().grid(1, 201)
    with pytest.raises(InputNotFoundError, match="missing.png"):
        image_size(tmp_path / "missing.png")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataError, match="bad.png"):
        image_size(bad)
    with pytest.raises(ConfigError, match="min_pixels"):
        VisionRules(min_pixels=10, max_pixels=5)
    with pytest.raises(ConfigError, match="patch_size"):
        VisionRules(patch_size=0)
    (tmp_path / "preprocessor_config.json").write_text('{"merge_size": 1, "max_pixels": 9999}')
    assert VisionRules.from_pretrained(tmp_path) == VisionRules(merge_size=1, max_pixels=9999)


def test_families():
    qwen3 = VisionRules.from_dict({"processor_class": "Qwen3VLProcessor"})
    assert qwen3 == VisionRules.from_dict(QWEN3_VL) == VisionRules.from_dict({}, "qwen3-vl")
    assert qwen3 == VisionRules.from_processor(image_processor(QWEN3_VL))
    assert qwen3.factor == 32 and VisionRules.from_dict({}) == VisionRules()
    assert VisionRules.from_dict({"model_type": "qwen2_5_vl"}) == VisionRules()
    # the config's own values win over the family's defaults
    assert VisionRules.from_dict({"patch_size": 14}, "qwen3-vl").patch_size == 14
    assert detect_family({"processor_class": "Qwen2_5_VLProcessor"}).name == "qwen2.5-vl"
    assert detect_family({"processor_class": "Qwen3VLProcessor"}, "qwen2-vl").name == "qwen2-vl"
    assert detect_family({"processor_class": "Other"}).name == "qwen2-vl"
    assert family("Qwen2_5-VL").name == "qwen2.5-vl"
    with pytest.raises(ConfigError, match='unknown multimodal family "llava"'):
        family("llava")
