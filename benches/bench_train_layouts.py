"""Training-step throughput of three batch layouts of the same samples (issue 34), in one run:
a tiny random Llama on sdpa, CPU, float32, forward + backward of the model's own loss.

- ``padded``: the baseline without packing, one sample per row padded to the step's longest
  (``input_ids``, ``labels`` -100 on padding, a 2-D ``attention_mask``).
- ``recipe``: the training guide's loop until issue 34, ``PackedCollator("hf")``: the step's B
  packed rows as one ``[1, B*L]`` padding-free sequence; transformers finds the samples from
  ``position_ids`` restarting and builds one dense ``[1, 1, B*L, B*L]`` block-diagonal mask, so
  attention costs as if the B rows were one.
- ``per-row``: ``PackedCollator("padded")`` rows ``[B, L]`` with ``position_ids`` restarting per
  sample and no ``attention_mask``: transformers' ``find_packed_sequence_indices`` runs per row,
  so sdpa gets a ``[B, 1, L, L]`` block mask per row (the ``document_ids`` are tokpack's
  bookkeeping and are not passed).

Every layout trains on the same samples (SFT-like lengths from ``tokpack.synthetic``, packed
into rows of ``--max-len`` by ``tokpack.pack_tokens``, ``--rows`` rows per step); the losses of
each step must agree across layouts (asserted), then tokens/s (real tokens, not padding) are
timed, best of ``--repeats`` passes with the layouts interleaved, and printed with their ratio
against ``padded``.

    python benches/bench_train_layouts.py
    python benches/bench_train_layouts.py --steps 2 --repeats 2 --hidden 128
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List

import numpy as np
import torch

from tokpack import pack_tokens
from tokpack.synthetic import sft_lengths
from tokpack.torch import PackedCollator

LAYOUTS = ("padded", "recipe", "per-row")


def tiny_llama(args: argparse.Namespace):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.max_len,
        use_cache=False,
    )
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa").train()


def packed_steps(args: argparse.Namespace) -> List[List[Dict[str, torch.Tensor]]]:
    """``--steps`` steps of ``--rows`` packed rows each (rows as the collator takes them)."""
    rng = np.random.default_rng(0)
    # Enough samples to fill the steps' rows, SFT-like, none longer than a row.
    lengths = sft_lengths(args.steps * args.rows * 8, seed=0, max_length=args.max_len)
    samples = [rng.integers(1, args.vocab, size=int(n), dtype=np.int64) for n in lengths]
    labels = []
    for s in samples:
        lab = s.copy()
        lab[: len(s) * 3 // 10] = -100  # the prompt
        labels.append(lab)
    table = pack_tokens(samples, args.max_len, labels=labels, seed=0)
    if table.num_rows < args.steps * args.rows:
        raise SystemExit("not enough packed rows: raise the sample count")
    rows = [
        {
            k: torch.tensor(table.column(k)[i].as_py(), dtype=torch.int64)
            for k in ("input_ids", "labels", "seq_lengths")
        }
        for i in range(args.steps * args.rows)
    ]
    return [rows[i : i + args.rows] for i in range(0, len(rows), args.rows)]


def padded_batch(rows: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """The rows' samples one per row, right-padded, with a 2-D attention mask."""
    samples = []
    for row in rows:
        lens = row["seq_lengths"].tolist()
        samples += zip(torch.split(row["input_ids"], lens), torch.split(row["labels"], lens))
    width = max(len(x) for x, _ in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.int64)
    lab = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for r, (x, y) in enumerate(samples):
        ids[r, : len(x)], lab[r, : len(y)], mask[r, : len(x)] = x, y, 1
        lab[r, 0] = -100  # as the collators do; never a target after the shift anyway
    return {"input_ids": ids, "labels": lab, "attention_mask": mask}


def layout_batches(steps) -> Dict[str, List[Dict[str, torch.Tensor]]]:
    hf, per_row = PackedCollator("hf"), PackedCollator("padded")
    keep = ("input_ids", "labels", "position_ids")
    return {
        "padded": [padded_batch(rows) for rows in steps],
        "recipe": [{k: hf.collate(rows)[k] for k in keep} for rows in steps],
        "per-row": [{k: per_row.collate(rows)[k] for k in keep} for rows in steps],
    }


def train_pass(model, batches) -> List[float]:
    """Forward + backward of every batch; the losses."""
    losses = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.item())
    return losses


def best_of(repeats: int, run: Dict[str, Callable[[], object]]) -> Dict[str, float]:
    """Best wall time of each entry over ``repeats`` rounds, the entries interleaved."""
    best = {name: float("inf") for name in run}
    for _ in range(repeats):
        for name, fn in run.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8, help="packed rows per step")
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = tiny_llama(args)
    steps = packed_steps(args)
    batches = layout_batches(steps)
    real_tokens = sum(int(r["input_ids"].numel()) for rows in steps for r in rows)
    losses = {name: train_pass(model, b) for name, b in batches.items()}  # also the warm-up
    for name in LAYOUTS[1:]:
        np.testing.assert_allclose(losses[name], losses["padded"], rtol=1e-4, err_msg=name)
    seconds = best_of(
        args.repeats, {n: (lambda b=b: train_pass(model, b)) for n, b in batches.items()}
    )

    params = sum(p.numel() for p in model.parameters())
    n_samples = sum(len(r["seq_lengths"]) for rows in steps for r in rows)
    print(
        f"tiny Llama ({params / 1e6:.1f}M parameters, hidden {args.hidden}, {args.layers} layers,"
        f" sdpa, float32, CPU, {torch.get_num_threads()} threads): {args.steps} steps of"
        f" {args.rows} rows of {args.max_len} ({n_samples} SFT-like samples,"
        f" {real_tokens / (args.steps * args.rows * args.max_len):.0%} of the rows' tokens"
        " real); losses equal across layouts (rtol 1e-4)"
    )
    print(f"{'layout':<10} {'batch shape':>14} {'s/step':>8} {'tokens/s':>10} {'vs padded':>10}")
    for name in LAYOUTS:
        shape = "x".join(str(d) for d in batches[name][0]["input_ids"].shape)
        per_step = seconds[name] / args.steps
        print(
            f"{name:<10} {shape:>14} {per_step:>8.3f} {real_tokens / seconds[name]:>10.0f}"
            f" {seconds['padded'] / seconds[name]:>9.2f}x"
        )


if __name__ == "__main__":
    main()
