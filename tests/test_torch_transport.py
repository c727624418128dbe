"""Batches from DataLoader workers through the shared-memory ring (tokpack.torch._transport): they
arrive as plain dicts equal to the batches made in the main process, whatever the main process
holds on to, with fork and spawn workers."""

import copy
import gc
import multiprocessing.util
import os
import pickle
import shutil
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from tokpack.errors import OutputError
from tokpack.torch import PackedCollator, PackedDataset, PackedIterableDataset, _transport
from tokpack.torch._transport import WorkerBatch, ship

from .packed_corpus import small_packed_dir

COLLATORS = {
    "none": None,
    "hf": PackedCollator("hf", return_seq_idx=True, return_loss_weights=True),
    "flash": PackedCollator("flash"),
    "padded": PackedCollator("padded", pad_to=48),
    "torchtune": PackedCollator("torchtune"),
    "cp": PackedCollator("flash", cp_size=2, cp_rank=1, return_seq_idx=True),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_packed_dir(tmp_path_factory, "packed_transport", 300, seed=5, rows_per_shard=40)


def _assert_same(a, b):
    """Equal structures: same container types (plain dicts), dtypes, shapes and values."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def _iterable(path, collate):
    return PackedIterableDataset(path, batch_rows=3, rank=0, world_size=1, collate_fn=collate)


@pytest.mark.parametrize("name", list(COLLATORS))
def test_held_worker_batches_equal_main_process_batches(corpus, name):
    # 34 batches, all held: more than a ring's slots, so later ones take the fallback block.
    collate = COLLATORS[name]
    alone = list(DataLoader(_iterable(corpus, collate), batch_size=None, num_workers=0))
    loader = DataLoader(_iterable(corpus, collate), batch_size=None, num_workers=2)
    held = list(loader)
    assert len(held) == len(alone) > 2 * _transport._SLOTS
    for a, b in zip(alone, held):
        _assert_same(b, a)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_released_worker_batches_equal_main_process_batches(corpus, method):
    # Batches dropped as they arrive (their slots are reused) and every third one kept: the
    # kept ones are never overwritten by later batches.
    collate = COLLATORS["hf"]
    alone = list(DataLoader(_iterable(corpus, collate), batch_size=None, num_workers=0))
    loader = DataLoader(
        _iterable(corpus, collate), batch_size=None, num_workers=2, multiprocessing_context=method
    )
    kept = {}
    for k, batch in enumerate(loader):
        _assert_same(batch, alone[k])
        if k % 3 == 0:
            kept[k] = batch
    assert k == len(alone) - 1
    for k, batch in kept.items():
        _assert_same(batch, alone[k])
    mapped = DataLoader(
        PackedDataset(corpus),
        batch_size=4,
        num_workers=2,
        collate_fn=PackedCollator("flash"),
        multiprocessing_context=method,
    )
    in_process = DataLoader(PackedDataset(corpus), batch_size=4, collate_fn=PackedCollator("flash"))
    for a, b in zip(in_process, mapped, strict=True):
        _assert_same(b, a)


def test_file_system_sharing_strategy(corpus):
    import torch.multiprocessing as mp

    collate = COLLATORS["hf"]
    alone = list(DataLoader(_iterable(corpus, collate), batch_size=None, num_workers=0))
    strategy = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        loader = DataLoader(_iterable(corpus, collate), batch_size=None, num_workers=2)
        for a, b in zip(alone, loader, strict=True):
            _assert_same(b, a)
    finally:
        mp.set_sharing_strategy(strategy)


def _round_trip(batch):
    """What a DataLoader's queue does to a batch, in this process."""
    return ForkingPickler.loads(ForkingPickler.dumps(batch))


def test_round_trip_keeps_structure_identity_and_values():
    shared = torch.arange(5, dtype=torch.int32)
    grad = torch.ones(2, requires_grad=True)  # not movable: pickled by torch as usual
    batch = WorkerBatch(
        a=shared,
        b=shared,
        nested=[torch.zeros(0, dtype=torch.int64), (torch.tensor(2.5), "x"), {"n": 3}],
        t=torch.arange(12, dtype=torch.int64).view(3, 4).t(),  # not contiguous
        mask=torch.tensor([True, False, True]),
        half=torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        grad=grad,
        position={"epoch": 1, "batch": 2},
    )
    out = _round_trip(batch)
    assert type(out) is dict and type(out["nested"]) is list and type(out["position"]) is dict
    assert out["a"] is out["b"]
    expected = {k: v for k, v in batch.items() if k != "grad"}
    _assert_same({k: v for k, v in out.items() if k != "grad"}, expected)
    assert torch.equal(out["grad"], grad) and out["grad"].requires_grad


def test_held_batches_survive_full_rings_and_bigger_rings():
    # Batches of growing size, all held: the ring fills up (fallback blocks) and is replaced by
    # bigger ones; every batch keeps its values.
    made = [WorkerBatch(x=torch.full((3000 * (1 + k),), k, dtype=torch.int64)) for k in range(30)]
    held = [_round_trip(b) for b in made]
    for b, out in zip(made, held):
        _assert_same(out, dict(b))
    del held
    for b in made:  # slots released: rounds reuse them
        _assert_same(_round_trip(b), dict(b))


def test_outside_the_queue_a_worker_batch_is_a_plain_dict():
    batch = {"x": torch.arange(3), "n": 1}
    assert ship(batch) is batch  # not in a DataLoader worker: unchanged
    wrapped = WorkerBatch(batch)
    for other in (pickle.loads(pickle.dumps(wrapped)), copy.deepcopy(wrapped)):
        assert type(other) is dict
        _assert_same(other, batch)
    assert type(copy.copy(wrapped)) is WorkerBatch


def test_a_forked_child_freeing_its_copy_does_not_release_the_slot():
    # The main process forks new DataLoader workers while it holds batches: a child that frees
    # its inherited copy must not hand the slot back under the parent's batch.
    held = _round_trip(WorkerBatch(x=torch.full((1000,), 7, dtype=torch.int64)))
    pid = os.fork()
    if pid == 0:
        del held
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    later = [_round_trip(WorkerBatch(x=torch.full((9,), k, dtype=torch.int64))) for k in range(3)]
    assert bool((held["x"] == 7).all()) and [int(b["x"][0]) for b in later] == [0, 1, 2]


class _Child:
    """A forked process that sends worker batches over a pipe, each when told to, then exits:
    a DataLoader worker that finished its share (its ring crosses with its first batch, while
    it is alive to hand over the descriptor)."""

    def __init__(self, values):
        self.go_r, go_w = os.pipe()
        out_r, self.out_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                # What multiprocessing does in a child it starts (the fd sharer's reset).
                multiprocessing.util._run_after_forkers()
                os.close(go_w), os.close(out_r)
                for v in values:
                    os.read(self.go_r, 1)
                    data = bytes(ForkingPickler.dumps(WorkerBatch(x=torch.full((50,), v))))
                    os.write(self.out_w, len(data).to_bytes(8, "little") + data)
                os.read(self.go_r, 1)
            finally:
                os._exit(0)
        os.close(self.go_r), os.close(self.out_w)
        self.go, self.out = go_w, os.fdopen(out_r, "rb")

    def next(self):
        os.write(self.go, b"x")
        return self.out.read(int.from_bytes(self.out.read(8), "little"))

    def exit(self):
        os.write(self.go, b"x")
        os.waitpid(self.pid, 0)


def test_an_exited_workers_batches_still_in_the_queue_arrive():
    # Worker A exited with a batch still queued; worker B's first batch (a new ring) is read
    # before it. Found by test_torch_shared_groups: "a batch refers to shared-memory ring ...
    # that this process never received".
    a, b = _Child([1, 2]), _Child([3])
    first = pickle.loads(a.next())
    queued = a.next()
    a.exit()
    del first
    gc.collect()
    assert int(pickle.loads(b.next())["x"][0]) == 3
    assert int(pickle.loads(queued)["x"][0]) == 2
    b.exit()


# -- shared memory running out (issue 20, item 13) --------------------------------------------


def _no_room_over(limit):
    """A stand-in for ``_shared_bytes`` failing as torch does when /dev/shm is full, for
    allocations over ``limit`` bytes."""
    real = _transport._shared_bytes

    def shared_bytes(n):
        if n > limit:
            raise RuntimeError(
                "unable to allocate shared memory(shm) for file </torch_0_0_0>: No space left on"
                " device (28)"
            )
        return real(n)

    return shared_bytes


def test_no_shared_memory_in_a_worker_is_an_error_in_the_main_process(corpus, monkeypatch):
    """The worker takes its batch's shared memory before the batch is queued: with none to be
    had, the DataLoader raises tokpack's OutputError. It used to be taken on the queue's feeder
    thread, which printed the error and lost the batch, and the loop waited forever (here: the
    DataLoader's timeout)."""
    monkeypatch.setattr(_transport, "_shared_bytes", _no_room_over(0))
    loader = DataLoader(
        _iterable(corpus, COLLATORS["hf"]),
        batch_size=None,
        num_workers=1,
        multiprocessing_context="fork",
        timeout=60,
    )
    with pytest.raises(OutputError, match="cannot get .* bytes of shared memory .*--shm-size"):
        next(iter(loader))


def test_without_room_for_a_ring_batches_travel_in_blocks_of_their_own(corpus, monkeypatch):
    """Room for one batch but not for a ring of them: every batch still arrives, equal."""
    collate = COLLATORS["hf"]
    alone = list(DataLoader(_iterable(corpus, collate), batch_size=None, num_workers=0))
    monkeypatch.setattr(_transport, "_shared_bytes", _no_room_over(_transport._MIN_SLOT))
    loader = DataLoader(
        _iterable(corpus, collate),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    for a, b in zip(alone, loader, strict=True):
        _assert_same(b, a)


def test_a_place_taken_on_the_feeder_thread_fails_where_the_batch_arrives(monkeypatch):
    """A WorkerBatch that did not come through ship() takes its memory when pickled; a failure
    there travels with the batch and is raised where it is unpickled, never lost."""
    monkeypatch.setattr(_transport, "_ring", None)
    monkeypatch.setattr(_transport, "_shared_bytes", _no_room_over(0))
    data = ForkingPickler.dumps(WorkerBatch(x=torch.arange(10)))
    with pytest.raises(OutputError, match="shared memory"):
        pickle.loads(data)


def test_a_shipped_batch_takes_its_slot_in_the_worker_and_frees_it_unsent(monkeypatch):
    monkeypatch.setattr(_transport, "_ring", None)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    shipped = ship({"x": torch.arange(100), "n": 3})
    ring = _transport._ring
    assert type(shipped) is WorkerBatch and list(ring.flags) == [1] + [0] * (_transport._SLOTS - 1)
    del shipped  # never sent: its slot is free again
    gc.collect()
    assert not ring.flags.any()
    grown = ship({"x": torch.arange(10)})
    grown["y"] = torch.arange(100_000)  # bigger than its slot since: placed anew when sent
    out = _round_trip(grown)
    _assert_same(out, {"x": torch.arange(10), "y": torch.arange(100_000)})
    assert ship({"n": 1}) == {"n": 1}  # no tensor: no shared memory


_SMALL_SHM = """
import sys
sys.path.insert(0, {root!r})
from torch.utils.data import DataLoader
from tokpack.torch import PackedCollator, PackedIterableDataset
ds = PackedIterableDataset({corpus!r}, batch_rows=64, rank=0, world_size=1,
                           collate_fn=PackedCollator("hf"))
try:
    print(sum(1 for _ in DataLoader(ds, batch_size=None, num_workers=1, timeout=60)))
except Exception as exc:
    print(type(exc).__name__, str(exc).splitlines()[-1])
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
def test_a_full_dev_shm_is_an_error_not_a_hang(corpus, tmp_path):
    """The real thing: a DataLoader worker under a /dev/shm of 64 KiB (a private mount
    namespace), where neither a ring nor one batch fits."""
    script = tmp_path / "small_shm.py"
    script.write_text(_SMALL_SHM.format(root=str(Path(__file__).parents[1]), corpus=str(corpus)))
    shell = f"mount -t tmpfs -o size=64k tmpfs /dev/shm && exec {sys.executable} {script}"
    try:
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the DataLoader hung on a full /dev/shm")
    if "mount:" in proc.stderr or "unshare:" in proc.stderr:
        pytest.skip(f"cannot mount a private /dev/shm here: {proc.stderr.strip()}")
    assert proc.stdout.startswith("OutputError "), proc.stdout + proc.stderr
    assert "cannot get" in proc.stdout
    assert "No space left on device" in proc.stdout
