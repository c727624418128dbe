"""The vision-encoder cost of packed multimodal rows: the patches of each row's images, in the
manifest (total, heaviest row), in ``tokpack inspect`` (the per-row distribution), from the
reader (one figure per row) and as the third coefficient of the readers' balance cost."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("PIL")
pytest.importorskip("transformers")

import tokpack  # noqa: E402
from tests._vl_factory import vl_token_shards  # noqa: E402
from tokpack import ConfigError  # noqa: E402
from tokpack.balance.packed import row_compute  # noqa: E402
from tokpack.cli import main  # noqa: E402
from tokpack.multimodal.stats import row_patch_figures, row_vision_patches  # noqa: E402
from tokpack.remote import open_packed  # noqa: E402


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl-cost")
    _, samples = vl_token_shards(root, 40, seed=8)
    max_len = max(s["length"] for s in samples) + 60
    manifest = tokpack.pack_files(root / "tokens", root / "packed", max_len, row_group_rows=3)
    return root / "packed", samples, manifest


def _by_hand(out):
    """Each row's patches (the readers' row order: shards in order), from the shards."""
    rows = pq.read_table(sorted(out.glob("part-*.parquet"))).to_pylist()
    return np.array([sum(r["vision_patches"]) for r in rows], dtype=np.int64), rows


def test_manifest_records_the_total_and_the_heaviest_row(packed):
    """Failed before: the manifest had no vision figure (the schema check runs on it too)."""
    out, samples, manifest = packed
    per_row, rows = _by_hand(out)
    figures = manifest["figures"]
    assert figures["vision_patches"] == sum(s["vision_patches"] for s in samples) > 0
    assert figures["vision_patches_max_row"] == per_row.max()
    for row in rows:  # each segment's patches are its images' t*h*w
        for media, vp in zip(row["media"], row["vision_patches"]):
            assert vp == sum(int(np.prod(m["grid"])) for m in json.loads(media))


def test_text_outputs_have_no_vision_figures(tmp_path):
    (shard,) = tokpack.synthetic.write_token_shards(tmp_path / "t", 20, n_files=1, max_length=50)
    figures = tokpack.pack_files(shard, tmp_path / "p", 64)["figures"]
    assert "vision_patches" not in figures
    with pytest.raises(ConfigError, match="no per-segment column 'vision_patches'"):
        row_vision_patches(tmp_path / "p")
    with pytest.raises(ConfigError, match="not multimodal"):
        row_compute(open_packed(tmp_path / "p"), (1.0, 0.0, 2.0))
    assert len(row_compute(open_packed(tmp_path / "p"), (1.0, 0.0, 0.0))) > 0


def test_reader_gives_each_rows_patches(packed):
    out, _, _ = packed
    per_row, _ = _by_hand(out)
    assert np.array_equal(row_vision_patches(out), per_row)
    pytest.importorskip("torch")
    from tokpack.torch import PackedDataset

    ds = PackedDataset(out)
    assert [int(ds[i]["vision_patches"].sum()) for i in range(len(ds))] == per_row.tolist()
    assert np.array_equal(row_vision_patches(ds.packed), per_row)


def test_inspect_shows_the_per_row_distribution(packed, capsys):
    out, _, _ = packed
    per_row, _ = _by_hand(out)
    assert main(["inspect", str(out), "--rows", "0"]) == 0
    text = capsys.readouterr().out
    assert "vision-encoder patches per row" in text
    f = row_patch_figures(per_row)
    assert f["max"] == per_row.max() and f["min"] == per_row.min()
    assert f["imbalance"] == pytest.approx(per_row.max() / per_row.mean())
    assert f"{f['max']:,}" in text and f"{f['imbalance']:.2f}x" in text


def test_balance_takes_the_patches_as_a_third_cost(packed):
    out, _, _ = packed
    packed_dir = open_packed(out)
    per_row = row_vision_patches(packed_dir)
    tokens = row_compute(packed_dir, "tokens")
    assert np.array_equal(row_compute(packed_dir, (1.0, 0.0, 3.0)), tokens + 3.0 * per_row)
    assert np.array_equal(row_compute(packed_dir, (0.0, 0.0, 1.0)), per_row.astype(float))
    with pytest.raises(ConfigError, match="vision-encoder patch"):
        row_compute(packed_dir, (1.0, 0.0, -1.0))
    with pytest.raises(ConfigError):
        tokpack.balance.micro_batches(np.array([3, 4]), 8, cost=(1.0, 0.0, 1.0))
    torch = pytest.importorskip("torch")
    from tokpack.torch import PackedBatchSampler, PackedDataset

    ds = PackedDataset(out)
    sampler = PackedBatchSampler(
        ds, batch_rows=2, world_size=2, rank=0, balance="compute", cost=(0.0, 0.0, 1.0)
    )
    assert np.array_equal(sampler._compute, per_row.astype(float))
    assert sum(1 for _ in sampler) > 0
    del torch
