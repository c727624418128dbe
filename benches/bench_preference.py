"""Packing preference pairs: compute and time against TRL's padded pairs, in one run.

1. **Rows and tokens per epoch** on generated UltraFeedback-like token lengths (no data set is
   at hand here, so the lengths are drawn: prompt, chosen and rejected completions lognormal,
   medians 120 / 230 / 210 tokens, capped at 2,048; the shapes of UltraFeedback-binarized under
   a Llama-3 tokenizer). Compared, at the same max_len:
   - *padded pairs* (TRL's `DPOTrainer` default): batches of `--batch-pairs` pairs in random
     order, chosen and rejected concatenated into one batch padded to its longest sequence;
   - *separate packing* (`--pair-layout separate`): each pair a unit of its two sequences;
   - *shared-prompt packing* (`--pair-layout shared-prompt`): the prompt once per pair.
   Rows are what a step with `max_len`-token rows runs; "computed tokens" counts padding too.
2. **Preparation time** on generated text records of those shapes: `tokpack tokenize --format
   preference` + `tokpack pack` (both layouts) against TRL's own `DPOTrainer` dataset preparation
   (`_prepare_dataset`: prompt extraction, chat template, tokenizing) of the same records, with
   the same tokenizer, in the same run.

    python benches/bench_preference.py --pairs 200000 --timed-pairs 20000
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_tokenize import corpus, train_tokenizer  # noqa: E402

MEDIANS = {"prompt": 120, "chosen": 230, "rejected": 210}
SIGMA = 0.9
CAP = 2048


def pair_lengths(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        k: np.minimum(np.maximum(rng.lognormal(np.log(m), SIGMA, n), 1).astype(np.int64), CAP)
        for k, m in MEDIANS.items()
    }


def padded_pairs(lengths: dict, batch_pairs: int, seed: int = 0) -> tuple:
    """(rows, computed tokens) of TRL's padded pairs: per batch, 2 x B sequences padded to the
    longest of them."""
    rng = np.random.default_rng(seed)
    chosen = lengths["prompt"] + lengths["chosen"]
    rejected = lengths["prompt"] + lengths["rejected"]
    order = rng.permutation(len(chosen))
    computed = 0
    for a in range(0, len(order), batch_pairs):
        b = order[a : a + batch_pairs]
        computed += 2 * len(b) * int(max(chosen[b].max(), rejected[b].max()))
    return 2 * len(chosen), computed


def packed(units: np.ndarray, max_len: int) -> tuple:
    import tokpack

    plan = tokpack.plan(units, max_len, overlong="drop")
    return plan.n_bins, plan.n_bins * max_len, plan.total_tokens, len(plan.dropped)


def token_figures(n: int, max_len: int, batch_pairs: int) -> list:
    """(layout, rows, computed tokens, real tokens, dropped pairs) of each layout."""
    lengths = pair_lengths(n)
    p, c, r = lengths["prompt"], lengths["chosen"], lengths["rejected"]
    rows_pad, computed_pad = padded_pairs(lengths, batch_pairs)
    out = [["padded pairs (TRL)", rows_pad, computed_pad, int((2 * p + c + r).sum()), 0]]
    for name, units in (("separate", 2 * p + c + r), ("shared-prompt", p + c + r)):
        out.append([f"{name} packing", *packed(units, max_len)])
    return out


def text_records(n: int, seed: int = 1) -> list:
    """Conversational preference records: a one-turn prompt and two answers, word counts drawn
    so their token lengths follow the shapes above (about 1.3 tokens a word here)."""
    lengths = pair_lengths(n, seed)
    convs = corpus(n, seed)
    out = []
    for i, conv in enumerate(convs):
        words = " ".join(m["content"] for m in conv["messages"]).split()
        words = (words * (1 + 4000 // max(1, len(words))))[:4000]

        text = {
            k: " ".join(words[at : at + max(1, int(lengths[k][i] / 1.3))])
            for k, at in (("prompt", 0), ("chosen", 1000), ("rejected", 2500))
        }
        out.append(
            {
                "prompt": [{"role": "user", "content": text["prompt"]}],
                "chosen": [{"role": "assistant", "content": text["chosen"]}],
                "rejected": [{"role": "assistant", "content": text["rejected"]}],
            }
        )
    return out


def time_trl(records: list, tok_dir: Path) -> float:
    import datasets
    import trl
    from transformers import PreTrainedTokenizerFast

    datasets.disable_progress_bars()
    hf = PreTrainedTokenizerFast(
        tokenizer_file=str(tok_dir / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    hf.chat_template = json.loads((tok_dir / "tokenizer_config.json").read_text())["chat_template"]
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    dataset = datasets.Dataset.from_list(records)
    start = time.perf_counter()
    trl.DPOTrainer._prepare_dataset(SimpleNamespace(_tokenizer=hf), dataset, hf, args, "train")
    return time.perf_counter() - start


def time_tokpack(jsonl: Path, tok_dir: Path, work: Path, max_len: int, layout: str) -> dict:
    import tokpack

    start = time.perf_counter()
    tokens = tokpack.tokenize_files(
        [jsonl], work / "tokens", tok_dir, format="preference", force=True
    )
    tokenized = time.perf_counter() - start
    manifest = tokpack.pack_files(
        [work / "tokens"], work / f"packed-{layout}", max_len, pair_layout=layout, force=True
    )
    return {
        "tokenize_s": tokenized,
        "total_s": time.perf_counter() - start,
        "rows": manifest["figures"]["rows"],
        "pairs": tokens["counts"]["samples_out"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200_000, help="pairs for the token figures")
    parser.add_argument("--timed-pairs", type=int, default=20_000, help="pairs for the timing")
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--batch-pairs", type=int, default=8, help="TRL's per-device batch")
    parser.add_argument("--vocab", type=int, default=16_000)
    parser.add_argument("--no-timing", action="store_true", help="token figures only")
    args = parser.parse_args()

    from tokpack.report import table

    rows = token_figures(args.pairs, args.max_len, args.batch_pairs)
    base = rows[0][2]
    print(
        f"\n{args.pairs:,} generated pairs, max_len {args.max_len}, TRL batches of "
        f"{args.batch_pairs} pairs\n"
    )
    head = ["layout", "rows", "computed tokens", "real tokens", "efficiency", "vs padded"]
    body = [
        [name, f"{n:,}", f"{comp:,}", f"{real:,}", f"{real / comp:.1%}", f"{comp / base:.2f}x"]
        + [f"{dropped:,}"]
        for name, n, comp, real, dropped in rows
    ]
    print(table([*head, "dropped"], body))
    saved = 1 - rows[2][3] / rows[1][3]
    print(
        f"shared prompt: {saved:.1%} fewer real tokens than separate sequences (pairs longer "
        "than max_len are dropped here; overlong='truncate' would trim their completions)"
    )
    if args.no_timing:
        return 0

    work = Path(tempfile.mkdtemp(prefix="tokpack-bench-pref-"))
    try:
        records = text_records(args.timed_pairs)
        jsonl = work / "pairs.jsonl"
        with open(jsonl, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        chat = work / "chat.jsonl"
        with open(chat, "w", encoding="utf-8") as f:
            for r in corpus(5000, 7):
                f.write(json.dumps(r) + "\n")
        tok_dir = train_tokenizer(chat, work / "tok", args.vocab, 5000)
        trl_s = time_trl(records, tok_dir)
        timings = [["TRL DPOTrainer._prepare_dataset", f"{trl_s:.1f}", "1.00x", "-", "-"]]
        for layout in ("separate", "shared-prompt"):
            t = time_tokpack(jsonl, tok_dir, work, args.max_len, layout)
            timings.append(
                [
                    f"tokpack tokenize + pack ({layout})",
                    f"{t['total_s']:.1f}",
                    f"{trl_s / t['total_s']:.2f}x",
                    f"{t['tokenize_s']:.1f}",
                    f"{t['rows']:,}",
                ]
            )
        print(f"\n{args.timed_pairs:,} generated text pairs\n")
        print(table(["run", "time (s)", "speed vs TRL", "of which tokenize (s)", "rows"], timings))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
