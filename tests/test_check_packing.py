"""``check_packing`` on tiny float64 transformers models: it passes the families that are exact
with the ``hf`` format and flags every planted way of mixing samples, naming the layer (and its
kind) where packed and alone first diverge."""

import pytest
import torch

from tokpack import ConfigError, PackingError
from tokpack.torch import PackedCollator, check_packing, sdpa_block_causal_mask

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    use_cache=False,
)


def tiny(config_cls, model_cls, attn="sdpa", layers=2, **fields):
    """A seeded random float64 model of ``layers`` layers."""
    torch.manual_seed(0)
    config = config_cls(**{**SMALL, "num_hidden_layers": layers, **fields})
    return model_cls._from_config(config, attn_implementation=attn).to(torch.float64)


def tiny_llama(layers=2):
    return tiny(transformers.LlamaConfig, transformers.LlamaForCausalLM, layers=layers)


def tiny_gemma2():
    """Gemma2 with a full-attention layer, then a sliding-window one (window 16: the segments
    are about 100 tokens, so a window ignoring the boundaries reaches into the sample before)."""
    return tiny(
        transformers.Gemma2Config,
        transformers.Gemma2ForCausalLM,
        attn="eager",  # transformers 5 has no sdpa path for Gemma2
        head_dim=8,
        sliding_window=16,
        layer_types=["full_attention", "sliding_attention"],
    )


def tiny_mamba2():
    torch.manual_seed(0)
    config = transformers.Mamba2Config(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=4,
        head_dim=16,
        state_size=8,
        n_groups=1,
        chunk_size=16,
        use_cache=False,
    )
    return transformers.Mamba2ForCausalLM(config).to(torch.float64)


EXACT_FAMILIES = {
    "llama": lambda: tiny_llama(),
    "qwen3": lambda: tiny(transformers.Qwen3Config, transformers.Qwen3ForCausalLM, head_dim=8),
    "mistral": lambda: tiny(
        transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=16
    ),
    "gemma2": tiny_gemma2,
}


@pytest.mark.parametrize("family", sorted(EXACT_FAMILIES))
def test_exact_families_pass_with_the_hf_format(family):
    model = EXACT_FAMILIES[family]()
    report = check_packing(model, PackedCollator("hf"))
    assert report.exact and report.mixes is None and report.first_diverging_layer is None
    assert report.family == family and report.format == "hf" and report.dtype == "float64"
    assert len(report.layer_errors) == 2 and max(report.layer_errors) < 1e-12
    assert report.errors["output"] < 1e-12
    assert len(report.segments) == 3 and sum(report.segments) == 300
    assert report.forward_passes == 4


def test_padded_rows_with_restarting_positions_pass():
    """``[B, L]`` rows: transformers builds a block mask per row from position_ids that restart
    per sample (the per-row layout), and the check maps each row's segments back."""
    report = check_packing(tiny_llama(), PackedCollator("padded"), segments=4)
    assert report.exact and report.format == "padded" and len(report.segments) == 4


class FlatLlama(torch.nn.Module):
    """A model of the ``flash`` format's flat ``[T]`` batch, running an HF stack on ``[1, T]``
    (its layers' outputs are ``[1, T, hidden]``)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, position_ids, cu_seqlens, max_seqlen):
        assert input_ids.dim() == 1 and int(cu_seqlens[-1]) == input_ids.numel()
        return self.inner(input_ids=input_ids[None], position_ids=position_ids[None]).logits[0]


def test_flat_flash_batches_are_mapped_back_to_their_segments():
    report = check_packing(FlatLlama(tiny_llama()), PackedCollator("flash"))
    assert report.exact and report.format == "flash"
    assert len(report.layer_errors) == 2 and report.errors["output"] < 1e-12


class Planted:
    """A collator with a planted bug: ``edit(batch)`` changes the hf batch."""

    format = "planted"

    def __init__(self, edit, base="hf"):
        self.base = PackedCollator(base)
        self.edit = edit

    def __call__(self, rows):
        batch = self.base.collate(rows)
        self.edit(batch)
        return batch


def restart_nowhere(batch):
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[-1]).view(1, -1)


def drop_boundaries(batch):
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
        del batch[key]
    restart_nowhere(batch)


@pytest.mark.parametrize(
    "edit", [drop_boundaries, restart_nowhere], ids=["boundaries dropped", "no position restarts"]
)
def test_flags_a_collator_that_loses_the_boundaries(edit):
    model = tiny_llama()
    with pytest.raises(PackingError, match=r"^llama \(LlamaForCausalLM\) mixes samples") as err:
        check_packing(model, Planted(edit))
    assert "layer 0 (LlamaDecoderLayer)" in str(err.value)
    report = check_packing(model, Planted(edit), raise_on_failure=False)
    assert not report.exact and report.first_diverging_layer == 0
    assert report.errors["output"] > 1e-3


def test_flags_boundary_fields_that_join_two_samples():
    """cu_seq_lens that merge the first two segments: the batch itself says they are one."""

    def merge_first_two(batch):
        cu = batch["cu_seq_lens_q"]
        batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = torch.cat([cu[:1], cu[2:]])

    report = check_packing(tiny_llama(), Planted(merge_first_two), raise_on_failure=False)
    assert not report.exact and report.mixes == "the batch's boundaries"


def test_names_the_kv_cache_when_use_cache_turns_packing_off():
    model = tiny_llama()
    model.config.use_cache = True
    with pytest.raises(PackingError, match="set model.config.use_cache = False"):
        check_packing(model)


def test_does_not_blame_the_cache_when_the_batches_mix_without_it():
    model = tiny_llama()
    model.config.use_cache = True
    with pytest.raises(PackingError) as err:
        check_packing(model, Planted(drop_boundaries))
    assert "use_cache" not in str(err.value) and "PackedCollator.for_model" in str(err.value)


def test_flags_a_sliding_window_that_crosses_a_sample():
    """Per-layer-type masks where the sliding one is a window over the whole row, ignoring the
    documents: the full-attention layer 0 stays exact, the sliding layer 1 mixes."""

    def window_ignoring_documents(batch):
        n = batch["input_ids"].shape[-1]
        i = torch.arange(n)
        window = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 16)
        block = sdpa_block_causal_mask(batch)[0, 0]
        neg = torch.finfo(torch.float64).min

        def additive(allowed):
            return torch.zeros(1, 1, n, n, dtype=torch.float64).masked_fill(~allowed, neg)

        batch["attention_mask"] = {
            "full_attention": additive(block),
            "sliding_attention": additive(window),
        }

    report = check_packing(
        tiny_gemma2(), Planted(window_ignoring_documents), raise_on_failure=False
    )
    assert report.first_diverging_layer == 1 and report.mixes == "layer 1 (sliding_attention)"
    assert report.layer_errors[0] < 1e-12 and report.errors["full_attention"] < 1e-12
    assert report.errors["sliding_attention"] > 1e-3


def test_flags_recurrent_state_carried_across_samples():
    """Mamba2's torch path ignores seq_idx: each sample starts from the previous one's state."""
    with pytest.raises(PackingError, match=r"^mamba2 .* layer 0 \(linear_attention\)"):
        check_packing(tiny_mamba2(), PackedCollator("hf", return_seq_idx=True))


def test_names_the_mamba_layer_of_a_hybrid():
    """Jamba: an attention layer (exact with hf batches), then a Mamba one (its torch path
    carries the state across samples): the report tells them apart by config.layer_types."""
    torch.manual_seed(0)
    config = transformers.JambaConfig(
        **{**SMALL, "num_hidden_layers": 2},
        attn_layer_period=2,
        attn_layer_offset=0,
        expert_layer_period=100,
        expert_layer_offset=50,
        num_experts=1,
        mamba_d_state=8,
        mamba_dt_rank=4,
    )
    model = transformers.JambaForCausalLM._from_config(config, attn_implementation="sdpa")
    report = check_packing(model.to(torch.float64), raise_on_failure=False)
    assert report.layer_kinds == ("full_attention", "linear_attention")
    assert report.mixes == "layer 1 (linear_attention)" and report.errors["full_attention"] < 1e-12


def test_flags_a_pipeline_stage_that_loses_the_boundaries():
    """Layers 2.. run as a later pipeline stage that gets the hidden states only and rebuilds
    plain causal attention and positions: layers 0-1 exact, layer 2 is the first that mixes."""
    model = tiny_llama(layers=4)
    rotary = model.model.rotary_emb

    def later_stage(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        positions = torch.arange(hidden.shape[1]).view(1, -1)
        kwargs.update(attention_mask=None, position_embeddings=rotary(hidden, positions))
        return args, kwargs

    handles = [
        layer.register_forward_pre_hook(later_stage, with_kwargs=True)
        for layer in model.model.layers[2:]
    ]
    try:
        with pytest.raises(PackingError, match=r"layer 2 \(LlamaDecoderLayer\)"):
            check_packing(model)
        report = check_packing(model, raise_on_failure=False)
    finally:
        for h in handles:
            h.remove()
    assert max(report.layer_errors[:2]) < 1e-12 and min(report.layer_errors[2:]) > 1e-3


def test_the_fix_is_the_callers():
    with pytest.raises(PackingError, match=r"; install causal-conv1d$"):
        check_packing(tiny_mamba2(), fix="install causal-conv1d")


def test_mode_is_restored_and_tolerance_follows_the_dtype():
    model = tiny_llama().to(torch.float32).train()
    report = check_packing(model, seed=3)
    assert model.training and report.exact
    assert (report.dtype, report.atol, report.rtol) == ("float32", 1e-4, 1e-4)
    model.eval()
    with pytest.raises(PackingError):
        check_packing(model, Planted(drop_boundaries))
    assert not model.training
    assert check_packing(model, atol=0.5, rtol=0).atol == 0.5


def test_same_seed_same_segments():
    model = tiny_llama()
    a, b, c = (check_packing(model, seed=s) for s in (1, 1, 2))
    assert a.segments == b.segments != c.segments


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(segments=1), "segments must be"),
        (dict(segments=3, tokens=11), "tokens must be"),
        (dict(collator=PackedCollator("torchtune")), "got 'torchtune'"),
        (dict(dtype=torch.int32), "unknown dtype torch.int32; expected one of"),
    ],
)
def test_bad_options_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        check_packing(tiny_llama(), **kwargs)


def test_the_default_collator_is_the_model_aware_layout():
    """Without a collator the check measures what PackedCollator.for_model would give: [B, L]
    rows under sdpa (the README's recipe), not the [1, T] hf layout."""
    report = check_packing(tiny_llama())
    assert report.exact and report.format == "padded"
