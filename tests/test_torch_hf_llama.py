"""The "hf" format fed to a real transformers Llama (sdpa) matches the samples run one by one.

transformers detects packed rows from ``position_ids`` restarting at 0 when no ``attention_mask``
and no KV cache are given (``masking_utils.find_packed_sequence_indices``), and builds a
block-diagonal causal mask for sdpa; ``use_cache=False`` is required outside ``Trainer``.
"""

import pytest
import torch
import torch.nn.functional as F

from tokpack import pack_tokens
from tokpack.torch import PackedCollator

from .packed_corpus import random_samples

transformers = pytest.importorskip("transformers")


def tiny_llama():
    """A random 2-layer Llama on sdpa in float64 (seeded), in eval mode."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    m = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    return m.to(torch.float64).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _rows(table):
    """The packed rows of a ``pack_tokens`` table as the collator's input."""
    columns = ("input_ids", "labels", "seq_lengths")
    return [
        {k: torch.tensor(table.column(k)[i].as_py()) for k in columns}
        for i in range(table.num_rows)
    ]


def _token_losses(logits, labels):
    return F.cross_entropy(logits[0, :-1], labels[0, 1:], reduction="none", ignore_index=-100)


def test_packed_hf_batch_matches_one_by_one(model):
    samples, labels = random_samples(10, 24, seed=5, vocab=128)
    table = pack_tokens(samples, 64, labels=labels)
    rows = _rows(table)
    batch = PackedCollator("hf")(rows)
    order = [i for r in range(table.num_rows) for i in table.column("sample_ids")[r].as_py()]
    with torch.no_grad():
        kwargs = {k: v for k, v in batch.items() if k not in ("num_loss_tokens", "num_seqs")}
        out = model(**kwargs, use_cache=False)
        packed = _token_losses(out.logits, batch["labels"])
        singles = []
        for i in order:
            ids = torch.tensor(samples[i], dtype=torch.int64).view(1, -1)
            lab = torch.tensor(labels[i], dtype=torch.int64).view(1, -1).clone()
            lab[0, 0] = -100
            logits = model(input_ids=ids, use_cache=False).logits
            # The packed row's loss at a sample's last token predicts the next sample's first
            # token and is masked: -100 there too.
            singles.append(
                torch.cat([_token_losses(logits, lab), torch.zeros(1, dtype=logits.dtype)])
            )
        expected = torch.cat(singles)[:-1]
    assert packed.shape == expected.shape
    assert torch.allclose(packed, expected, atol=1e-9, rtol=0)
    # The model's own mean loss (computed in float32) uses the same terms as num_loss_tokens.
    assert out.loss.item() == pytest.approx(
        packed.sum().item() / batch["num_loss_tokens"], rel=1e-6
    )


def test_attention_mask_of_ones_would_contaminate(model):
    """Why the collator returns no attention_mask: with one, sdpa attends across samples."""
    samples, labels = random_samples(6, 20, seed=6, vocab=128)
    table = pack_tokens(samples, 64, labels=labels)
    rows = _rows(table)
    b = PackedCollator("hf")(rows)
    with torch.no_grad():
        good = model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False)
        bad = model(
            input_ids=b["input_ids"],
            position_ids=b["position_ids"],
            attention_mask=torch.ones_like(b["input_ids"]),
            use_cache=False,
        )
    assert not torch.allclose(good.logits, bad.logits, atol=1e-6)


def test_cp_shift_labels_drive_the_hf_loss(model):
    # A context-parallel slice carries pre-shifted targets: transformers' ForCausalLMLoss must use
    # them as they are instead of shifting the rank's labels (which crosses chunk boundaries).
    samples, labels = random_samples(6, 21, seed=2, vocab=128)
    table = pack_tokens(samples, 48, labels=labels)
    rows = _rows(table)
    batch = PackedCollator("hf", cp_size=2, cp_rank=1)(rows)
    with torch.no_grad():
        out = model(
            **{k: batch[k] for k in ("input_ids", "position_ids", "labels", "shift_labels")},
            use_cache=False,
        )
    # transformers computes the loss in float32.
    logits = out.logits[0].float()
    expected = F.cross_entropy(logits, batch["shift_labels"][0])
    shifted_locally = F.cross_entropy(logits[:-1], batch["labels"][0, 1:])
    assert abs(out.loss.item() - expected.item()) < 1e-6
    assert abs(out.loss.item() - shifted_locally.item()) > 1e-3
