"""The planner's static-shape options (issue 38): ``max_segments_per_row`` (a hard cap of every
strategy) and ``align_segments`` (segments planned on their lengths rounded up), through
``PackConfig``, ``plan``, ``pack_files``, the manifest, the CLI and ``stats``."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack import PackConfig, packing_stats, plan
from tokpack.cli import main
from tokpack.errors import ConfigError
from tokpack.pack.plan import STRATEGIES
from tokpack.stats.estimate import segments_histogram
from tokpack.synthetic import sft_lengths


def write_lengths(path, lengths):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = (np.arange(int(offsets[-1])) % 1000 + 1).astype(np.int32)
    pq.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, tokens)}), path)
    return path


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_row_over_the_cap_and_each_sample_once(strategy):
    lengths = np.random.default_rng(0).integers(1, 40, 3000)
    p = plan(lengths, 512, strategy=strategy, max_segments_per_row=5, overlong="split")
    assert np.diff(p.bin_offsets).max() <= 5
    assert np.array_equal(np.bincount(p.sample_ids, minlength=3000), np.ones(3000))
    assert p.n_bins >= plan(lengths, 512, strategy=strategy).n_bins


@pytest.mark.parametrize("strategy", ["bfd", "ffd"])
def test_cap_32_at_4096_costs_at_most_a_thousandth_of_the_rows(strategy):
    # The goal on the bench's fixed corpus (benches/bench_static.py): greedy capped
    # placement cost 1.67 % more rows here; planning uncapped, then swapping the short samples
    # out of the rows over the cap, costs a few rows in 30,000.
    lengths = sft_lengths(200_000, seed=0, max_length=32768)
    base = plan(lengths, 4096, strategy=strategy, overlong="split")
    capped = plan(lengths, 4096, strategy=strategy, overlong="split", max_segments_per_row=32)
    assert np.diff(capped.bin_offsets).max() <= 32
    assert np.array_equal(np.sort(capped.sample_ids), np.sort(base.sample_ids))
    assert capped.n_bins - base.n_bins <= 0.001 * base.n_bins


def test_aligned_plan_keeps_real_lengths_and_fits_rows_aligned():
    lengths = np.random.default_rng(1).integers(1, 300, 2000)
    p = plan(lengths, 1024, align_segments=64)
    assert np.array_equal(np.sort(p.lengths), np.sort(lengths))
    aligned = -(-p.lengths // 64) * 64
    row_footprint = np.add.reduceat(aligned, p.bin_offsets[:-1])
    assert row_footprint.max() <= 1024
    assert p.n_bins >= plan(lengths, 1024).n_bins


def test_unset_options_leave_the_config_dict_unchanged():
    # The cache key and the manifest of a pack without them stay what they were.
    d = PackConfig(4096).to_dict()
    assert "max_segments_per_row" not in d and "align_segments" not in d
    c = PackConfig(4096, max_segments_per_row=32, align_segments=128)
    assert c.to_dict()["max_segments_per_row"] == 32 and c.to_dict()["align_segments"] == 128
    assert PackConfig.from_dict(c.to_dict()) == c
    assert c.replace(max_segments_per_row=None, align_segments=1).to_dict() == d


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(max_segments_per_row=0), "max_segments_per_row must be at least 1"),
        (dict(align_segments=0), "align_segments must be at least 1"),
        (dict(align_segments=100), "pass max_len=4000"),
        (dict(align_segments=16, strategy="random"), 'strategy "random" cuts samples'),
    ],
)
def test_impossible_options_are_refused_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        PackConfig(4096, **fields)


def test_manifest_records_the_options_and_their_figures(tmp_path):
    src = write_lengths(tmp_path / "t.parquet", sft_lengths(800, seed=2, max_length=900))
    out = tmp_path / "out"
    tokpack.pack_files([src], out, max_len=1024, max_segments_per_row=4, align_segments=64)
    m = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    assert m["config"]["max_segments_per_row"] == 4 and m["config"]["align_segments"] == 64
    assert 1 <= m["figures"]["max_row_segments"] <= 4
    assert m["figures"]["alignment_padding_tokens"] > 0
    # The rows store the segments unpadded: loss tokens are the unaligned pack's.
    plain = tmp_path / "plain"
    tokpack.pack_files([src], plain, max_len=1024)
    p = json.loads((plain / "__tokpack__" / "_manifest.json").read_text())
    assert m["figures"]["loss_tokens"] == p["figures"]["loss_tokens"]
    assert "max_row_segments" not in p["figures"] and "max_segments_per_row" not in p["config"]


def test_preference_pairs_refuse_the_options(tmp_path):
    rows = {
        "chosen_input_ids": [[1, 2, 3, 4]],
        "rejected_input_ids": [[1, 2, 5]],
        "prompt_length": [2],
    }
    src = tmp_path / "p.parquet"
    pq.write_table(pa.table(rows), src)
    with pytest.raises(ConfigError, match="max_segments_per_row applies to SFT samples"):
        tokpack.pack_files([src], tmp_path / "o", max_len=64, max_segments_per_row=4)


def test_cli_takes_the_options_and_exits_2_on_a_bad_one(tmp_path, capsys):
    src = write_lengths(tmp_path / "t.parquet", [5, 7, 9, 11] * 20)
    assert (
        main(
            [
                "pack",
                str(src),
                "-o",
                str(tmp_path / "o"),
                "--max-len",
                "64",
                "--max-segments-per-row",
                "2",
                "--quiet",
            ]
        )
        == 0
    )
    m = json.loads((tmp_path / "o" / "__tokpack__" / "_manifest.json").read_text())
    assert m["figures"]["max_row_segments"] == 2
    code = main(
        [
            "pack",
            str(src),
            "-o",
            str(tmp_path / "x"),
            "--max-len",
            "100",
            "--align-segments",
            "64",
            "--quiet",
        ]
    )
    assert code == 2
    assert "pass max_len=64" in capsys.readouterr().err


def test_stats_reports_segments_per_row_and_what_each_cap_costs():
    lengths = np.full(640, 10)
    c = packing_stats(lengths, [640], segment_caps=[8, 64]).candidates[0]
    # bfd: ten rows of 64 segments; a cap of 8 needs 80 rows.
    assert c.max_row_segments == 64
    assert c.segments_histogram["33-64"] == 10
    assert c.capped_rows == {8: 80, 64: 10}
    assert c.cap_cost(8) == pytest.approx(7.0) and c.cap_cost(64) == 0.0


def test_segments_histogram_bins():
    assert segments_histogram(np.array([1, 2, 2, 5])) == {"1": 1, "2": 2, "3-4": 0, "5-8": 1}
