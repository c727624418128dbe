"""Context-parallel batches (``PackedCollator(cp_size=N, cp_rank=r)``): layout and loss.

The ranks' slices must reassemble the padded THD stream exactly, and a float64 emulation of ring
attention (each rank's queries against the keys and values gathered from every rank, masked by
document and causality) must give the same summed loss as the unsplit packed batch and as the
samples run alone.
"""

import pytest
import torch
import torch.nn.functional as F

import tokpack
from tokpack.torch import (
    IGNORE_INDEX,
    PackedCollator,
    document_ids,
    flex_block_mask,
    sdpa_block_causal_mask,
)

from .test_torch_collate import _rows
from .test_torch_contamination import VOCAB, setup, summed_loss  # noqa: F401 (setup: fixture)

CP_SIZES = (2, 4)


def global_index(batch, cp_size, cp_rank):
    """Index in the padded stream of each of the rank's tokens, from ``cu_seqlens_padded`` alone:
    of every sample, chunk ``cp_rank`` then chunk ``2 * cp_size - 1 - cp_rank``."""
    cu = batch["cu_seqlens_padded"].tolist()
    index = []
    for start, end in zip(cu[:-1], cu[1:]):
        chunk = (end - start) // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            index.extend(range(start + c * chunk, start + (c + 1) * chunk))
    return torch.tensor(index, dtype=torch.int64)


def expected_stream(rows, cp_size, pad_id):
    """The padded stream built directly from the unsplit flash batch: every sample padded to a
    multiple of 2 * cp_size with pad_id, label -100 and continuing positions."""
    flat = PackedCollator("flash", return_seq_idx=True, return_loss_weights=True)(rows)
    cu = flat["cu_seqlens"].tolist()
    out = {k: [] for k in ("input_ids", "labels", "position_ids", "seq_idx", "loss_weights")}
    padded = [0]
    for s, (a, e) in enumerate(zip(cu[:-1], cu[1:])):
        n = e - a
        pad = -n % (2 * cp_size)
        out["input_ids"] += flat["input_ids"][a:e].tolist() + [pad_id] * pad
        out["labels"] += flat["labels"][a:e].tolist() + [IGNORE_INDEX] * pad
        out["position_ids"] += list(range(n + pad))
        out["seq_idx"] += [s] * n + [-1] * pad
        out["loss_weights"] += flat["loss_weights"][a:e].tolist() + [0.0] * pad
        padded.append(padded[-1] + n + pad)
    # Next-token targets and their weights, shifted on the whole stream.
    out["shift_labels"] = out["labels"][1:] + [IGNORE_INDEX]
    out["loss_weights"] = out["loss_weights"][1:] + [0.0]
    return flat, out, padded


def corpus_rows(seed):
    """Three packed rows of random samples, odd and even lengths, from 1 token up."""
    from .packed_corpus import random_samples

    samples, labels = random_samples(12, 21, seed=seed, vocab=VOCAB)
    assert any(len(s) % 2 for s in samples) and any(len(s) % 2 == 0 for s in samples)
    table = tokpack.pack_tokens(samples, 48, labels=labels)
    return [
        {
            k: torch.tensor(table.column(k)[i].as_py())
            for k in ("input_ids", "labels", "seq_lengths")
        }
        for i in range(table.num_rows)
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cp_size": 0},
        {"cp_size": -2},
        {"cp_size": 2.0},
        {"cp_size": True},
        {"cp_size": 2, "cp_rank": 2},
        {"cp_size": 2, "cp_rank": -1},
        {"cp_size": 1, "cp_rank": 1},
        {"cp_size": 4, "cp_rank": None},
        {"cp_size": 2, "format": "padded"},
        {"cp_size": 2, "format": "torchtune"},
    ],
)
def test_invalid_cp_arguments(kwargs):
    with pytest.raises(tokpack.ConfigError):
        PackedCollator(**kwargs)


@pytest.mark.parametrize("fmt", ["hf", "flash", "padded", "torchtune"])
def test_cp_size_one_is_unchanged(fmt):
    options = {"return_seq_idx": True, "return_loss_weights": True}
    plain = PackedCollator(fmt, **options)
    one = PackedCollator(fmt, cp_size=1, cp_rank=0, **options)
    assert repr(one) == repr(plain)
    a, b = plain(_rows()), one(_rows())
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], list):
            assert all(torch.equal(x, y) for x, y in zip(a[key], b[key]))
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]) and a[key].dtype == b[key].dtype
        else:
            assert a[key] == b[key]


@pytest.mark.parametrize("fmt", ["hf", "flash"])
@pytest.mark.parametrize("cp_size", CP_SIZES)
@pytest.mark.parametrize("seed", [0, 1])
def test_slices_reassemble_the_padded_stream(fmt, cp_size, seed):
    rows = corpus_rows(seed)
    flat, expected, padded = expected_stream(rows, cp_size, pad_id=7)
    total = padded[-1]
    keys = ("input_ids", "labels", "shift_labels", "position_ids", "seq_idx", "loss_weights")
    stream = {k: torch.full((total,), -5, dtype=torch.float64) for k in keys}
    covered = torch.zeros(total, dtype=torch.int64)
    for rank in range(cp_size):
        b = PackedCollator(
            fmt,
            pad_id=7,
            return_seq_idx=True,
            return_loss_weights=True,
            cp_size=cp_size,
            cp_rank=rank,
        )(rows)
        assert b["input_ids"].shape == (
            (total // cp_size,) if fmt == "flash" else (1, total // cp_size)
        )
        assert (
            b["input_ids"].dtype
            == b["position_ids"].dtype
            == b["shift_labels"].dtype
            == torch.int64
        )
        assert b["cu_seqlens"].dtype == b["cu_seqlens_padded"].dtype == torch.int32
        # Boundaries and normalisers describe the whole group, identical on every rank.
        assert torch.equal(b["cu_seqlens"], flat["cu_seqlens"])
        assert b["cu_seqlens_padded"].tolist() == padded
        assert b["max_seqlen"] == max(e - a for a, e in zip(padded[:-1], padded[1:]))
        assert b["num_loss_tokens"] == flat["num_loss_tokens"]
        assert b["num_seqs"] == flat["num_seqs"]
        assert not any(k.startswith("cu_seq_lens") for k in b)
        index = global_index(b, cp_size, rank)
        covered[index] += 1
        for k in keys:
            stream[k][index] = b[k].reshape(-1).to(torch.float64)
    assert covered.eq(1).all()
    for k in keys:
        assert stream[k].tolist() == pytest.approx(expected[k], abs=0), k


@pytest.mark.parametrize("cp_size", CP_SIZES)
def test_ring_attention_emulation_matches_unsplit_and_alone(setup, cp_size):  # noqa: F811
    model, rows, reference, n_terms = setup
    assert any(n % 2 for r in rows for n in r["seq_lengths"].tolist())
    batches = [PackedCollator("flash", cp_size=cp_size, cp_rank=r)(rows) for r in range(cp_size)]
    ids = torch.stack([b["input_ids"] for b in batches])
    positions = torch.stack([b["position_ids"] for b in batches])
    # Document and global index of every token, as a CP attention kernel derives them from
    # cu_seqlens_padded; padding belongs to its sample's padded span, after its real tokens.
    index = torch.stack([global_index(b, cp_size, r) for r, b in enumerate(batches)])
    doc = torch.searchsorted(batches[0]["cu_seqlens_padded"].to(torch.int64), index, right=True)
    index_all, doc_all = index.reshape(-1), doc.reshape(-1)
    mask = (doc.unsqueeze(2) == doc_all) & (index_all <= index.unsqueeze(2))

    def ring(q, k, v):
        # Each rank's queries against the keys and values all-gathered from the group.
        k_all = torch.cat(list(k), dim=1).expand(cp_size, -1, -1, -1)
        v_all = torch.cat(list(v), dim=1).expand(cp_size, -1, -1, -1)
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask.unsqueeze(1))

    with torch.no_grad():
        logits = model(ids, positions, ring)
        shift = torch.stack([b["shift_labels"] for b in batches])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), shift.reshape(-1), reduction="sum")
        # Shifting a rank's own slice (HF's default) loses the targets across chunk boundaries.
        local_labels = torch.stack([b["labels"] for b in batches])
        wrong = summed_loss(logits, local_labels)
        hf = PackedCollator("hf")(rows)
        attn = sdpa_block_causal_mask(hf)
        unsplit = summed_loss(
            model(
                hf["input_ids"],
                hf["position_ids"],
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=attn),
            ),
            hf["labels"],
        )
    assert all(b["num_loss_tokens"] == n_terms for b in batches)
    assert int((shift != IGNORE_INDEX).sum()) == n_terms
    assert abs(loss.item() - unsplit.item()) < 1e-9
    assert abs(loss.item() - reference.item()) < 1e-9
    assert abs(wrong.item() - reference.item()) > 1e-3


@pytest.mark.parametrize("fmt", ["hf", "flash"])
def test_local_masks_refuse_a_cp_slice(fmt):
    # The slice's cu_seqlens describe the whole group: a mask built from them would not fit it.
    b = PackedCollator(fmt, cp_size=2, cp_rank=1)(_rows())
    for make_mask in (document_ids, sdpa_block_causal_mask, flex_block_mask):
        with pytest.raises(tokpack.ConfigError, match="context-parallel"):
            make_mask(b)
