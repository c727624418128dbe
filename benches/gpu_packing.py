"""Packing on a CUDA machine (issue 34), one table: ``check_packing`` over tiny random models of
a few families in bf16, with whatever attention implementations and kernels are importable
(flash_attn, fla, causal_conv1d, mamba_ssm: detected, never installed), then the training
throughput of a ~100M-parameter Llama-style model on SFT-like lengths, packed against padded
batches of the same samples (tokens/s of real tokens and the ratio), in the same run.

Without CUDA it prints one line and exits 0. ``--device cpu --tiny`` runs the same code on tiny
models (float32, a few steps), which is what the tests run. On a GPU the whole script takes
well under 5 minutes (about a minute on one A100-class card).

Rows of the table:
- ``check FAMILY / IMPL / FORMAT``: ``exact``, ``MIXES at layer N (kind)`` (the first layer that
  lets one sample see another), or ``raises`` with transformers' refusal (a family whose exact
  path needs a kernel that is not installed), and the check's wall time.
- ``train LAYOUT``: forward + backward of the model's loss over the same samples: ``padded``
  (``--rows`` samples per batch, padded to the batch's longest, 2-D attention mask; the
  baseline), ``recipe`` (``--rows`` packed rows as one ``[1, rows*L]`` sequence under sdpa),
  ``per-row`` (``[rows, L]`` packed rows with positions restarting per sample under sdpa: a
  block mask per row) and, with flash_attn, ``varlen`` (the ``[1, rows*L]`` batch's
  ``cu_seq_lens`` under ``flash_attention_2``). Mean loss per layout (they train on the same
  tokens: the losses agree up to bf16 rounding).

    python benches/gpu_packing.py                       # on a CUDA machine
    python benches/gpu_packing.py --device cpu --tiny   # the CPU-capable parts, tiny
"""

from __future__ import annotations

import argparse
import importlib.util
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from tokpack import PackingError, pack_tokens
from tokpack.synthetic import sft_lengths
from tokpack.torch import PackedCollator, check_packing

KERNELS = ("flash_attn", "fla", "causal_conv1d", "mamba_ssm")

SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    use_cache=False,
)

# Tiny configs of families with different ways of keeping samples apart: plain attention,
# sliding windows, sinks + windows, Mamba-2 state, Mamba-2 hybrids, Gated DeltaNet hybrids.
FAMILIES: Dict[str, Dict[str, Any]] = {
    "llama": {},
    "qwen3": dict(head_dim=16),
    "mistral": dict(sliding_window=16),
    "gemma2": dict(
        head_dim=16, sliding_window=16, layer_types=["full_attention", "sliding_attention"]
    ),
    "gpt_oss": dict(
        head_dim=16,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        num_local_experts=2,
        num_experts_per_tok=1,
    ),
    "mamba2": dict(num_heads=4, head_dim=32, state_size=16, n_groups=1, chunk_size=16),
    "bamba": dict(
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_chunk_size=16,
    ),
    "qwen3_next": dict(
        head_dim=16,
        layer_types=["linear_attention", "full_attention"],
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    ),
}


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def tiny_model(family: str, impl: str, device: str, dtype: torch.dtype):
    """A seeded random tiny model of ``family`` on ``impl`` (eager where transformers has no
    sdpa path for it); (model, the implementation used)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **{**SMALL, **FAMILIES[family]})
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=impl)
    except ValueError:
        if impl != "sdpa":
            raise
        impl = "eager"
        model = AutoModelForCausalLM.from_config(config, attn_implementation=impl)
    return model.to(device=device, dtype=dtype), impl


def collators(model) -> List[Tuple[str, Any]]:
    out = [
        ("hf", PackedCollator("hf")),
        ("hf+seq_idx", PackedCollator("hf", return_seq_idx=True)),
        ("padded", PackedCollator("padded")),
    ]
    # The model-aware batches, where this tokpack has them.
    for_model = getattr(PackedCollator, "for_model", None)
    if for_model is not None:
        try:
            out.append(("for_model", for_model(model)))
        except PackingError as exc:
            out.append(("for_model", exc))
    return out


def check_rows(args: argparse.Namespace, dtype: torch.dtype) -> List[Tuple[str, str, str]]:
    impls = ["sdpa"] + (["flash_attention_2"] * (args.device == "cuda" and installed("flash_attn")))
    rows = []
    for family in args.families:
        for impl in impls:
            try:
                model, used = tiny_model(family, impl, args.device, dtype)
            except Exception as exc:  # a family this transformers cannot build here
                rows.append((f"check {family} / {impl}", f"not built: {_short(exc)}", ""))
                continue
            for name, collator in collators(model):
                label = f"check {family} / {used} / {name}"
                if isinstance(collator, Exception):
                    rows.append((label, f"refused: {_short(collator)}", ""))
                    continue
                try:
                    report = check_packing(model, collator, raise_on_failure=False)
                    verdict = "exact" if report.exact else f"MIXES at {report.mixes}"
                    cost = f"{_check_ms(model, collator, repeats=1 if args.tiny else 3):.0f} ms"
                except Exception as exc:  # transformers refusing a batch it cannot keep apart
                    verdict, cost = f"raises: {_short(exc)}", ""
                rows.append((label, verdict, cost))
    return rows


def _check_ms(model, collator, repeats: int = 3) -> float:
    """Best wall time of ``check_packing`` over ``repeats`` runs, in ms (the machine's load
    varies between runs; the first run above also warmed the kernels up)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        check_packing(model, collator, raise_on_failure=False)
        _sync(str(next(model.parameters()).device.type))
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _forward_ms(model, tokens: int, repeats: int = 3) -> float:
    """Best wall time of one no-grad forward of ``tokens`` tokens, in ms."""
    device = next(model.parameters()).device
    ids = torch.randint(1, model.config.vocab_size, (1, tokens), device=device)
    best = float("inf")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model(input_ids=ids)
            _sync(device.type)
            best = min(best, time.perf_counter() - start)
    model.train(was_training)
    return best * 1e3


def _short(exc: BaseException, width: int = 90) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def train_model(args: argparse.Namespace, impl: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.tiny:
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, heads=4)
    else:  # ~110M parameters with tied embeddings (GPT-2 small sized)
        shape = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, heads=12)
    heads = shape.pop("heads")
    config = LlamaConfig(
        vocab_size=args.vocab,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=args.max_len,
        tie_word_embeddings=True,
        use_cache=False,
        **shape,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(config, attn_implementation=impl)
    return model.to(device=args.device, dtype=dtype).train()


def training_data(args: argparse.Namespace):
    """(packed rows, the same samples as (input_ids, labels) pairs in a shuffled order)."""
    rng = np.random.default_rng(0)
    lengths = sft_lengths(args.steps * args.rows * 12, seed=0, max_length=args.max_len)
    samples = [rng.integers(1, args.vocab, size=int(n), dtype=np.int64) for n in lengths]
    labels = []
    for s in samples:
        lab = s.copy()
        lab[: len(s) * 3 // 10] = -100
        labels.append(lab)
    table = pack_tokens(samples, args.max_len, labels=labels, seed=0)
    n_rows = min(table.num_rows, args.steps * args.rows)
    rows = [
        {
            k: torch.tensor(table.column(k)[i].as_py(), dtype=torch.int64)
            for k in ("input_ids", "labels", "seq_lengths")
        }
        for i in range(n_rows)
    ]
    pairs = []
    for row in rows:
        lens = row["seq_lengths"].tolist()
        pairs += zip(torch.split(row["input_ids"], lens), torch.split(row["labels"], lens))
    order = rng.permutation(len(pairs))
    return rows, [pairs[i] for i in order]


def padded_batch(pairs) -> Dict[str, torch.Tensor]:
    width = max(len(x) for x, _ in pairs)
    ids = torch.zeros(len(pairs), width, dtype=torch.int64)
    lab = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for r, (x, y) in enumerate(pairs):
        ids[r, : len(x)], lab[r, : len(y)], mask[r, : len(x)] = x, y, 1
    return {"input_ids": ids, "labels": lab, "attention_mask": mask}


def layouts(args: argparse.Namespace) -> Tuple[int, Dict[str, Tuple[str, List[Dict[str, Any]]]]]:
    """The samples' tokens (every layout holds the same samples), and per layout: (attention
    implementation, batches)."""
    rows, pairs = training_data(args)
    steps = [rows[i : i + args.rows] for i in range(0, len(rows), args.rows)]
    hf, per_row = PackedCollator("hf"), PackedCollator("padded")
    keep = ("input_ids", "labels", "position_ids")
    out = {
        "padded": (
            "sdpa",
            [padded_batch(pairs[i : i + args.rows]) for i in range(0, len(pairs), args.rows)],
        ),
        "recipe": ("sdpa", [{k: hf.collate(s)[k] for k in keep} for s in steps]),
        "per-row": ("sdpa", [{k: per_row.collate(s)[k] for k in keep} for s in steps]),
    }
    if args.device == "cuda" and installed("flash_attn"):
        varlen = [
            {k: v for k, v in hf.collate(s).items() if k not in ("num_loss_tokens", "num_seqs")}
            for s in steps
        ]
        out["varlen"] = ("flash_attention_2", varlen)
    return sum(len(x) for x, _ in pairs), out


def train_rows(args: argparse.Namespace, dtype: torch.dtype) -> List[Tuple[str, str, str]]:
    results = []
    models: Dict[str, Any] = {}
    real, batches_of = layouts(args)
    for name, (impl, batches) in batches_of.items():
        if impl not in models:
            models[impl] = train_model(args, impl, dtype)
        model = models[impl]
        # The model's loss is a mean over each batch's terms (labels after the shift).
        terms = [int((b["labels"][..., 1:] != -100).sum()) for b in batches]
        batches = [{k: _to(v, args.device) for k, v in b.items()} for b in batches]
        for b in batches[: args.warmup]:
            model(**b).loss.backward()
        model.zero_grad(set_to_none=True)
        _sync(args.device)
        start = time.perf_counter()
        loss_sum = 0.0
        for b, n in zip(batches, terms):
            loss = model(**b).loss
            loss.backward()
            loss_sum += loss.item() * n
        _sync(args.device)
        seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        shape = "x".join(map(str, batches[0]["input_ids"].shape))
        results.append(
            (name, impl, shape, real / seconds, loss_sum / sum(terms), len(batches), seconds)
        )
    sdpa = models["sdpa"]
    params = sum(p.numel() for p in sdpa.parameters())
    base = next(r[3] for r in results if r[0] == "padded")
    check_ms, forward_ms = _check_ms(sdpa, PackedCollator("hf")), _forward_ms(sdpa, 300)
    cost = (
        f"check_packing on the training model (hf, 300 tokens): {check_ms:.0f} ms,"
        f" {check_ms / forward_ms:.1f}x one forward of 300 tokens ({forward_ms:.0f} ms)"
    )
    return [
        ("cost", cost, ""),
        *[
            (
                f"train {name} ({impl}, {n} batches of {shape})",
                f"{rate:,.0f} tokens/s, {rate / base:.2f}x padded, mean loss {loss:.4f}",
                f"{secs:.1f} s, {params / 1e6:.0f}M params",
            )
            for name, impl, shape, rate, loss, n, secs in results
        ],
    ]


def _to(value: Any, device: str) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="tiny models and few steps (tests)")
    parser.add_argument("--rows", type=int, default=None, help="packed rows (samples) per batch")
    parser.add_argument("--max-len", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="packed steps timed")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=None)
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"of {','.join(FAMILIES)}")
    args = parser.parse_args(argv)
    args.families = args.families.split(",")
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}: choose from {','.join(FAMILIES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_packing: no CUDA device here; skipped (--device cpu --tiny runs the CPU parts)")
        return 0
    defaults = dict(rows=4, max_len=256, steps=2, vocab=512) if args.tiny else {}
    defaults = {**dict(rows=8, max_len=2048, steps=20, vocab=32000), **defaults}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.tiny:
        args.warmup = min(args.warmup, 1)
    # bf16 as GPU training runs; float32 on CPU (bf16 matmuls there are slow and add nothing).
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    kernels = ", ".join(f"{k} {'yes' if installed(k) else 'no'}" for k in KERNELS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = check_rows(args, dtype) + train_rows(args, dtype)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"gpu_packing on {device}, {str(dtype).replace('torch.', '')}; kernels: {kernels}")
    width = max(len(r[0]) for r in rows)
    verdict_width = max(len(r[1]) for r in rows)
    for what, verdict, cost in rows:
        print(f"{what:<{width}}  {verdict:<{verdict_width}}  {cost}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
