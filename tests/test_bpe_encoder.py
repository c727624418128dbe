"""tokpack's byte-level BPE encoder (``tokpack-core``'s ``bpe``) against ``tokenizers``, the
reference: the same ids on any text, the same labels as the offsets-based rule, the same output
for any thread count, and a fallback to ``tokenizers`` for configurations it does not handle."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokpack
from tokpack import _tokpack
from tokpack.tokenize import load_tokenizer
from tokpack.tokenize.masks import labels_from_spans

from ._tokenizer_factory import build_tokenizer, conversations, write_jsonl

tokenizers = pytest.importorskip("tokenizers")

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]

TRICKY = [
    "",
    "It'S THE'RE 'Ll 'VE's 'x 'hello ''s",
    "digits 1 12 123 1234 12345 ١٢٣٤ x1y22z333",
    "(hello) [world] ...word !!!\n\n?? x\r\n\r\ny ;\n\tz",
    "  \n \n  x \t\ty \n\n\n",
    "\thello\n\nworld\r\nagain   \n",
    "Hello world",
    "I'm here, they're there; we've, I'll, he'd, it's 'quoted' 'S 'RE",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\n\n\nend\n",
    "a  b   c    d \n e \t\t f",
    "   \n  x",
    "numbers 1234567 3.14 (42) ½ ² ٣٤ ５",
    "héllo naïve café Ünïcödé",
    "東京 数据 中文字符 日本語テキスト",
    "emoji 🙂🙃 👨‍👩‍👧 flags 🇫🇷",
    "combining e\u0301 a\u0308 and ZWJ\u200d zero\u200bwidth",
    "nbsp\u00a0here, ideographic\u3000space, em\u2003space, nel\u0085x",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>",
    "<|im_start|><|im_end|><|im_start",
    "x<|im_end|>y <|endoftext|> z",
    "!!!???... --- ((( ))) {json: 1} print(x)",
    "\x00\x01\x1c\x1d\x1e\x1f control",
]

ALPHABET = st.sampled_from(
    list("abcXYZ 019'\".,!?()-_\t\n\r\x0b\x0c")
    + ["\u00a0", "\u0085", "\u2003", "\u3000", "\u200b", "\u2028", "é", "ß", "東", "ж", "٣", "½"]
    + ["²", "🙂", "\u0301", "\U0001f468\u200d\U0001f469"]
    + SPECIALS
    + ["<|im_", "'s", "'ll", "  ", "\n\n"]
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("bpe") / "tok")


def _with_nfc(directory: Path) -> Path:
    data = json.loads((directory / "tokenizer.json").read_text())
    data["normalizer"] = {"type": "NFC"}
    (directory / "tokenizer.json").write_text(json.dumps(data))
    return directory


@pytest.fixture(scope="module", params=["gpt2", "llama3", "qwen2", "qwen2-nfc"])
def pair(request, tmp_path_factory):
    """The encoder and the reference for each configuration the encoder reproduces (Qwen2
    itself normalizes to NFC)."""
    split = request.param.split("-")[0]
    directory = build_tokenizer(tmp_path_factory.mktemp("bpe") / request.param, split=split)
    if request.param.endswith("-nfc"):
        _with_nfc(directory)
    ref = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    fast, why = _tokpack.BpeEncoder.load((directory / "tokenizer.json").read_text())
    assert fast is not None, why
    return fast, ref


def _variant(tok_dir: Path, tmp_path: Path, edit) -> Path:
    """A copy of the tokenizer with its JSON edited by ``edit``."""
    data = json.loads((tok_dir / "tokenizer.json").read_text())
    edit(data)
    out = tmp_path / "variant"
    out.mkdir(exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(data))
    (out / "tokenizer_config.json").write_text((tok_dir / "tokenizer_config.json").read_text())
    return out


def _check_same_ids(fast, ref, text):
    mine = fast.encode(text)
    if mine is None:  # left to tokenizers: only text an NFC tokenizer would change
        assert ref.normalizer is not None and not unicodedata.is_normalized("NFC", text)
    else:
        assert mine == ref.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("text", TRICKY)
def test_same_ids_as_tokenizers_on_tricky_text(pair, text):
    _check_same_ids(*pair, text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ALPHABET, max_size=40).map("".join))
def test_same_ids_as_tokenizers_on_generated_text(pair, text):
    _check_same_ids(*pair, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(st.characters(exclude_categories=("Cs", "Cn", "Co")), max_size=60))
def test_same_ids_as_tokenizers_on_any_unicode(pair, text):
    _check_same_ids(*pair, text)


def _span_arrays(spans_per_text):
    counts = [0] + [len(s) for s in spans_per_text]
    starts = [a for spans in spans_per_text for a, _ in spans]
    ends = [b for spans in spans_per_text for _, b in spans]
    return {
        "span_offsets": np.cumsum(counts).astype(np.int64),
        "span_starts": np.array(starts, dtype=np.int64),
        "span_ends": np.array(ends, dtype=np.int64),
    }


@st.composite
def texts_with_spans(draw):
    texts = draw(st.lists(st.lists(ALPHABET, min_size=1, max_size=30).map("".join), max_size=8))
    all_spans = []
    for text in texts:
        cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
        all_spans.append([(a, b) for a, b in zip(cuts[::2], cuts[1::2])])
    return texts, all_spans


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts_with_spans())
def test_labels_follow_the_offsets_rule(pair, case):
    fast, ref = pair
    texts, spans = case
    ids, labels, offsets, fallback = fast.encode_batch(
        texts=texts, **_span_arrays(spans), threads=1
    )
    assert offsets[0] == 0 and len(offsets) == len(texts) + 1
    for i, text in enumerate(texts):
        enc = ref.encode(text, add_special_tokens=False)
        mine = slice(offsets[i], offsets[i + 1])
        if i in fallback:
            assert offsets[i] == offsets[i + 1] and fast.encode(text) is None
            continue
        assert ids[mine].tolist() == enc.ids
        expected = labels_from_spans(enc, np.array(enc.ids, dtype=np.int32), spans[i])
        assert labels[mine].tolist() == expected.tolist()


def test_batches_are_identical_for_any_thread_count(pair):
    fast, _ = pair
    texts = [f"conversation {i}: " + "word " * (i % 50) + "<|im_end|>" for i in range(3000)]
    spans = [[(0, len(t) // 2)] for t in texts]
    arrays = _span_arrays(spans)
    texts[7] = "cafe\u0301"  # not NFC: in the fallback list for an NFC tokenizer
    one = fast.encode_batch(texts=texts, **arrays, threads=1)
    two = fast.encode_batch(texts=texts, **arrays, threads=2)
    for a, b in zip(one, two):
        assert np.array_equal(a, b)


def test_bad_span_arrays_are_refused(pair):
    fast, _ = pair
    with pytest.raises(ValueError):
        fast.encode_batch(texts=["a", "b"], **_span_arrays([[(0, 1)]]), threads=1)


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda d: d.update(normalizer={"type": "Lowercase"}), "normalizer"),
        (lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer"),
        (
            lambda d: d.update(
                pre_tokenizer={
                    "type": "Sequence",
                    "pretokenizers": [
                        {
                            "type": "Split",
                            "pattern": {"Regex": "\\s+"},
                            "behavior": "Isolated",
                            "invert": False,
                        },
                        {
                            "type": "ByteLevel",
                            "add_prefix_space": False,
                            "trim_offsets": False,
                            "use_regex": False,
                        },
                    ],
                }
            ),
            "Split pattern",
        ),
        (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
        (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer"),
        (lambda d: d["post_processor"].update(trim_offsets=True), "trim_offsets"),
        (lambda d: d["model"].update(dropout=0.1), "dropout"),
        (lambda d: d["added_tokens"][1].update(lstrip=True), "lstrip"),
    ],
)
def test_unsupported_tokenizers_fall_back_to_tokenizers(tok_dir, tmp_path, edit, reason):
    loaded = load_tokenizer(_variant(tok_dir, tmp_path, edit))
    assert loaded.fast is None
    assert reason in loaded.fast_unsupported


def test_ignore_merges_and_normalized_added_tokens(tok_dir, tmp_path):
    # ignore_merges: a pre-token found whole in the vocabulary is one token (Llama-3 style);
    # a non-special added token (normalized=True) is matched after the special ones.
    def edit(data):
        data["model"]["ignore_merges"] = True
        data["added_tokens"].append(
            {
                "id": max(data["model"]["vocab"].values()) + 1,
                "content": "<tool>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": True,
                "special": False,
            }
        )

    path = _variant(tok_dir, tmp_path, edit) / "tokenizer.json"
    ref = tokenizers.Tokenizer.from_file(str(path))
    fast, why = _tokpack.BpeEncoder.load(path.read_text())
    assert fast is not None, why
    for text in TRICKY + ["call <tool> now<tool><|im_end|>", "the water is hot"]:
        assert fast.encode(text) == ref.encode(text, add_special_tokens=False).ids


def test_tokenize_files_same_output_with_either_encoder(tmp_path, tok_dir):
    corpus = write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": m} for m in conversations(300)] + [{"text": "plain text sample"}],
    )
    fast = tokpack.tokenize_files(corpus, tmp_path / "fast", tok_dir, threads=1)
    slow = tokpack.tokenize_files(corpus, tmp_path / "slow", tok_dir, encoder="tokenizers")
    assert fast["encoder"] == {"name": "tokpack-bpe"}
    assert slow["encoder"] == {"name": "tokenizers", "reason": "requested"}
    assert fast["counts"] == slow["counts"]
    a = (tmp_path / "fast" / "part-00000.parquet").read_bytes()
    b = (tmp_path / "slow" / "part-00000.parquet").read_bytes()
    assert a == b


def test_post_processor_tokens_still_added_to_plain_text(tok_dir, tmp_path):
    # A BOS template: chat text is encoded without it (as apply_chat_template), plain text
    # with it, so plain text goes through tokenizers while chat stays on the fast encoder.
    def edit(data):
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {
                "<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}
            },
        }

    variant = _variant(tok_dir, tmp_path, edit)
    assert load_tokenizer(variant).fast.post_processor_adds_tokens
    records = [{"messages": m} for m in conversations(20)] + [{"text": "plain words here"}] * 3
    corpus = write_jsonl(tmp_path / "mixed.jsonl", records)
    fast = tokpack.tokenize_files(corpus, tmp_path / "fast", variant, threads=1)
    slow = tokpack.tokenize_files(corpus, tmp_path / "slow", variant, encoder="tokenizers")
    a = (tmp_path / "fast" / "part-00000.parquet").read_bytes()
    assert a == (tmp_path / "slow" / "part-00000.parquet").read_bytes()
    assert fast["counts"] == slow["counts"]


def test_nfc_tokenizer_mixes_both_encoders_exactly(tmp_path):
    # Qwen2-like: Llama-3 split with one digit, NFC normalizer. Text not in NFC (decomposed
    # accents) goes to tokenizers, the rest to tokpack's encoder; the shards equal an
    # all-tokenizers run.
    directory = _with_nfc(build_tokenizer(tmp_path / "qwen", split="qwen2"))
    assert load_tokenizer(directory).fast is not None
    records = [{"messages": m} for m in conversations(200)]
    for i in range(0, 200, 7):
        records[i]["messages"][-1]["content"] += " cafe\u0301 re\u0301sume\u0301 12345"
    corpus = write_jsonl(tmp_path / "nfc.jsonl", records)
    fast = tokpack.tokenize_files(corpus, tmp_path / "fast", directory, threads=1)
    slow = tokpack.tokenize_files(corpus, tmp_path / "slow", directory, encoder="tokenizers")
    assert fast["encoder"]["name"] == "tokpack-bpe"
    assert fast["counts"] == slow["counts"]
    a = (tmp_path / "fast" / "part-00000.parquet").read_bytes()
    assert a == (tmp_path / "slow" / "part-00000.parquet").read_bytes()
