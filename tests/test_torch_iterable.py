"""PackedIterableDataset: one global order, exactly-once delivery across ranks and workers,
resumption with a different topology, fork/spawn workers."""

import collections
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import tokpack
from tokpack.packed.format import ROW_COLUMNS
from tokpack.packed.order import EpochOrder
from tokpack.torch import PackedCollator, PackedDataset, PackedIterableDataset

from .packed_corpus import random_samples, small_packed_dir, write_packed_dir

N_SAMPLES = 400


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_packed_dir(tmp_path_factory, "packed_iter", N_SAMPLES, seed=2, rows_per_shard=60)


def _run(path, *, rank, world_size, num_workers, state=None, stop_after=None, **kw):
    """Batches one rank receives: (list of sample_id lists, positions)."""
    ds = PackedIterableDataset(path, batch_rows=3, rank=rank, world_size=world_size, seed=7, **kw)
    if state is not None:
        ds.load_state_dict(state)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
    batches, positions = [], []
    for batch in loader:
        batches.append([int(x) for ids in batch["sample_ids"] for x in ids])
        positions.append(batch["position"])
        if stop_after is not None and len(batches) == stop_after:
            break
    return ds, batches, positions


def _assert_exactly_once(sample_lists):
    counts = collections.Counter(s for b in sample_lists for s in b)
    assert sorted(counts) == list(range(N_SAMPLES))
    assert max(counts.values()) == 1


def test_exactly_once_world2_workers2_and_order_independent_of_workers(corpus):
    delivered, lengths = [], []
    for rank in range(2):
        ds, batches, positions = _run(corpus, rank=rank, world_size=2, num_workers=2)
        assert len(batches) == len(ds)
        assert [p["batch"] for p in positions] == list(range(len(ds)))
        _, alone, _ = _run(corpus, rank=rank, world_size=2, num_workers=0)
        assert batches == alone
        delivered.extend(batches)
        lengths.append(len(batches))
    assert lengths[0] == lengths[1]
    _assert_exactly_once(delivered)


def test_resume_mid_epoch_with_other_workers_and_world_size(corpus):
    first = []
    for rank in range(2):
        ds, batches, positions = _run(corpus, rank=rank, world_size=2, num_workers=2, stop_after=5)
        first.extend(batches)
        state = ds.state_dict(batches_consumed=5)
        assert state["rows_consumed"] == positions[-1]["rows_consumed"] == 5 * 2 * 3
    # Same world size, one worker instead of two; state from the batch's position dict.
    rest = []
    for rank in range(2):
        _, batches, _ = _run(corpus, rank=rank, world_size=2, num_workers=1, state=positions[-1])
        rest.extend(batches)
    _assert_exactly_once(first + rest)
    # World size 3 with two workers.
    rest3 = []
    counts = set()
    for rank in range(3):
        _, batches, _ = _run(corpus, rank=rank, world_size=3, num_workers=2, state=state)
        rest3.extend(batches)
        counts.add(len(batches))
    assert len(counts) == 1
    _assert_exactly_once(first + rest3)


def test_in_process_state_dict_counts_handed_out_batches(corpus):
    ds = PackedIterableDataset(corpus, batch_rows=4, world_size=1, rank=0)
    it = iter(ds)
    next(it), next(it)
    assert ds.state_dict()["rows_consumed"] == 8
    resumed = PackedIterableDataset(corpus, batch_rows=4, world_size=1, rank=0)
    resumed.load_state_dict(ds.state_dict())
    first_rest = next(iter(resumed))["sample_ids"]
    third = next(it)["sample_ids"]
    assert [t.tolist() for t in first_rest] == [t.tolist() for t in third]


def test_epochs_reshuffle_and_are_deterministic(corpus):
    ds = PackedIterableDataset(corpus, batch_rows=4, world_size=1, rank=0, seed=3)
    e0 = [b["sample_ids"][0].tolist() for b in ds]
    again = [b["sample_ids"][0].tolist() for b in ds]
    ds.set_epoch(1)
    e1 = [b["sample_ids"][0].tolist() for b in ds]
    assert e0 == again and e0 != e1
    plain = PackedIterableDataset(corpus, batch_rows=4, world_size=1, rank=0, shuffle=False)
    rows = [t.tolist() for b in plain for t in b["sample_ids"]]
    ref = PackedDataset(corpus)
    assert rows == [ref[i]["sample_ids"].tolist() for i in range(len(ref))]


def test_window_shuffle_is_a_permutation_that_mixes_row_groups():
    group_rows = np.array([8] * 10 + [5])
    order = EpochOrder(group_rows, seed=1, epoch=0, shuffle=True, window=4)
    g, r = order.rows(0, order.num_rows)
    starts = np.concatenate([[0], np.cumsum(group_rows)])
    flat = starts[g] + r
    assert sorted(flat.tolist()) == list(range(85))
    assert len(set(g[:8].tolist())) > 1
    g2, r2 = order.rows(13, 40)
    assert (g2 == g[13:40]).all() and (r2 == r[13:40]).all()


def test_drop_tail_gives_full_batches(corpus):
    counts = []
    for rank in range(2):
        ds = PackedIterableDataset(corpus, batch_rows=5, rank=rank, world_size=2, tail="drop")
        sizes = [len(b["input_ids"]) for b in ds]
        assert set(sizes) == {5}
        counts.append(len(sizes))
    assert counts[0] == counts[1] == len(ds)


def test_even_tail_merges_a_round_shorter_than_the_world(corpus):
    n = PackedDataset(corpus).packed.num_rows
    world = 4
    batch_rows = 2
    # Find a resume point leaving a last round of fewer rows than ranks.
    start = n - (2 * world * batch_rows + 1)
    delivered = []
    sizes = set()
    for rank in range(world):
        ds = PackedIterableDataset(corpus, batch_rows=batch_rows, rank=rank, world_size=world)
        ds.load_state_dict({"epoch": 0, "rows_consumed": start})
        batches = [b["sample_ids"] for b in ds]
        assert len(batches) == 2
        sizes.update(len(b) for b in batches)
        delivered.extend(int(x) for b in batches for t in b for x in t)
    assert sizes == {2, 3}
    assert len(delivered) == len(set(delivered))


def test_collate_fn_batches(corpus):
    ds = PackedIterableDataset(
        corpus, batch_rows=4, world_size=1, rank=0, collate_fn=PackedCollator("padded", pad_to=48)
    )
    batch = next(iter(DataLoader(ds, batch_size=None, num_workers=0)))
    assert batch["input_ids"].shape == (4, 48)
    assert batch["position"] == {"epoch": 0, "batch": 0, "rows_consumed": 4}


def test_bad_arguments(corpus, monkeypatch):
    with pytest.raises(tokpack.ConfigError, match="batch_rows"):
        PackedIterableDataset(corpus, batch_rows=0)
    with pytest.raises(tokpack.ConfigError, match="tail"):
        PackedIterableDataset(corpus, batch_rows=2, tail="wrap")
    with pytest.raises(tokpack.ConfigError, match="rank"):
        PackedIterableDataset(corpus, batch_rows=2, rank=2, world_size=2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    ds = PackedIterableDataset(corpus, batch_rows=2)
    assert (ds.rank, ds.world_size) == (3, 4)
    with pytest.raises(tokpack.ConfigError, match="seed=7"):
        ds.load_state_dict({"epoch": 0, "rows_consumed": 0, "seed": 7})
    with pytest.raises(tokpack.ConfigError, match="rows_consumed"):
        ds.load_state_dict({"epoch": 0})
    with pytest.raises(tokpack.InputNotFoundError):
        PackedIterableDataset(corpus / "nope", batch_rows=2)


def plan_in_worker(rows):
    """A collate_fn that runs Rust work (the thread pool) inside the worker process."""
    lengths = [int(n) for r in rows for n in r["seq_lengths"]]
    p = tokpack.plan(lengths, max_len=64, threads=2)
    threads = os.environ.get("TOKPACK_NUM_THREADS")
    return {"n_bins": p.n_bins, "ids": [r["sample_ids"] for r in rows], "threads": threads}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_with_fork_and_spawn(corpus, method, monkeypatch):
    monkeypatch.delenv("TOKPACK_NUM_THREADS", raising=False)
    tokpack.plan([5, 6, 7] * 1000, max_len=64, threads=2)  # start the parent's pool before fork
    ds = PackedIterableDataset(
        corpus, batch_rows=8, world_size=1, rank=0, collate_fn=plan_in_worker
    )
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=method)
    batches = list(loader)
    seen = [int(x) for b in batches for t in b["ids"] for x in t]
    assert sorted(seen) == list(range(N_SAMPLES))
    assert {b["threads"] for b in batches} == {"1"}  # one Rust thread per worker by default
    mapped = DataLoader(
        PackedDataset(corpus),
        batch_size=8,
        num_workers=2,
        multiprocessing_context=method,
        collate_fn=plan_in_worker,
    )
    mapped_batches = list(mapped)
    assert len(mapped_batches) == len(mapped) and all(b["n_bins"] > 0 for b in mapped_batches)
    assert {b["threads"] for b in mapped_batches} == {"1"}


@pytest.mark.parametrize("world_size", [1, 2])
def test_torchdata_stateful_dataloader_resumes_in_order(corpus, world_size):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make(rank):
        ds = PackedIterableDataset(corpus, batch_rows=3, rank=rank, world_size=world_size, seed=5)
        return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=2)

    for rank in range(world_size):
        full = [b["position"]["batch"] for b in make(rank)]
        loader = make(rank)
        it = iter(loader)
        head = [next(it)["position"]["batch"] for _ in range(5)]
        saved = loader.state_dict()
        del it
        resumed = make(rank)
        resumed.load_state_dict(saved)
        tail = [b["position"]["batch"] for b in resumed]
        assert head + tail == full == list(range(len(full)))


def test_in_process_pass_continues_after_interruption_and_replays_when_done(corpus):
    ds = PackedIterableDataset(corpus, batch_rows=4, world_size=1, rank=0)
    full = [b["position"]["batch"] for b in ds]
    it = iter(ds)
    next(it), next(it)
    del it
    assert [b["position"]["batch"] for b in ds] == full[2:]
    assert [b["position"]["batch"] for b in ds] == full


def test_persistent_workers_replay_the_whole_epoch_on_every_pass(corpus):
    ds = PackedIterableDataset(corpus, batch_rows=3, rank=0, world_size=1, seed=7)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    passes = [[int(x) for b in loader for ids in b["sample_ids"] for x in ids] for _ in range(2)]
    assert passes[0] == passes[1]
    _assert_exactly_once([passes[1]])


def test_rows_without_collate_fn_are_not_shared_with_later_reads(corpus):
    ds = PackedIterableDataset(corpus, batch_rows=3, rank=0, world_size=1, shuffle=False)
    first = next(iter(ds))
    before = first["input_ids"][0][0].item()
    first["input_ids"][0][0] = 12345
    ds.load_state_dict({"epoch": 0, "rows_consumed": 0})  # the same rows again, from the cache
    assert next(iter(ds))["input_ids"][0][0].item() == before != 12345


def test_open_dataset_raises_when_the_directory_is_rebuilt(tmp_path):
    samples, labels = random_samples(N_SAMPLES, 30, seed=2)
    out = tmp_path / "packed"
    write_packed_dir(out, samples, labels, max_len=48, rows_per_shard=60, row_group_rows=8)
    ds = PackedIterableDataset(out, batch_rows=3, rank=0, world_size=1)
    write_packed_dir(out, samples, labels, max_len=40, rows_per_shard=60, row_group_rows=8)
    with pytest.raises(tokpack.CorruptOutputError, match="changed since the dataset was opened"):
        list(DataLoader(ds, batch_size=None, num_workers=0))


# -- balance="compute" ------------------------------------------------------------------------


def _compute(batch):
    """Attention compute of a batch's rows (``24576·L + L²`` over their segments)."""
    return sum(float((24576 * s + s * s).sum()) for s in (t.double() for t in batch["seq_lengths"]))


def _stream(path, rank, world_size, state=None, **kw):
    ds = PackedIterableDataset(path, rank=rank, world_size=world_size, seed=7, **kw)
    if state is not None:
        ds.load_state_dict(state)
    return ds


def test_balanced_stream_deals_each_step_with_even_compute(corpus):
    """The same rows per optimizer step as the plain stream, the same batch sizes, every row
    exactly once, the same batches with workers, and even compute per step."""
    world, steps = 3, 2
    runs = {}
    for balance in (None, "compute"):
        ranks = []
        for rank in range(world):
            ds = _stream(corpus, rank, world, batch_rows=3, grad_accum_steps=steps, balance=balance)
            ranks.append(list(ds))
            if balance:
                loader = DataLoader(ds, batch_size=None, num_workers=2)
                with_workers = [b["sample_ids"] for b in loader]
                assert [[t.tolist() for t in b] for b in with_workers] == [
                    [t.tolist() for t in b["sample_ids"]] for b in ranks[-1]
                ]
        runs[balance] = ranks
    _assert_exactly_once([[x for t in b for x in t] for r in runs["compute"] for b in _ids(r)])
    plain, even = runs[None], runs["compute"]
    assert [[len(b["sample_ids"]) for b in r] for r in even] == [
        [len(b["sample_ids"]) for b in r] for r in plain
    ]
    imbalance = {}
    for balance, ranks in runs.items():
        per_step = []
        for m in range(0, len(ranks[0]), steps):
            loads = [sum(_compute(b) for b in r[m : m + steps]) for r in ranks]
            per_step.append(max(loads) / np.mean(loads))
        imbalance[balance] = np.array(per_step)
        rows = [
            sorted(x for r in ranks for b in _ids(r[m : m + steps]) for t in b for x in t)
            for m in range(0, len(ranks[0]), steps)
        ]
        if balance is None:
            plain_rows = rows
        else:
            assert rows == plain_rows
    assert np.all(imbalance["compute"] <= imbalance[None] + 1e-12)
    assert imbalance["compute"].mean() < imbalance[None].mean()


def _at(state):
    """Where a state or a batch's position stands in the stream."""
    return {k: state[k] for k in ("epoch", "rows_consumed", "mid_step") if k in state}


def _ids(batches):
    return [[t.tolist() for t in b["sample_ids"]] for b in batches]


@settings(max_examples=25)
@given(
    world=st.integers(1, 4),
    batch_rows=st.integers(1, 4),
    steps=st.integers(1, 3),
    tail=st.sampled_from(["even", "drop"]),
    stop=st.integers(0, 40),
)
def test_balanced_stream_resumes_exactly_once(corpus, world, batch_rows, steps, tail, stop):
    """Stopped after any batch (inside a step or at its end) and resumed from that batch's
    position, every rank gets the rest of its uninterrupted batches, and all together deliver
    the plain stream's rows, each exactly once."""
    kw = dict(batch_rows=batch_rows, grad_accum_steps=steps, tail=tail, balance="compute")
    whole = [list(_stream(corpus, r, world, **kw)) for r in range(world)]
    stop = min(stop, len(whole[0]))
    state = _stream(corpus, 0, world, **kw).state_dict(batches_consumed=stop)
    if stop:
        assert _at(whole[0][stop - 1]["position"]) == _at(state)
    assert ("mid_step" in state) == (0 < stop < len(whole[0]) and stop % steps != 0)
    delivered = []
    for r in range(world):
        rest = list(_stream(corpus, r, world, state=state, **kw))
        assert _ids(rest) == _ids(whole[r][stop:])
        delivered += [x for b in _ids(whole[r][:stop] + rest) for t in b for x in t]
    plain = [
        x
        for r in range(world)
        for b in _ids(_stream(corpus, r, world, batch_rows=batch_rows, tail=tail))
        for t in b
        for x in t
    ]
    assert sorted(delivered) == sorted(plain) and len(set(delivered)) == len(delivered)


def test_balanced_mid_step_state_needs_the_same_deal(corpus):
    kw = dict(batch_rows=3, grad_accum_steps=2, balance="compute")
    ds = _stream(corpus, 0, 2, **kw)
    state = ds.state_dict(batches_consumed=3)
    assert state["mid_step"]["batches"] == 1
    assert state["rows_consumed"] == 2 * 2 * 3
    with pytest.raises(tokpack.ConfigError, match=r"world_size=2, this stream has world_size=3"):
        _stream(corpus, 0, 3, state=state, **kw)
    with pytest.raises(tokpack.ConfigError, match=r"needs balance=\"compute\""):
        _stream(corpus, 0, 2, state=state, batch_rows=3, grad_accum_steps=2)
    # At a step boundary: any topology, with or without balancing.
    boundary = ds.state_dict(batches_consumed=4)
    assert "mid_step" not in boundary and boundary["rows_consumed"] == 4 * 2 * 3
    rest = [b for r in range(3) for b in _stream(corpus, r, 3, state=boundary, batch_rows=2)]
    head = [b for r in range(2) for b in list(_stream(corpus, r, 2, **kw))[:4]]
    _assert_exactly_once([[int(x) for t in b["sample_ids"] for x in t] for b in head + rest])
    with pytest.raises(tokpack.ConfigError, match='balance must be None or "compute"'):
        PackedIterableDataset(corpus, batch_rows=2, balance="tokens")


def test_balanced_stream_resumes_mid_step_with_other_workers(corpus):
    """A mid-step position resumed with two DataLoader workers (and state_dict counting from
    the resumed position)."""
    kw = dict(batch_rows=2, grad_accum_steps=3, balance="compute")
    full = [list(_stream(corpus, r, 2, **kw)) for r in range(2)]
    state = full[0][4]["position"]
    assert state["mid_step"]["batches"] == 2
    for r in range(2):
        ds = _stream(corpus, r, 2, state=state, **kw)
        assert len(ds) == len(full[r]) - 5
        got = [b["sample_ids"] for b in DataLoader(ds, batch_size=None, num_workers=2)]
        assert [[t.tolist() for t in b] for b in got] == [
            [t.tolist() for t in b["sample_ids"]] for b in full[r][5:]
        ]
        assert _at(ds.state_dict(batches_consumed=1)) == _at(full[r][5]["position"])


# -- the single-process reading path: views for PackedCollator, decodes ahead ------------------


def test_packed_collator_batches_do_not_share_memory_with_the_cache(corpus):
    """PackedCollator gets views of the cached groups (it only reads them): its batches are new
    tensors, so writing into one changes nothing a later read returns."""
    ds = PackedIterableDataset(
        corpus, batch_rows=3, rank=0, world_size=1, shuffle=False, collate_fn=PackedCollator()
    )
    first = next(iter(ds))
    before = first["input_ids"].clone()
    first["input_ids"].fill_(12345)
    first["labels"].fill_(7)
    ds.load_state_dict({"epoch": 0, "rows_consumed": 0})
    again = next(iter(ds))
    assert again["input_ids"].equal(before)
    assert (again["labels"] != 7).any()


class _Writes:
    """A collate_fn that writes into its rows (as a user's may): it must get copies."""

    def __call__(self, rows):
        out = [r["input_ids"].clone() for r in rows]
        for r in rows:
            r["input_ids"][:] = -1
        return {"input_ids": out}


def test_a_collate_fn_without_reads_rows_only_gets_copies(corpus):
    ds = PackedIterableDataset(
        corpus, batch_rows=3, rank=0, world_size=1, shuffle=False, collate_fn=_Writes()
    )
    first = next(iter(ds))["input_ids"]
    ds.load_state_dict({"epoch": 0, "rows_consumed": 0})
    again = next(iter(ds))["input_ids"]
    assert all(a.equal(b) and (a >= 0).all() for a, b in zip(first, again))


def _decodes(monkeypatch):
    """(thread name, group) of every decode of a PackedDir, recorded."""
    from tokpack.packed.reader import PackedDir

    calls = []
    decode = PackedDir.decode

    def counting(self, group, columns=None):
        import threading

        calls.append((threading.current_thread().name, group, columns))
        return decode(self, group, columns)

    monkeypatch.setattr(PackedDir, "decode", counting)
    return calls


def test_one_process_decodes_ahead_on_a_background_thread_each_group_once(corpus, monkeypatch):
    calls = _decodes(monkeypatch)
    ds = PackedIterableDataset(corpus, batch_rows=3, rank=0, world_size=1, seed=7)
    background = [[int(x) for ids in b["sample_ids"] for x in ids] for b in ds]
    _assert_exactly_once(background)
    groups = [g for _, g, _ in calls]
    assert sorted(groups) == list(range(ds.sources[0].num_groups))  # each group once
    assert {name for name, _, _ in calls} != {"MainThread"}
    assert any(name.startswith("tokpack-decode") for name, _, _ in calls)
    assert {cols for _, _, cols in calls} == {None}  # rows without a collate_fn: every column
    # The same batches as with workers (which decode in the worker processes).
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    assert [[int(x) for ids in b["sample_ids"] for x in ids] for b in loader] == background


def test_one_process_asks_a_window_ahead_for_decodes(tmp_path, monkeypatch):
    """Before the first batch of a window is built, its groups are already on the background
    decoder: looking only a batch or two ahead, the loop waited on a window's decodes at every
    window boundary (40 % of its time at 0 workers)."""
    from tokpack.torch._rows import GroupCache

    samples, labels = random_samples(N_SAMPLES, 30, seed=2)
    out = tmp_path / "packed"
    write_packed_dir(out, samples, labels, max_len=48, rows_per_shard=64, row_group_rows=8)
    asked = []
    ahead = GroupCache.decode_ahead
    monkeypatch.setattr(
        GroupCache, "decode_ahead", lambda self, g: (asked.append(g), ahead(self, g))[1]
    )
    ds = PackedIterableDataset(out, batch_rows=3, rank=0, world_size=1, seed=3, shuffle_window=2)
    order = EpochOrder(ds.packed.group_rows, seed=3, epoch=0, shuffle=True, window=2)
    assert len(order.window_groups) > 2
    it = iter(ds)
    next(it)
    # Stream rows [0, 3 + a window of rows) were looked at: window 1's first rows among them.
    first_of_next = order.rows(int(order.window_start[1]), int(order.window_start[1]) + 3)[0]
    assert set(first_of_next.tolist()) <= set(asked)
    del it


class _HeapProbe:
    """A collate_fn that reports whether a 24 MB block it allocates is mapped on its own (glibc's
    default for large blocks) or comes from the heap."""

    def __call__(self, rows):
        import ctypes

        class MallInfo2(ctypes.Structure):
            _fields_ = [
                (f, ctypes.c_size_t)
                for f in (
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
                ).split()
            ]

        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = MallInfo2
        before = libc.mallinfo2().hblkhd
        block = np.ones(3 << 20, dtype=np.int64)  # 24 MB
        mapped = libc.mallinfo2().hblkhd - before
        del block
        return {"mapped": mapped}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_worker_keeps_the_blocks_it_frees_on_its_heap(corpus):
    """Each batch allocates and frees blocks of the same few MB (up to tens with long rows);
    mapped anew each time, a 2-worker reader spent a fifth of its CPU on page faults."""
    ds = PackedIterableDataset(
        corpus, batch_rows=3, rank=0, world_size=1, seed=7, collate_fn=_HeapProbe()
    )
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    mapped = [b["mapped"] for b in loader]
    assert mapped and set(mapped) == {0}


def test_decode_error_ahead_is_raised_at_the_batch_that_needs_the_group(tmp_path):
    samples, labels = random_samples(N_SAMPLES, 30, seed=2)
    out = tmp_path / "packed"
    write_packed_dir(out, samples, labels, max_len=48, rows_per_shard=60, row_group_rows=8)
    ds = PackedIterableDataset(out, batch_rows=3, rank=0, world_size=1, shuffle=False)
    shard = sorted(out.glob("*.parquet"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    got = []
    with pytest.raises(tokpack.CorruptOutputError, match=shard.name):
        for b in ds:
            got.append(b)
    assert got  # the batches before the damaged group came out


def test_fork_after_a_partial_pass_with_decodes_pending(corpus):
    """Workers forked while the parent has decodes queued on its thread (which they do not
    inherit) decode for themselves instead of waiting on them."""
    ds = PackedIterableDataset(corpus, batch_rows=3, rank=0, world_size=1, seed=7)
    it = iter(ds)
    next(it)  # decodes are now queued on the parent's thread
    loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
    batches = [[int(x) for ids in b["sample_ids"] for x in ids] for b in loader]
    assert batches
    del it


def test_packed_collator_has_only_the_columns_it_reads_decoded(corpus, monkeypatch):
    calls = _decodes(monkeypatch)
    ds = PackedIterableDataset(
        corpus, batch_rows=3, rank=0, world_size=1, collate_fn=PackedCollator("flash")
    )
    batches = list(ds)
    assert {cols for _, _, cols in calls} == {("input_ids", "labels", "seq_lengths")}
    full = PackedIterableDataset(corpus, batch_rows=3, rank=0, world_size=1)
    for got, rows in zip(batches, full, strict=True):
        assert got["input_ids"].tolist() == [int(x) for r in rows["input_ids"] for x in r]
    assert PackedCollator(return_pairs=True).reads_columns(ROW_COLUMNS) == ROW_COLUMNS
