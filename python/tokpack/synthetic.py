"""Synthetic corpora with SFT-like length distributions, and a small trained chat tokenizer, for
the demo, tests and benchmarks (nothing here reaches for a model hub)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from ._contract import IGNORE_INDEX, SPLIT_REGEXES  # the Split regexes the encoder recognizes

__all__ = ["sft_lengths", "write_token_shards", "train_chat_tokenizer", "CHAT_SPECIAL_TOKENS"]

CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# (weight, median, sigma) of a lognormal mixture: mostly short chat turns, a band of longer
# answers and a thin tail of long documents, clipped to [1, max_length]. The overall median is
# close to 250 tokens and the tail reaches 8k, like public SFT mixtures.
_MIXTURE = ((0.62, 160.0, 0.75), (0.28, 560.0, 0.70), (0.10, 2300.0, 0.65))


def sft_lengths(n: int, seed: int = 0, max_length: int = 8192) -> np.ndarray:
    """``n`` sample lengths (int32) drawn from an SFT-like lognormal mixture."""
    rng = np.random.default_rng(seed)
    weights, medians, sigmas = map(np.array, zip(*_MIXTURE))
    component = rng.choice(len(_MIXTURE), size=n, p=weights / weights.sum())
    lengths = np.exp(np.log(medians[component]) + sigmas[component] * rng.standard_normal(n))
    return np.clip(np.rint(lengths), 1, max_length).astype(np.int32)


def write_token_shards(
    out_dir,
    n: int,
    *,
    n_files: int = 4,
    seed: int = 0,
    max_length: int = 8192,
    vocab_size: int = 32_000,
    labels: bool = True,
    row_group_rows: int = 8192,
    compression: str = "zstd",
):
    """Writes an SFT-like tokenized corpus of ``n`` samples as Parquet token shards
    ``shard-NNNNN.parquet`` with ``input_ids`` (list<int32>) and, with ``labels``, a ``labels``
    column where a prompt prefix of each sample is -100. Returns the list of files.

    Tokens are random ids, generated and written one row group at a time, so a corpus larger
    than memory can be made."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lengths = sft_lengths(n, seed=seed, max_length=max_length)
    rng = np.random.default_rng(seed + 1)
    bounds = np.linspace(0, n, n_files + 1).astype(np.int64)
    files = []
    for f in range(n_files):
        path = out_dir / f"shard-{f:05d}.parquet"
        schema = pa.schema(
            [("input_ids", pa.list_(pa.int32()))] + ([("labels", pa.list_(pa.int32()))] * labels)
        )
        with pq.ParquetWriter(path, schema, compression=compression) as writer:
            for a in range(bounds[f], bounds[f + 1], row_group_rows):
                b = min(a + row_group_rows, bounds[f + 1])
                lens = lengths[a:b].astype(np.int64)
                offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
                tokens = rng.integers(0, vocab_size, size=int(offsets[-1]), dtype=np.int32)
                cols = {"input_ids": pa.ListArray.from_arrays(offsets, tokens)}
                if labels:
                    # The first ~30% of each sample is the prompt: not trained on.
                    prompt = (lens * 0.3).astype(np.int64)
                    pos = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lens)
                    untrained = pos < np.repeat(prompt, lens)
                    lab = np.where(untrained, IGNORE_INDEX, tokens).astype(np.int32)
                    cols["labels"] = pa.ListArray.from_arrays(offsets, lab)
                writer.write_table(pa.table(cols, schema=schema), row_group_size=row_group_rows)
        files.append(path)
    return files


def train_chat_tokenizer(
    texts: Iterable[str],
    directory: Path,
    *,
    vocab_size: int,
    chat_template: Optional[str],
    eos: str = "<|im_end|>",
    split: str = "gpt2",
) -> Path:
    """Trains a byte-level BPE on ``texts`` with the ChatML special tokens and writes
    ``directory/tokenizer.json`` and ``tokenizer_config.json`` (with ``chat_template`` when given);
    returns ``directory``. ``split`` is the pre-tokenizer: ``"gpt2"`` (ByteLevel with GPT-2's
    regex), ``"llama3"`` or ``"qwen2"`` (their ``Split`` regex, then ByteLevel, and merges
    ignored for whole words as in Llama 3). Needs the ``tokenizers`` package."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if split == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif split in SPLIT_REGEXES:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(SPLIT_REGEXES[split]), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise ValueError(f"unknown split {split!r}")
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHAT_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"eos_token": eos, "bos_token": None, "pad_token": "<|endoftext|>"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory
