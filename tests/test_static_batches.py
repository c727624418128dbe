"""Static-shape batches (``PackedCollator(static=StaticShapes(...))``, issue 38): shapes fixed
by the config, aligned segments, the tail policies, FlexAttention block tables equal to
``create_block_mask``, exact losses against the unpadded batches, and one compile per epoch."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokpack import plan
from tokpack.errors import ConfigError, DataError
from tokpack.torch.collate import PackedCollator
from tokpack.torch.static import StaticShapes, block_mask

BLOCK_FIELDS = (
    "kv_num_blocks",
    "kv_indices",
    "full_kv_num_blocks",
    "full_kv_indices",
    "q_num_blocks",
    "q_indices",
    "full_q_num_blocks",
    "full_q_indices",
)


def packed_rows(n=60, max_len=256, cap=4, align=16, seed=0, vocab=128):
    """Rows of a capped, aligned plan with random tokens and labels (as a reader gives them)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 90, n)
    p = plan(lengths, max_len, max_segments_per_row=cap, align_segments=align, row_order="plan")
    rows = []
    for r in range(p.n_bins):
        ls = p.row(r)[2]
        ids = rng.integers(1, vocab, int(ls.sum()))
        labels = np.where(rng.random(ids.size) < 0.3, -100, ids)
        rows.append({"input_ids": ids, "labels": labels, "seq_lengths": ls})
    return rows


@pytest.mark.parametrize("fmt", ["flash", "hf", "padded"])
@pytest.mark.parametrize("tail", ["zero", "coalesce"])
def test_shapes_depend_only_on_the_config(fmt, tail):
    shapes = StaticShapes(4, 256, 4, align=16, tail=tail)
    rows = packed_rows()
    seen = set()
    for i in range(0, len(rows), 4):
        b = PackedCollator(fmt, static=shapes).collate(rows[i : i + 4])
        fixed = {k: tuple(v.shape) for k, v in b.items() if torch.is_tensor(v)}
        seen.add(tuple(sorted(fixed.items())))
    assert len(seen) == 1, seen


def _chunk_sequence_ids(cu, chunk):
    """The sequence of each chunk as FLA's ``prepare_chunk_indices`` numbers them: by counting
    first chunks, so a zero-length sequence among real ones shifts every later one."""
    n_chunks = -(-np.diff(cu) // chunk)
    firsts = np.concatenate([np.arange(n) for n in n_chunks]) == 0
    return np.cumsum(firsts) - 1, np.repeat(np.arange(n_chunks.size), n_chunks)


@pytest.mark.parametrize("fmt", ["flash", "hf"])
def test_coalesced_tail_is_one_padding_segment_then_fixed_length(fmt):
    shapes = StaticShapes(4, 256, 4, align=16, tail="coalesce")
    rows = packed_rows()
    for i in range(0, len(rows), 4):
        b = PackedCollator(fmt, static=shapes).collate(rows[i : i + 4])
        cu = (b["cu_seqlens"] if fmt == "flash" else b["cu_seq_lens_q"]).numpy()
        assert cu.size == 4 * 4 + 2 and cu[-1] == b["input_ids"].numel()
        lengths = np.diff(cu)
        real = np.count_nonzero(lengths)
        # The real segments and at most one padding segment, then zero-length entries only.
        assert (lengths[:real] > 0).all() and (lengths[real:] == 0).all()
        assert real - b["num_seqs"] in (0, 1)
        assert len(set(b["document_ids"].flatten().tolist())) == real
        # Chunked linear-attention kernels see each segment under its own index.
        numbered, actual = _chunk_sequence_ids(cu, 64)
        assert np.array_equal(numbered, actual)


def test_zero_tail_boundaries_have_fixed_capacity_and_aligned_starts():
    shapes = StaticShapes(4, 256, 4, align=16)
    b = PackedCollator("flash", static=shapes).collate(packed_rows()[:4])
    cu = b["cu_seqlens"]
    assert cu.numel() == 4 * 4 + 2 and int(cu[-1]) == 4 * 256 and b["max_seqlen"] == 256
    real = cu[: b["num_seqs"] + 1]
    assert (real % 16 == 0).all()


def test_labels_and_loss_counts_are_the_unpadded_batch_ones():
    rows = packed_rows()[:4]
    plain = PackedCollator("flash").collate(rows)
    static = PackedCollator("flash", static=StaticShapes(4, 256, 4, align=16)).collate(rows)
    assert static["num_loss_tokens"] == plain["num_loss_tokens"]
    assert static["num_seqs"] == plain["num_seqs"]
    trained = static["labels"] != -100
    assert torch.equal(static["labels"][trained], plain["labels"][plain["labels"] != -100])


def test_rows_over_the_shapes_are_refused_with_the_fix():
    row = {"input_ids": np.arange(1, 11), "seq_lengths": np.array([2, 2, 2, 4])}
    with pytest.raises(DataError, match="row 0 has 4 segments.*--max-segments-per-row 3"):
        PackedCollator("flash", static=StaticShapes(1, 64, 3)).collate([row])
    with pytest.raises(DataError, match="row 0 takes 64 tokens.*--align-segments 16"):
        PackedCollator("flash", static=StaticShapes(1, 48, 4, align=16)).collate([row])
    with pytest.raises(ConfigError, match="static shapes need format"):
        PackedCollator("torchtune", static=StaticShapes(1, 64, 4)).collate([row])
    with pytest.raises(ConfigError, match="repack it with --max-segments-per-row"):
        StaticShapes.of_packed({"config": {"max_len": 64}}, rows=2)


@pytest.mark.parametrize(
    "option, clash",
    [
        ({"cp_size": 2}, "cp_size > 1"),
        ({"return_pairs": True}, "return_pairs"),
        ({"layer_masks": {"full_attention": None}}, "layer_masks"),
        ({"pad_to": 64}, "pad_to"),
        ({"return_seq_idx": True}, "return_seq_idx"),
        ({"return_loss_weights": True}, "return_loss_weights"),
    ],
)
def test_a_static_collator_refuses_the_options_it_would_ignore(option, clash):
    with pytest.raises(ConfigError, match=f"static shapes need .* with {re.escape(clash)}"):
        PackedCollator("hf", static=StaticShapes(1, 64, 4), **option)


def test_a_static_batch_keeps_the_step_counts_and_carried_columns():
    class Step(list):
        step_counts = (7, 3)

    row = {"input_ids": np.arange(1, 11), "seq_lengths": np.array([4, 6]), "score": [0.5, 1.5]}
    batch = PackedCollator("hf", static=StaticShapes(1, 64, 4)).collate(Step([row]))
    assert (batch["global_num_loss_tokens"], batch["global_num_samples"]) == (7, 3)
    assert batch["score"] == [0.5, 1.5]


@pytest.mark.parametrize("fmt", ["hf", "padded"])
@pytest.mark.parametrize("align", [1, 16, 128])
def test_block_tables_equal_create_block_mask(fmt, align):
    from torch.nn.attention.flex_attention import create_block_mask

    rows = packed_rows(max_len=512, cap=6, align=align, seed=align)[:3]
    b = PackedCollator(fmt, static=StaticShapes(3, 512, 6, align=align, block_mask=True))(rows)
    ours = block_mask(b)
    doc = b["document_ids"].to(torch.int64)
    n_rows, n = doc.shape

    def mask_mod(bi, h, q, kv):
        return (doc[bi, q] == doc[bi, kv]) & (q >= kv)

    ref = create_block_mask(mask_mod, n_rows, None, n, n, device="cpu", BLOCK_SIZE=128)
    for name in BLOCK_FIELDS:
        assert torch.equal(getattr(ours, name), getattr(ref, name)), name


def test_block_tables_cross_dataloader_workers():
    rows = packed_rows(max_len=512, cap=6)[:8]
    collator = PackedCollator("padded", static=StaticShapes(2, 512, 6, align=16, block_mask=True))
    loader = torch.utils.data.DataLoader(rows, batch_size=2, collate_fn=collator, num_workers=1)
    for got, i in zip(loader, range(0, 8, 2)):
        want = collator.collate(rows[i : i + 2])["block_mask_data"]
        for k, v in want.items():
            assert torch.equal(got["block_mask_data"][k], v)


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
    )
    m = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    return m.to(torch.float64).eval()


def _loss_sum(model, batch):
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
    labels = batch["labels"]
    return F.cross_entropy(logits[0, :-1], labels[0, 1:], reduction="sum", ignore_index=-100)


def test_static_batches_train_exactly_as_the_unpadded_ones():
    model = tiny_llama()
    rows = packed_rows()
    shapes = StaticShapes(4, 256, 4, align=16, tail="zero")
    for i in range(0, 12, 4):
        plain = PackedCollator("hf").collate(rows[i : i + 4])
        static = PackedCollator("hf", static=shapes).collate(rows[i : i + 4])
        assert static["input_ids"].shape == (1, 4 * 256)
        got, want = _loss_sum(model, static), _loss_sum(model, plain)
        assert torch.allclose(got, want, atol=1e-9, rtol=0)


class _TinyAttention(torch.nn.Module):
    """One same-document causal attention layer over ``document_ids`` (a small stand-in whose
    compile takes seconds on CPU; benches/bench_static.py counts a Llama's)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(128, 16)
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 128)

    def forward(self, ids, doc, labels):
        x = self.emb(ids)
        q, k, v = self.qkv(x).chunk(3, -1)
        n = ids.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        mask = (doc.unsqueeze(-1) == doc.unsqueeze(-2)) & causal
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        logits = self.out(h)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")


def test_an_epoch_of_static_batches_compiles_once():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = torch.compile(_TinyAttention())
    collator = PackedCollator("padded", static=StaticShapes(4, 256, 4, align=16))
    rows = packed_rows()
    for i in range(0, len(rows), 4):
        b = collator.collate(rows[i : i + 4])
        model(b["input_ids"], b["document_ids"], b["labels"]).backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()
