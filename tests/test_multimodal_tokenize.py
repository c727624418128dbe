"""Tokenizing image chats: parity with transformers' Qwen2-VL processor + chat template on every
sample (ids, labels, grids), media references, safe cuts and errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

from tests._vl_factory import (  # noqa: E402
    PREPROCESSOR,
    build_vl_tokenizer,
    image_chats,
    processor,
    write_image,
    write_jsonl,
)
from tokpack import InputNotFoundError, InvalidRecordError, OverlongError  # noqa: E402
from tokpack.multimodal import VisionRules, tokenize_files  # noqa: E402
from tokpack.multimodal.media import MediaReader, media_hash  # noqa: E402
from tokpack.multimodal.tokenize import MultimodalEncoder, _Counts  # noqa: E402
from tokpack.tokenize.formats import read_records  # noqa: E402


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_vl_tokenizer(tmp_path_factory.mktemp("vl-tok"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl-data")
    records = image_chats(40, root / "imgs", seed=3)
    return root, records, write_jsonl(root / "chats.jsonl", records)


def manifest_shard(out: Path) -> Path:
    return sorted(out.glob("part-*.parquet"))[0]


def _rows(out: Path):
    return pq.read_table(sorted(out.glob("part-*.parquet"))).to_pylist()


def _with_paths(messages, images, root: Path):
    """The conversation as the processor takes it: each image part holding its image path."""
    messages = copy.deepcopy(messages)
    it = iter(images)
    for m in messages:
        if isinstance(m["content"], list):
            for part in m["content"]:
                if part["type"] == "image":
                    part["image"] = str(root / next(it))
    return messages


@pytest.fixture(scope="module")
def tok3(tmp_path_factory):
    return build_vl_tokenizer(tmp_path_factory.mktemp("vl3-tok"), "qwen3-vl")


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen3-vl"])
def test_parity_with_the_processor_on_every_sample(tok, tok3, data, tmp_path, family):
    root, records, jsonl = data
    tok = tok3 if family == "qwen3-vl" else tok
    manifest = tokenize_files(jsonl, tmp_path / "out", tok, vision=tok)
    rows = _rows(tmp_path / "out")
    assert manifest["counts"]["samples"] == len(rows) == len(records)
    assert manifest["counts"]["images"] == sum(len(r["images"]) for r in records) > 40
    assert manifest["multimodal"]["family"] == manifest["config"]["family"] == family
    assert (
        pq.read_schema(manifest_shard(tmp_path / "out")).metadata[b"tokpack.multimodal"]
        == family.encode()
    )
    proc = processor(tok, family)
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for record, row in zip(records, rows):
        out = proc.apply_chat_template(
            _with_paths(record["messages"], record["images"], root),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            return_tensors="np",
        )
        ids = out["input_ids"][0]
        expected_labels = np.where(out["assistant_masks"][0] == 1, ids, -100)
        assert row["input_ids"] == ids.tolist()
        assert row["labels"] == expected_labels.tolist()
        assert row["length"] == len(ids)
        media = json.loads(row["media"])
        grids = out["image_grid_thw"].tolist() if len(media) else []
        assert [m["grid"] for m in media] == grids
        # Each span is a run of pads between vision_start and vision_end.
        starts = [i for i in range(len(ids)) if ids[i] == pad and (i == 0 or ids[i - 1] != pad)]
        assert [m["span"][0] for m in media] == starts
        assert row["vision_tokens"] == int((ids == pad).sum()) == sum(m["span"][1] for m in media)
        assert row["vision_patches"] == sum(int(np.prod(g)) for g in grids)
        for m, name in zip(media, record["images"]):
            assert m["ref"] == {"path": str((root / name).resolve())}
            assert m["hash"] == media_hash((root / name).read_bytes())
    again = tokenize_files(jsonl, tmp_path / "out", tok, vision=tok)
    assert again.get("cache_hit") is True


def test_vision_tokens_are_never_trained(tok, tmp_path):
    write_image(tmp_path / "a.png", (90, 60), seed=0)
    record = {
        "messages": [
            {"role": "user", "content": "draw"},
            {"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "x"}]},
        ],
        "images": ["a.png"],
    }
    out = tmp_path / "out"
    tokenize_files(write_jsonl(tmp_path / "c.jsonl", [record]), out, tok, vision=tok)
    row = _rows(out)[0]
    m = json.loads(row["media"])[0]
    start, n = m["span"]
    labels = row["labels"]
    assert labels[start - 1 : start + n + 1] == [-100] * (n + 2)
    assert any(x != -100 for x in labels[start + n + 1 :])  # the assistant text is trained


def test_parquet_bytes_are_referenced_by_file_and_row(tok, tmp_path):
    images = [write_image(tmp_path / f"{i}.png", (50 + 30 * i, 70), seed=i) for i in range(3)]
    raw = [p.read_bytes() for p in images]
    user = [{"type": "image"}, {"type": "text", "text": "what"}]
    records = [
        {
            "messages": [
                {"role": "user", "content": user},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
            ],
            "images": [{"bytes": raw[0], "path": None}],
        },
        {
            "messages": [
                {"role": "user", "content": user + [{"type": "image"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
            ],
            "images": [{"bytes": raw[1], "path": None}, {"bytes": None, "path": str(images[2])}],
        },
    ]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(records), src, row_group_size=1)
    tokenize_files(src, tmp_path / "out", tok, vision=tok)
    rows = _rows(tmp_path / "out")
    media = [json.loads(r["media"]) for r in rows]
    assert media[0][0]["ref"] == {
        "file": str(src.resolve()),
        "row": 0,
        "column": "images",
        "index": 0,
    }
    assert media[1][0]["ref"]["row"] == 1 and media[1][1]["ref"] == {"path": str(images[2])}
    reader = MediaReader()
    assert reader.read(media[1][0]["ref"], media[1][0]["hash"]) == raw[1]
    assert reader.image(media[0][0]["ref"], media[0][0]["hash"]).size == (50, 70)
    rules = VisionRules.from_dict(PREPROCESSOR)
    assert media[1][1]["grid"] == list(rules.grid(110, 70))


def _encoder(tok, **kw):
    return MultimodalEncoder(tok, VisionRules.from_dict(PREPROCESSOR), **kw)


def _one(tmp_path, record):
    path = write_jsonl(tmp_path / "one.jsonl", [record])
    return next(iter(read_records(path))), path


def _long_record(tmp_path):
    for i in range(3):
        write_image(tmp_path / f"l{i}.png", (140, 140), seed=i)  # 25 tokens each
    parts = []
    for _ in range(3):
        parts += [{"type": "text", "text": "the cat sat on the mat " * 3}, {"type": "image"}]
    return {
        "messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "ok"}],
        "images": [f"l{i}.png" for i in range(3)],
    }


@pytest.mark.parametrize("max_len", list(range(20, 130, 7)))
def test_cuts_never_fall_inside_an_image(tok, tmp_path, max_len):
    record, path = _one(tmp_path, _long_record(tmp_path))
    whole = _encoder(tok).encode(record, path)
    n = len(whole.input_ids)
    assert n > 130
    blocks = [(m["span"][0] - 1, m["span"][0] + m["span"][1] + 1) for m in whole.media]
    for policy in ("truncate", "split"):
        counts = _Counts()
        pieces = _encoder(tok, max_len=max_len, overlong=policy).fit(whole, record, counts)
        block = max(y - x for x, y in blocks)
        if not pieces:  # only split drops: an image block longer than max_len
            assert policy == "split" and max_len < block and counts.dropped_overlong == 1
            continue
        assert policy == "truncate" or max_len >= block
        offset = 0
        for piece in pieces:
            assert 0 < len(piece.input_ids) <= max_len
            a, b = offset, offset + len(piece.input_ids)
            assert not any(x < a < y or x < b < y for x, y in blocks), (a, b, blocks)
            for m in piece.media:  # spans are the piece's own and still hold the image's pads
                s, k = m["span"]
                assert (piece.input_ids[s : s + k] == whole.input_ids[s + a : s + a + k]).all()
                assert piece.input_ids[s - 1] == whole.input_ids[blocks[0][0]]
            assert len(piece.media) == sum(a <= x and y <= b for x, y in blocks)
            offset = b
        if policy == "split":
            assert offset == n and counts.split == 1
            assert np.array_equal(np.concatenate([p.input_ids for p in pieces]), whole.input_ids)
        else:
            assert counts.truncated == 1 and len(pieces) == 1


def test_overlong_error_and_drop(tok, tmp_path):
    record, path = _one(tmp_path, _long_record(tmp_path))
    whole = _encoder(tok).encode(record, path)
    with pytest.raises(OverlongError, match="one.jsonl:1"):
        _encoder(tok, max_len=50).fit(whole, record, _Counts())
    counts = _Counts()
    assert _encoder(tok, max_len=50, overlong="drop").fit(whole, record, counts) == []
    assert counts.dropped_overlong == 1


def test_bad_records_name_file_and_line(tok, tmp_path):
    write_image(tmp_path / "a.png", (60, 60), seed=0)
    user = [{"type": "image"}, {"type": "text", "text": "hi"}]
    good = {
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "x"}],
        "images": ["a.png"],
    }
    missing = {**good, "images": ["nope.png"]}
    mismatch = {**good, "images": []}
    corrupt_path = tmp_path / "bad.png"
    corrupt_path.write_bytes(b"\x89PNG garbage")
    corrupt = {**good, "images": ["bad.png"]}
    jsonl = write_jsonl(tmp_path / "c.jsonl", [good, missing, mismatch, corrupt])
    with pytest.raises(InvalidRecordError, match=r"c.jsonl:2: image 0: .*nope.png"):
        tokenize_files(jsonl, tmp_path / "out", tok, vision=tok)
    manifest = tokenize_files(jsonl, tmp_path / "out", tok, vision=tok, skip_invalid=True)
    assert manifest["counts"]["samples"] == 1 and manifest["counts"]["rejected"] == 3
    rejected = [
        json.loads(x)
        for x in (tmp_path / "out/__tokpack__/_rejected.jsonl").read_text().splitlines()
    ]
    assert [r["line"] for r in rejected] == [2, 3, 4]
    assert "1 image part(s)" in rejected[1]["error"]
    assert "bad.png" in rejected[2]["error"]


def test_changed_or_missing_media_is_refused_when_read(tmp_path):
    path = write_image(tmp_path / "a.png", (30, 30), seed=0)
    reader = MediaReader()
    ref = {"path": str(path)}
    digest = media_hash(path.read_bytes())
    assert reader.read(ref, digest) == path.read_bytes()
    write_image(path, (30, 30), seed=1)
    with pytest.raises(Exception, match="a.png: the image changed"):
        reader.read(ref, digest)
    path.unlink()
    with pytest.raises(InputNotFoundError, match="a.png"):
        reader.read(ref, digest)


def test_cli(tok, data, tmp_path, capsys):
    from tokpack.cli import main

    _, records, jsonl = data
    api = tokenize_files(jsonl, tmp_path / "api", tok, vision=tok, max_len=300, overlong="split")
    args = ["tokenize", str(jsonl), "--tokenizer", str(tok), "--vision", str(tok)]
    assert (
        main(args + ["-o", str(tmp_path / "cli"), "--max-len", "300", "--overlong", "split"]) == 0
    )
    out = capsys.readouterr().out
    assert f"{api['counts']['images']:,} images" in out
    assert pq.read_table(tmp_path / "cli").equals(pq.read_table(tmp_path / "api"))
    cli = args + ["-o", str(tmp_path / "cli"), "--max-len", "300", "--overlong", "split"]
    assert main(cli) == 0 and "up to date" in capsys.readouterr().out
    assert main(cli + ["--quiet"]) == 0 and capsys.readouterr().out == ""
    assert main(args + ["-o", str(tmp_path / "x"), "--carry", "id"]) == 2
    assert "--vision does not take --carry" in capsys.readouterr().err
