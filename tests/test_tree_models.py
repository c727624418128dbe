"""Tree rows fed to real transformers models (float64, random weights, sdpa and eager): every
sequence's log-probs and loss equal the sequence run alone, within 1e-12 relative on sdpa.

transformers' eager attention takes its softmax in float32 whatever the model's dtype
(``softmax(..., dtype=torch.float32)``), so a row summed over more (masked, zero) keys rounds
differently there: eager is held to 1e-6, float32's rounding, not float64's."""

import numpy as np
import pytest
import torch

from tokpack import PackingError
from tokpack.tree import (
    TreeCollator,
    check_tree_model,
    dense_mask,
    model_inputs,
    pack_step,
    pack_trees,
    sequence_logps,
    token_logps,
    tree_loss,
    tree_refusal,
)

transformers = pytest.importorskip("transformers")

VOCAB = 64
REL = {"sdpa": 1e-12, "eager": 1e-6}


def tiny(family, impl):
    """A random 2-layer Llama or Qwen3 in float64 (seeded), eval mode, on ``impl``."""
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if family == "llama":
        config, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen3Config(head_dim=8, **common)
        cls = transformers.Qwen3ForCausalLM
    return cls._from_config(config, attn_implementation=impl).to(torch.float64).eval()


MODELS = [(f, i) for f in ("llama", "qwen3") for i in ("sdpa", "eager")]


@pytest.fixture(scope="module", params=MODELS, ids=["-".join(m) for m in MODELS])
def model(request):
    return tiny(*request.param)


def alone(model, tokens, trained):
    """Per-token log-probs of ``tokens``' trained targets, the sequence run on its own."""
    ids = torch.tensor(tokens)[None]
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0]
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[[j - 1 for j in range(1, len(tokens)) if trained[j]]]


def tree_run(model, batch):
    with torch.no_grad():
        return model(**model_inputs(batch, model), use_cache=False).logits


def assert_alone(model, batch, seqs, flags):
    """Every sequence of ``batch`` matches itself alone: token and summed log-probs, losses."""
    rel = REL[model.config._attn_implementation]
    logits = tree_run(model, batch)
    per_token = token_logps(logits, batch)
    per_seq = sequence_logps(logits, batch)
    want_total = 0.0
    for row, i in enumerate(batch["tree_seq_index"].tolist()):
        want = alone(model, seqs[i], flags[i])
        n = want.numel()
        assert int(batch["tree_completion_lengths"][row]) == n
        torch.testing.assert_close(per_token[row, :n], want, rtol=rel, atol=0)
        torch.testing.assert_close(per_seq[row], want.sum(), rtol=rel, atol=0)
        want_total -= float(want.sum())
    got = float(tree_loss(logits, batch, "sum"))
    assert abs(got - want_total) <= rel * abs(want_total)
    return logits


def grpo_group(rng, prompt_len, completions, shared_start=3):
    """A prompt and its completions; the first two completions share their first tokens."""
    prompt = rng.integers(1, VOCAB, prompt_len).tolist()
    outs = [rng.integers(1, VOCAB, int(rng.integers(2, 9))).tolist() for _ in range(completions)]
    outs[1][:shared_start] = outs[0][:shared_start]
    return prompt, outs


def test_grpo_groups_match_each_rollout_alone(model):
    rng = np.random.default_rng(0)
    groups = [grpo_group(rng, 12, 4), grpo_group(rng, 7, 3)]
    prompts = [p for p, outs in groups for _ in outs]
    completions = [c for _, outs in groups for c in outs]
    step = pack_step(prompts, completions, max_tokens=128)
    seqs = [p + c for p, c in zip(prompts, completions)]
    flags = [[j >= len(p) for j in range(len(p) + len(c))] for p, c in zip(prompts, completions)]
    assert step.stats.forward_tokens < step.stats.flat_tokens
    for batch in step.micro_batches:
        assert_alone(model, batch, seqs, flags)


def test_multi_turn_histories_with_trained_turns(model):
    """Each turn's sample repeats the history; it trains its own assistant turn and the
    earlier ones (which a later sample also holds: a shared trained token counts once per
    sequence)."""
    rng = np.random.default_rng(1)
    turns = [
        (rng.integers(1, VOCAB, 5).tolist(), rng.integers(1, VOCAB, 4).tolist()) for _ in range(3)
    ]
    seqs, labels = [], []
    for k in range(1, 4):
        tokens, lab = [], []
        for user, assistant in turns[:k]:
            tokens += user + assistant
            lab += [-100] * len(user) + assistant
        seqs.append(tokens)
        labels.append(lab)
    batch = pack_trees(seqs, labels, max_tokens=64)
    assert batch["tree_stats"].forward_tokens == len(seqs[-1])
    flags = [[x != -100 for x in lab] for lab in labels]
    assert_alone(model, batch, seqs, flags)


def test_trees_cut_across_rows(model):
    rng = np.random.default_rng(2)
    prompt, outs = grpo_group(rng, 10, 6)
    seqs = [prompt + c for c in outs]
    flags = [[j >= 10 for j in range(len(s))] for s in seqs]
    batch = pack_trees(seqs, max_tokens=24, loss_mask=flags, pad_to_multiple_of=8)
    stats = batch["tree_stats"]
    assert stats.split_trees == 1 and stats.rows > 1
    assert batch["input_ids"].shape[1] % 8 == 0
    assert_alone(model, batch, seqs, flags)


def _dataset(n=12, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n // 3):
        prompt, outs = grpo_group(rng, 6, 3)
        out += [{"input_ids": prompt + c, "labels": [-100] * 6 + c} for c in outs]
    return out


@pytest.mark.parametrize("model", [("llama", "sdpa")], indirect=True, ids=["llama-sdpa"])
def test_dataloader_workers_build_tree_batches(model):
    data = _dataset()
    loader = torch.utils.data.DataLoader(
        data, batch_size=6, collate_fn=TreeCollator(max_tokens=64), num_workers=2
    )
    seen = 0
    for b, batch in enumerate(loader):
        seqs = [d["input_ids"] for d in data[b * 6 : (b + 1) * 6]]
        flags = [[x != -100 for x in d["labels"]] for d in data[b * 6 : (b + 1) * 6]]
        assert batch["tree_stats"].forward_tokens < batch["tree_stats"].flat_tokens
        assert_alone(model, batch, seqs, flags)
        seen += len(batch["tree_seq_index"])
    assert seen == len(data)


@pytest.mark.parametrize("model", [("llama", "sdpa")], indirect=True, ids=["llama-sdpa"])
def test_a_flat_causal_mask_misses(model):
    """The control: the same tree row without the tree mask — transformers then reads the
    position jumps as document starts (a flat packer's document mask: a branch loses its
    prompt) — moves the log-probs far beyond the tolerance."""
    rng = np.random.default_rng(4)
    prompt, outs = grpo_group(rng, 8, 3)
    seqs = [prompt + c for c in outs]
    batch = pack_trees(seqs, max_tokens=64)
    good = sequence_logps(tree_run(model, batch), batch)
    with torch.no_grad():
        flat = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
    bad = sequence_logps(flat, batch)
    assert float(((bad - good).abs() / good.abs()).max()) > 1e-6
    # A plain causal mask over the row: a later branch attends to the earlier ones.
    length = batch["input_ids"].shape[1]
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool))[None, None]
    with torch.no_grad():
        mixed = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=causal,
            use_cache=False,
        ).logits
    bad = sequence_logps(mixed, batch)
    assert float(((bad - good).abs() / good.abs()).max()) > 1e-6


def test_the_dense_masks_agree_with_the_intervals():
    batch = pack_trees([[1, 2, 3, 4], [1, 2, 5], [7, 8]], max_tokens=16, pad_to_multiple_of=4)
    bool_mask = dense_mask(batch)
    additive = dense_mask(batch, dtype=torch.float64)
    assert bool_mask.shape == (1, 1, 8, 8)
    assert torch.equal(additive == 0, bool_mask)
    # Node [1 2] then [3 4] and [5]; [7 8] a separate tree; two padding tokens.
    q5 = bool_mask[0, 0, 4].tolist()
    assert q5 == [True, True, False, False, True, False, False, False]


def test_recurrent_and_windowed_families_are_refused():
    mamba = transformers.MambaConfig(hidden_size=16, num_hidden_layers=1, vocab_size=32)
    assert "Mamba" in tree_refusal(mamba)
    with pytest.raises(PackingError, match="mamba"):
        check_tree_model(mamba)
    hybrid = transformers.LlamaConfig(num_hidden_layers=2)
    hybrid.layer_types = ["full_attention", "linear_attention"]
    assert "linear_attention" in tree_refusal(hybrid)
    mistral = transformers.MistralConfig(sliding_window=16)
    assert "sliding" in tree_refusal(mistral)
    # Positions from the mask or ALiBi by index distance would not follow the tree's paths.
    for position_blind in (transformers.BloomConfig(), transformers.OPTConfig()):
        assert "more than positions" in tree_refusal(position_blind)
    # Sinks and windows: gpt-oss takes a mask per layer type, not a tree.
    assert tree_refusal(transformers.GptOssConfig()) is not None
    assert tree_refusal(transformers.LlamaConfig()) is None
    assert tree_refusal(transformers.Qwen3Config()) is None
