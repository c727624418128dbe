"""Preference packing benchmark (issue 11): rows and tokens per epoch for padded pairs (TRL's
default), separate-sequence packing and shared-prompt packing, and tokenize + pack time against
TRL's ``DPOTrainer`` dataset preparation of the same records, in the same run.

The lengths are GENERATED, not read from a data set: UltraFeedback-like log-normal prompt and
completion lengths (medians ``--prompt-median`` / ``--completion-median`` tokens, chosen and
rejected drawn independently), keeping the pairs whose two whole sequences fit in one row of
``--max-len`` together (so every route trains on the same pairs, none truncated). Padded pairs
are TRL's collator: batches of ``--batch-pairs`` pairs in a shuffled order, chosen and rejected
stacked and padded to the batch's longest sequence. Packed rows are counted from
``tokpack.pack_files`` itself.

The timing part writes ``--records`` standard preference records (prompt, chosen, rejected
strings of pseudo-words with those lengths in words), trains a byte-level BPE on them, and times
``tokpack.pack_files(jsonl, tokenizer=...)`` (tokenize + pack, file to packed shards) against
``DPOTrainer._prepare_dataset`` (tokenizing only, no packing; ``datasets`` map with
``--num-proc`` processes, after a warm-up call on 8 records). Run on a release build:

    pip install ".[tokenize]" datasets transformers trl && python benches/bench_preference.py
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tokpack
from tokpack._io.tables import table
from tokpack.synthetic import train_chat_tokenizer
from tokpack.tokenize import PREFERENCE_SCHEMA

IGNORE = -100


def pair_lengths(args, rng: np.random.Generator) -> np.ndarray:
    """(prompt, chosen completion, rejected completion) lengths of the pairs whose two whole
    sequences fit in one row together (so no route truncates or drops any)."""

    def draw(median: float, sigma: float, n: int) -> np.ndarray:
        return np.maximum(1, rng.lognormal(np.log(median), sigma, n)).astype(np.int64)

    n = args.pairs * 2  # generous: the long tail is filtered out
    lengths = np.stack(
        [
            draw(args.prompt_median, 0.9, n),
            draw(args.completion_median, 0.8, n),
            draw(args.completion_median, 0.8, n),
        ],
        axis=1,
    )
    fits = 2 * lengths[:, 0] + lengths[:, 1:].sum(axis=1) <= args.max_len
    return lengths[fits][: args.pairs]


def padded_pairs(lengths: np.ndarray, batch_pairs: int, rng: np.random.Generator):
    """Rows and token slots per epoch of TRL's padded batches: 2 rows per pair, each batch
    padded to its longest sequence."""
    order = rng.permutation(len(lengths))
    seqs = lengths[order, 0:1] + lengths[order, 1:]  # chosen and rejected sequence lengths
    slots = 0
    for start in range(0, len(seqs), batch_pairs):
        batch = seqs[start : start + batch_pairs]
        slots += batch.size * int(batch.max())
    return 2 * len(lengths), slots


def write_pairs(path: Path, lengths: np.ndarray, rng: np.random.Generator) -> Path:
    cols = {k: [] for k in PREFERENCE_SCHEMA.names}
    for p, c, r in lengths.tolist():
        prompt = rng.integers(0, 32000, p).tolist()
        for role, n in (("chosen", c), ("rejected", r)):
            completion = rng.integers(0, 32000, n).tolist()
            cols[f"{role}_input_ids"].append(prompt + completion)
            cols[f"{role}_labels"].append([IGNORE] * p + completion)
        cols["prompt_length"].append(p)
        cols["length"].append(2 * p + c + r)
    pq.write_table(pa.table(cols, schema=PREFERENCE_SCHEMA), path)
    return path


def rows_and_tokens(args, tmp: Path) -> None:
    rng = np.random.default_rng(args.seed)
    lengths = pair_lengths(args, rng)
    real = int(2 * lengths[:, 0].sum() + lengths[:, 1:].sum())
    rows, slots = padded_pairs(lengths, args.batch_pairs, rng)
    out = [["padded pairs (TRL default)", f"{rows:,}", f"{slots:,}", f"{real:,}", "1.00"]]
    src = write_pairs(tmp / "pairs.parquet", lengths, rng)
    for layout in ("separate", "shared-prompt"):
        m = tokpack.pack_files(src, tmp / layout, args.max_len, pair_layout=layout)
        f = m["figures"]
        packed_slots = f["rows"] * args.max_len
        out.append(
            [
                f"packed, {layout}",
                f"{f['rows']:,}",
                f"{packed_slots:,}",
                f"{f['tokens']:,}",
                f"{slots / packed_slots:.2f}",
            ]
        )
    print(
        f"{len(lengths):,} pairs (generated lengths: prompt median {args.prompt_median}, completion"
        f" median {args.completion_median}), max_len {args.max_len}, padded batches of"
        f" {args.batch_pairs} pairs\n"
    )
    headers = ["route", "rows / epoch", "token slots / epoch", "real tokens", "slots saved (x)"]
    print(table(headers, out))


def words(rng: np.random.Generator, vocab: np.ndarray, n: int) -> str:
    return " ".join(vocab[rng.integers(0, len(vocab), n)])


def tokenize_and_pack_time(args, tmp: Path) -> None:
    rng = np.random.default_rng(args.seed + 1)
    syllables = "ka ri to na me su lo pe an de ing er ti on al re co mu ex".split()
    vocab = np.array(
        ["".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(20_000)], dtype=object
    )
    args_lengths = SimpleNamespace(**{**vars(args), "pairs": args.records})
    lengths = pair_lengths(args_lengths, rng) // 2  # words, about 2 tokens each
    records = [
        {
            "prompt": words(rng, vocab, int(p)),
            # A leading space: the completion's first token does not merge with the prompt's end.
            "chosen": " " + words(rng, vocab, int(c)),
            "rejected": " " + words(rng, vocab, int(r)),
        }
        for p, c, r in lengths
    ]
    jsonl = tmp / "pref.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    texts = (r[k] for r in records[:2000] for k in ("prompt", "chosen", "rejected"))
    tok = train_chat_tokenizer(texts, tmp / "tok", vocab_size=8000, chat_template=None)

    start = time.perf_counter()
    m = tokpack.pack_files(
        jsonl, tmp / "one-step", args.max_len, tokenizer=tok, overlong="truncate"
    )
    ours = time.perf_counter() - start

    import datasets
    import trl
    from transformers import PreTrainedTokenizerFast

    datasets.disable_progress_bars()
    hf = PreTrainedTokenizerFast(
        tokenizer_file=str(tok / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    dataset = datasets.Dataset.from_list(records)
    prepare = SimpleNamespace(
        dataset_num_proc=args.num_proc, max_length=None, truncation_mode="keep_start"
    )
    trainer = SimpleNamespace(_tokenizer=hf)
    # Warm-up on a few records: the one-time costs (imports, hashing the tokenizer for the
    # cache fingerprint) are not counted.
    trl.DPOTrainer._prepare_dataset(trainer, dataset.select(range(8)), hf, prepare, "train")
    start = time.perf_counter()
    trl.DPOTrainer._prepare_dataset(trainer, dataset, hf, prepare, "train")
    theirs = time.perf_counter() - start
    n = len(records)
    print(
        f"\n{n:,} standard preference records, {m['figures']['input_tokens']:,} tokens;"
        f" TRL {trl.__version__}, datasets num_proc={args.num_proc}\n"
    )
    rows = [
        ["tokpack pack --tokenizer (tokenize + pack)", f"{ours:.2f}", f"{n / ours:,.0f}", "1.00"],
        [
            "TRL DPOTrainer._prepare_dataset (tokenize)",
            f"{theirs:.2f}",
            f"{n / theirs:,.0f}",
            f"{theirs / ours:.2f}",
        ],
    ]
    print(table(["route", "seconds", "records/s", "tokpack speed-up"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--prompt-median", type=float, default=150)
    parser.add_argument("--completion-median", type=float, default=300)
    parser.add_argument("--batch-pairs", type=int, default=8)
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-timing", action="store_true", help="rows and tokens only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rows_and_tokens(args, Path(d))
        if not args.no_timing:
            tokenize_and_pack_time(args, Path(d))


if __name__ == "__main__":
    main()
