"""Byte-for-byte regression of ``pack`` on fixed, generated corpora: the sha256 of every shard,
index and dropped file and the manifest's config, figures and shard entries, pinned in
``tests/pack_regression.json`` (generated from main before the PackConfig / PackReport /
format-room refactor landed; the shard and index hashes of the ``spill-*`` corpora are those
pinned before the compact spill, issue 24; every case was regenerated when the shuffled row order
became the default, issue 23). ``TOKPACK_REGEN_REGRESSION=1`` rewrites the file
(only when the bytes are meant to change, with a FORMAT_VERSION bump; say so in the commit)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack.synthetic import write_token_shards
from tokpack.tokenize import KTO_SCHEMA, PREFERENCE_SCHEMA, TOKEN_SCHEMA

PINNED = Path(__file__).with_name("pack_regression.json")
IGNORE = -100


def _sft(n: int, seed: int, longest: int, *, empty_every: int = 0, extra: bool = False) -> pa.Table:
    rng = random.Random(seed)
    ids, labels, source, weight = [], [], [], []
    for i in range(n):
        length = 0 if empty_every and i % empty_every == 0 else rng.randint(1, longest)
        tokens = [rng.randrange(1, 5000) for _ in range(length)]
        prompt = rng.randint(0, length)
        ids.append(tokens)
        labels.append([IGNORE] * prompt + tokens[prompt:])
        source.append(f"src{i % 3}")
        weight.append(rng.random())
    cols: Dict[str, Any] = {"input_ids": ids, "labels": labels}
    table = pa.table(cols, schema=pa.schema([(c, pa.list_(pa.int32())) for c in cols]))
    if extra:
        table = table.append_column("source", pa.array(source))
        table = table.append_column("weight", pa.array(weight, pa.float64()))
        mask = [[int(x != IGNORE) for x in row] for row in labels]
        table = table.append_column("mask", pa.array(mask, pa.list_(pa.int8())))
    return table


def _pairs(n: int, seed: int, longest: int) -> pa.Table:
    rng = random.Random(seed)
    cols: Dict[str, list] = {k: [] for k in PREFERENCE_SCHEMA.names}
    source = []
    for i in range(n):
        p = [rng.randrange(1000) for _ in range(rng.randint(1, longest))]
        c = [rng.randrange(1000) for _ in range(rng.randint(0 if i == 7 else 1, longest))]
        r = [rng.randrange(1000) for _ in range(rng.randint(1, longest))]
        for role, comp in (("chosen", c), ("rejected", r)):
            cols[f"{role}_input_ids"].append(p + comp)
            cols[f"{role}_labels"].append([IGNORE] * len(p) + comp)
        cols["prompt_length"].append(len(p))
        cols["length"].append(2 * len(p) + len(c) + len(r))
        source.append(f"s{i % 4}")
    table = pa.table(cols, schema=PREFERENCE_SCHEMA)
    return table.append_column("source", pa.array(source))


def _kto(n: int, seed: int, longest: int) -> pa.Table:
    sft = _sft(n, seed, longest)
    rng = random.Random(seed + 1)
    schema = pa.schema(
        list(TOKEN_SCHEMA)
        + [("prompt_length", pa.int32()), ("label", pa.bool_()), ("turn", pa.int64())],
        metadata={b"tokpack.kind": b"kto"},
    )
    return pa.table(
        {
            "input_ids": sft.column("input_ids"),
            "labels": sft.column("labels"),
            "length": pa.compute.list_value_length(sft.column("input_ids")).cast(pa.int32()),
            "prompt_length": pa.array([rng.randint(0, 3) for _ in range(n)], pa.int32()),
            "label": [rng.random() < 0.5 for _ in range(n)],
            "turn": pa.array(list(range(n)), pa.int64()),
        },
        schema=schema,
    )


# The corpora of the spill's encodings (issue 24): labels that are -100 or the token, labels that
# are neither, a loss mask, no labels, ids below 2**16, below 2**24 and up to 2**31 - 1, pairs in
# both layouts, KTO with carried columns, truncated / split samples (reads inside a sample).
def _lists(rng: np.random.Generator, lengths, high: int, low: int = 0) -> list:
    return [rng.integers(low, high, size=int(n)).tolist() for n in lengths]


def _labels(rng: np.random.Generator, seqs: list, odd: float) -> list:
    """Per token: -100 (a prompt prefix), the token, or (with probability ``odd``) any other
    valid label (0..=2**31 - 1): the extremes, the u16 edge, or the token plus one."""
    specials = [0, 1, 65_535, 65_536, 2**31 - 1]
    out = []
    for seq in seqs:
        prompt = int(len(seq) * rng.uniform(0, 0.6))
        lab = [IGNORE] * prompt + list(seq[prompt:])
        for i in range(len(lab)):
            if rng.random() < odd:
                lab[i] = int(rng.choice(specials)) if rng.random() < 0.5 else seq[i] + 1
        out.append(lab)
    return out


def _wide_sft(path: Path, n: int, seed: int, high: int, odd: float, longest: int = 300) -> Path:
    rng = np.random.default_rng(seed)
    seqs = _lists(rng, rng.integers(0, longest, size=n), high)
    labels = _labels(rng, seqs, odd)
    if odd == 1:  # pre-shifted labels: each token's label is the next token
        labels = [s[1:] + [IGNORE] if s else [] for s in seqs]
    table = pa.table(
        {
            "input_ids": pa.array(seqs, pa.list_(pa.int64())),
            "labels": pa.array(labels, pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, path, row_group_size=97)
    return path


def _wide_mask(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 200, size=700)
    seqs = _lists(rng, lengths, 70_000)
    mask = [rng.integers(0, 2, size=int(n)).tolist() for n in lengths]
    table = pa.table(
        {"tok": pa.array(seqs, pa.list_(pa.int32())), "m": pa.array(mask, pa.list_(pa.int8()))}
    )
    pq.write_table(table, path, row_group_size=128)
    return path


def _wide_pairs(path: Path, seed: int, high: int) -> Path:
    rng = np.random.default_rng(seed)
    n = 400
    prompts = _lists(rng, rng.integers(1, 60, size=n), high)
    cols = {}
    for role in ("chosen", "rejected"):
        completions = _lists(rng, rng.integers(1, 80, size=n), high)
        cols[f"{role}_input_ids"] = [p + c for p, c in zip(prompts, completions)]
        cols[f"{role}_labels"] = [[IGNORE] * len(p) + c for p, c in zip(prompts, completions)]
    cols["prompt_length"] = [len(p) for p in prompts]
    both = zip(cols["chosen_input_ids"], cols["rejected_input_ids"])
    cols["length"] = [len(c) + len(r) for c, r in both]
    pq.write_table(pa.table(cols, schema=PREFERENCE_SCHEMA), path, row_group_size=50)
    return path


def _wide_kto(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    n = 600
    seqs = _lists(rng, rng.integers(1, 150, size=n), 200_000)
    table = pa.table(
        {
            "input_ids": seqs,
            "labels": _labels(rng, seqs, 0.01),
            "length": [len(s) for s in seqs],
            "prompt_length": rng.integers(0, 10, size=n).tolist(),
            "label": (rng.random(n) < 0.5).tolist(),
        },
        schema=KTO_SCHEMA,
    )
    table = table.append_column("score", pa.array(rng.standard_normal(n), pa.float32()))
    pq.write_table(table, path, row_group_size=64)
    return path


def _write(table: pa.Table, path: Path, row_group_size: int) -> Path:
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def _jsonl_corpus(d: Path) -> list:
    from ._tokenizer_factory import build_tokenizer, sentence, write_jsonl

    rng = random.Random(9)
    records = [
        {
            "messages": [
                {"role": "user", "content": sentence(rng, rng.randint(1, 12))},
                {"role": "assistant", "content": sentence(rng, rng.randint(0, 20))},
            ]
        }
        for _ in range(60)
    ]
    build_tokenizer(d / "tok")
    return [write_jsonl(d / "chat.jsonl", records)]


def _sft_corpus(d: Path) -> list:
    return [
        _write(_sft(150, 1, 60, empty_every=37, extra=True), d / "a.parquet", 40),
        _write(_sft(90, 2, 90, extra=True), d / "b.parquet", 64),
    ]


# name -> (corpus builder, pack_files keywords)
CASES: Dict[str, tuple] = {
    "sft-bfd-error-zstd": (_sft_corpus, dict(max_len=96, rows_per_shard=16, row_group_rows=4)),
    # The planner's order: the bytes every case had before the shuffled row order (checked when
    # it landed: row_order="plan" reproduced the previous pin of every case).
    "sft-bfd-plan-order": (
        _sft_corpus,
        dict(max_len=96, rows_per_shard=16, row_group_rows=4, row_order="plan"),
    ),
    "sft-ffd-truncate-snappy": (
        _sft_corpus,
        dict(max_len=48, strategy="ffd", overlong="truncate", compression="snappy"),
    ),
    "sft-nextfit-drop-none": (
        _sft_corpus,
        dict(max_len=50, strategy="next_fit", overlong="drop", compression="none"),
    ),
    "sft-random-split-lz4-carry": (
        _sft_corpus,
        dict(
            max_len=40,
            strategy="random",
            overlong="split",
            seed=3,
            compression="lz4",
            rows_per_shard=50,
            carry=["source", "weight"],
        ),
    ),
    "sft-padding-lossmask-zstd9": (
        _sft_corpus,
        dict(
            max_len=128,
            strategy="padding",
            loss_mask_column="mask",
            compression="zstd:9",
            row_group_rows=32,
        ),
    ),
    "sft-nolabels": (
        _sft_corpus,
        dict(max_len=100, labels_column=None, rows_per_shard=40),
    ),
    "preference-separate-drop-carry": (
        lambda d: [_write(_pairs(80, 5, 30), d / "p.parquet", 16)],
        dict(max_len=100, overlong="drop", pair_layout="separate", carry=["source"]),
    ),
    "preference-shared-truncate": (
        lambda d: [_write(_pairs(80, 6, 40), d / "p.parquet", 16)],
        dict(max_len=90, overlong="truncate", pair_layout="shared-prompt", rows_per_shard=8),
    ),
    "one-step-jsonl-drop": (
        _jsonl_corpus,
        dict(max_len=40, overlong="drop", tokenizer="tok", rows_per_shard=10),
    ),
    "kto-carry": (
        lambda d: [_write(_kto(120, 7, 50), d / "k.parquet", 32)],
        dict(max_len=64, overlong="split", carry=["turn"], rows_per_shard=20),
    ),
    "spill-sft-synthetic": (
        lambda d: write_token_shards(d, 3000, n_files=2, max_length=700, row_group_rows=500),
        dict(max_len=512, overlong="split", rows_per_shard=150, row_group_rows=40),
    ),
    "spill-sft-u16-odd-labels": (
        lambda d: [_wide_sft(d / "a.parquet", 900, 1, 65_536, 0.02)],
        dict(max_len=256, overlong="truncate", strategy="ffd", row_group_rows=16),
    ),
    "spill-sft-u24-odd-labels": (
        lambda d: [_wide_sft(d / "a.parquet", 900, 2, 1 << 24, 0.05)],
        dict(max_len=256, overlong="split", rows_per_shard=100),
    ),
    "spill-sft-i32-odd-labels": (
        lambda d: [_wide_sft(d / "a.parquet", 600, 3, 2**31 - 1, 0.3, longest=100)],
        dict(max_len=128, overlong="drop", compression="snappy"),
    ),
    "spill-sft-shifted-labels": (
        lambda d: [_wide_sft(d / "a.parquet", 400, 12, 50_000, 1.0)],
        dict(max_len=300, overlong="split", row_group_rows=8),
    ),
    "spill-sft-mixed-widths": (
        lambda d: [
            _wide_sft(d / "a.parquet", 500, 4, 1000, 0.0),
            _wide_sft(d / "b.parquet", 300, 5, 2**31 - 1, 0.01),
            _wide_sft(d / "c.parquet", 500, 6, 65_536, 0.0),
        ],
        dict(max_len=300, overlong="split"),
    ),
    "spill-loss-mask": (
        lambda d: [_wide_mask(d / "m.parquet", 7)],
        dict(max_len=200, tokens_column="tok", loss_mask_column="m", strategy="next_fit"),
    ),
    "spill-no-labels": (
        lambda d: write_token_shards(d, 2000, n_files=3, max_length=500, labels=False),
        dict(max_len=512, overlong="split", row_group_rows=32),
    ),
    "spill-labels-ignored": (
        lambda d: [_wide_sft(d / "a.parquet", 500, 8, 100_000, 0.1)],
        dict(max_len=300, overlong="truncate", labels_column=None),
    ),
    "spill-pairs-separate": (
        lambda d: [_wide_pairs(d / "p.parquet", 9, 50_000)],
        dict(max_len=300, pair_layout="separate", overlong="drop"),
    ),
    "spill-pairs-shared-prompt": (
        lambda d: [_wide_pairs(d / "p.parquet", 10, 3_000_000)],
        dict(max_len=200, pair_layout="shared-prompt", overlong="truncate"),
    ),
    "spill-kto-carry": (
        lambda d: [_wide_kto(d / "k.parquet", 11)],
        dict(max_len=256, carry=["prompt_length", "score"], overlong="split"),
    ),
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _outcome(out: Path, manifest: Dict[str, Any]) -> Dict[str, Any]:
    """What is pinned: file hashes, and the manifest's config, figures and shard entries."""
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "_manifest.json")
    figures = {k: v for k, v in manifest["figures"].items() if k != "wall_time_s"}
    keep = ("format", "format_version", "config", "has_labels", "shards", "dropped_file")
    pinned = {k: manifest[k] for k in keep}
    pinned["sample_kind"] = manifest.get("sample_kind")
    pinned["inputs_rows"] = [i.get("rows") for i in manifest["inputs"]]
    return {
        "files": {str(p.relative_to(out)): _sha(p) for p in files},
        "manifest": {**pinned, "figures": figures},
    }


def _run(case: str, tmp: Path) -> Dict[str, Any]:
    build, kw = CASES[case]
    corpus = tmp / "corpus"
    corpus.mkdir()
    paths = [p.name for p in build(corpus)]
    kw = dict(kw)
    max_len = kw.pop("max_len")
    # Relative paths: the dropped list names the files as given.
    cwd = os.getcwd()
    os.chdir(corpus)
    try:
        manifest = tokpack.pack_files(paths, tmp / "out", max_len, threads=2, **kw)
    finally:
        os.chdir(cwd)
    return _outcome(tmp / "out", manifest)


def _pack_tokens_outcome() -> Dict[str, Any]:
    table = _sft(60, 11, 30)
    packed, plan = tokpack.pack_tokens(table, 64, overlong="drop", return_plan=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, packed.schema) as writer:
        writer.write_table(packed)
    return {
        "columns": packed.column_names,
        "ipc_sha256": hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest(),
        "metadata": json.loads(packed.schema.metadata[b"tokpack"]),
    }


def _all(tmp_factory: Callable[[str], Path]) -> Dict[str, Any]:
    got = {case: _run(case, tmp_factory(case)) for case in CASES}
    got["pack_tokens"] = _pack_tokens_outcome()
    return got


def test_outputs_are_byte_identical_to_the_pinned_ones(tmp_path_factory):
    got = _all(lambda name: tmp_path_factory.mktemp(name))
    got = json.loads(json.dumps(got))  # tuples to lists, as the pinned file holds them
    if os.environ.get("TOKPACK_REGEN_REGRESSION"):
        PINNED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(PINNED.read_text())
    assert sorted(got) == sorted(pinned)
    for case in pinned:
        assert got[case] == pinned[case], case


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_count_does_not_change_the_bytes(tmp_path, threads):
    build, kw = CASES["sft-random-split-lz4-carry"]
    paths = build(tmp_path)
    kw = dict(kw)
    max_len = kw.pop("max_len")
    a = tokpack.pack_files(paths, tmp_path / "a", max_len, threads=threads, **kw)
    b = tokpack.pack_files(paths, tmp_path / "b", max_len, threads=2, **kw)
    assert [s["checksum"] for s in a["shards"]] == [s["checksum"] for s in b["shards"]]
