"""mRoPE positions against the model's own get_rope_index, the multimodal collator through
DataLoader workers, and the exactness of packed training: tiny random Qwen2.5-VL, Qwen2-VL and
Qwen3-VL models in float64 give each sample the per-token losses it gets alone, and plain 1-D
positions do not."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
pytest.importorskip("transformers")

from tests._vl_factory import (  # noqa: E402
    QWEN3_PREPROCESSOR,
    build_vl_tokenizer,
    image_chats,
    image_processor,
    model_inputs,
    packed_logits,
    tiny_qwen2_5_vl,
    tiny_qwen3_vl,
    write_image,
    write_jsonl,
)
from tokpack import DataError, InputNotFoundError  # noqa: E402
from tokpack.multimodal import (  # noqa: E402
    pack_files,
    packed_positions,
    sample_positions,
    tokenize_files,
)
from tokpack.multimodal.media import MediaReader  # noqa: E402
from tokpack.torch import MultimodalCollator, PackedDataset  # noqa: E402


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """``corpora(kind)``: tokenized and packed image chats of a tokenizer / processor config of
    ``kind`` (``qwen2-vl``: also Qwen2.5-VL's; ``qwen3-vl``), built once."""
    built = {}

    def get(kind):
        if kind not in built:
            root = tmp_path_factory.mktemp(f"vl-torch-{kind}")
            tok = build_vl_tokenizer(root / "tok", kind)
            records = image_chats(24, root / "imgs", seed=11)
            jsonl = write_jsonl(root / "chats.jsonl", records)
            tokenize_files(jsonl, root / "tokens", tok, vision=tok)
            samples = pq.read_table(sorted((root / "tokens").glob("part-*.parquet"))).to_pylist()
            max_len = max(s["length"] for s in samples) + 40
            pack_files(root / "tokens", root / "packed", max_len, row_group_rows=4)
            built[kind] = (root, tok, samples)
        return built[kind]

    return get


@pytest.fixture(scope="module")
def corpus(corpora):
    return corpora("qwen2-vl")


_MODELS = {}


def _model(corpus, family):
    if family not in _MODELS:
        tok = corpus[1]
        _MODELS[family] = (
            tiny_qwen3_vl(tok) if family == "qwen3_vl" else tiny_qwen2_5_vl(tok, family)
        )
    return _MODELS[family]


def _family_corpus(corpora, family):
    return corpora("qwen3-vl" if family == "qwen3_vl" else "qwen2-vl")


def _processor(family):
    return image_processor(QWEN3_PREPROCESSOR) if family == "qwen3_vl" else image_processor()


def _alone(model, sample, reader, processor):
    """Per-token losses of one sample run alone, positions from the model's get_rope_index."""
    ids = torch.tensor(sample["input_ids"])[None]
    media = json.loads(sample["media"])
    kwargs = {}
    if media:
        out = processor(
            images=[reader.image(m["ref"], m["hash"]) for m in media], return_tensors="pt"
        )
        kwargs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    kwargs["mm_token_type_ids"] = (ids == model.config.image_token_id).to(torch.int32)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False, **kwargs).logits[0]
    labels = torch.tensor(sample["labels"])
    return _token_losses(logits, labels)


def _token_losses(logits, labels):
    losses = torch.nn.functional.cross_entropy(
        logits[:-1], labels[1:].clamp(min=0), reduction="none"
    )
    return torch.where(labels[1:] == -100, torch.zeros_like(losses), losses)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_positions_equal_get_rope_index_on_each_sample(corpora, family):
    corpus = _family_corpus(corpora, family)
    model = _model(corpus, family)
    _, _, samples = corpus
    with_images = 0
    for sample in samples:
        media = json.loads(sample["media"])
        ids = torch.tensor(sample["input_ids"])[None]
        ours = sample_positions(len(sample["input_ids"]), media, merge_size=2)
        if not media:
            assert (ours == np.arange(len(sample["input_ids"]))).all()
            continue
        with_images += 1
        theirs, _ = model.model.get_rope_index(
            ids,
            mm_token_type_ids=(ids == model.config.image_token_id).to(torch.int32),
            image_grid_thw=torch.tensor([m["grid"] for m in media]),
        )
        assert np.array_equal(ours, theirs[:, 0].numpy())
    assert with_images > 10


def test_packed_positions_restart_per_segment():
    media = [[], [{"grid": [1, 4, 6], "span": [2, 6]}]]
    pos = packed_positions([3, 10], media, merge_size=2)
    assert pos.shape == (4, 13)
    assert pos[0].tolist() == [0, 1, 2] + list(range(10))
    assert pos[1].tolist() == [0, 1, 2] + [0, 1] + [2] * 6 + [5, 6]
    assert pos[2].tolist() == [0, 1, 2] + [0, 1] + [2, 2, 2, 3, 3, 3] + [5, 6]
    assert pos[3].tolist() == [0, 1, 2] + [0, 1] + [2, 3, 4, 2, 3, 4] + [5, 6]


@pytest.mark.parametrize(
    "family, context",
    [("qwen2_5_vl", "fork"), ("qwen2_5_vl", "spawn"), ("qwen2_vl", "fork"), ("qwen3_vl", "fork")],
)
def test_packed_losses_equal_each_sample_alone(corpora, family, context):
    corpus = _family_corpus(corpora, family)
    model = _model(corpus, family)
    root, _, samples = corpus
    ds = PackedDataset(root / "packed")
    processor = _processor(family)
    collator = MultimodalCollator(processor)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=1, num_workers=2, collate_fn=collator, multiprocessing_context=context
    )
    reader = MediaReader()
    alone = {}
    checked = multi = 0
    for i, batch in enumerate(loader):
        row = ds[i]
        assert batch["position_ids"].shape == (4, 1, batch["input_ids"].shape[1])
        n_images = sum(len(json.loads(m)) for m in row["media"])
        assert batch.get("image_grid_thw", torch.zeros(0, 3)).shape[0] == n_images
        logits, plain = packed_logits(model, batch)
        packed = _token_losses(logits, batch["labels"][0])
        packed_plain = _token_losses(plain, batch["labels"][0])
        offset = 0
        for sid, n in zip(row["sample_ids"].tolist(), row["seq_lengths"].tolist()):
            if sid not in alone:
                alone[sid] = _alone(model, samples[sid], reader, processor)
            mine = packed[offset : offset + n - 1]
            assert torch.allclose(mine, alone[sid], rtol=0, atol=1e-9), sid
            if json.loads(samples[sid]["media"]) and alone[sid].abs().sum() > 0:
                plain_part = packed_plain[offset : offset + n - 1]
                assert not torch.allclose(plain_part, alone[sid], rtol=0, atol=1e-6)
            offset += n
            checked += 1
        multi += len(row["sample_ids"]) > 1 and n_images > 1
    assert checked == len(samples) and multi >= 3


@pytest.mark.parametrize(
    "overlong, strategy", [("split", "bfd"), ("truncate", "bfd"), ("split", "random")]
)
def test_pack_cut_samples_train_exactly_as_their_pieces_alone(corpus, tmp_path, overlong, strategy):
    """Samples pack cut at max_len (truncate / split, at safe boundaries, each piece with its
    own images and rebased spans), or that the random strategy cuts at row ends (at safe
    boundaries too): every segment's packed losses are its piece's alone."""
    model = _model(corpus, "qwen2_5_vl")
    root, _, samples = corpus
    max_len = sorted(s["length"] for s in samples)[len(samples) // 3]
    out = tmp_path / overlong
    figures = pack_files(
        root / "tokens", out, max_len, overlong=overlong, strategy=strategy, seed=2
    )["figures"]
    assert figures["samples_truncated" if overlong == "truncate" else "samples_split"] > 0
    ds = PackedDataset(out)
    processor = image_processor()
    collator = MultimodalCollator(processor)
    reader = MediaReader()
    cut_with_images = 0
    for i in range(len(ds)):
        row = ds[i]
        batch = collator([row])
        kwargs = model_inputs(batch)
        with torch.no_grad():
            logits = model(**kwargs, use_cache=False).logits[0]
        packed = _token_losses(logits, batch["labels"][0])
        offset = 0
        segments = zip(row["sample_ids"].tolist(), row["seq_lengths"].tolist(), row["media"])
        for sid, n, media in segments:
            piece = {
                "input_ids": row["input_ids"][offset : offset + n].tolist(),
                "labels": row["labels"][offset : offset + n].tolist(),
                "media": media,
            }
            alone = _alone(model, piece, reader, processor)
            assert torch.allclose(packed[offset : offset + n - 1], alone, rtol=0, atol=1e-9), sid
            cut_with_images += n < samples[sid]["length"] and json.loads(media) != []
            offset += n
    assert cut_with_images > 0


def test_missing_or_corrupt_media_is_an_error_naming_the_file(tmp_path):
    tok = build_vl_tokenizer(tmp_path / "tok")
    write_image(tmp_path / "a.png", (80, 80), seed=0)
    write_image(tmp_path / "b.png", (80, 80), seed=1)
    user = [{"type": "image"}, {"type": "text", "text": "what"}]
    records = [
        {
            "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "x"}],
            "images": [name],
        }
        for name in ("a.png", "b.png")
    ]
    tokenize_files(write_jsonl(tmp_path / "c.jsonl", records), tmp_path / "t", tok, vision=tok)
    pack_files(tmp_path / "t", tmp_path / "p", 400)
    ds = PackedDataset(tmp_path / "p")
    collator = MultimodalCollator(image_processor())
    batch = collator([ds[0]])
    assert batch["image_grid_thw"].shape == (2, 3) and batch["position_ids"].shape[0] == 4
    three = MultimodalCollator(image_processor(), mrope_rows=3)([ds[0]])["position_ids"]
    assert torch.equal(three, batch["position_ids"][1:])
    (tmp_path / "b.png").unlink()
    with pytest.raises(InputNotFoundError, match="b.png"):
        collator([ds[0]])
    (tmp_path / "b.png").write_bytes(b"garbage")
    with pytest.raises(DataError, match="b.png: the image changed"):
        collator([ds[0]])
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=1, collate_fn=collator)
    with pytest.raises(DataError, match="b.png"):
        next(iter(loader))
    other = MultimodalCollator(
        image_processor({"min_pixels": 28 * 28 * 16, "max_pixels": 28 * 28 * 40})
    )
    (tmp_path / "b.png").unlink()
    write_image(tmp_path / "b.png", (80, 80), seed=1)
    with pytest.raises(DataError, match="a.png: the image processor gives grid"):
        other([ds[0]])


def test_streaming_reader_batches(corpus):
    """PackedIterableDataset with the collator in two workers: every row once, each batch's
    pixels matching its grids and its image pads."""
    from tokpack.torch import PackedIterableDataset

    root, _, samples = corpus
    ds = PackedIterableDataset(
        root / "packed", batch_rows=2, collate_fn=MultimodalCollator(image_processor())
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    images = 0
    for batch in loader:
        grids = batch.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
        if len(grids):
            assert batch["pixel_values"].shape[0] == int(grids.prod(dim=1).sum())
        assert batch["position_ids"].shape == (4, 1, batch["input_ids"].shape[1])
        images += len(grids)
    assert images == sum(len(json.loads(s["media"])) for s in samples)


def test_a_row_cut_inside_an_image_is_refused(corpus):
    """Rows that cut a sample inside an image (which tokpack.pack_files never does: a row built
    by hand, or by another packer) are refused by the collator, naming row and image."""
    _, _, samples = corpus
    sample = next(s for s in samples if s["vision_tokens"] > 4)
    start, n = json.loads(sample["media"])[0]["span"]
    cut = start + n // 2
    row = {
        "input_ids": torch.tensor(sample["input_ids"][:cut]),
        "labels": torch.tensor(sample["labels"][:cut]),
        "seq_lengths": torch.tensor([cut]),
        "media": [sample["media"]],
    }
    with pytest.raises(DataError, match="row 0, segment 0: the sample was cut inside its image 0"):
        MultimodalCollator(image_processor())([row])
    before = start - 1  # a cut right before the image's vision_start keeps no image
    batch = MultimodalCollator(image_processor())(
        [
            {
                **row,
                "input_ids": row["input_ids"][:before],
                "labels": row["labels"][:before],
                "seq_lengths": torch.tensor([before]),
            }
        ]
    )
    assert "pixel_values" not in batch and batch["position_ids"].shape == (4, 1, before)
