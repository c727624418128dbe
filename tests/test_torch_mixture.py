"""PackedMixture and the mixture schedule: quota at every prefix, determinism, equal batches per
rank, budgets per ``stop`` policy, exact resumption with another topology, clear errors, and
``tokpack mix-stats``."""

import collections
import json
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import tokpack
from tokpack.cli import main
from tokpack.packed.mixture import MAX_PERIOD, Mixture, Schedule, integer_weights
from tokpack.torch import PackedCollator, PackedMixture

from .packed_corpus import random_samples, write_packed_dir
from .test_optional_deps import run_blocked

SIZES = {"code": 120, "chat": 300, "text": 60}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    out = {}
    for seed, (name, n) in enumerate(SIZES.items()):
        samples, labels = random_samples(n, 30, seed=seed)
        # "text" has no labels: the mixture takes labelled and unlabelled sources alike.
        write_packed_dir(
            root / name,
            samples,
            None if name == "text" else labels,
            max_len=48,
            rows_per_shard=40,
            row_group_rows=8,
        )
        out[name] = str(root / name)
    return out


WEIGHTS = {"code": 0.3, "chat": 0.5, "text": 0.2}


# -- the schedule ---------------------------------------------------------------------------


@given(st.lists(st.integers(1, 40), min_size=1, max_size=6))
def test_schedule_keeps_every_prefix_within_one_row_of_the_shares(weights):
    sched = Schedule(weights)
    T = sched.period
    assert T == sum(weights)
    src, j = sched.locate(0, 3 * T)
    counts = np.zeros(len(weights), dtype=np.int64)
    for n, (s, js) in enumerate(zip(src, j), start=1):
        assert js == counts[s]  # a source's rows come in order
        assert sched.position(int(s), int(js)) == n - 1
        counts[s] += 1
        # |c_s(n) - n W_s / T| < 1, in integers.
        assert np.all(np.abs(counts * T - n * sched.weights) < T)
        assert np.array_equal(sched.counts(n), counts)
    # Any window: two prefixes, so within two rows.
    prefix = np.zeros((len(weights), 3 * T + 1), dtype=np.int64)
    for s in range(len(weights)):
        prefix[s, 1:] = np.cumsum(src == s)
    lengths = np.arange(1, T + 1)
    for a in range(T):
        windows = prefix[:, a + 1 : a + T + 1] - prefix[:, a : a + 1]
        diff = windows * T - lengths * sched.weights[:, None]
        assert np.all(np.abs(diff) < 2 * T)
        if len(weights) == 2:
            assert np.all(np.abs(diff) < T)


def _window_balanced_sequence_exists(weights, length):
    """Whether some sequence of ``length`` rows keeps every window strictly within one row of
    its shares (exhaustive depth-first search, checking the windows ending at each new row)."""
    T = sum(weights)
    seq = []

    def windows_ok():
        counts = [0] * len(weights)
        for a in range(len(seq) - 1, -1, -1):
            counts[seq[a]] += 1
            n = len(seq) - a
            if any(abs(c * T - n * w) >= T for c, w in zip(counts, weights)):
                return False
        return True

    def extend():
        if len(seq) == length:
            return True
        for s in range(len(weights)):
            seq.append(s)
            if windows_ok() and extend():
                return True
            seq.pop()
        return False

    return extend()


def test_one_row_for_every_window_is_impossible_with_three_sources():
    """Why the schedule promises two rows for windows: with weights 1:2:3 (or the 3:5:2 of these
    tests) not even 10 rows can keep every window within one row of its shares, while two
    sources can (the schedule does, above) and so can some three-source weights."""
    assert not _window_balanced_sequence_exists([1, 2, 3], 10)
    assert not _window_balanced_sequence_exists([3, 5, 2], 10)
    assert _window_balanced_sequence_exists([1, 1, 2], 10)
    assert _window_balanced_sequence_exists([2, 5], 10)


def test_integer_weights_are_exact_for_decimal_weights_and_reduced():
    names = ["a", "b", "c"]
    assert integer_weights(names, [Fraction("0.3"), Fraction("0.7"), Fraction("0.5")]) == [3, 7, 5]
    assert integer_weights(names, [Fraction(2), Fraction(4), Fraction(6)]) == [1, 2, 3]
    approx = integer_weights(names[:2], [Fraction(1, 3) + Fraction(1, 10**9), Fraction(2, 3)])
    assert sum(approx) <= MAX_PERIOD


# -- the dataset ----------------------------------------------------------------------------


def _rows(ds, num_workers=0):
    """(source, first sample id) of every row of every batch, per batch."""
    out = []
    for batch in DataLoader(ds, batch_size=None, num_workers=num_workers):
        out.append([(int(s), int(ids[0])) for s, ids in zip(batch["sources"], batch["sample_ids"])])
    return out


def _mix(sources, **kw):
    args = dict(batch_rows=3, seed=5, rank=0, world_size=1)
    args.update(kw)
    return PackedMixture(sources, WEIGHTS, **args)


def test_deterministic_per_seed_and_epoch(sources):
    a, b = _rows(_mix(sources)), _rows(_mix(sources))
    assert a == b
    other = _mix(sources)
    other.set_epoch(1)
    assert _rows(other) != a
    assert _rows(_mix(sources, seed=6)) != a


def test_ranks_get_equal_batches_and_the_epoch_once_per_source_epoch(sources):
    ds = _mix(sources)
    stream = [r for batch in _rows(ds) for r in batch]
    assert len(stream) == ds.mixture.num_rows
    for world in (2, 3):
        per_rank = [_rows(_mix(sources, rank=r, world_size=world)) for r in range(world)]
        assert len({len(b) for b in per_rank}) == 1
        assert len(per_rank[0]) == len(_mix(sources, rank=0, world_size=world))
        got = collections.Counter(r for batches in per_rank for b in batches for r in b)
        assert got == collections.Counter(stream)
    # stop="first", one epoch each: no row of any source twice, and the first source to run
    # out ends the epoch.
    assert max(collections.Counter(stream).values()) == 1
    mix = ds.mixture
    counts = mix.schedule.counts(mix.num_rows)
    assert np.all(counts <= mix.budget) and np.any(counts == mix.budget)


def test_stop_all_restarts_sources_and_stop_never_runs_on(sources):
    ds = _mix(sources, stop="all", epochs_per_source={"code": 1, "chat": 0.5, "text": 2})
    mix = ds.mixture
    counts = mix.schedule.counts(mix.num_rows)
    assert np.all(counts >= mix.budget)
    assert np.any(mix.schedule.counts(mix.num_rows - 1) < mix.budget)
    stream = [r for batch in _rows(ds) for r in batch]
    for s, n in enumerate(mix.num_rows_per_source):
        seen = [r for r in stream if r[0] == s]
        assert len(seen) == counts[s]
        # Whole source epochs deliver every row of the source once each.
        full = collections.Counter(seen[: (len(seen) // n) * n])
        assert all(v == len(seen) // n for v in full.values())
    endless = _mix(sources, stop="never")
    with pytest.raises(TypeError):
        len(endless)
    it = iter(endless)
    batches = [next(it) for _ in range(300)]
    assert batches[-1]["position"]["rows_consumed"] == 900


def test_realised_shares_follow_the_weights_and_token_weights(sources):
    ds = _mix(sources, stop="never")
    it = iter(ds)
    src = np.concatenate([next(it)["sources"] for _ in range(100)])
    tenths = {"code": 3, "chat": 5, "text": 2}  # WEIGHTS in tenths: exact integer comparisons
    for s, name in enumerate(ds.names):
        counts = np.cumsum(src == s)
        n = np.arange(1, len(src) + 1)
        assert np.all(np.abs(10 * counts - n * tenths[name]) < 10)
    by_tokens = Mixture(sources, {"code": 1, "chat": 1, "text": 1}, weight_unit="tokens")
    mean = [int(p.manifest["figures"]["tokens"]) / p.num_rows for p in by_tokens.packed]
    token_share = np.array(list(by_tokens.shares.values())) * mean
    assert np.allclose(token_share / token_share.sum(), 1 / 3, atol=1e-4)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_with_other_workers_and_world_size(sources, num_workers):
    whole = [r for batch in _rows(_mix(sources, world_size=1)) for r in batch]
    first, positions = [], []
    for rank in range(2):
        ds = _mix(sources, rank=rank, world_size=2)
        loader = DataLoader(ds, batch_size=None, num_workers=2)
        for k, batch in enumerate(loader):
            if k == 4:
                break
            first.append(
                [(int(s), int(i[0])) for s, i in zip(batch["sources"], batch["sample_ids"])]
            )
            positions.append(batch["position"])
    state = _mix(sources, rank=0, world_size=2).state_dict(batches_consumed=4)
    assert state["rows_consumed"] == positions[-1]["rows_consumed"] == 4 * 2 * 3
    rest = []
    for rank in range(3):
        ds = _mix(sources, rank=rank, world_size=3)
        ds.load_state_dict(state)
        rest.extend(_rows(ds, num_workers))
    got = collections.Counter(r for b in first + rest for r in b)
    assert got == collections.Counter(whole)


def test_torchdata_stateful_dataloader_resumes_the_mixture(sources):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        ds = _mix(sources, grad_accum_steps=2)
        return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=2)

    def key(batch):
        return (batch["sources"], batch["global_num_loss_tokens"])

    full = [key(b) for b in make()]
    loader = make()
    it = iter(loader)
    head = [key(next(it)) for _ in range(5)]
    saved = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(saved)
    assert head + [key(b) for b in resumed] == full


def test_state_from_other_weights_or_source_order_is_refused(sources):
    state = json.loads(json.dumps(_mix(sources).state_dict(batches_consumed=2)))
    other = PackedMixture(sources, {**WEIGHTS, "code": 0.4}, batch_rows=3, seed=5)
    with pytest.raises(tokpack.ConfigError, match="state was saved with"):
        other.load_state_dict(state)
    reordered = dict(reversed(list(sources.items())))
    # Same names, weights and (endless) length: only the order of the sources differs, which
    # changes the schedule and the seeds.
    equal = {name: 1 for name in sources}
    same_weights = PackedMixture(sources, equal, batch_rows=3, seed=5, stop="never")
    saved = json.loads(json.dumps(same_weights.state_dict(1)))
    same_weights.load_state_dict(saved)
    with pytest.raises(tokpack.ConfigError, match="state was saved with sources"):
        PackedMixture(reordered, equal, batch_rows=3, seed=5, stop="never").load_state_dict(saved)


def test_collated_batches_and_sources(sources):
    ds = _mix(sources, collate_fn=PackedCollator("flash"))
    batch = next(iter(ds))
    assert len(batch["sources"]) == 3 and all(isinstance(s, int) for s in batch["sources"])
    assert batch["input_ids"].dim() == 1


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(weights={"code": 1, "chat": 1}), tokpack.ConfigError, "no value for sources"),
        (dict(weights={**WEIGHTS, "x": 1}), tokpack.ConfigError, "unknown sources"),
        (dict(weights={**WEIGHTS, "code": -1}), tokpack.ConfigError, "positive"),
        (dict(weights={**WEIGHTS, "code": float("nan")}), tokpack.ConfigError, "positive"),
        (dict(weights={**WEIGHTS, "code": "1"}), tokpack.ConfigError, "positive"),
        (dict(stop="last"), tokpack.ConfigError, 'unknown stop "last"'),
        (dict(weight_unit="bytes"), tokpack.ConfigError, "weight_unit"),
        (dict(epochs_per_source={"code": 1}), tokpack.ConfigError, "epochs_per_source"),
        (dict(epochs_per_source=0.001), tokpack.ConfigError, "less than one row"),
        (dict(epochs_per_source=1e30), tokpack.ConfigError, "'code' .* rows, more than"),
        (dict(seed=-5), tokpack.ConfigError, "seed must be at least 0"),
    ],
)
def test_bad_configuration_is_a_config_error(sources, kwargs, error, match):
    weights = kwargs.pop("weights", WEIGHTS)
    with pytest.raises(error, match=match):
        PackedMixture(sources, weights, batch_rows=3, **kwargs)


@pytest.fixture(scope="module")
def dropped_source(tmp_path_factory):
    """A packed directory whose every sample was dropped (over-long): no rows."""
    root = tmp_path_factory.mktemp("dropped")
    long = pa.table({"input_ids": pa.array([[1] * 100] * 5, pa.list_(pa.int32()))})
    pq.write_table(long, root / "long.parquet")
    tokpack.pack_files(root / "long.parquet", root / "packed", 16, overlong="drop")
    return str(root / "packed")


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(epochs_per_source=1e30), "source 'code' .* rows, more than"),
        (dict(epochs_per_source=0.001), "source 'code' .* less than one row"),
        (dict(seed=-5), "seed must be at least 0"),
        (dict(shuffle_window=0), "shuffle_window must be at least 1"),
        (dict(empty=True), "source 'none': it has no rows \\(all 5 of its samples were dropped"),
        (dict(empty=True, weight_unit="tokens"), "source 'none': it has no rows"),
    ],
)
def test_the_mixture_and_mix_stats_refuse_the_same_options_alike(
    sources, dropped_source, capsys, options, match
):
    """One validation (packed.mixture.Mixture) for PackedMixture, mixture_stats and mix-stats:
    the same ConfigError, never a ZeroDivisionError, OverflowError or numpy ValueError (issue
    20, items 14 and 19: each of these was a traceback in mix-stats, and an empty source was
    reported as "less than one row")."""
    options = dict(options)
    if options.pop("empty", False):
        sources, weights = {**sources, "none": dropped_source}, {**WEIGHTS, "none": 1}
    else:
        weights = WEIGHTS
    errors = []
    for make in (
        lambda: PackedMixture(sources, weights, batch_rows=3, **options),
        lambda: tokpack.mixture_stats(sources, weights, **options),
    ):
        with pytest.raises(tokpack.ConfigError, match=match) as info:
            make()
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    flags = {
        "epochs_per_source": "--epochs-per-source",
        "seed": "--seed",
        "weight_unit": "--weight-unit",
    }
    args = [f"{n}={p}" for n, p in sources.items()]
    args += ["--weights", ",".join(f"{n}={w}" for n, w in weights.items())]
    if "shuffle_window" in options:  # not a mix-stats flag
        return
    for key, value in options.items():
        args += [flags[key], str(value)]
    assert main(["mix-stats", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tokpack mix-stats: error: {errors[0]}"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rows", "99999999999999999999999"], "rows must be at least 0 and at most"),
        (["--epoch", "-1"], "epoch must be at least 0"),
        (["--weights", "code=1,chat=1,text=1,chat=2"], "--weights gives 'chat' twice"),
        (["--epochs-per-source", "code=1,chat=1,text=1,code=2"], "gives 'code' twice"),
    ],
)
def test_mix_stats_refuses_out_of_range_and_repeated_values(sources, capsys, args, message):
    """A weight given twice was silently the last one; --rows beyond int64 was an
    OverflowError traceback (issue 20, items 14 and 19)."""
    argv = ["mix-stats", *(f"{n}={p}" for n, p in sources.items())]
    if "--weights" not in args:
        argv += ["--weights", "code=1,chat=1,text=1"]
    assert main([*argv, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokpack mix-stats: error:") and message in err[0]


def test_missing_directory_names_the_source(sources, tmp_path):
    with pytest.raises(tokpack.InputNotFoundError, match="source 'code'.*no such packed"):
        PackedMixture({**sources, "code": tmp_path / "nope"}, WEIGHTS, batch_rows=3)


# -- mix-stats ------------------------------------------------------------------------------


def test_mixture_stats_match_what_the_dataset_delivers(sources):
    stats = tokpack.mixture_stats(sources, WEIGHTS, seed=5, epoch=1)
    ds = _mix(sources, collate_fn=None)
    ds.set_epoch(1)
    rows = collections.Counter()
    tokens = collections.Counter()
    for batch in ds:
        for s, ids in zip(batch["sources"], batch["input_ids"]):
            rows[s] += 1
            tokens[s] += len(ids)
    for s, name in enumerate(ds.names):
        assert stats["sources"][name]["rows"] == rows[s]
        assert stats["sources"][name]["tokens"] == tokens[s]
    assert stats["rows"] == ds.mixture.num_rows


def test_mix_stats_cli(sources, capsys):
    args = [f"{n}={p}" for n, p in sources.items()]
    assert main(["mix-stats", *args, "--weights", "code=0.3,chat=0.5,text=0.2"]) == 0
    out = capsys.readouterr().out
    assert "code" in out and "chat" in out and "rows" in out
    assert main(["mix-stats", *args, "--weights", "code=0.3,chat=0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokpack mix-stats: error:")


def test_mix_stats_needs_no_torch(sources):
    args = [f"{n}={p}" for n, p in sources.items()]
    proc = run_blocked(
        f"""
        from tokpack.cli import main
        raise SystemExit(main(["mix-stats", *{args!r}, "--weights", "code=1,chat=1,text=1"]))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "chat" in proc.stdout
