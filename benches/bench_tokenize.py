"""Tokenize benchmark: synthetic multi-turn conversations (JSONL) to token ids + assistant-only
labels, with tokpack and, in the same run, with the usual Hugging Face route:
``datasets.Dataset.map(batched=True, num_proc=2)`` calling ``apply_chat_template(...,
tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`` on a ChatML template with
``{% generation %}`` markers, then labels from the mask (what TRL does).

A byte-level BPE of ~32k tokens is trained on the corpus first (no network). Both sides read the
same JSONL file; tokpack's time is file -> Parquet shards on disk; the baseline's time is the
``map`` alone (loading the JSON into an Arrow dataset is not counted). tokpack runs twice: chat
templates rendered in Rust (``renderer="auto"``, the default) and with Jinja in Python
(``renderer="python"``); both outputs must be identical. With the Rust renderer the JSONL records
are parsed, rendered and encoded in Rust (one call a chunk; the manifest's renderer says
``records: rust``); with Jinja they go through Python. Goal (issue 13): tokpack with the Rust
renderer at least 10x the baseline's conversations/s. Run on a release build:

    pip install ".[tokenize]" datasets transformers && python benches/bench_tokenize.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import tokpack
from tokpack._io.tables import table
from tokpack.synthetic import train_chat_tokenizer
from tokpack.tokenize.template import CHATML_TEMPLATE

# The built-in ChatML template: generation markers around each assistant turn.
TEMPLATE = CHATML_TEMPLATE

SYLLABLES = (
    "ka ri to na me su lo pe an de ing er ti on al re co mu ex pro str ght qu ly "
    "tion ment able ous ize ver ter ca ma la se ba ne po di fa go hu ja ke vi wo"
).split()


def vocabulary(rng: np.random.Generator, n_words: int) -> np.ndarray:
    """Pseudo-words built from syllables, so BPE finds real merges."""
    counts = rng.integers(1, 5, size=n_words)
    parts = rng.integers(0, len(SYLLABLES), size=int(counts.sum()))
    words, pos = [], 0
    for c in counts:
        words.append("".join(SYLLABLES[i] for i in parts[pos : pos + c]))
        pos += c
    return np.array(words, dtype=object)


def corpus(n_conversations: int, seed: int = 0):
    """Zipf-distributed words, 1-4 turns, a system prompt half of the time, some punctuation."""
    rng = np.random.default_rng(seed)
    words = vocabulary(rng, 60_000)
    ranks = np.arange(1, len(words) + 1)
    cdf = np.cumsum(1.0 / ranks**1.07)
    cdf /= cdf[-1]
    punct = np.array(["", "", "", "", "", "", ",", ".", "?", "!", ":", " -", " (42)", " 3.14"])

    def text(n: int) -> str:
        w = words[np.minimum(np.searchsorted(cdf, rng.random(n)), len(words) - 1)]
        marks = punct[rng.integers(0, len(punct), size=n)]
        return " ".join(a + b for a, b in zip(w, marks)).capitalize()

    for i in range(n_conversations):
        messages = []
        if i % 2 == 0:
            messages.append({"role": "system", "content": text(int(rng.integers(8, 30)))})
        for _ in range(int(rng.integers(1, 5))):
            messages.append({"role": "user", "content": text(int(rng.integers(8, 80)))})
            messages.append({"role": "assistant", "content": text(int(rng.integers(15, 200)))})
        yield {"messages": messages}


def train_tokenizer(jsonl: Path, out_dir: Path, vocab_size: int, sample: int) -> Path:
    def texts():
        with open(jsonl, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i == sample:
                    return
                for m in json.loads(line)["messages"]:
                    yield m["content"]

    return train_chat_tokenizer(texts(), out_dir, vocab_size=vocab_size, chat_template=TEMPLATE)


def run_baseline(jsonl: Path, tok_dir: Path, cache: Path, num_proc: int):
    import datasets
    from transformers import PreTrainedTokenizerFast

    datasets.disable_progress_bars()
    hf = PreTrainedTokenizerFast(
        tokenizer_file=str(tok_dir / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    hf.chat_template = TEMPLATE
    ds = datasets.load_dataset("json", data_files=str(jsonl), split="train", cache_dir=str(cache))

    def tokenize(batch):
        out = hf.apply_chat_template(
            batch["messages"],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        labels = [
            [t if m else -100 for t, m in zip(ids, mask)]
            for ids, mask in zip(out["input_ids"], out["assistant_masks"])
        ]
        return {"input_ids": out["input_ids"], "labels": labels}

    start = time.perf_counter()
    mapped = ds.map(tokenize, batched=True, num_proc=num_proc, remove_columns=["messages"])
    seconds = time.perf_counter() - start
    return mapped, seconds


def encoders_only(jsonl: Path, tok_dir: Path, sample: int):
    """tokens/s of each encoder alone on the rendered text (no reading, template, labels or
    writing), all cores: ``tokenizers``' ``encode_batch`` and tokpack's Rust BPE encoder."""
    from tokenizers import Tokenizer

    from tokpack import _tokpack
    from tokpack.tokenize.formats import Record
    from tokpack.tokenize.template import ChatTemplate

    template = ChatTemplate(TEMPLATE, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    record = Record(str(jsonl), 0, False, None, None)
    texts = []
    with open(jsonl, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i == sample:
                break
            texts.append(template.render(json.loads(line)["messages"], record))
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    start = time.perf_counter()
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    hf_seconds = time.perf_counter() - start
    n_tokens = sum(len(e) for e in encodings)
    fast, _ = _tokpack.BpeEncoder.load((tok_dir / "tokenizer.json").read_text())
    no_spans = np.zeros(len(texts) + 1, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    start = time.perf_counter()
    ids, _, _, _ = fast.encode_batch(
        texts=texts, span_offsets=no_spans, span_starts=empty, span_ends=empty
    )
    fast_seconds = time.perf_counter() - start
    assert len(ids) == n_tokens
    return n_tokens / hf_seconds, n_tokens / fast_seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--train-sample", type=int, default=20_000, help="conversations for BPE")
    parser.add_argument("--num-proc", type=int, default=2, help="baseline processes")
    parser.add_argument("--threads", type=int, default=None, help="tokpack threads")
    parser.add_argument("--check", type=int, default=2000, help="rows compared with baseline")
    parser.add_argument(
        "--encoder-sample",
        type=int,
        default=10_000,
        help="conversations for the encoders-alone line",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tokpack-bench-tokenize-"))
    try:
        jsonl = work / "chat.jsonl"
        with open(jsonl, "w", encoding="utf-8") as f:
            for record in corpus(args.conversations):
                f.write(json.dumps(record) + "\n")
        tok_dir = train_tokenizer(jsonl, work / "tok", args.vocab, args.train_sample)
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab_size()
        size_mb = jsonl.stat().st_size / 1e6

        loads = [os.getloadavg()[0]]
        seconds, manifests = {}, {}
        for renderer in ("auto", "python"):
            start = time.perf_counter()
            manifests[renderer] = tokpack.tokenize_files(
                jsonl, work / f"tokens-{renderer}", tok_dir, threads=args.threads, renderer=renderer
            )
            seconds[renderer] = time.perf_counter() - start
            loads.append(os.getloadavg()[0])
        manifest, tp_s = manifests["auto"], seconds["auto"]
        assert manifest["renderer"] == {"name": "rust", "records": "rust"}, manifest["renderer"]
        n_tokens = manifest["counts"]["tokens"]

        mapped, hf_s = run_baseline(jsonl, tok_dir, work / "hf-cache", args.num_proc)
        loads.append(os.getloadavg()[0])
        hf_enc, fast_enc = encoders_only(jsonl, tok_dir, args.encoder_sample)

        import pyarrow as pa
        import pyarrow.parquet as pq

        def shards(renderer):
            files = manifests[renderer]["shards"]
            return pa.concat_tables(
                pq.read_table(work / f"tokens-{renderer}" / s["file"]) for s in files
            )

        ours = shards("auto")
        same_renderers = ours.equals(shards("python"))
        k = min(args.check, args.conversations)
        same = ours.slice(0, k).column("input_ids").to_pylist() == mapped[:k]["input_ids"]
        same &= ours.slice(0, k).column("labels").to_pylist() == mapped[:k]["labels"]

        n = args.conversations
        rows = [
            [
                f"datasets.map(num_proc={args.num_proc}) + apply_chat_template",
                f"{hf_s:.1f}",
                f"{n / hf_s:,.0f}",
                f"{n_tokens / hf_s:,.0f}",
                "1.00x",
            ],
        ] + [
            [
                f"tokpack.tokenize_files (threads={args.threads or os.cpu_count()}, "
                f"{'Rust' if renderer == 'auto' else 'Python'} render)",
                f"{seconds[renderer]:.1f}",
                f"{n / seconds[renderer]:,.0f}",
                f"{n_tokens / seconds[renderer]:,.0f}",
                f"{hf_s / seconds[renderer]:.2f}x",
            ]
            for renderer in ("auto", "python")
        ]
        print(
            f"{n:,} conversations ({size_mb:,.0f} MB JSONL), {n_tokens:,} tokens "
            f"({n_tokens / n:,.0f} per conversation), byte-level BPE vocab {vocab:,}, "
            f"{manifest['counts']['trained_share']:.1%} of tokens trained; {os.cpu_count()} cores\n"
        )
        print(table(["route", "seconds", "conversations/s", "tokens/s", "speed-up"], rows))
        print(
            f"\nencoders alone on the rendered text of the first "
            f"{min(args.encoder_sample, n):,} conversations (no reading, template, labels or "
            f"writing; all cores): tokenizers encode_batch {hf_enc:,.0f} tokens/s, tokpack's "
            f"BPE encoder {fast_enc:,.0f} tokens/s ({fast_enc / hf_enc:.1f}x)"
        )
        print(
            "1-minute load average before tokpack / after its Rust-render run / after its "
            "Python-render run / after the baseline "
            f"(other work on the machine skews the ratio): {' / '.join(f'{x:.1f}' for x in loads)}"
        )
        print(f"\nfirst {k:,} rows identical to the baseline (ids and labels): {same}")
        print(f"Rust-render and Python-render outputs identical: {same_renderers}")
        goal = hf_s / tp_s >= 10.0
        print(f"goal >= 10x the baseline (Rust render): {'met' if goal else 'MISSED'}")
        return 0 if same and same_renderers else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
