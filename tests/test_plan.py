"""tokpack.plan: invariants (hypothesis), argument handling, figures and determinism."""

import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokpack
from tokpack.synthetic import sft_lengths

WHOLE = ("bfd", "ffd", "next_fit", "padding")
ALL = WHOLE + ("random",)

lengths_st = st.lists(st.integers(0, 300), max_size=300)


def coverage(lengths, p):
    """Per sample, the (start, length) pieces the plan holds."""
    pieces = {}
    for sid, start, ln in zip(p.sample_ids.tolist(), p.starts.tolist(), p.lengths.tolist()):
        pieces.setdefault(sid, []).append((start, ln))
    return pieces


def assert_valid(lengths, p, max_len):
    assert p.bin_offsets[0] == 0 and p.bin_offsets[-1] == p.n_segments
    assert np.all(np.diff(p.bin_offsets) > 0), "empty row"
    assert np.all(p.row_tokens() <= max_len), "row over max_len"
    assert np.all(p.lengths > 0)
    pieces = coverage(lengths, p)
    dropped, truncated = set(p.dropped.tolist()), set(p.truncated.tolist())
    for i, n in enumerate(lengths):
        if i in dropped:
            assert i not in pieces
            assert n == 0 or n > max_len
            continue
        expected = max_len if i in truncated else n
        got = sorted(pieces[i])
        cursor = 0
        for start, ln in got:
            assert start == cursor
            cursor += ln
        assert cursor == expected
    assert set(p.empty.tolist()) == {i for i, n in enumerate(lengths) if n == 0}
    assert p.total_tokens == sum(
        min(n, max_len) if i in truncated else (0 if i in dropped else n)
        for i, n in enumerate(lengths)
    )
    assert p.lower_bound == -(-p.total_tokens // max_len)
    assert p.n_bins >= p.lower_bound


@given(
    lengths_st,
    st.integers(1, 256),
    st.sampled_from(["truncate", "drop", "split"]),
    st.sampled_from(ALL),
)
def test_plan_invariants(lengths, max_len, overlong, strategy):
    p = tokpack.plan(lengths, max_len, strategy=strategy, overlong=overlong, seed=3)
    assert_valid(lengths, p, max_len)
    assert p.n_samples == len(lengths)
    # Every sample is in exactly one class (whole, truncated, split, dropped).
    assert sum(len(c) for c in sample_classes(p)) == len(lengths)


@given(lengths_st, st.integers(1, 256), st.sampled_from(WHOLE))
def test_whole_sample_strategies_pack_each_sample_exactly_once(lengths, max_len, strategy):
    p = tokpack.plan(lengths, max_len, strategy=strategy, overlong="drop")
    ids = p.sample_ids.tolist()
    assert len(ids) == len(set(ids))
    expected = {i for i, n in enumerate(lengths) if 0 < n <= max_len}
    assert set(ids) == expected
    assert set(p.dropped.tolist()) == set(range(len(lengths))) - expected


@given(st.lists(st.integers(1, 200), max_size=400), st.integers(200, 600))
def test_heuristics_meet_their_proven_bounds(lengths, max_len):
    # Not "decreasing beats next-fit": false on [80, 140, 109, 118, 179, 92] at 389 (next-fit
    # 2 rows, ffd / bfd 3). Proven: consecutive next-fit rows hold more than max_len together;
    # first-fit / best-fit leave at most one row at most half full.
    nf = tokpack.plan(lengths, max_len, strategy="next_fit", row_order="plan").row_tokens()
    assert np.all(nf[:-1] + nf[1:] > max_len)
    for strategy in ("ffd", "bfd"):
        rows = tokpack.plan(lengths, max_len, strategy=strategy).row_tokens()
        assert np.count_nonzero(2 * rows <= max_len) <= 1


def test_next_fit_can_beat_the_decreasing_strategies():
    lengths, max_len = [80, 140, 109, 118, 179, 92], 389
    rows = {s: tokpack.plan(lengths, max_len, strategy=s).n_bins for s in WHOLE}
    assert (rows["next_fit"], rows["ffd"], rows["bfd"]) == (2, 3, 3)


def sample_classes(p):
    """(whole, truncated, split, dropped) sample id sets; asserts they are disjoint."""
    segments = np.bincount(p.sample_ids, minlength=p.n_samples)
    truncated, split, dropped = (set(a.tolist()) for a in (p.truncated, p.split, p.dropped))
    assert not (truncated & split) and not (truncated & dropped) and not (split & dropped)
    assert all(segments[i] >= 2 for i in split)
    whole = set(range(p.n_samples)) - truncated - split - dropped
    assert all(segments[i] == 1 for i in whole)
    return whole, truncated, split, dropped


def test_random_with_truncate_counts_each_sample_once():
    p = tokpack.plan([10, 100, 20, 100, 7], 64, strategy="random", overlong="truncate")
    assert p.truncated.tolist() == [1, 3]
    assert not set(p.split.tolist()) & {1, 3}
    lengths = sft_lengths(2000, seed=4)
    p = tokpack.plan(lengths, 512, strategy="random", overlong="truncate")
    whole, truncated, split, dropped = sample_classes(p)
    assert len(whole) == 2000 - len(truncated) - len(split) - len(dropped) >= 0


@pytest.mark.parametrize("length", [2**40, 2**63 - 1])
def test_absurd_split_is_an_error_not_an_abort(length):
    with pytest.raises(tokpack.DataError, match="sample 0 has .* a plan can hold"):
        tokpack.plan([length, 3], 8, overlong="split")


@pytest.mark.parametrize("strategy", ALL)
def test_same_plan_for_any_thread_count(strategy):
    lengths = sft_lengths(300_000, seed=1)
    a = tokpack.plan(lengths, 2048, strategy=strategy, overlong="split", seed=5, threads=1)
    b = tokpack.plan(lengths, 2048, strategy=strategy, overlong="split", seed=5, threads=2)
    for field in ("bin_offsets", "sample_ids", "starts", "lengths", "dropped", "split"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_bfd_is_near_the_lower_bound_on_sft_lengths():
    lengths = sft_lengths(200_000, seed=2)
    for max_len in (2048, 4096, 8192):
        p = tokpack.plan(lengths, max_len, overlong="split")
        assert p.n_bins <= p.lower_bound * 1.001 + 1
        assert p.efficiency > 0.99


def test_random_strategy_is_seeded_and_cuts_samples():
    lengths = [5, 7, 3, 9, 4]
    a = tokpack.plan(lengths, 6, strategy="random", overlong="split", seed=1)
    b = tokpack.plan(lengths, 6, strategy="random", overlong="split", seed=1)
    np.testing.assert_array_equal(a.sample_ids, b.sample_ids)
    assert a.n_bins == a.lower_bound == 5
    assert len(a.split) > 0
    seeds = {
        tuple(tokpack.plan(lengths, 6, strategy="random", overlong="split", seed=s).sample_ids)
        for s in range(8)
    }
    assert len(seeds) > 1


@pytest.mark.parametrize(
    "lengths",
    [
        np.array([5, 3, 8], dtype=np.int32),
        np.array([5, 3, 8], dtype=np.int64),
        np.array([5, 3, 8], dtype=np.uint16),
        [5, 3, 8],
        pa.array([5, 3, 8]),
        pa.chunked_array([[5], [3, 8]]),
    ],
)
def test_accepts_array_likes(lengths):
    p = tokpack.plan(lengths, 8)
    assert p.n_bins == 2 and p.total_tokens == 16


def test_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    assert tokpack.plan(torch.tensor([5, 3, 8]), 8).n_bins == 2


def test_plan_arrays_are_numpy_with_documented_dtypes():
    p = tokpack.plan([5, 0, 12, 3], 8, overlong="truncate")
    for field in ("bin_offsets", "sample_ids", "starts", "lengths", "dropped", "truncated"):
        arr = getattr(p, field)
        assert isinstance(arr, np.ndarray) and arr.dtype == np.int64, field
    assert p.dropped.tolist() == [1] and p.empty.tolist() == [1]
    assert p.truncated.tolist() == [2]
    assert p.input_tokens == 20 and p.total_tokens == 16


def test_repr_shows_the_figures():
    text = repr(tokpack.plan([5, 3, 8], 8))
    for part in ("n_bins=2", "lower_bound=2", "efficiency=1.0000", "n_samples=3"):
        assert part in text


def test_empty_input_gives_an_empty_plan():
    p = tokpack.plan([], 8)
    assert p.n_bins == 0 and p.efficiency == 0.0 and p.total_tokens == 0


def test_overlong_error_names_the_sample():
    with pytest.raises(tokpack.OverlongError, match="sample 1 has 9 tokens"):
        tokpack.plan([3, 9], 8)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(lengths=[1, -2], max_len=8), tokpack.DataError, "sample 1 has a negative length"),
        (dict(lengths=[1, 2], max_len=0), tokpack.ConfigError, "max_len must be at least 1"),
        (dict(lengths=[1, 2], max_len=8, strategy="best"), tokpack.ConfigError, "unknown strategy"),
        (dict(lengths=[1, 2], max_len=8, overlong="cut"), tokpack.ConfigError, "unknown overlong"),
        (dict(lengths=[1.5, 2], max_len=8), tokpack.DataError, "must be integers"),
        (dict(lengths=pa.array([1, None]), max_len=8), tokpack.DataError, "row 1 is null"),
        (dict(lengths=[[1], [2]], max_len=8), tokpack.DataError, "1-D"),
        (dict(lengths=[1], max_len=8, threads=0), tokpack.ConfigError, "threads"),
        (dict(lengths=[1], max_len=8.5), tokpack.ConfigError, "max_len must be an integer"),
        (dict(lengths=[1], max_len=10**20), tokpack.ConfigError, "max_len .* at most 2147483647"),
        (
            dict(lengths=[1], max_len=8, seed=2**64),
            tokpack.ConfigError,
            "seed .* at most 18446744073709551615",
        ),
        (dict(lengths=[1], max_len=8, seed=-1), tokpack.ConfigError, "seed must be at least 0"),
        (
            dict(lengths=[1], max_len=8, threads=1025),
            tokpack.ConfigError,
            "threads .* at most 1024",
        ),
        (dict(lengths=[1], max_len=8, threads=10**20), tokpack.ConfigError, "at most 1024"),
    ],
)
def test_bad_arguments_raise_value_errors(kwargs, error, match):
    with pytest.raises(error, match=match) as info:
        tokpack.plan(**kwargs)
    assert isinstance(info.value, tokpack.TokpackError)
    assert isinstance(info.value, ValueError)


def test_row_accessor():
    p = tokpack.plan([3, 6, 4, 5], 10, row_order="plan")
    ids, starts, lens = p.row(0)
    assert ids.tolist() == [1, 2] and lens.tolist() == [6, 4] and starts.tolist() == [0, 0]
    with pytest.raises(IndexError):
        p.row(2)


@pytest.mark.parametrize("value", ["1025", "10000", "0", "lots"])
def test_bad_thread_count_in_the_environment_is_refused(monkeypatch, value):
    monkeypatch.setenv("TOKPACK_NUM_THREADS", value)
    with pytest.raises(tokpack.ConfigError, match="TOKPACK_NUM_THREADS .*1 and 1024"):
        tokpack.plan([1, 2], 8)


def test_thread_counts_above_256_give_the_same_plan(monkeypatch):
    lengths = sft_lengths(5000, seed=3)
    a = tokpack.plan(lengths, 1024, overlong="split", threads=1)
    b = tokpack.plan(lengths, 1024, overlong="split", threads=258)
    np.testing.assert_array_equal(a.sample_ids, b.sample_ids)
    monkeypatch.setenv("TOKPACK_NUM_THREADS", "270")
    c = tokpack.plan(lengths, 1024, overlong="split")
    np.testing.assert_array_equal(c.sample_ids, a.sample_ids)


HUGE = "99999999999999999999"


@pytest.mark.parametrize(
    "argv, match",
    [
        (["pack", "IN", "-o", "OUT", "--max-len", HUGE], "max_len must be at least 1 and at most"),
        (["pack", "IN", "-o", "OUT", "--row-group-rows", HUGE], "row_group_rows must be at least"),
        (["pack", "IN", "-o", "OUT", "--rows-per-shard", "0"], "rows_per_shard must be at least"),
        (["pack", "IN", "-o", "OUT", "--seed", HUGE], "seed must be at least 0 and at most"),
        (["pack", "IN", "-o", "OUT", "--threads", "10000"], "threads .* at most 1024"),
        (["stats", "IN", "--max-len", HUGE], "max_len must be at least 1 and at most"),
        (["stats", "IN", "--threads", HUGE], "threads .* at most 1024"),
        (["tokenize", "IN", "-o", "OUT", "--tokenizer", "T", "--max-len", HUGE], "max_len"),
        (["tokenize", "IN", "-o", "OUT", "--tokenizer", "T", "--shard-rows", HUGE], "shard_rows"),
        (["tokenize", "IN", "-o", "OUT", "--tokenizer", "T", "--threads", HUGE], "threads"),
    ],
)
def test_numeric_options_out_of_range_give_one_line_errors(tmp_path, capsys, argv, match):
    import pyarrow.parquet as pq

    from tokpack.cli import main

    pq.write_table(pa.table({"input_ids": [[1, 2, 3]]}), tmp_path / "in.parquet")
    paths = {"IN": str(tmp_path / "in.parquet"), "OUT": str(tmp_path / "out")}
    argv = [paths.get(a, a) for a in argv] + ["--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(f"^tokpack {argv[0]}: error: .*{match}", err), err
    assert not (tmp_path / "out").exists()
