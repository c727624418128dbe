"""PackedCollator formats and attention helpers: shapes, dtypes, boundary masking."""

import pickle

import numpy as np
import pytest
import torch

import tokpack
from tokpack.torch import (
    PackedCollator,
    document_ids,
    flex_block_mask,
    sdpa_block_causal_mask,
)


def _rows():
    return [
        {
            "input_ids": torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32),
            "labels": torch.tensor([-100, 2, 3, -100, 5], dtype=torch.int32),
            "seq_lengths": torch.tensor([3, 2], dtype=torch.int32),
        },
        {
            "input_ids": torch.tensor([6, 7, 8], dtype=torch.int32),
            "labels": torch.tensor([6, 7, 8], dtype=torch.int32),
            "seq_lengths": torch.tensor([3], dtype=torch.int32),
        },
    ]


def test_hf_format():
    b = PackedCollator()(_rows())
    assert set(b) == {
        "input_ids",
        "labels",
        "position_ids",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "num_loss_tokens",
        "num_seqs",
    }
    assert b["input_ids"].shape == (1, 8) and b["input_ids"].dtype == torch.int64
    assert b["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, 7, 8]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert b["position_ids"].dtype == torch.int64
    assert b["cu_seq_lens_q"].tolist() == [0, 3, 5, 8]
    assert b["cu_seq_lens_q"].dtype == torch.int32 and b["cu_seq_lens_k"].dtype == torch.int32
    assert b["max_length_q"] == b["max_length_k"] == 3
    assert isinstance(b["max_length_q"], int)
    assert b["num_loss_tokens"] == 5 and b["num_seqs"] == 3


def test_flash_format():
    b = PackedCollator("flash", return_seq_idx=True)(_rows())
    assert b["input_ids"].shape == (8,) and b["position_ids"].shape == (8,)
    assert b["cu_seqlens"].dtype == torch.int32 and b["cu_seqlens"].tolist() == [0, 3, 5, 8]
    assert b["max_seqlen"] == 3
    assert b["seq_idx"].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert b["seq_idx"].dtype == torch.int32
    assert "attention_mask" not in b


def test_padded_format():
    b = PackedCollator("padded", pad_to=6, pad_id=9, return_seq_idx=True)(_rows())
    assert b["input_ids"].shape == (2, 6) and b["input_ids"].dtype == torch.int64
    assert b["input_ids"].tolist() == [[1, 2, 3, 4, 5, 9], [6, 7, 8, 9, 9, 9]]
    assert b["labels"].tolist() == [[-100, 2, 3, -100, 5, -100], [-100, 7, 8, -100, -100, -100]]
    assert b["position_ids"][0, :5].tolist() == [0, 1, 2, 0, 1]
    assert b["document_ids"].tolist() == [[0, 0, 0, 1, 1, -1], [0, 0, 0, -1, -1, -1]]
    assert b["seq_idx"].tolist() == [[0, 0, 0, 1, 1, -1], [2, 2, 2, -1, -1, -1]]
    assert b["num_loss_tokens"] == 5 and b["num_seqs"] == 3
    # pad_to=None pads to the longest row
    assert PackedCollator("padded")(_rows())["input_ids"].shape == (2, 5)
    with pytest.raises(tokpack.DataError, match="pad_to=4"):
        PackedCollator("padded", pad_to=4)(_rows())


def test_torchtune_format():
    b = PackedCollator("torchtune", pad_to=6)(_rows())
    assert set(b) == {"tokens", "labels", "input_pos", "seq_lens", "num_loss_tokens", "num_seqs"}
    assert b["tokens"].shape == b["labels"].shape == b["input_pos"].shape == (2, 6)
    assert b["input_pos"].dtype == torch.int64
    assert [s.tolist() for s in b["seq_lens"]] == [[3, 2, 1], [3, 3]]
    assert b["input_pos"][1].tolist() == [0, 1, 2, 0, 1, 2]


def test_rows_without_labels_train_on_inputs():
    rows = [{k: v for k, v in r.items() if k != "labels"} for r in _rows()]
    b = PackedCollator()(rows)
    assert b["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, 7, 8]]


def test_loss_weights_average_per_sample():
    b = PackedCollator("padded", return_loss_weights=True)(_rows())
    w = b["loss_weights"]
    assert w.dtype == torch.float32 and w.shape == b["labels"].shape
    # samples have 2, 1 and 2 loss tokens
    assert w[0].tolist() == pytest.approx([0, 0.5, 0.5, 0, 1.0])
    assert w[1].tolist() == pytest.approx([0, 0.5, 0.5, 0, 0])
    assert float(w.sum()) == pytest.approx(b["num_seqs"])


def test_collator_is_picklable_and_validates():
    c = pickle.loads(pickle.dumps(PackedCollator("padded", pad_to=8)))
    assert c.format == "padded" and c.pad_to == 8
    with pytest.raises(tokpack.ConfigError):
        PackedCollator("bogus")
    with pytest.raises(tokpack.ConfigError):
        PackedCollator("padded", pad_to=0)
    bad = _rows()
    bad[0]["seq_lengths"] = torch.tensor([4, 2])
    with pytest.raises(tokpack.DataError, match="row 0: seq_lengths"):
        PackedCollator()(bad)
    with pytest.raises(tokpack.DataError, match="empty batch"):
        PackedCollator()([])


def test_masks_from_every_format():
    rows = _rows()
    hf = PackedCollator("hf")(rows)
    flash = PackedCollator("flash")(rows)
    tt = PackedCollator("torchtune", pad_to=6)(rows)
    padded = PackedCollator("padded", pad_to=6)(rows)
    assert document_ids(hf).tolist() == [[0, 0, 0, 1, 1, 2, 2, 2]]
    assert document_ids(flash).tolist() == [[0, 0, 0, 1, 1, 2, 2, 2]]
    assert document_ids(tt).tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 0, 1, 1, 1]]
    assert document_ids(padded)[1].tolist() == [0, 0, 0, -1, -1, -1]
    m = sdpa_block_causal_mask(hf)
    assert m.shape == (1, 1, 8, 8) and m.dtype == torch.bool
    assert m[0, 0, 4].tolist() == [False, False, False, True, True, False, False, False]
    dense = flex_block_mask(padded, block_size=2).to_dense()
    assert dense.shape == (2, 1, 3, 3)
    # The block at (row block 2, col block 0) mixes samples 0 and 1 only partially: kept; the
    # block of padding vs sample 0 in row 1 is not.
    assert dense[1, 0, 2, 0].item() == 0
    with pytest.raises(tokpack.ConfigError):
        document_ids({"input_ids": torch.zeros(1, 3)})


@pytest.mark.parametrize("fmt", ["hf", "flash", "padded", "torchtune"])
def test_read_only_rows_collate_without_a_warning_or_a_copy(fmt):
    """Fails on the code before issue 20: on the read_packed route Ray hands rows_collate
    read-only numpy arrays (Arrow memory), and torch warned that writing them is undefined
    behaviour. The collators never write row tensors: they are shared, not copied."""
    import warnings

    from tokpack.ray import rows_collate

    def frozen(values, dtype):
        a = np.asarray(values, dtype=dtype)
        a.flags.writeable = False
        return a

    batch = {
        "input_ids": np.array([frozen([1, 2, 3, 4], np.int32), frozen([5, 6], np.int32)], object),
        "labels": np.array([frozen([-100, 2, 3, 4], np.int32), frozen([5, 6], np.int32)], object),
        "seq_lengths": np.array([frozen([3, 1], np.int32), frozen([2], np.int32)], object),
        "sample_ids": np.array([frozen([0, 1], np.int64), frozen([2], np.int64)], object),
        "seq_roles": np.array([frozen([0, 0], np.int8), frozen([0], np.int8)], object),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = rows_collate(PackedCollator(format=fmt))(batch)
    assert out["num_seqs"] == 3
    assert all(not a.flags.writeable for v in batch.values() for a in v)
    row = batch["input_ids"][0]
    from tokpack.torch.pairs import row_tensor

    assert row_tensor(row).data_ptr() == row.ctypes.data  # shared, not copied


def _random_rows(rng, n_rows, as_):
    rows = []
    for _ in range(n_rows):
        lens = rng.integers(1, 40, size=int(rng.integers(0, 5)))
        n = int(lens.sum())
        ids = rng.integers(0, 50_000, size=n).astype(np.int32)
        labels = np.where(rng.random(n) < 0.3, -100, ids).astype(np.int32)
        row = {"input_ids": ids, "labels": labels, "seq_lengths": lens.astype(np.int32)}
        if rng.random() < 0.2:
            del row["labels"]
        rows.append({k: as_(v) for k, v in row.items()})
    return rows


@pytest.mark.parametrize("fmt", ["hf", "flash"])
@pytest.mark.parametrize("extras", [False, True])
def test_host_rows_collate_exactly_as_the_torch_path(fmt, extras):
    """NumPy rows and CPU tensor rows take the NumPy path; rows of Python lists the torch path:
    the same batch, field by field, dtype by dtype."""
    rng = np.random.default_rng(11)
    c = PackedCollator(fmt, return_seq_idx=extras, return_loss_weights=extras)
    for _ in range(30):
        n_rows = int(rng.integers(1, 6))
        state = rng.bit_generator.state
        rows = _random_rows(rng, n_rows, lambda a: a)
        rng.bit_generator.state = state
        tensors = _random_rows(rng, n_rows, torch.from_numpy)
        rng.bit_generator.state = state
        lists = _random_rows(rng, n_rows, lambda a: a.tolist())
        want = c(lists)
        for got in (c(rows), c(tensors)):
            assert set(got) == set(want)
            for k, v in want.items():
                if isinstance(v, torch.Tensor):
                    assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
                    assert torch.equal(got[k], v), k
                else:
                    assert got[k] == v, k


@pytest.mark.parametrize("as_", [np.asarray, torch.as_tensor, list])
def test_seq_lengths_that_do_not_split_the_row_are_named_on_every_path(as_):
    good = {"input_ids": as_([1, 2, 3]), "seq_lengths": as_([3])}
    for bad in ([2], [4], [3, 0], [5, -2]):
        row = {"input_ids": as_([4, 5, 6]), "seq_lengths": as_(bad)}
        with pytest.raises(tokpack.DataError, match=r"row 1: seq_lengths .* do not split"):
            PackedCollator()([good, row])
