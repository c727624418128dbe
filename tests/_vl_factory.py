"""Tiny Qwen2-VL-style pieces built from configs (no network): a BPE tokenizer with the
vision special tokens, the Qwen2-VL chat template (with generation markers on assistant
turns), transformers' processor over them, synthetic images and image chats."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict, List, Tuple

from tests._tokenizer_factory import build_tokenizer, hf_tokenizer, sentence

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# Qwen2-VL's chat template, with {% generation %} around assistant turns so transformers'
# return_assistant_tokens_mask gives the labels to compare with.
QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>{% endgeneration %}\n"
    "{% else %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL's chat template (no default system prompt), with generation markers likewise.
QWEN3_VL_TEMPLATE = QWEN2_VL_TEMPLATE.replace(
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}",
    "",
)

# Small pixel bounds keep images (and the tiny model's vision tower) cheap.
PREPROCESSOR = {
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "min_pixels": 28 * 28 * 4,
    "max_pixels": 28 * 28 * 24,
}

# Qwen3-VL's processor keys (patch 16, pixel bounds as ``size``), bounds as small.
QWEN3_PREPROCESSOR = {
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 24},
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}


def build_vl_tokenizer(directory: Path, family: str = "qwen2-vl") -> Path:
    """tokenizer.json + tokenizer_config.json (the family's template) +
    preprocessor_config.json (``family``: ``qwen2-vl`` or ``qwen3-vl``)."""
    from tokenizers import AddedToken, Tokenizer

    qwen3 = family == "qwen3-vl"
    build_tokenizer(directory, chat_template=QWEN3_VL_TEMPLATE if qwen3 else QWEN2_VL_TEMPLATE)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok.save(str(directory / "tokenizer.json"))
    config = QWEN3_PREPROCESSOR if qwen3 else PREPROCESSOR
    (directory / "preprocessor_config.json").write_text(json.dumps(config))
    return directory


def image_processor(config: Dict[str, Any] = PREPROCESSOR):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    config = {k: v for k, v in config.items() if not k.endswith(("_class", "_type"))}
    return Qwen2VLImageProcessorPil(**config)


def video_processor(config: Dict[str, Any] = PREPROCESSOR):
    """transformers' Qwen2VLVideoProcessor (Qwen3VLVideoProcessor for the Qwen3-VL config;
    both need torchvision) with ``config``'s settings, as transformers builds it from a model
    whose only processor config is preprocessor_config.json, frame sampling off (frame
    lists)."""
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    cls = Qwen3VLVideoProcessor if config.get("patch_size") == 16 else Qwen2VLVideoProcessor
    config = {k: v for k, v in config.items() if not k.endswith(("_class", "_type"))}
    return cls(**config, cap_pixels_per_frame=False, do_sample_frames=False)


# What a Qwen-VL forward takes from a MultimodalCollator batch (those present).
MODEL_INPUTS = (
    "input_ids",
    "position_ids",
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
)


def model_inputs(batch) -> dict:
    """The batch's fields a Qwen-VL forward takes."""
    return {k: batch[k] for k in MODEL_INPUTS if k in batch}


def packed_logits(model, batch):
    """The model's logits for a packed batch, with its mRoPE positions and with plain ones
    (the text row repeated: the common bug, which must give other losses)."""
    import torch

    kwargs = model_inputs(batch)
    with torch.no_grad():
        logits = model(**kwargs, use_cache=False).logits[0]
        flat = batch["position_ids"].clone()
        flat[1:] = flat[0]
        plain = model(**{**kwargs, "position_ids": flat}, use_cache=False).logits[0]
    return logits, plain


def video_processor_pipeline(directory: Path, family: str = "qwen2-vl"):
    """transformers' Qwen2VLProcessor (``family="qwen2.5-vl"``: Qwen2_5_VLProcessor,
    ``"qwen3-vl"``: Qwen3VLProcessor) with its image and video processors (the video one needs
    torchvision)."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor

    tok = hf_tokenizer(directory)
    if family == "qwen3-vl":
        return Qwen3VLProcessor(
            image_processor=image_processor(QWEN3_PREPROCESSOR),
            tokenizer=tok,
            video_processor=video_processor(QWEN3_PREPROCESSOR),
            chat_template=QWEN3_VL_TEMPLATE,
        )
    cls = Qwen2_5_VLProcessor if family == "qwen2.5-vl" else Qwen2VLProcessor
    return cls(
        image_processor=image_processor(),
        tokenizer=tok,
        video_processor=video_processor(),
        chat_template=QWEN2_VL_TEMPLATE,
    )


def processor(directory: Path, family: str = "qwen2-vl"):
    """transformers' Qwen2VLProcessor (``family="qwen3-vl"``: Qwen3VLProcessor) without its
    video processor (which needs torchvision, not installed here); images and text go through
    the processor's own code."""
    from transformers import Qwen2VLProcessor, Qwen3VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):
            Qwen3VLProcessor.__init__(
                self, image_processor, tokenizer, None, chat_template=chat_template
            )

    tok = hf_tokenizer(directory)
    if family == "qwen3-vl":
        return ImageOnlyQwen3VLProcessor(
            image_processor=image_processor(QWEN3_PREPROCESSOR),
            tokenizer=tok,
            chat_template=QWEN3_VL_TEMPLATE,
        )
    return ImageOnlyQwen2VLProcessor(
        image_processor=image_processor(), tokenizer=tok, chat_template=QWEN2_VL_TEMPLATE
    )


def tiny_qwen2_5_vl(directory: Path, family: str = "qwen2_5_vl"):
    """A randomly initialised two-layer Qwen2.5-VL (``family="qwen2_vl"``: Qwen2-VL), vision
    tower included, in float64; its vocabulary and vision token ids are those of the tokenizer
    in ``directory``."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    vision = {
        "depth": 2,
        "num_heads": 2,
        "patch_size": PREPROCESSOR["patch_size"],
        "spatial_merge_size": PREPROCESSOR["merge_size"],
        "temporal_patch_size": PREPROCESSOR["temporal_patch_size"],
    }
    if family == "qwen2_5_vl":
        config_class = transformers.Qwen2_5_VLConfig
        model_class = transformers.Qwen2_5_VLForConditionalGeneration
        vision.update(
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            window_size=56,
            fullatt_block_indexes=[1],
            tokens_per_second=2,  # as Qwen2.5-VL's checkpoints (transformers' default: 4)
        )
    else:
        config_class = transformers.Qwen2VLConfig
        model_class = transformers.Qwen2VLForConditionalGeneration
        vision.update(embed_dim=32, mlp_ratio=2, hidden_size=64)
    config = config_class(
        text_config={
            "vocab_size": tok.get_vocab_size(),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
            },
            "use_cache": False,
        },
        vision_config=vision,
        image_token_id=tok.token_to_id("<|image_pad|>"),
        video_token_id=tok.token_to_id("<|video_pad|>"),
        vision_start_token_id=tok.token_to_id("<|vision_start|>"),
        vision_end_token_id=tok.token_to_id("<|vision_end|>"),
        attn_implementation="sdpa",
    )
    return model_class(config).to(torch.float64).eval()


def tiny_qwen3_vl(directory: Path):
    """A randomly initialised two-layer Qwen3-VL (vision tower with a DeepStack merger
    included, interleaved mRoPE) in float64; vocabulary and vision token ids from the
    tokenizer in ``directory``."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.Qwen3VLConfig(
        text_config={
            "vocab_size": tok.get_vocab_size(),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 2048,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
            "use_cache": False,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "patch_size": QWEN3_PREPROCESSOR["patch_size"],
            "spatial_merge_size": QWEN3_PREPROCESSOR["merge_size"],
            "temporal_patch_size": QWEN3_PREPROCESSOR["temporal_patch_size"],
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=tok.token_to_id("<|image_pad|>"),
        video_token_id=tok.token_to_id("<|video_pad|>"),
        vision_start_token_id=tok.token_to_id("<|vision_start|>"),
        vision_end_token_id=tok.token_to_id("<|vision_end|>"),
        attn_implementation="sdpa",
    )
    return transformers.Qwen3VLForConditionalGeneration(config).to(torch.float64).eval()


def write_image(path: Path, size: Tuple[int, int], seed: int) -> Path:
    """A deterministic noise image of ``size`` (width, height); format from the suffix."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def image_chats(
    n: int, image_dir: Path, seed: int = 0, max_images: int = 3
) -> List[Dict[str, Any]]:
    """Records with ``messages`` (image parts in user turns) and ``images`` (relative paths)."""
    rng = random.Random(seed)
    image_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(n):
        messages: List[Dict[str, Any]] = []
        images: List[str] = []
        for turn in range(rng.randint(1, 2)):
            content: List[Dict[str, Any]] = []
            for k in range(rng.randint(0 if turn else 1, max_images)):
                name = f"img-{i}-{turn}-{k}.{rng.choice(['png', 'jpg', 'webp'])}"
                size = (rng.randint(20, 300), rng.randint(20, 300))
                write_image(image_dir / name, size, seed=rng.randint(0, 1 << 30))
                images.append(f"{image_dir.name}/{name}")
                content.append({"type": "image"})
                if rng.random() < 0.5:
                    content.append({"type": "text", "text": sentence(rng, rng.randint(1, 6))})
            content.append({"type": "text", "text": sentence(rng, rng.randint(1, 8))})
            rng.shuffle(content)
            messages.append({"role": "user", "content": content})
            messages.append({"role": "assistant", "content": sentence(rng, rng.randint(1, 12))})
        records.append({"messages": messages, "images": images})
    return records


def media_chats(
    n: int, media_dir: Path, seed: int = 0, min_frames: int = 1
) -> List[Dict[str, Any]]:
    """Records with image and video parts in user turns, ``images`` (relative paths) and
    ``videos`` (each a list of ``min_frames``-6 relative frame paths of one size)."""
    rng = random.Random(seed)
    media_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(n):
        messages: List[Dict[str, Any]] = []
        images: List[str] = []
        videos: List[List[str]] = []
        for turn in range(rng.randint(1, 2)):
            content: List[Dict[str, Any]] = []
            for k in range(rng.randint(0 if turn else 1, 3)):
                size = (rng.randint(20, 200), rng.randint(20, 200))
                if rng.random() < 0.6:
                    frames = []
                    for f in range(rng.randint(min_frames, 6)):
                        name = f"vid-{i}-{turn}-{k}-{f}.{rng.choice(['png', 'jpg'])}"
                        write_image(media_dir / name, size, seed=rng.randint(0, 1 << 30))
                        frames.append(f"{media_dir.name}/{name}")
                    videos.append(frames)
                    content.append({"type": "video"})
                else:
                    name = f"img-{i}-{turn}-{k}.png"
                    write_image(media_dir / name, size, seed=rng.randint(0, 1 << 30))
                    images.append(f"{media_dir.name}/{name}")
                    content.append({"type": "image"})
            content.append({"type": "text", "text": sentence(rng, rng.randint(1, 8))})
            rng.shuffle(content)
            messages.append({"role": "user", "content": content})
            messages.append({"role": "assistant", "content": sentence(rng, rng.randint(1, 12))})
        records.append({"messages": messages, "images": images, "videos": videos})
    return records


def write_jsonl(path: Path, records: List[Dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def vl_token_shards(root: Path, n: int, seed: int) -> Tuple[Path, List[Dict[str, Any]]]:
    """Multimodal token shards of ``n`` image chats under ``root / "tokens"`` (the tiny VL
    tokenizer and processor config in ``root / "tok"``), and their samples as dicts."""
    import pyarrow.parquet as pq

    from tokpack.multimodal import tokenize_files

    tok = build_vl_tokenizer(root / "tok")
    records = image_chats(n, root / "imgs", seed=seed)
    tokenize_files(write_jsonl(root / "chats.jsonl", records), root / "tokens", tok, vision=tok)
    samples = pq.read_table(sorted((root / "tokens").glob("part-*.parquet"))).to_pylist()
    return root / "tokens", samples
