"""The written row order (``PackConfig.row_order``): ``"shuffled"`` rows are the planned rows in a
seeded permutation, on every path; ``"plan"`` keeps the planner's order. And the shuffle-quality
figure of ``tokpack.shuffle_quality`` / ``tokpack inspect``."""

from __future__ import annotations

import inspect
import math
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack import ConfigError, PackConfig
from tokpack._contract import ROW_ORDERS
from tokpack.cli import main
from tokpack.packed.reader import PackedDir
from tokpack.packed.shuffle_quality import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_SHUFFLE_WINDOW,
    batch_figures,
    lag1_autocorrelation,
    reader_order,
    shuffle_quality,
)
from tokpack.synthetic import write_token_shards

from .test_pack_pairs import gen_pairs, write_pairs


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("row-order-corpus")
    return write_token_shards(d, 3000, n_files=2, max_length=700, row_group_rows=400, seed=5)


def _rows(out: Path):
    """Every packed row (all columns) in file order."""
    files = sorted(Path(out).glob("part-*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def _key(row) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(row.items()))


def _pack(shards, out, **kw):
    kw.setdefault("rows_per_shard", 70)
    kw.setdefault("row_group_rows", 16)
    return tokpack.pack_files(shards, out, 512, overlong="split", **kw)


def test_shuffled_rows_are_the_planned_rows_permuted(shards, tmp_path):
    plan_m = _pack(shards, tmp_path / "plan", row_order="plan")
    shuf_m = _pack(shards, tmp_path / "shuffled")
    assert shuf_m["config"]["row_order"] == "shuffled" and plan_m["config"]["row_order"] == "plan"
    planned, shuffled = _rows(tmp_path / "plan"), _rows(tmp_path / "shuffled")
    assert sorted(map(_key, planned)) == sorted(map(_key, shuffled))
    assert [r["sample_ids"] for r in planned] != [r["sample_ids"] for r in shuffled]
    # Everything the manifest adds up is the same; both pass the full check.
    for name in ("rows", "tokens", "loss_tokens", "samples_packed", "samples_split"):
        assert plan_m["figures"][name] == shuf_m["figures"][name]
    for out in ("plan", "shuffled"):
        tokpack.verify(tmp_path / out)
    # Plan order is best-fit decreasing's: the row holding the longest segment comes first.
    longest = max(max(r["seq_lengths"]) for r in planned)
    assert planned[0]["seq_lengths"][0] == longest


def test_row_order_is_the_plan_functions_row_order(shards):
    table = pq.read_table(shards[0])
    lengths = [len(x) for x in table.column("input_ids").to_pylist()]
    planned = tokpack.plan(lengths, 512, overlong="split", row_order="plan")
    shuffled = tokpack.plan(lengths, 512, overlong="split")
    assert shuffled.row_order == "shuffled" and planned.row_order == "plan"
    assert "row_order='shuffled'" in repr(shuffled)
    rows = lambda p: [tuple(map(tuple, p.row(r))) for r in range(p.n_bins)]  # noqa: E731
    assert sorted(rows(planned)) == sorted(rows(shuffled)) and rows(planned) != rows(shuffled)
    # pack_tokens writes the rows of its plan, in its order.
    packed, plan = tokpack.pack_tokens(table, 512, overlong="split", return_plan=True)
    assert plan.row_order == "shuffled"
    assert packed.column("sample_ids").to_pylist() == [
        list(plan.row(r)[0]) for r in range(len(plan))
    ]
    ids = table.column("input_ids").to_pylist()
    for row, seg_ids, seg_lens in zip(
        packed.column("input_ids").to_pylist()[:20],
        packed.column("sample_ids").to_pylist(),
        packed.column("seq_lengths").to_pylist(),
    ):
        assert len(row) == sum(seg_lens) and all(
            len(ids[s]) >= n for s, n in zip(seg_ids, seg_lens)
        )


@pytest.mark.parametrize("threads", [1, 3])
def test_same_seed_same_bytes_whatever_the_thread_count(shards, tmp_path, threads):
    a = _pack(shards, tmp_path / "a", threads=threads, seed=4)
    b = _pack(shards, tmp_path / "b", threads=2, seed=4)
    assert [s["checksum"] for s in a["shards"]] == [s["checksum"] for s in b["shards"]]
    assert [s["index_checksum"] for s in a["shards"]] == [s["index_checksum"] for s in b["shards"]]


def test_the_seed_changes_the_order_not_the_rows(shards, tmp_path):
    _pack(shards, tmp_path / "s0")
    _pack(shards, tmp_path / "s1", seed=1)
    a, b = _rows(tmp_path / "s0"), _rows(tmp_path / "s1")
    assert sorted(map(_key, a)) == sorted(map(_key, b))
    assert [r["sample_ids"] for r in a] != [r["sample_ids"] for r in b]


def test_config_field_manifest_and_cli(shards, tmp_path, capsys):
    assert ROW_ORDERS == ("shuffled", "plan")
    c = PackConfig(64)
    assert c.row_order == "shuffled" and c.to_dict()["row_order"] == "shuffled"
    assert PackConfig.from_dict(c.replace(row_order="plan").to_dict()).row_order == "plan"
    # A manifest written before the field existed was packed in plan order.
    legacy = {k: v for k, v in c.to_dict().items() if k != "row_order"}
    assert PackConfig.from_dict(legacy).row_order == "plan"
    with pytest.raises(ConfigError, match='unknown row order "sorted"'):
        PackConfig(64, row_order="sorted")
    # The cache key holds it: another order is a rebuild, the same one a cache hit.
    first = _pack(shards, tmp_path / "o")
    again = _pack(shards, tmp_path / "o")
    other = _pack(shards, tmp_path / "o", row_order="plan")
    assert not first["cache_hit"] and again["cache_hit"] and not other["cache_hit"]
    args = ["pack", *map(str, shards), "-o", str(tmp_path / "cli"), "--max-len", "512"]
    assert main([*args, "--overlong", "split", "--row-order", "plan", "--quiet"]) == 0
    tokpack.verify(tmp_path / "cli")
    assert PackedDir(tmp_path / "cli").manifest["config"]["row_order"] == "plan"
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "cli"), "--rows", "0"]) == 0
    shown = capsys.readouterr().out
    assert "row order plan" in shown and "shuffle quality" in shown
    assert "reader, shuffle_window=4" in shown and "random permutation" in shown


def test_pairs_and_kto_rows_are_permuted_whole(tmp_path):
    src = write_pairs(tmp_path / "p.parquet", gen_pairs(random.Random(3), 300), source=["s"] * 300)
    for layout in ("separate", "shared-prompt"):
        outs = {}
        for order in ROW_ORDERS:
            out = tmp_path / f"{layout}-{order}"
            kw = dict(pair_layout=layout, row_order=order, carry=["source"], rows_per_shard=40)
            tokpack.pack_files(src, out, 200, **kw)
            tokpack.verify(out)
            outs[order] = _rows(out)
        assert sorted(map(_key, outs["plan"])) == sorted(map(_key, outs["shuffled"]))
        assert outs["plan"] != outs["shuffled"]


def test_carried_columns_follow_their_rows(tmp_path):
    rng = np.random.default_rng(2)
    ids = [rng.integers(1, 900, size=int(n)).tolist() for n in rng.integers(1, 90, size=400)]
    table = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "tag": list(range(400))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=64)
    tokpack.pack_files(tmp_path / "t.parquet", tmp_path / "out", 128, carry=["tag"])
    for row in _rows(tmp_path / "out"):
        assert row["tag"] == row["sample_ids"]
        assert row["seq_lengths"] == [len(ids[s]) for s in row["sample_ids"]]


# -- the shuffle-quality figure ------------------------------------------------------------------


def test_lag1_autocorrelation_on_known_series():
    assert lag1_autocorrelation([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(0.625)
    assert lag1_autocorrelation([1, -1] * 50) == pytest.approx(-0.99)
    assert math.isnan(lag1_autocorrelation([3.0] * 10)) and math.isnan(lag1_autocorrelation([1, 2]))
    noise = np.random.default_rng(0).standard_normal(20_000)
    assert abs(lag1_autocorrelation(noise)) < 2 / math.sqrt(20_000)


def test_batch_figures():
    tokens = np.array([10, 20, 30, 40])
    segments = np.array([1, 2, 3, 4])
    seg, length = batch_figures(tokens, segments, np.array([3, 0, 1, 2, 0]), 2)
    assert seg.tolist() == [2.5, 2.5] and length.tolist() == [10.0, 10.0]


@pytest.fixture(scope="module")
def sorted_and_shuffled(tmp_path_factory):
    """A corpus of many short and a few long samples packed at 256 in both orders."""
    d = tmp_path_factory.mktemp("quality")
    rng = np.random.default_rng(1)
    lengths = np.concatenate([rng.integers(5, 40, 6000), rng.integers(150, 256, 1500)])
    ids = [np.full(int(n), 7, np.int32) for n in rng.permutation(lengths)]
    pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32()))}), d / "c.parquet")
    outs = {}
    for order in ROW_ORDERS:
        outs[order] = d / order
        tokpack.pack_files(d / "c.parquet", outs[order], 256, row_order=order, row_group_rows=64)
    return outs


def test_quality_figure_tells_sorted_from_shuffled(sorted_and_shuffled):
    planned = shuffle_quality(sorted_and_shuffled["plan"], batch_rows=8)
    shuffled = shuffle_quality(sorted_and_shuffled["shuffled"], batch_rows=8)
    band = planned.noise
    assert planned.batches == shuffled.batches > 100
    # Plan order (best-fit decreasing): long-sample rows first, then the many-short ones.
    assert planned.orders["file order"][0] > 0.8 and planned.orders["file order"][1] > 0.8
    for name, (seg, length) in shuffled.orders.items():
        assert abs(seg) < band and abs(length) < band, name
    assert abs(planned.orders["random permutation"][0]) < band
    # Shuffling within windows of 4 row groups leaves sorted rows correlated.
    assert planned.orders[f"reader, shuffle_window={DEFAULT_SHUFFLE_WINDOW}"][0] > 0.3
    # A window over every row group is a full shuffle.
    n_groups = PackedDir(sorted_and_shuffled["plan"]).num_groups
    whole = shuffle_quality(sorted_and_shuffled["plan"], windows=[n_groups])
    assert abs(whole.orders[f"reader, shuffle_window={n_groups}"][0]) < band
    with pytest.raises(ConfigError, match="batch_rows"):
        shuffle_quality(sorted_and_shuffled["plan"], batch_rows=0)


def test_reader_order_is_the_iterable_datasets_order(sorted_and_shuffled):
    torch = pytest.importorskip("torch")
    from tokpack.torch import PackedIterableDataset

    params = inspect.signature(PackedIterableDataset).parameters
    assert params["shuffle_window"].default == DEFAULT_SHUFFLE_WINDOW
    path = sorted_and_shuffled["plan"]
    packed = PackedDir(path)
    ds = PackedIterableDataset(path, batch_rows=DEFAULT_BATCH_ROWS, seed=3, shuffle_window=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    got = [[int(s[0]) for s in batch["sample_ids"]] for batch in loader]
    order = reader_order(packed, shuffle_window=2, seed=3)
    firsts = []
    for g in range(packed.num_groups):
        values, offsets = packed.decode(g, ["sample_ids"])["sample_ids"]
        firsts.append(values[offsets[:-1]])
    first_ids = np.concatenate(firsts)
    expected = first_ids[order].reshape(-1).tolist()
    assert [s for batch in got for s in batch] == expected
