"""Videos given as frame lists (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): tokenize parity with
transformers' processor (ids, labels, video grids; Qwen3-VL's timestamps), mRoPE positions
equal to the model's own get_rope_index (Qwen2.5-VL's time step included), packed float64
losses equal to each sample alone through DataLoader workers, and errors naming the frame
file. transformers' video processor needs
torchvision: the tests that run it are skipped without it."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("transformers")

from tests._vl_factory import (  # noqa: E402
    PREPROCESSOR,
    QWEN3_PREPROCESSOR,
    build_vl_tokenizer,
    image_processor,
    media_chats,
    packed_logits,
    tiny_qwen2_5_vl,
    tiny_qwen3_vl,
    video_processor,
    video_processor_pipeline,
    write_image,
    write_jsonl,
)
from tokpack import ConfigError, InputNotFoundError, InvalidRecordError  # noqa: E402
from tokpack.multimodal import (  # noqa: E402
    VisionRules,
    pack_files,
    sample_positions,
    tokenize_files,
)
from tokpack.multimodal.media import MediaReader  # noqa: E402
from tokpack.torch import MultimodalCollator, PackedDataset  # noqa: E402

try:
    import torchvision  # noqa: F401

    HAS_TORCHVISION = True
except Exception:  # not installed, or built for another torch
    HAS_TORCHVISION = False

needs_torchvision = pytest.mark.skipif(
    not HAS_TORCHVISION, reason="transformers' video processor needs torchvision"
)

# Qwen2.5-VL's time step: frames at 3 fps -> second_per_grid_t = 2/3, 2 tokens per second:
# 4/3 positions per temporal patch (floored), the fractional case.
FPS = 3.0


FAMILIES = ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """``corpora(family)``: ``(root, tok, records, packed_dir, samples)``, built once; the two
    Qwen2 families share a tokenizer and records, Qwen3-VL has its own (videos of 2 frames at
    least: its video processor needs as many as temporal_patch_size)."""
    root = tmp_path_factory.mktemp("vl-video")
    built = {}

    def get(family):
        if family not in built:
            kind = "qwen3-vl" if family == "qwen3-vl" else "qwen2-vl"
            base = root / kind
            if not base.exists():
                build_vl_tokenizer(base / "tok", kind)
                records = media_chats(
                    20, base / "media", seed=21, min_frames=2 if kind == "qwen3-vl" else 1
                )
                (base / "records.json").write_text(json.dumps(records))
                write_jsonl(base / "chats.jsonl", records)
            tok, jsonl = base / "tok", base / "chats.jsonl"
            records = json.loads((base / "records.json").read_text())
            tokens, packed = root / f"tokens-{family}", root / f"packed-{family}"
            tokenize_files(jsonl, tokens, tok, vision=tok, family=family, video_fps=FPS)
            samples = pq.read_table(sorted(tokens.glob("part-*.parquet"))).to_pylist()
            max_len = max(s["length"] for s in samples) + 40
            pack_files(tokens, packed, max_len, row_group_rows=4)
            built[family] = (base, tok, records, packed, samples)
        return built[family]

    return get


def _config(family):
    return QWEN3_PREPROCESSOR if family == "qwen3-vl" else PREPROCESSOR


def _media(sample):
    return json.loads(sample["media"])


def _with_media(messages, images, videos, root: Path):
    """The conversation as the processor takes it: each part holding its image / frame paths."""
    messages = copy.deepcopy(messages)
    its = {"image": iter(images), "video": iter(videos)}
    for m in messages:
        if isinstance(m["content"], list):
            for part in m["content"]:
                if part["type"] == "image":
                    part["image"] = str(root / next(its["image"]))
                elif part["type"] == "video":
                    part["video"] = [str(root / f) for f in next(its["video"])]
    return messages


def test_video_grids_and_tokens(corpora):
    root, tok, records, _, samples = corpora("qwen2-vl")
    rules = VisionRules.from_pretrained(tok)
    samples_25 = corpora("qwen2.5-vl")[4]
    n_videos = 0
    for record, sample, sample_25 in zip(records, samples, samples_25):
        videos = [m for m in _media(sample) if m.get("type") == "video"]
        assert len(videos) == len(record["videos"])
        for m, frames in zip(videos, record["videos"]):
            n_videos += 1
            assert [f["ref"]["path"] for f in m["frames"]] == [
                str((root / f).resolve()) for f in frames
            ]
            t, h, w = m["grid"]
            assert t == (len(frames) + 1) // 2
            assert m["span"][1] == t * h * w // 4
            assert m["grid"] == list(rules.video_grid(len(frames), *m["size"]))
            assert "second_per_grid_t" not in m  # Qwen2-VL: the time axis is the patch index
        for m in _media(sample_25):
            if m.get("type") == "video":
                assert m["second_per_grid_t"] == 2 / FPS and m["tokens_per_second"] == 2
    assert n_videos > 15 and any(len(f) % 2 for r in records for f in r["videos"])


def test_qwen3_video_blocks(corpora):
    """A Qwen3-VL video: one "<t seconds><|vision_start|>pads<|vision_end|>" block per
    temporal patch inside its span, the time of each the mean of its two frames at FPS."""
    _, tok, records, _, samples = corpora("qwen3-vl")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tok / "tokenizer.json"))
    n_videos = 0
    for record, sample in zip(records, samples):
        ids = sample["input_ids"]
        videos = [m for m in _media(sample) if m.get("type") == "video"]
        for m, frames in zip(videos, record["videos"]):
            n_videos += 1
            t, h, w = m["grid"]
            start, n = m["span"]
            assert len(m["groups"]) == t == (len(frames) + 1) // 2 and m["tokens"] == t * h * w // 4
            text = tokenizer.decode(ids[start - 1 : start + n + 1], skip_special_tokens=False)
            stamps = [((2 * i) + min(2 * i + 1, len(frames) - 1)) / 2 / FPS for i in range(t)]
            block = "".join(
                f"<{x:.1f} seconds><|vision_start|>{'<|video_pad|>' * (h * w // 4)}<|vision_end|>"
                for x in stamps
            )
            assert text.replace(" ", "") == f"<|vision_start|>{block}<|vision_end|>".replace(
                " ", ""
            )
        assert sample["vision_tokens"] == sum(m.get("tokens", m["span"][1]) for m in _media(sample))
    assert n_videos > 15


@needs_torchvision
@pytest.mark.parametrize("family", FAMILIES)
def test_parity_with_the_processor_on_every_sample(corpora, tmp_path, family):
    root, tok, records, _, _ = corpora(family)
    # The processor's frame rate for a frame list given without metadata: 24 fps.
    tokenize_files(root / "chats.jsonl", tmp_path / "out", tok, vision=tok, family=family)
    rows = pq.read_table(sorted((tmp_path / "out").glob("part-*.parquet"))).to_pylist()
    proc = video_processor_pipeline(tok, family)
    video_pad = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    checked = 0
    for record, row in zip(records, rows):
        out = proc.apply_chat_template(
            _with_media(record["messages"], record["images"], record["videos"], root),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            return_tensors="np",
        )
        ids = out["input_ids"][0]
        assert row["input_ids"] == ids.tolist()
        assert row["labels"] == np.where(out["assistant_masks"][0] == 1, ids, -100).tolist()
        media = _media(row)
        videos = [m for m in media if m.get("type") == "video"]
        images = [m for m in media if m.get("type", "image") == "image"]
        if videos:
            assert [m["grid"] for m in videos] == out["video_grid_thw"].tolist()
            assert row["vision_tokens"] == int((ids == video_pad).sum()) + sum(
                m["span"][1] for m in images
            )
            if family == "qwen2.5-vl":
                assert [m["second_per_grid_t"] for m in videos] == pytest.approx(
                    out["second_per_grid_ts"].tolist()
                )
            checked += 1
        if images:
            assert [m["grid"] for m in images] == out["image_grid_thw"].tolist()
        assert row["vision_patches"] == sum(int(np.prod(m["grid"])) for m in media)
    assert checked > 10


_MODELS = {}


def _model(tok, family):
    if family not in _MODELS:
        if family == "qwen3-vl":
            _MODELS[family] = tiny_qwen3_vl(tok)
        else:
            _MODELS[family] = tiny_qwen2_5_vl(tok, family.replace(".", "_").replace("-", "_"))
    return _MODELS[family]


def _types(model, ids):
    """mm_token_type_ids: 1 on image pads, 2 on video pads."""
    types = (ids == model.config.image_token_id).to(torch.int32)
    return types + 2 * (ids == model.config.video_token_id).to(torch.int32)


def _alone_kwargs(model, sample, reader, family):
    """The model inputs of one sample run alone, as transformers' processor gives them."""
    ids = torch.tensor(sample["input_ids"])[None]
    media = _media(sample)
    images = [m for m in media if m.get("type", "image") == "image"]
    videos = [m for m in media if m.get("type") == "video"]
    kwargs = {"input_ids": ids, "mm_token_type_ids": _types(model, ids)}
    if images:
        out = image_processor(_config(family))(
            images=[reader.image(m["ref"], m["hash"]) for m in images], return_tensors="pt"
        )
        kwargs.update(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"])
    if videos:
        clips = [[reader.image(f["ref"], f["hash"]) for f in m["frames"]] for m in videos]
        out = video_processor(_config(family))(videos=clips, return_tensors="pt")
        kwargs.update(
            pixel_values_videos=out["pixel_values_videos"], video_grid_thw=out["video_grid_thw"]
        )
        if family == "qwen2.5-vl":
            kwargs["second_per_grid_ts"] = torch.tensor(
                [m["second_per_grid_t"] for m in videos], dtype=torch.float32
            )
    return kwargs


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_equal_get_rope_index_on_each_sample(corpora, family):
    _, tok, _, _, samples = corpora(family)
    model = _model(tok, family)
    with_videos = 0
    for sample in samples:
        media = _media(sample)
        if not media:
            continue
        ids = torch.tensor(sample["input_ids"])[None]
        videos = [m for m in media if m.get("type") == "video"]
        images = [m for m in media if m.get("type", "image") == "image"]
        kwargs = {}
        if family == "qwen2.5-vl" and videos:
            kwargs["second_per_grid_ts"] = torch.tensor(
                [m["second_per_grid_t"] for m in videos], dtype=torch.float32
            )
        theirs, _ = model.model.get_rope_index(
            ids,
            mm_token_type_ids=_types(model, ids),
            image_grid_thw=torch.tensor([m["grid"] for m in images]) if images else None,
            video_grid_thw=torch.tensor([m["grid"] for m in videos]) if videos else None,
            **kwargs,
        )
        ours = sample_positions(len(sample["input_ids"]), media, merge_size=2)
        assert np.array_equal(ours, theirs[:, 0].numpy())
        with_videos += bool(videos)
    assert with_videos > 10


@needs_torchvision
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_losses_equal_each_sample_alone(corpora, family):
    _, tok, _, packed_dir, samples = corpora(family)
    model = _model(tok, family)
    ds = PackedDataset(packed_dir)
    config = _config(family)
    collator = MultimodalCollator(image_processor(config), video_processor=video_processor(config))
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2, collate_fn=collator)
    reader = MediaReader()
    checked = multi = 0
    for i, batch in enumerate(loader):
        row = ds[i]
        n_videos = sum(sum(m.get("type") == "video" for m in json.loads(x)) for x in row["media"])
        assert batch.get("video_grid_thw", torch.zeros(0, 3)).shape[0] == n_videos
        logits, plain = packed_logits(model, batch)
        packed = _losses(logits, batch["labels"][0])
        packed_plain = _losses(plain, batch["labels"][0])
        offset = 0
        for sid, n in zip(row["sample_ids"].tolist(), row["seq_lengths"].tolist()):
            sample = samples[sid]
            with torch.no_grad():
                alone_logits = model(
                    **_alone_kwargs(model, sample, reader, family), use_cache=False
                ).logits[0]
            alone = _losses(alone_logits, torch.tensor(sample["labels"]))
            assert torch.allclose(packed[offset : offset + n - 1], alone, rtol=0, atol=1e-9), sid
            if _media(sample) and alone.abs().sum() > 0:
                plain_part = packed_plain[offset : offset + n - 1]
                assert not torch.allclose(plain_part, alone, rtol=0, atol=1e-6)
            offset += n
            checked += 1
        multi += len(row["sample_ids"]) > 1 and n_videos > 1
    assert checked == len(samples) and multi >= 2


def _losses(logits, labels):
    losses = torch.nn.functional.cross_entropy(
        logits[:-1], labels[1:].clamp(min=0), reduction="none"
    )
    return torch.where(labels[1:] == -100, torch.zeros_like(losses), losses)


def test_tokens_per_second_from_the_model_config(tmp_path):
    from tokpack.multimodal.tokenize import MultimodalEncoder

    tok = build_vl_tokenizer(tmp_path / "tok")
    assert MultimodalEncoder(tok, tok, family="qwen2.5-vl").tokens_per_second == 2
    (tmp_path / "tok/config.json").write_text('{"vision_config": {"tokens_per_second": 4}}')
    assert MultimodalEncoder(tok, tok, family="qwen2.5-vl").tokens_per_second == 4
    encoder = MultimodalEncoder(tok, tok, family="qwen2.5-vl", tokens_per_second=3, video_fps=6)
    assert (encoder.tokens_per_second, encoder.video_fps) == (3, 6.0)
    for bad in (0, -1.0, "2", True):
        with pytest.raises(ConfigError, match="video_fps must be a positive"):
            MultimodalEncoder(tok, tok, video_fps=bad)
    with pytest.raises(ConfigError, match="tokens_per_second must be an integer"):
        MultimodalEncoder(tok, tok, tokens_per_second=2.5)


def _video_record(frames):
    user = [{"type": "video"}, {"type": "text", "text": "what"}]
    return {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "x"}],
        "videos": [frames],
    }


def test_bad_videos_name_file_and_frame(tmp_path):
    tok = build_vl_tokenizer(tmp_path / "tok")
    for i in range(3):
        write_image(tmp_path / f"f{i}.png", (60, 40), seed=i)
    write_image(tmp_path / "big.png", (61, 40), seed=9)
    (tmp_path / "bad.png").write_bytes(b"\x89PNG garbage")
    records = [
        _video_record(["f0.png", "f1.png", "f2.png"]),
        _video_record(["f0.png", "gone.png"]),
        _video_record(["f0.png", "bad.png"]),
        _video_record(["f0.png", "big.png"]),
        _video_record([]),
        {**_video_record(["f0.png"]), "videos": []},
    ]
    jsonl = write_jsonl(tmp_path / "c.jsonl", records)
    with pytest.raises(InvalidRecordError, match=r"c.jsonl:2: video 0, frame 1: .*gone.png"):
        tokenize_files(jsonl, tmp_path / "out", tok, vision=tok)
    manifest = tokenize_files(jsonl, tmp_path / "out", tok, vision=tok, skip_invalid=True)
    assert manifest["counts"]["samples"] == 1 and manifest["counts"]["rejected"] == 5
    rejected = [
        json.loads(x)["error"]
        for x in (tmp_path / "out/__tokpack__/_rejected.jsonl").read_text().splitlines()
    ]
    assert "frame 1" in rejected[1] and "bad.png" in rejected[1]
    assert "big.png" in rejected[2] and "61x40 pixels, frame 0 has 60x40" in rejected[2]
    assert "non-empty list of frames" in rejected[3]
    assert "1 video part(s)" in rejected[4]
    one = write_jsonl(tmp_path / "one.jsonl", [_video_record(["f0.png"])])
    with pytest.raises(InvalidRecordError, match="one.jsonl:1: video 0: .*needs at least 2"):
        tokenize_files(one, tmp_path / "q3", tok, vision=tok, family="qwen3-vl")
    # The collator reading a frame that went missing (or changed) names it.
    pack_files(tmp_path / "out", tmp_path / "p", 400)
    ds = PackedDataset(tmp_path / "p")
    (tmp_path / "f2.png").unlink()
    collator = MultimodalCollator(image_processor(), video_processor=object())
    with pytest.raises(InputNotFoundError, match="f2.png"):
        collator([ds[0]])
    shutil.copy(tmp_path / "f1.png", tmp_path / "f2.png")
    with pytest.raises(Exception, match="f2.png: the image changed"):
        collator([ds[0]])
    with pytest.raises(Exception, match="f0.png: the batch holds videos"):
        MultimodalCollator(image_processor())([ds[0]])


def test_parquet_frames_are_referenced_by_row_and_frame(tmp_path):
    tok = build_vl_tokenizer(tmp_path / "tok")
    raw = [write_image(tmp_path / f"f{i}.png", (50, 70), seed=i).read_bytes() for i in range(3)]
    record = _video_record([{"bytes": b, "path": None} for b in raw])
    record["messages"][1]["content"] = [{"type": "text", "text": "x"}]  # one Arrow type
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([record]), src)
    tokenize_files(src, tmp_path / "out", tok, vision=tok)
    row = pq.read_table(tmp_path / "out").to_pylist()[0]
    (video,) = _media(row)
    refs = [f["ref"] for f in video["frames"]]
    assert refs[2] == {
        "file": str(src.resolve()),
        "row": 0,
        "column": "videos",
        "index": 0,
        "frame": 2,
    }
    reader = MediaReader()
    assert [reader.read(r, f["hash"]) for r, f in zip(refs, video["frames"])] == raw
    assert video["grid"] == list(VisionRules.from_pretrained(tok).video_grid(3, 50, 70))


@needs_torchvision
@pytest.mark.parametrize("family", ["qwen2-vl", "qwen3-vl"])
def test_video_grid_equals_the_video_processor(family):
    """tokpack's video grid against the video processor's own count, on many frame counts and
    sizes (Qwen3-VL: the bounds hold for the whole clip), with the models' published
    settings and the tests' small ones."""
    import random

    published = {
        "qwen2-vl": {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2},
        "qwen3-vl": {
            "patch_size": 16,
            "merge_size": 2,
            "temporal_patch_size": 2,
            "size": {"shortest_edge": 4096, "longest_edge": 25165824},
        },
    }[family]
    rng = random.Random(5)
    clip = family == "qwen3-vl"
    for config in (published, _config(family)):
        processor = video_processor(config)
        rules = VisionRules.from_dict(config, family, video=True)
        assert rules == VisionRules.from_dict(
            {
                **{k: getattr(processor, k) for k in ("patch_size", "merge_size")},
                "temporal_patch_size": processor.temporal_patch_size,
                "size": dict(processor.size),
            }
        )
        for _ in range(300):
            frames = rng.randint(2 if clip else 1, 40)
            width = rng.randint(8, 2000)
            height = max(8, min(2000, int(width * rng.uniform(0.05, 20))))
            if max(width, height) / min(width, height) > 150:
                continue
            t, h, w = rules.video_grid(frames, width, height, clip_pixels=clip)
            expected = processor.get_num_of_video_patches(frames, height, width, {})
            assert t * h * w == expected, (frames, width, height)


def test_cli_and_stats(corpora, tmp_path, capsys):
    from tokpack.cli import main

    root, tok, records, _, samples = corpora("qwen2.5-vl")
    renamed = [
        {**{k: v for k, v in r.items() if k != "videos"}, "clips": r["videos"]} for r in records
    ]
    jsonl = write_jsonl(root / "renamed.jsonl", renamed)
    args = ["tokenize", str(jsonl), "--tokenizer", str(tok), "--vision", str(tok)]
    args += ["--family", "qwen2.5-vl", "--video-fps", str(FPS), "--column", "videos=clips"]
    assert main(args + ["-o", str(tmp_path / "cli")]) == 0
    n_videos = sum(len(r["videos"]) for r in records)
    n_images = sum(len(r["images"]) for r in records)
    assert f"{n_images:,} images and {n_videos:,} videos" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "cli").to_pylist()
    assert [r["input_ids"] for r in rows] == [s["input_ids"] for s in samples]
    assert [r["media"] for r in rows] == [s["media"] for s in samples]
    assert main(["stats", str(tmp_path / "cli"), "--json", "--quiet", "--max-len", "4096"]) == 0
    vision = json.loads(capsys.readouterr().out)["vision"]
    assert (vision["images"], vision["videos"]) == (n_images, n_videos)
    assert vision["vision_tokens"] == sum(s["vision_tokens"] for s in samples)


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen3-vl"])
def test_cuts_never_fall_inside_a_video(tmp_path, family):
    """max_len cuts of samples with videos (Qwen3-VL's span holds its timestamps): every piece
    ends outside each video's block, keeps the videos it holds whole, and gets positions."""
    from tokpack.multimodal.tokenize import MultimodalEncoder, _Counts
    from tokpack.tokenize.formats import read_records

    kind = "qwen3-vl" if family == "qwen3-vl" else "qwen2-vl"
    tok = build_vl_tokenizer(tmp_path / "tok", kind)
    for i in range(4):
        write_image(tmp_path / f"f{i}.png", (64, 64), seed=i)
    parts = []
    for _ in range(2):
        parts += [{"type": "text", "text": "the cat sat on the mat " * 3}, {"type": "video"}]
    record = {
        "messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "ok"}],
        "videos": [[f"f{i}.png" for i in range(4)], ["f0.png", "f1.png", "f2.png"]],
    }
    path = write_jsonl(tmp_path / "one.jsonl", [record])
    rec = next(iter(read_records(path)))
    whole = MultimodalEncoder(tok, tok, family=family).encode(rec, path)
    blocks = [(m["span"][0] - 1, m["span"][0] + m["span"][1] + 1) for m in whole.media]
    assert len(blocks) == 2
    n = len(whole.input_ids)
    for max_len in range(10, n + 5, 3):
        for policy in ("truncate", "split"):
            encoder = MultimodalEncoder(tok, tok, family=family, max_len=max_len, overlong=policy)
            offset = 0
            for piece in encoder.fit(whole, rec, _Counts()):
                a, b = offset, offset + len(piece.input_ids)
                assert not any(x < a < y or x < b < y for x, y in blocks), (a, b, blocks)
                assert len(piece.media) == sum(a <= x and y <= b for x, y in blocks)
                sample_positions(len(piece.input_ids), piece.media, merge_size=2)
                offset = b
