"""No cross-contamination, measured: packed losses equal the sum of per-sample losses.

A tiny causal transformer (float64, random weights) runs a batch of packed rows with the boundary
information of each collator format and must reproduce the summed loss of every sample run alone;
plain causal attention over the packed row (naive packing) must not.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from tokpack.torch import PackedCollator, flex_block_mask, sdpa_block_causal_mask

from .packed_corpus import random_samples

VOCAB, DIM, HEADS, LAYERS, MAX_POS = 97, 32, 4, 2, 64


class TinyCausalLM(torch.nn.Module):
    """Pre-norm transformer whose attention is a pluggable function of (q, k, v)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def p(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64) * 0.3)

        self.tok, self.pos = p(VOCAB, DIM), p(MAX_POS, DIM)
        self.qkv = torch.nn.ParameterList([p(DIM, 3 * DIM) for _ in range(LAYERS)])
        self.proj = torch.nn.ParameterList([p(DIM, DIM) for _ in range(LAYERS)])
        self.mlp = torch.nn.ParameterList([p(DIM, DIM) for _ in range(LAYERS)])
        self.head = p(DIM, VOCAB)

    def forward(self, ids, positions, attend):
        """ids, positions: [B, L]; attend(q, k, v) with q, k, v [B, H, L, D] -> same shape."""
        b, n = ids.shape
        x = self.tok[ids] + self.pos[positions]
        for qkv, proj, mlp in zip(self.qkv, self.proj, self.mlp):
            q, k, v = (F.layer_norm(x, (DIM,)) @ qkv).split(DIM, dim=-1)
            q, k, v = (t.view(b, n, HEADS, -1).transpose(1, 2) for t in (q, k, v))
            x = x + attend(q, k, v).transpose(1, 2).reshape(b, n, DIM) @ proj
            x = x + torch.tanh(F.layer_norm(x, (DIM,)) @ mlp)
        return F.layer_norm(x, (DIM,)) @ self.head


def summed_loss(logits, labels):
    """Sum of next-token losses with the HF shift (labels are the unshifted targets)."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), reduction="sum"
    )


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    samples, labels = random_samples(14, 20, seed=3, vocab=VOCAB)
    # Rows of up to 48 tokens holding several samples each.
    from tokpack import pack_tokens

    table = pack_tokens(samples, 48, labels=labels)
    rows = [
        {
            k: torch.tensor(table.column(k)[i].as_py())
            for k in ("input_ids", "labels", "seq_lengths")
        }
        for i in range(table.num_rows)
    ]
    assert any(len(r["seq_lengths"]) > 1 for r in rows)
    model = TinyCausalLM()
    reference = torch.zeros((), dtype=torch.float64)
    n_terms = 0
    with torch.no_grad():
        for s, lab in zip(samples, labels):
            ids = torch.tensor(s, dtype=torch.int64).view(1, -1)
            pos = torch.arange(ids.shape[1]).view(1, -1)
            lab = torch.tensor(lab, dtype=torch.int64).view(1, -1)

            def causal(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            reference += summed_loss(model(ids, pos, causal), lab)
            n_terms += int((lab[0, 1:] != -100).sum())
    return model, rows, reference, n_terms


def test_sdpa_block_mask_hf_format(setup):
    model, rows, reference, n_terms = setup
    b = PackedCollator("hf")(rows)
    mask = sdpa_block_causal_mask(b)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    with torch.no_grad():
        loss = summed_loss(model(b["input_ids"], b["position_ids"], attend), b["labels"])
    assert b["num_loss_tokens"] == n_terms
    assert abs(loss.item() - reference.item()) < 1e-6


def test_sdpa_block_mask_torchtune_format(setup):
    model, rows, reference, n_terms = setup
    b = PackedCollator("torchtune", pad_to=48)(rows)
    mask = sdpa_block_causal_mask(b)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    with torch.no_grad():
        loss = summed_loss(model(b["tokens"], b["input_pos"], attend), b["labels"])
    assert b["num_loss_tokens"] == n_terms
    assert abs(loss.item() - reference.item()) < 1e-6


def test_flex_block_mask_padded_format(setup):
    from torch.nn.attention.flex_attention import flex_attention

    model, rows, reference, n_terms = setup
    b = PackedCollator("padded", pad_to=48)(rows)
    block_mask = flex_block_mask(b, block_size=16)

    def attend(q, k, v):
        return flex_attention(q, k, v, block_mask=block_mask)

    with torch.no_grad(), warnings.catch_warnings():
        # Eager flex_attention (the unfused reference path) runs on CPU and warns about it.
        warnings.simplefilter("ignore", UserWarning)
        loss = summed_loss(model(b["input_ids"], b["position_ids"], attend), b["labels"])
    assert b["num_loss_tokens"] == n_terms
    assert abs(loss.item() - reference.item()) < 1e-6


def test_varlen_emulation_flash_format(setup):
    model, rows, reference, n_terms = setup
    b = PackedCollator("flash")(rows)
    cu = b["cu_seqlens"].tolist()

    def attend(q, k, v):
        # What flash_attn_varlen_func computes: causal attention within each cu_seqlens span.
        return torch.cat(
            [
                F.scaled_dot_product_attention(
                    q[:, :, a:e], k[:, :, a:e], v[:, :, a:e], is_causal=True
                )
                for a, e in zip(cu[:-1], cu[1:])
            ],
            dim=2,
        )

    with torch.no_grad():
        logits = model(b["input_ids"].view(1, -1), b["position_ids"].view(1, -1), attend)
        loss = summed_loss(logits, b["labels"].view(1, -1))
    assert b["num_loss_tokens"] == n_terms
    assert abs(loss.item() - reference.item()) < 1e-6


def test_naive_causal_packing_does_not_match(setup):
    model, rows, reference, _ = setup
    b = PackedCollator("hf")(rows)

    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        loss = summed_loss(model(b["input_ids"], b["position_ids"], causal), b["labels"])
    assert abs(loss.item() - reference.item()) > 1e-3
