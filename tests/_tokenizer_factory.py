"""A tiny byte-level BPE tokenizer with ChatML special tokens, trained on text the tests write,
saved as tokenizer.json + tokenizer_config.json (no network)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Optional

from tokpack.synthetic import train_chat_tokenizer

WORDS = (
    "the a an of to and in is it you that he was for on are with as I his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up use "
    "your how said each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did number "
    "sound no most people my over know water than call first who may down side been now find "
    "héllo naïve café 東京 数据 emoji 🙂 code def return print(x) {json: 1} 42 3.14"
).split()

CHATML_GEN = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen-style: a default system prompt, no generation markers.
CHATML_PLAIN = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def build_tokenizer(
    directory: Path,
    chat_template: Optional[str] = CHATML_GEN,
    vocab_size: int = 600,
    eos: str = "<|im_end|>",
    split: str = "gpt2",
) -> Path:
    """Trains the BPE and writes ``directory/tokenizer.json`` (+ config); returns directory."""
    rng = random.Random(0)
    corpus = [sentence(rng, rng.randint(3, 30)) for _ in range(2000)]
    return train_chat_tokenizer(
        corpus, directory, vocab_size=vocab_size, chat_template=chat_template, eos=eos, split=split
    )


def hf_tokenizer(directory: Path, eos: str = "<|im_end|>"):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), eos_token=eos, pad_token="<|endoftext|>"
    )


def conversations(n: int, seed: int = 1):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs = []
        if i % 2 == 0:
            msgs.append({"role": "system", "content": sentence(rng, rng.randint(2, 8))})
        for _ in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": sentence(rng, rng.randint(1, 12))})
            msgs.append({"role": "assistant", "content": sentence(rng, rng.randint(1, 20))})
        out.append(msgs)
    return out


def write_jsonl(path: Path, records) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")
    return path
