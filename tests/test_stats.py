"""``tokpack.packing_stats``, its advice, and ``tokpack stats`` (tables, JSON, plot, argument
checks)."""

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack import packing_stats, plan
from tokpack.cli import main
from tokpack.commands.stats import render
from tokpack.pack.plan import STRATEGIES
from tokpack.stats.estimate import MaxLenFigures, PackingStats, advice, default_max_lens
from tokpack.synthetic import sft_lengths, write_token_shards


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    write_token_shards(d, 3000, n_files=2, max_length=8192, row_group_rows=1000, seed=3)
    return d


def write_lengths(path, lengths):
    """A token shard whose samples have the given lengths."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = np.ones(int(offsets[-1]), dtype=np.int32)
    pq.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, tokens)}), path)
    return path


def figures(max_len, rows, efficiency=None, over=(0, 0, 0, 0), samples=10_000, tokens=10**7):
    """Constructed figures of one candidate: rows per strategy (missing ones as bfd's)."""
    rows = {s: rows.get(s, rows["bfd"]) for s in STRATEGIES}
    efficiency = {s: (efficiency or {}).get(s, 0.5) for s in STRATEGIES}
    n, t, beyond, pieces = over
    return MaxLenFigures(max_len, samples, tokens, n, t, beyond, pieces, rows, efficiency)


def constructed(*cands, overlong="split", batch_size=None):
    return PackingStats(
        samples=cands[0].samples,
        tokens=cands[0].tokens,
        empty=0,
        distribution={"min": 1, "median": 2, "mean": 2.0, "p90": 3, "p99": 4, "max": 5},
        overlong=overlong,
        batch_size=batch_size,
        candidates=tuple(cands),
    )


# --- advice, on constructed figures ---------------------------------------------------------


def test_advice_packs_when_bfd_saves_rows_whatever_the_padding_efficiency():
    # Issue (reliability 11): "Padding is fine ... uses 56% of the row capacity" was printed
    # next to padding 6,565 rows vs bfd 3,860.
    c = figures(4096, {"bfd": 3860, "padding": 6565}, {"bfd": 0.95, "padding": 0.56})
    first = advice(constructed(c))[0]
    assert first.startswith("Pack:") and "Padding is fine" not in first
    assert "3,860" in first and "6,565" in first and "41% fewer" in first


def test_advice_pads_when_bfd_saves_little():
    c = figures(4096, {"bfd": 9500, "padding": 10_000})
    assert advice(constructed(c))[0].startswith("Padding is fine")
    cands = [figures(m, {"bfd": 9500, "padding": 10_000}) for m in (1024, 2048)]
    assert advice(constructed(*cands))[0].startswith("Padding is fine")


def test_advice_names_the_candidates_where_packing_pays():
    cands = [
        figures(1024, {"bfd": 9500, "padding": 10_000}),
        figures(4096, {"bfd": 3000, "padding": 10_000}),
    ]
    first = advice(constructed(*cands))[0]
    assert (
        first.startswith("Pack at max_len 4,096,")
        and "(bfd vs padding: 5% fewer at 1,024, 70% fewer at 4,096)" in first
    )


def test_advice_trade_off_and_smallest_fitting_candidate():
    cands = [
        figures(1024, {"bfd": 4000, "padding": 10_000}, over=(800, 3_000_000, 2_000_000, 2400)),
        figures(2048, {"bfd": 2100, "padding": 10_000}, over=(90, 500_000, 300_000, 200)),
        figures(4096, {"bfd": 1100, "padding": 10_000}, over=(9, 90_000, 40_000, 18)),
        figures(8192, {"bfd": 600, "padding": 10_000}),
    ]
    lines = advice(constructed(*cands, overlong="truncate", batch_size=64))
    assert lines[1] == (
        "max_len 1,024: 4,000 bfd rows (63 steps at batch size 64); 800 samples (8.0%) holding "
        "30.0% of the tokens are truncated, losing 20.0% of the tokens."
    )
    assert lines[4] == "max_len 8,192: 600 bfd rows (10 steps at batch size 64), every sample fits."
    assert "max_len 4,096 (1,100 bfd rows, 0.9% of the tokens" in lines[-1]


def test_advice_when_no_candidate_fits():
    c = figures(1024, {"bfd": 4000, "padding": 10_000}, over=(800, 3_000_000, 2_000_000, 2400))
    assert "consider a larger max_len" in advice(constructed(c, overlong="drop"))[-1]
    assert "are dropped." in advice(constructed(c, overlong="drop"))[1]


# --- the figures ----------------------------------------------------------------------------


@pytest.mark.parametrize("overlong", ["split", "truncate", "drop"])
def test_figures_match_plans_and_brute_force(overlong):
    lengths = sft_lengths(4000, seed=11)
    stats = packing_stats(lengths, [512, 2048, 3000], overlong=overlong, batch_size=7)
    assert [c.max_len for c in stats.candidates] == [512, 2048, 3000]
    assert stats.samples == 4000 and stats.tokens == int(lengths.sum())
    for c in stats.candidates:
        over = lengths[lengths > c.max_len].astype(np.int64)
        assert c.over_samples == len(over) and c.over_tokens == int(over.sum())
        assert c.beyond_tokens == int((over - c.max_len).sum())
        assert c.split_pieces == sum(-(-int(x) // c.max_len) for x in over)
        for s in STRATEGIES:
            p = plan(lengths, c.max_len, strategy=s, overlong=overlong)
            assert (c.rows[s], c.efficiency[s]) == (p.n_bins, p.efficiency)
            assert stats.steps(c.rows[s]) == -(-p.n_bins // 7)


def test_default_max_lens_follow_the_tail():
    # A heavy-tailed chat corpus (p99 ~3k, max ~27k) gets 1,024 .. 8,192.
    lengths = np.concatenate([sft_lengths(5000, seed=1, max_length=3000), [27_189]])
    assert default_max_lens(lengths) == [1024, 2048, 4096, 8192]
    assert packing_stats(lengths).candidates[-1].max_len == 8192
    # A p99 far out moves the top up; at most five candidates.
    assert default_max_lens([40_000] * 5 + [100] * 95) == [4096, 8192, 16384, 32768, 65536]
    assert default_max_lens([3] * 10) == [64, 128, 256, 512, 1024]
    assert default_max_lens([900] * 10) == [1024]


def test_bad_values_raise_config_errors():
    from tokpack import ConfigError, DataError

    for kw in ({"overlong": "error"}, {"batch_size": 0}):
        with pytest.raises(ConfigError):
            packing_stats([1, 2], [8], **kw)
    with pytest.raises(ConfigError):
        packing_stats([1, 2], [8, 0])
    for lengths in ([], [0, 0], [3, -1]):
        with pytest.raises(DataError):
            packing_stats(lengths, [8])
    with pytest.raises(DataError, match="sample 1 has a negative length"):
        packing_stats([3, -1])


# --- the command ----------------------------------------------------------------------------


def test_cli_tables_and_advice_agree(corpus, capsys):
    assert main(["stats", str(corpus), "--max-len", "4096,1024,2048", "--batch-size", "16"]) == 0
    text = capsys.readouterr().out
    tables, advice_text = text.split("\nAdvice:\n")
    assert "over-long samples split (the default" in tables
    # Every figure the advice quotes is printed in the tables above it.
    for number in re.findall(r"\d{1,3}(?:,\d{3})*(?:\.\d+)?%?", advice_text):
        assert number in tables, number
    assert "- Pack:" in advice_text


def test_cli_advice_regression_mean_above_half_max_len(tmp_path, capsys):
    # Pairs of 600 + 400 tokens: the mean is half of max_len, yet bfd halves the rows.
    data = write_lengths(tmp_path / "pairs.parquet", [600, 400] * 500)
    assert main(["stats", str(data), "--max-len", "1000", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "Padding is fine" not in text and "- Pack:" in text and "50% fewer" in text


def test_cli_json_equals_the_api(corpus, capsys):
    assert main(["stats", str(corpus), "--json", "--overlong", "drop", "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    from tokpack.pack.files import read_lengths

    expected = packing_stats(read_lengths([corpus]), overlong="drop").as_dict()
    assert printed == json.loads(json.dumps(expected))
    assert [c["max_len"] for c in printed["candidates"]] == [1024, 2048, 4096, 8192]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-len", "0"], "--max-len: max_len must be at least 1 and at most 2147483647, got 0"),
        (["--max-len", "2048,x"], "--max-len: 'x' is not an integer"),
        (["--batch-size", "0"], "batch_size must be at least 1"),
        (
            ["--overlong", "error"],
            'unknown overlong "error"; expected one of "split", "truncate", "drop"',
        ),
        (["--threads", "0"], "threads must be at least 1"),
        (["--plot", "lengths.jpg"], "must end in .png or .svg"),
        (["--plot", "no/such/dir/lengths.png"], "does not exist"),
    ],
)
def test_cli_bad_values_exit_2_before_any_output(corpus, capsys, args, message):
    # Issue (reliability 16c): `stats --max-len 0` printed its table before the error.
    assert main(["stats", str(corpus), "--quiet"] + args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("tokpack stats: error: ") and message in err


def test_plot_without_matplotlib_says_what_to_install(corpus, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["matplotlib"] = None
        from tokpack.cli import main
        sys.exit(main(["stats", {str(corpus)!r}, "--plot", {str(tmp_path / "x.png")!r}]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "pip install 'tokpack[plot]'" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


# --- the plot -------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_plot_is_written(corpus, tmp_path, capsys, suffix, magic):
    path = tmp_path / f"lengths{suffix}"
    assert main(["stats", str(corpus), "--quiet", "--plot", str(path)]) == 0
    assert f"plot written to {path}" in capsys.readouterr().out
    assert path.read_bytes()[: len(magic)] == magic
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left


@pytest.mark.parametrize("batch_size", [None, 8])
def test_plotted_figures_equal_the_tables(batch_size):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from tokpack.stats.plot import PLOT_STRATEGIES, stats_figure

    lengths = np.concatenate([sft_lengths(3000, seed=2, max_length=3000), [27_189, 9000]])
    stats = packing_stats(lengths, batch_size=batch_size)
    text = render(stats, overlong_default=True)
    fig = stats_figure(stats, lengths)
    try:
        lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid()}
        marks = {t.get_gid(): t for ax in fig.axes for t in ax.texts if t.get_gid()}
        what = "optimizer steps" if batch_size else "rows"
        for s in PLOT_STRATEGIES:
            ys = [c.rows[s] for c in stats.candidates]
            if batch_size:
                ys = [stats.steps(r) for r in ys]
            assert list(lines[f"{what}:{s}"].get_ydata()) == ys
            effs = [c.efficiency[s] for c in stats.candidates]
            assert list(lines[f"efficiency:{s}"].get_ydata()) == effs
            assert list(lines[f"efficiency:{s}"].get_xdata()) == [
                c.max_len for c in stats.candidates
            ]
        renderer = fig.canvas.get_renderer()
        boxes = []
        for c in stats.candidates:
            label = marks[f"mark:{c.max_len}"].get_text()
            share = f"{c.over_token_share:.1%}"
            assert share in label and f"({share})" in text
            boxes.append(marks[f"mark:{c.max_len}"].get_window_extent(renderer))
        # The candidate labels do not overlap one another.
        for a, b in zip(boxes, boxes[1:]):
            assert not a.overlaps(b)
    finally:
        plt.close(fig)


# --- preference and KTO token shards (issue 20, item 20) ----------------------------------------


@pytest.fixture(scope="module")
def pair_shards(tmp_path_factory):
    """Preference shards (a pair with an empty completion among them: pack drops it as empty)
    and KTO shards."""
    import random

    from tokpack.tokenize import KTO_SCHEMA

    from .test_pack_pairs import gen_pairs, write_pairs

    d = tmp_path_factory.mktemp("pair_shards")
    pairs = gen_pairs(random.Random(7), 300, longest=60)
    pairs[5] = (pairs[5][0], pairs[5][1], [])
    write_pairs(d / "pref.parquet", pairs)
    rng = random.Random(8)
    rows = []
    for _ in range(300):
        p = [rng.randrange(1, 100) for _ in range(rng.randint(1, 60))]
        c = [rng.randrange(1, 100) for _ in range(rng.randint(1, 60))]
        ids, labels = p + c, [-100] * len(p) + c
        rows.append(dict(input_ids=ids, labels=labels, length=len(ids), prompt_length=len(p)))
        rows[-1]["label"] = rng.random() < 0.5
    pq.write_table(pa.Table.from_pylist(rows, schema=KTO_SCHEMA), d / "kto.parquet")
    return d, pairs


@pytest.mark.parametrize("layout", ["separate", "shared-prompt"])
def test_stats_of_preference_shards_count_pairs_as_pack_packs_them(
    pair_shards, tmp_path, layout, capsys
):
    """`stats` took no preference shards ("no column input_ids") although `pack` does: a pair
    is one sample whose length is its footprint in the layout, so the rows stats predicts are
    the rows pack writes."""
    d, pairs = pair_shards
    prompt = 1 if layout == "shared-prompt" else 2
    footprints = [prompt * len(p) + len(c) + len(r) if r else 0 for p, c, r in pairs]
    args = ["stats", str(d / "pref.parquet"), "--max-len", "128,256", "--overlong", "drop"]
    assert main([*args, "--pair-layout", layout, "--json", "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["samples"] == len(pairs) and printed["tokens"] == sum(footprints)
    assert printed["empty"] == 1 and printed["distribution"]["max"] == max(footprints)
    for candidate in printed["candidates"]:
        out = tmp_path / f"packed-{candidate['max_len']}"
        manifest = tokpack.pack_files(
            d / "pref.parquet",
            out,
            candidate["max_len"],
            overlong="drop",
            pair_layout=layout,
        )
        figures = manifest["figures"]
        assert candidate["strategies"]["bfd"]["rows"] == figures["rows"]
        assert candidate["over_samples"] == figures["samples_dropped"] - figures["samples_empty"]


def test_stats_of_kto_shards_count_samples_as_pack_packs_them(pair_shards, tmp_path, capsys):
    d, _ = pair_shards
    assert main(["stats", str(d / "kto.parquet"), "--max-len", "64", "--json", "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    manifest = tokpack.pack_files(d / "kto.parquet", tmp_path / "kto", 64, overlong="split")
    assert printed["candidates"][0]["strategies"]["bfd"]["rows"] == manifest["figures"]["rows"]


def test_a_pair_layout_for_other_shards_is_refused(corpus, capsys):
    assert main(["stats", str(corpus), "--pair-layout", "shared-prompt", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "applies to preference pairs" in err[0]
