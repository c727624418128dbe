"""Multimodal token shards through every other entry point: each either carries the images
right or refuses in one explicit check (ConfigError naming the path and what to use instead),
never a row with image tokens and no images."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

import tokpack  # noqa: E402
from tests._vl_factory import vl_token_shards  # noqa: E402
from tokpack import ConfigError  # noqa: E402
from tokpack.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Multimodal token shards, a packed directory of them, and a text packed directory."""
    root = tmp_path_factory.mktemp("vl-joins")
    _, samples = vl_token_shards(root, 24, seed=3)
    max_len = max(s["length"] for s in samples) + 20
    tokpack.pack_files(root / "tokens", root / "packed", max_len, row_group_rows=4)
    (text,) = tokpack.synthetic.write_token_shards(root / "text", 30, n_files=1, max_length=60)
    tokpack.pack_files(text, root / "text-packed", max_len)
    return root, samples, max_len


def test_pack_tokens_refuses_a_multimodal_table(corpus):
    """Failed before: packed the ids in memory and returned rows without their images."""
    root, _, max_len = corpus
    table = pq.read_table(sorted((root / "tokens").glob("part-*.parquet")))
    with pytest.raises(ConfigError, match=r"tokpack.pack_tokens .* use tokpack.pack_files"):
        tokpack.pack_tokens(table, max_len)
    # A plain token table is packed as before.
    assert tokpack.pack_tokens(table.select(["input_ids", "labels"]), max_len).num_rows > 0


@pytest.mark.parametrize("target, dest", [("megatron", "out/data"), ("nemo", "out.idx.parquet")])
def test_export_refuses_multimodal_rows(corpus, tmp_path, capsys, target, dest):
    """Failed before: exported the token ids and lost every image, silently."""
    root, _, _ = corpus
    assert main(["export", target, str(root / "packed"), str(tmp_path / dest)]) == 2
    err = capsys.readouterr().err
    assert "multimodal data" in err and "MultimodalCollator" in err, err
    assert not list(tmp_path.iterdir())
    export = tokpack.export_megatron if target == "megatron" else tokpack.export_nemo_packed
    with pytest.raises(ConfigError, match="multimodal data"):
        export(root / "packed", tmp_path / dest)
    assert main(["export", target, str(root / "text-packed"), str(tmp_path / dest)]) == 0


def test_pairs_layouts_refuse_multimodal_shards(corpus, tmp_path):
    root, _, max_len = corpus
    with pytest.raises(ConfigError, match="pair_layout"):
        tokpack.pack_files(root / "tokens", tmp_path / "p", max_len, pair_layout="shared-prompt")


def test_carry_adds_to_the_media_columns(corpus, tmp_path):
    """--carry with multimodal shards: the media columns come first, then the asked ones."""
    root, samples, max_len = corpus
    out = tmp_path / "c"
    code = main(
        ["pack", str(root / "tokens"), "-o", str(out), "--max-len", str(max_len), "--quiet"]
        + ["--carry", "length"]
    )
    assert code == 0
    manifest = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    assert manifest["config"]["carry"] == ["media", "vision_tokens", "vision_patches", "length"]
    rows = pq.read_table(sorted(out.glob("part-*.parquet"))).to_pylist()
    for row in rows:
        for sid, media, n in zip(row["sample_ids"], row["media"], row["length"]):
            assert (media, n) == (samples[sid]["media"], samples[sid]["length"])


def test_mixture_of_multimodal_and_text_directories(corpus):
    """Failed before: the mixture kept only the columns every source has, so the multimodal
    rows lost their media (silently without a collator; the multimodal collator refused every
    batch). Text rows now carry empty media per segment: one collator takes both."""
    torch = pytest.importorskip("torch")
    from tests._vl_factory import image_processor
    from tokpack.torch import MultimodalCollator, PackedMixture

    root, samples, _ = corpus
    sources = {"vl": root / "packed", "text": root / "text-packed"}
    plain = PackedMixture(sources, {"vl": 0.5, "text": 0.5}, batch_rows=2, seed=1)
    images = {0: 0, 1: 0}
    for batch in plain:
        for src, media in zip(batch["sources"], batch["media"]):
            images[src] += sum(len(json.loads(m)) for m in media)
    assert images[0] > 0 and images[1] == 0
    ds = PackedMixture(
        sources,
        {"vl": 0.5, "text": 0.5},
        batch_rows=2,
        seed=1,
        collate_fn=MultimodalCollator(image_processor()),
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    grids = 0
    for batch in loader:
        assert batch["position_ids"].shape == (4, 1, batch["input_ids"].shape[1])
        grids += len(batch.get("image_grid_thw", ()))
    assert grids > 0


def test_multimodal_rows_from_object_storage_through_workers(corpus, s3, tmp_path):
    """Pack onto S3 (filesystem=), then read the rows back through the range cache in two
    DataLoader workers with the multimodal collator: the same images, grids and positions as
    the local directory gives."""
    torch = pytest.importorskip("torch")
    from tests._vl_factory import image_processor
    from tokpack.torch import MultimodalCollator, PackedIterableDataset

    root, _, max_len = corpus
    prefix = "tokpack-test/vl-joins"
    m = tokpack.pack_files(
        root / "tokens", prefix, max_len, row_group_rows=4, filesystem=s3, strategy="random"
    )
    local = tokpack.pack_files(
        root / "tokens", tmp_path / "local", max_len, row_group_rows=4, strategy="random"
    )
    assert [s["checksum"] for s in m["shards"]] == [s["checksum"] for s in local["shards"]]

    def batches(path, **kw):
        ds = PackedIterableDataset(
            path,
            batch_rows=2,
            seed=4,
            rank=0,
            world_size=1,
            collate_fn=MultimodalCollator(image_processor()),
            **kw,
        )
        out = []
        for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
            out.append({k: v for k, v in b.items() if isinstance(v, torch.Tensor)})
        return out

    from tokpack.multimodal import row_vision_patches
    from tokpack.remote import open_packed

    on_s3 = open_packed(prefix, filesystem=s3, cache_dir=tmp_path / "cache")
    assert (row_vision_patches(on_s3) == row_vision_patches(tmp_path / "local")).all()
    assert m["figures"]["vision_patches"] == local["figures"]["vision_patches"] > 0
    remote = batches(prefix, filesystem=s3, cache_dir=tmp_path / "cache")
    here = batches(tmp_path / "local")
    assert len(remote) == len(here) > 0
    assert sum(len(b.get("image_grid_thw", ())) for b in here) > 0
    for a, b in zip(remote, here):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
