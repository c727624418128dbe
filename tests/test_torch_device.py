"""DeviceLoader and the device= mode of PackedDataset, on device="cpu" (the code paths GPUs use)."""

import pytest
import torch
from torch.utils.data import DataLoader

import tokpack
from tokpack.torch import DeviceLoader, PackedCollator, PackedDataset, PackedIterableDataset
from tokpack.torch.device import to_device

from .packed_corpus import small_packed_dir


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_packed_dir(tmp_path_factory, "packed_dev", 120, seed=4, rows_per_shard=30)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.parametrize("prefetch", [1, 3])
def test_device_loader_yields_the_same_batches(corpus, prefetch):
    loader = DataLoader(
        PackedDataset(corpus), batch_size=4, collate_fn=PackedCollator("torchtune", pad_to=48)
    )
    wrapped = DeviceLoader(loader, "cpu", prefetch=prefetch)
    assert len(wrapped) == len(loader)
    got = list(wrapped)
    assert len(got) == len(loader)
    assert all(_same(a, b) for a, b in zip(got, loader))
    assert all(b["tokens"].device.type == "cpu" for b in got)


def test_device_loader_passes_through_the_dataset_api(corpus):
    ds = PackedIterableDataset(corpus, batch_rows=4, world_size=1, rank=0)
    wrapped = DeviceLoader(ds, torch.device("cpu"))
    batches = list(wrapped)
    assert batches[-1]["position"]["rows_consumed"] == len(PackedDataset(corpus))
    wrapped.set_epoch(2)
    assert ds.epoch == 2
    with pytest.raises(tokpack.ConfigError):
        DeviceLoader(ds, "cpu", prefetch=0)


def test_to_device_moves_nested_tensors_only():
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), (torch.ones(1), 3)], "n": 5}
    moved = to_device(batch, torch.device("cpu"), pin=False, non_blocking=True)
    assert _same(batch, moved)


def test_in_device_mode_rows_are_copies_on_the_device(corpus):
    ds = PackedDataset(corpus, device="cpu")
    a, b = ds[0], ds[0]
    assert torch.equal(a["input_ids"], b["input_ids"]) and a["input_ids"].device.type == "cpu"
    assert (
        a["input_ids"].untyped_storage().data_ptr() != b["input_ids"].untyped_storage().data_ptr()
    )
    batch = PackedCollator("hf")([ds[i] for i in range(4)])
    assert batch["input_ids"].device.type == "cpu" and batch["input_ids"].shape[0] == 1


def test_device_loader_copies_and_reports_missing_attributes(corpus):
    import copy

    wrapped = copy.copy(DeviceLoader([{"x": torch.ones(1)}], "cpu"))
    assert [b["x"].item() for b in wrapped] == [1.0]
    with pytest.raises(AttributeError):
        assert wrapped.no_such_attribute is None
