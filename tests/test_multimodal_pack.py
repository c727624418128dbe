"""Packing multimodal token shards: vision tokens count against max_len, media carried per
segment, no cut inside an image."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

import tokpack  # noqa: E402
from tests._vl_factory import build_vl_tokenizer, image_chats, write_jsonl  # noqa: E402
from tokpack import ConfigError  # noqa: E402
from tokpack.multimodal import pack_files, tokenize_files  # noqa: E402


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl-pack")
    tok = build_vl_tokenizer(root / "tok")
    records = image_chats(60, root / "imgs", seed=5)
    tokenize_files(write_jsonl(root / "chats.jsonl", records), root / "tokens", tok, vision=tok)
    return root / "tokens"


def _samples(tokens):
    return pq.read_table(sorted(tokens.glob("part-*.parquet"))).to_pylist()


def test_media_is_carried_per_segment(tokens, tmp_path):
    samples = _samples(tokens)
    max_len = max(s["length"] for s in samples)
    manifest = pack_files(tokens, tmp_path / "packed", max_len)
    assert manifest["figures"]["samples_packed"] == len(samples)
    assert manifest["config"]["carry"] == ["media", "vision_tokens", "vision_patches"]
    rows = pq.read_table(sorted((tmp_path / "packed").glob("part-*.parquet"))).to_pylist()
    seen = []
    for row in rows:
        assert row["num_tokens"] <= max_len
        offset = 0
        for sid, n, media, vt, vp in zip(
            row["sample_ids"],
            row["seq_lengths"],
            row["media"],
            row["vision_tokens"],
            row["vision_patches"],
        ):
            sample = samples[sid]
            assert row["input_ids"][offset : offset + n] == sample["input_ids"]
            assert (media, vt, vp) == (
                sample["media"],
                sample["vision_tokens"],
                sample["vision_patches"],
            )
            offset += n
            seen.append(sid)
    assert sorted(seen) == list(range(len(samples)))
    assert sum(s["vision_tokens"] for s in samples) > 0
    tokpack.verify(tmp_path / "packed")


def test_cuts_inside_images_are_refused(tokens, tmp_path):
    samples = _samples(tokens)
    # A sample whose first image has text after it, and a max_len inside that image.
    sid, sample = next(
        (i, s) for i, s in enumerate(samples) if s["media"] != "[]" and s["vision_tokens"] > 8
    )
    start, n = json.loads(sample["media"])[0]["span"]
    inside = start + n // 2
    shard = sorted(tokens.glob("part-*.parquet"))[0]
    with pytest.raises(ConfigError, match=rf"{shard.name}: row {sid}: truncating at max_len"):
        pack_files(tokens, tmp_path / "a", inside, overlong="truncate")
    with pytest.raises(ConfigError, match="overlong 'split' would cut its images"):
        pack_files(tokens, tmp_path / "b", inside, overlong="split")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # drop: every over-long sample dropped and listed.
    manifest = pack_files(tokens, tmp_path / "c", inside, overlong="drop")
    figures = manifest["figures"]
    assert figures["samples_dropped"] == sum(s["length"] > inside for s in samples) > 0
    assert figures["samples_packed"] + figures["samples_dropped"] == len(samples)


def test_truncation_before_an_image_is_allowed(tokens, tmp_path):
    samples = _samples(tokens)
    # The longest sample's last image ends well before its end: cut right after it.
    cuts = []
    for s in samples:
        media = json.loads(s["media"])
        if media:
            end = media[-1]["span"][0] + media[-1]["span"][1] + 1
            if end < s["length"]:
                cuts.append(end)
    max_len = max(cuts)
    safe = all(
        not (m["span"][0] - 1 < max_len <= m["span"][0] + m["span"][1])
        for s in samples
        for m in json.loads(s["media"])
    )
    if not safe:
        pytest.skip("no cut clear of every image in this corpus")
    manifest = pack_files(tokens, tmp_path / "t", max_len, overlong="truncate")
    assert manifest["figures"]["samples_truncated"] == sum(s["length"] > max_len for s in samples)


def test_stats_count_vision_tokens(tokens, capsys):
    from tokpack.cli import main

    samples = _samples(tokens)
    assert main(["stats", str(tokens), "--json", "--quiet", "--max-len", "4096"]) == 0
    vision = json.loads(capsys.readouterr().out)["vision"]
    media = [json.loads(s["media"]) for s in samples]
    assert vision["images"] == sum(map(len, media)) > 0
    assert vision["vision_tokens"] == sum(m["span"][1] for ms in media for m in ms)
    assert vision["tokens"] == sum(s["length"] for s in samples)
    assert vision["samples_with_images"] == sum(bool(ms) for ms in media)
    assert main(["stats", str(tokens), "--quiet", "--max-len", "4096"]) == 0
    assert "Vision tokens (counted in the lengths above)" in capsys.readouterr().out


def test_plain_pack_carries_the_media_of_multimodal_shards(tokens, tmp_path, capsys):
    """Failed before: `tokpack pack` (and `tokpack.pack_files`) packed multimodal shards without
    their media columns unless told `--carry media vision_tokens vision_patches`: rows with image
    tokens and no images, silently; nor did they refuse a cut inside an image."""
    from tokpack.cli import main

    max_len = max(s["length"] for s in _samples(tokens))
    out = tmp_path / "cli"
    assert main(["pack", str(tokens), "-o", str(out), "--max-len", str(max_len), "--quiet"]) == 0
    manifest = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    assert manifest["config"]["carry"] == ["media", "vision_tokens", "vision_patches"]
    got = tokpack.pack_files(tokens, tmp_path / "api", max_len, carry=["vision_tokens"])
    assert got["config"]["carry"] == ["media", "vision_tokens", "vision_patches"]
    with_images = [s for s in _samples(tokens) if json.loads(s["media"])]
    inside = json.loads(with_images[0]["media"])[0]["span"][0] + 1
    with pytest.raises(ConfigError, match="cut inside image"):
        tokpack.pack_files(tokens, tmp_path / "cut", inside, overlong="truncate")


def test_text_and_multimodal_shards_are_not_packed_together(tokens, tmp_path):
    from tokpack.synthetic import write_token_shards

    (text,) = write_token_shards(tmp_path / "t", 10, n_files=1)
    with pytest.raises(tokpack.SchemaError, match="text token shard among multimodal"):
        tokpack.pack_files([*sorted(tokens.glob("*.parquet")), text], tmp_path / "o", 4096)
