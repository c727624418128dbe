"""Row groups shared between DataLoader workers (tokpack.torch._shared): each group decoded once
per pass between the workers, the same bytes whatever the worker count, a rebuilt directory
still detected, and nothing left in shared memory."""

import gc
import os
import shutil

import numpy as np
import pytest
from torch.utils.data import DataLoader

import tokpack
from tokpack.packed.reader import PackedDir
from tokpack.torch import PackedCollator, PackedDataset, PackedIterableDataset
from tokpack.torch._shared import SharedGroups

from .packed_corpus import batch_bytes as _bytes
from .packed_corpus import random_samples, small_packed_dir, write_packed_dir


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_packed_dir(tmp_path_factory, "shared_groups", 400, seed=3, rows_per_shard=60)


def _decodes_logged(monkeypatch, log):
    """Record every row group a (forked) worker decodes, one line per decode, in ``log``."""
    decode = PackedDir.decode

    def logged(self, group, columns=None):
        with open(log, "a") as f:
            f.write(f"{group}\n")
        return decode(self, group, columns)

    monkeypatch.setattr(PackedDir, "decode", logged)


def _iterable(path, **kw):
    kw.setdefault("collate_fn", PackedCollator())
    return PackedIterableDataset(path, batch_rows=3, seed=11, **kw)


@pytest.mark.parametrize("world_size", [1, 2])
def test_batches_are_the_same_bytes_for_any_worker_count(corpus, world_size):
    for rank in range(world_size):
        alone = _bytes(_iterable(corpus, rank=rank, world_size=world_size))
        for workers in (1, 2, 3):
            ds = _iterable(corpus, rank=rank, world_size=world_size)
            assert _bytes(DataLoader(ds, batch_size=None, num_workers=workers)) == alone


@pytest.mark.parametrize("reader", ["iterable", "map"])
def test_workers_decode_each_row_group_once_per_pass(corpus, tmp_path, monkeypatch, reader):
    log = tmp_path / "decodes"
    _decodes_logged(monkeypatch, log)
    if reader == "iterable":
        ds = _iterable(corpus, rank=0, world_size=1)
        loader = DataLoader(ds, batch_size=None, num_workers=3, multiprocessing_context="fork")
    else:
        loader = DataLoader(
            PackedDataset(corpus),
            batch_size=3,
            num_workers=3,
            multiprocessing_context="fork",
            collate_fn=PackedCollator(),
        )
    assert sum(1 for _ in loader) == len(loader)
    decoded = [int(g) for g in log.read_text().split()]
    # The DataLoader keeps its workers within prefetch_factor * num_workers batches (18 rows) of
    # each other, less than the rows of the groups the shared cache holds beyond the window in
    # use and the one read ahead, so no worker needs a group after it was evicted.
    assert sorted(decoded) == list(range(PackedDir(corpus).num_groups))


def test_resume_mid_epoch_with_other_worker_count_is_exact(corpus):
    ds = _iterable(corpus, rank=0, world_size=1)
    full = _bytes(ds)
    ds = _iterable(corpus, rank=0, world_size=1)
    head = []
    for batch in DataLoader(ds, batch_size=None, num_workers=3):
        head.append(batch)
        if len(head) == 7:
            break
    resumed = _iterable(corpus, rank=0, world_size=1)
    resumed.load_state_dict(head[-1]["position"])
    tail = list(DataLoader(resumed, batch_size=None, num_workers=2))
    assert _bytes(head + tail) == full


@pytest.mark.parametrize("after_a_pass", [False, True])
def test_workers_raise_when_the_directory_is_rebuilt(tmp_path, after_a_pass):
    samples, labels = random_samples(400, 30, seed=3)
    out = tmp_path / "packed"
    write_packed_dir(out, samples, labels, max_len=48, rows_per_shard=60, row_group_rows=4)
    ds = _iterable(out, rank=0, world_size=1, collate_fn=None)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    if after_a_pass:
        # The shared cache keeps the last `capacity` groups published, the next pass starts with
        # the first window's 4 groups, published first (workers start with new local caches).
        assert PackedDir(out).num_groups > 2 * ds._caches[0].shared.capacity
        list(loader)
    write_packed_dir(out, samples, labels, max_len=40, rows_per_shard=60, row_group_rows=4)
    with pytest.raises(tokpack.CorruptOutputError, match="changed since the dataset was opened"):
        list(loader)


def test_shared_directory_is_removed_with_the_reader(corpus):
    ds = _iterable(corpus, rank=0, world_size=1)
    path = ds._caches[0].shared.path
    list(DataLoader(ds, batch_size=None, num_workers=2))
    assert os.path.isdir(path)
    del ds
    gc.collect()
    assert not os.path.exists(path)


def test_a_killed_readers_directory_is_removed_by_the_next_reader(tmp_path):
    """kill -9 runs no finalizer: the next reader removes directories whose creator is gone,
    and leaves a live creator's and foreign names alone."""
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(child.stdout)
    root = os.path.dirname(SharedGroups(capacity=1).path)
    orphan = os.path.join(root, f"tokpack-groups-{dead}-test{os.getpid()}")
    live = os.path.join(root, f"tokpack-groups-{os.getpid()}-test-live")
    foreign = os.path.join(root, f"not-tokpack-groups-{dead}")
    try:
        for d in (orphan, live, foreign):
            os.makedirs(os.path.join(d, "sub"))
        SharedGroups(capacity=1)
        assert not os.path.exists(orphan)
        assert os.path.isdir(live) and os.path.isdir(foreign)
    finally:
        for d in (orphan, live, foreign):
            shutil.rmtree(d, ignore_errors=True)


def test_groups_round_trip_and_the_oldest_are_evicted(tmp_path):
    shared = SharedGroups(capacity=2)
    calls = []

    def group(g):
        def decode():
            calls.append(g)
            values = np.arange(10 * g, 10 * g + 7, dtype=np.int32)
            return {
                "input_ids": (values, np.array([0, 3, 7], dtype=np.int64)),
                "num": np.array([g, g + 1], dtype=np.int64),
            }

        return decode

    for g in range(3):
        shared.get(g, group(g))
    got = shared.get(2, group(2))  # published: mapped, not decoded again
    assert calls == [0, 1, 2]
    np.testing.assert_array_equal(got["input_ids"][0], np.arange(20, 27, dtype=np.int32))
    np.testing.assert_array_equal(got["input_ids"][1], [0, 3, 7])
    np.testing.assert_array_equal(got["num"], [2, 3])
    shared.get(0, group(0))  # evicted (capacity 2): decoded again
    assert calls == [0, 1, 2, 0]


def test_non_numeric_groups_are_not_published():
    shared = SharedGroups(capacity=4)
    calls = []

    def decode():
        calls.append(1)
        return {"carried": (np.array(["a", "b"], dtype=object), np.array([0, 1, 2]))}

    for _ in range(2):
        assert list(shared.get(0, decode)["carried"][0]) == ["a", "b"]
    assert calls == [1, 1]
