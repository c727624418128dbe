"""Preference and KTO batches: per-sequence log-probs from packed rows are exact.

The float64 toy transformer of the contamination tests runs packed preference rows (separate and
shared-prompt layouts) with each attention backend the layout allows; ``sequence_logps`` must
equal, within 1e-9, the completion log-probs of every chosen and rejected sequence run alone, and
so must DPO and Bradley-Terry losses built on them. Naive packing (plain causal attention over
the row) must not. The rows come from ``pair_rows``, a pure-Python builder of the packed format.
"""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tokpack import ConfigError, DataError
from tokpack.torch import PackedCollator, flex_block_mask, sdpa_block_causal_mask, sequence_logps

from .pair_rows import kto_rows, preference_rows, random_pairs
from .test_torch_contamination import VOCAB, TinyCausalLM

LAYOUTS = ("separate", "shared-prompt")
ROW_LEN = 48


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def completion_logp(logits_of, prompt, completion):
    """Sum of log p(completion token | everything before it), the sequence run alone;
    ``logits_of(ids)`` is the model's ``[1, L, V]`` output for ``[1, L]`` ids."""
    ids = torch.tensor(prompt + completion).view(1, -1)
    logp = torch.log_softmax(logits_of(ids)[0, :-1], dim=-1)
    return logp.gather(1, ids[0, 1:, None]).squeeze(1)[len(prompt) - 1 :].sum()


def alone(logits_of, pairs):
    """``[num_pairs, 2]`` (chosen, rejected) log-probs of the sequences run one by one."""
    return torch.stack(
        [
            torch.stack([completion_logp(logits_of, p, c), completion_logp(logits_of, p, r)])
            for p, c, r in pairs
        ]
    )


def toy(model):
    """The toy model on one sequence (positions from 0, causal attention)."""
    return lambda ids: model(ids, torch.arange(ids.shape[1]).view(1, -1), causal)


@pytest.fixture(scope="module")
def model():
    return TinyCausalLM()


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("transformers")
    from .test_torch_hf_llama import tiny_llama

    return tiny_llama()


@pytest.fixture(scope="module")
def pairs():
    return random_pairs(10, seed=7, vocab=VOCAB, prompt=(1, 9), completion=(1, 8))


@pytest.fixture(scope="module")
def expected(model, pairs):
    with torch.no_grad():
        return alone(toy(model), pairs)


def packed(layout, pairs, fmt, **kwargs):
    rows = preference_rows(pairs, layout, ROW_LEN)
    assert len(rows) > 1 and any(len(r["seq_lengths"]) > 3 for r in rows)
    return PackedCollator(fmt, return_pairs=True, **kwargs)(rows)


def run(model, batch, attend):
    ids, pos = batch["input_ids"], batch["position_ids"]
    if ids.dim() == 1:
        ids, pos = ids.view(1, -1), pos.view(1, -1)
    with warnings.catch_warnings():
        # Eager flex_attention (the unfused reference path) runs on CPU and warns about it.
        warnings.simplefilter("ignore", UserWarning)
        return model(ids, pos, attend)


def sdpa(batch):
    mask = sdpa_block_causal_mask(batch)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def flex(batch):
    from torch.nn.attention.flex_attention import flex_attention

    block_mask = flex_block_mask(batch, block_size=16)
    return lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask)


def varlen(batch):
    """What flash_attn_varlen_func computes: causal attention within each cu_seqlens span."""
    cu = batch["cu_seqlens"].tolist()

    def attend(q, k, v):
        return torch.cat(
            [causal(q[:, :, a:e], k[:, :, a:e], v[:, :, a:e]) for a, e in zip(cu[:-1], cu[1:])],
            dim=2,
        )

    return attend


BACKENDS = [
    ("separate", "hf", sdpa),
    ("separate", "padded", flex),
    ("separate", "padded", sdpa),
    ("separate", "flash", varlen),
    ("shared-prompt", "hf", sdpa),
    ("shared-prompt", "padded", flex),
    ("shared-prompt", "padded", sdpa),
]


@pytest.mark.parametrize("layout,fmt,attention", BACKENDS)
def test_sequence_logps_equal_sequences_alone(model, pairs, expected, layout, fmt, attention):
    batch = packed(layout, pairs, fmt)
    with torch.no_grad():
        logits = run(model, batch, attention(batch))
        got = sequence_logps(logits, batch)
        mean = sequence_logps(logits, batch, average=True)
    assert batch["num_pairs"] == len(pairs)
    lengths = torch.tensor([[len(c), len(r)] for _, c, r in pairs])
    assert torch.equal(batch["completion_lengths"], lengths)
    assert got.shape == (len(pairs), 2) and got.dtype == torch.float64
    assert torch.allclose(got, expected, atol=1e-9, rtol=0)
    assert torch.allclose(mean, expected / lengths, atol=1e-9, rtol=0)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    layout=st.sampled_from(LAYOUTS),
    fmt=st.sampled_from(["hf", "padded"]),
    row_len=st.integers(16, 40),
)
def test_sequence_logps_exact_for_random_rows(model, seed, layout, fmt, row_len):
    """Short prompts and completions (down to one token) in rows of any fill."""
    pairs = random_pairs(5, seed=seed, vocab=VOCAB, prompt=(1, 4), completion=(1, 4))
    batch = PackedCollator(fmt, return_pairs=True)(preference_rows(pairs, layout, row_len))
    with torch.no_grad():
        got = sequence_logps(run(model, batch, sdpa(batch)), batch)
        want = alone(toy(model), pairs)
    assert torch.allclose(got, want, atol=1e-9, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_naive_causal_packing_does_not_match(model, pairs, expected, layout):
    batch = packed(layout, pairs, "hf")
    with torch.no_grad():
        got = sequence_logps(run(model, batch, causal), batch)
    assert (got - expected).abs().max() > 1e-3


def test_shared_prompt_needs_the_prompt_in_the_mask(model, pairs, expected):
    """Block-causal attention over the segments alone (what varlen cu_seqlens would do) loses
    the prompt: the shared-prompt mask is what makes the layout exact."""
    batch = packed("shared-prompt", pairs, "hf")
    doc = batch["document_ids"]
    causal_mask = torch.ones(doc.shape[1], doc.shape[1], dtype=torch.bool).tril()
    mask = ((doc.unsqueeze(2) == doc.unsqueeze(1)) & causal_mask).unsqueeze(1)
    with torch.no_grad():
        logits = run(
            model, batch, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        )
        got = sequence_logps(logits, batch)
    assert (got - expected).abs().max() > 1e-3


def test_shared_prompt_fields(pairs):
    rows = preference_rows(pairs, "shared-prompt", ROW_LEN)
    hf = PackedCollator("hf", return_pairs=True)(rows)
    assert "cu_seq_lens_q" not in hf and "max_length_q" not in hf
    roles = hf["seq_roles"].tolist()
    assert roles == [3, 1, 2] * len(pairs)
    assert hf["pair_index"].tolist() == [i for i in range(len(pairs)) for _ in range(3)]
    assert hf["sample_ids"].tolist() == hf["pair_index"].tolist()
    positions = hf["position_ids"].view(-1).tolist()
    want = []
    for p, c, r in pairs:
        want += list(range(len(p))) + list(range(len(p), len(p) + len(c)))
        want += list(range(len(p), len(p) + len(r)))
    assert positions == want
    padded = PackedCollator("padded", return_pairs=True)(rows)
    for key in ("seq_roles", "pair_index", "completion_lengths"):
        assert torch.equal(padded[key], hf[key])
    # seq_spans index the flattened tokens of the batch (with the padded format's padding).
    flat_ids = padded["input_ids"].view(-1)
    for (a, e), (b, f) in zip(padded["seq_spans"].tolist(), hf["seq_spans"].tolist()):
        assert torch.equal(flat_ids[a:e], hf["input_ids"].view(-1)[b:f])
    with pytest.raises(ConfigError, match="shared-prompt attention"):
        PackedCollator("flash", return_pairs=True)(rows)


def test_labels_keep_the_first_token_rule(pairs):
    rows = preference_rows(pairs, "separate", ROW_LEN)
    plain = PackedCollator("hf")(rows)
    with_pairs = PackedCollator("hf", return_pairs=True)(rows)
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q"):
        assert torch.equal(plain[key], with_pairs[key])
    assert plain["num_loss_tokens"] == with_pairs["num_loss_tokens"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dpo_and_reward_losses_equal_unpacked(model, pairs, layout):
    """DPO (sigmoid, beta 0.1, frozen reference) loss and gradient, and a Bradley-Terry loss on
    a scalar read at each sequence's last token, packed and unpacked."""
    beta = 0.1
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(
                0.05
                * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype)
            )
        ref_alone = alone(toy(reference), pairs)
    batch = packed(layout, pairs, "hf")
    attend = sdpa(batch)

    def dpo(policy, ref):
        margin = (policy[:, 0] - ref[:, 0]) - (policy[:, 1] - ref[:, 1])
        return -F.logsigmoid(beta * margin).mean()

    model.zero_grad()
    loss_alone = dpo(alone(toy(model), pairs), ref_alone)
    loss_alone.backward()
    grads_alone = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with torch.no_grad():
        ref_packed = sequence_logps(run(reference, batch, attend), batch)
    logits = run(model, batch, attend)
    loss = dpo(sequence_logps(logits, batch), ref_packed)
    loss.backward()
    assert abs(loss.item() - loss_alone.item()) < 1e-9
    for g, p in zip(grads_alone, model.parameters()):
        assert torch.allclose(p.grad, g, atol=1e-9, rtol=0)
    model.zero_grad()

    # Bradley-Terry: the reward is a scalar of the last token's output (here logit 0), read at
    # the last token of each chosen and rejected segment.
    last = batch["seq_spans"][batch["seq_roles"] != 3, 1].view(-1, 2) - 1
    rewards = logits.detach().reshape(-1, VOCAB)[last, 0]

    def reward_alone(ids):
        return toy(model)(torch.tensor(ids).view(1, -1))[0, -1, 0]

    with torch.no_grad():
        single = torch.stack(
            [torch.stack([reward_alone(p + c), reward_alone(p + r)]) for p, c, r in pairs]
        )

    def bradley_terry(r):
        return -F.logsigmoid(r[:, 0] - r[:, 1]).mean()

    assert abs(bradley_terry(rewards).item() - bradley_terry(single).item()) < 1e-9


@pytest.mark.parametrize("fmt", ["hf", "flash", "padded"])
def test_kto_label_and_unpaired_logps(model, fmt):
    pairs = random_pairs(8, seed=11, vocab=VOCAB, prompt=(1, 9), completion=(1, 9))
    records = [(p, c, i % 3 != 0) for i, (p, c, _) in enumerate(pairs)]
    batch = PackedCollator(fmt, return_pairs=True)(kto_rows(records, ROW_LEN))
    assert batch["num_pairs"] == 0 and batch["seq_roles"].tolist() == [0] * len(records)
    assert batch["label"].dtype == torch.bool
    assert batch["label"].tolist() == [label for _, _, label in records]
    attend = varlen(batch) if fmt == "flash" else sdpa(batch)
    with torch.no_grad():
        got = sequence_logps(run(model, batch, attend), batch)
        want = torch.stack([completion_logp(toy(model), p, c) for p, c, _ in records])
    assert got.shape == (len(records),)
    assert torch.allclose(got, want, atol=1e-9, rtol=0)


def test_bad_batches_are_refused(model, pairs):
    rows = preference_rows(pairs, "separate", ROW_LEN)
    broken = [dict(r) for r in rows]
    broken[1]["seq_roles"] = broken[1]["seq_roles"].flip(0)
    with pytest.raises(DataError, match="row 1: seq_roles"):
        PackedCollator(return_pairs=True)(broken)
    shared = preference_rows(pairs, "shared-prompt", ROW_LEN)
    cut = dict(
        shared[0],
        seq_roles=torch.tensor([3, 1, 2] * 3 + [3, 2] + [1] * (len(shared[0]["seq_roles"]) - 11)),
    )
    with pytest.raises(DataError, match="row 0: seq_roles"):
        PackedCollator(return_pairs=True)([cut])
    unpaired = {k: v for k, v in rows[1].items() if k != "seq_roles"}
    with pytest.raises(DataError, match="mixes preference pairs"):
        PackedCollator(return_pairs=True)([rows[0], unpaired])
    with pytest.raises(ConfigError, match="return_pairs"):
        PackedCollator("torchtune", return_pairs=True)
    with pytest.raises(ConfigError, match="return_pairs"):
        PackedCollator("flash", cp_size=2, return_pairs=True)
    plain = PackedCollator("hf")(rows)
    with pytest.raises(ConfigError, match="return_pairs=True"):
        sequence_logps(torch.zeros(1, plain["input_ids"].shape[1], VOCAB), plain)
    batch = PackedCollator("hf", return_pairs=True)(rows)
    with pytest.raises(ConfigError, match="unshifted logits"):
        sequence_logps(torch.zeros(1, batch["input_ids"].shape[1] - 1, VOCAB), batch)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tiny_llama_sequence_logps_packed_equal_unpacked(llama, layout):
    """transformers' sdpa path: the separate layout by its own packed-sequence detection
    (positions restarting at 0, no attention_mask); the shared-prompt layout with
    ``attention_mask=sdpa_block_causal_mask(batch)`` (a 4-D boolean mask is used as given)."""
    pairs = random_pairs(8, seed=3, vocab=128, prompt=(2, 12), completion=(1, 10))
    batch = PackedCollator("hf", return_pairs=True)(preference_rows(pairs, layout, 64))
    mask = sdpa_block_causal_mask(batch) if layout == "shared-prompt" else None
    with torch.no_grad():
        logits = llama(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=mask,
            use_cache=False,
        ).logits
        got = sequence_logps(logits, batch)
        want = alone(lambda ids: llama(input_ids=ids, use_cache=False).logits, pairs)
    assert torch.allclose(got, want, atol=1e-9, rtol=0)
