"""The bytes ``pack`` writes, pinned: packed shards and boundary indexes of varied corpora hashed
against ``golden/pack_shards.json``, generated from the code before the compact spill (issue 24)
so a change of the spill's encoding cannot change a single output byte.

The corpora cover what the spill encodes differently: labels that are -100 or the token, labels
that are neither, a loss mask, no labels, ids below 2**16, below 2**24 and up to 2**31 - 1,
preference pairs in both layouts, KTO with carried columns, and truncated / split samples (reads
from inside a sample).

An intended change of the output format regenerates the file:
``TOKPACK_REGEN_GOLDEN=1 python -m pytest tests/test_pack_golden.py`` (and says so in the commit).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack.synthetic import write_token_shards
from tokpack.tokenize import KTO_SCHEMA, PREFERENCE_SCHEMA

GOLDEN = Path(__file__).parent / "golden" / "pack_shards.json"
IGNORE = -100


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


def _sft(path: Path, n: int, seed: int, high: int, odd: float, longest: int = 300) -> Path:
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


def _loss_mask(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 200, size=700)
    seqs = _lists(rng, lengths, 70_000)
    mask = [rng.integers(0, 2, size=int(n)).tolist() for n in lengths]
    table = pa.table(
        {"tok": pa.array(seqs, pa.list_(pa.int32())), "m": pa.array(mask, pa.list_(pa.int8()))}
    )
    pq.write_table(table, path, row_group_size=128)
    return path


def _pairs(path: Path, seed: int, high: int) -> Path:
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


def _kto(path: Path, seed: int) -> Path:
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


# name -> (corpus builder, pack_files keyword arguments)
CASES = {
    "sft-synthetic": (
        lambda d: write_token_shards(d, 3000, n_files=2, max_length=700, row_group_rows=500),
        dict(max_len=512, overlong="split", rows_per_shard=150, row_group_rows=40),
    ),
    "sft-u16-odd-labels": (
        lambda d: [_sft(d / "a.parquet", 900, 1, 65_536, 0.02)],
        dict(max_len=256, overlong="truncate", strategy="ffd", row_group_rows=16),
    ),
    "sft-u24-odd-labels": (
        lambda d: [_sft(d / "a.parquet", 900, 2, 1 << 24, 0.05)],
        dict(max_len=256, overlong="split", rows_per_shard=100),
    ),
    "sft-i32-odd-labels": (
        lambda d: [_sft(d / "a.parquet", 600, 3, 2**31 - 1, 0.3, longest=100)],
        dict(max_len=128, overlong="drop", compression="snappy"),
    ),
    "sft-shifted-labels": (
        lambda d: [_sft(d / "a.parquet", 400, 12, 50_000, 1.0)],
        dict(max_len=300, overlong="split", row_group_rows=8),
    ),
    "sft-mixed-widths": (
        lambda d: [
            _sft(d / "a.parquet", 500, 4, 1000, 0.0),
            _sft(d / "b.parquet", 300, 5, 2**31 - 1, 0.01),
            _sft(d / "c.parquet", 500, 6, 65_536, 0.0),
        ],
        dict(max_len=300, overlong="split"),
    ),
    "loss-mask": (
        lambda d: [_loss_mask(d / "m.parquet", 7)],
        dict(max_len=200, tokens_column="tok", loss_mask_column="m", strategy="next_fit"),
    ),
    "no-labels": (
        lambda d: write_token_shards(d, 2000, n_files=3, max_length=500, labels=False),
        dict(max_len=512, overlong="split", row_group_rows=32),
    ),
    "labels-ignored": (
        lambda d: [_sft(d / "a.parquet", 500, 8, 100_000, 0.1)],
        dict(max_len=300, overlong="truncate", labels_column=None),
    ),
    "pairs-separate": (
        lambda d: [_pairs(d / "p.parquet", 9, 50_000)],
        dict(max_len=300, pair_layout="separate", overlong="drop"),
    ),
    "pairs-shared-prompt": (
        lambda d: [_pairs(d / "p.parquet", 10, 3_000_000)],
        dict(max_len=200, pair_layout="shared-prompt", overlong="truncate"),
    ),
    "kto-carry": (
        lambda d: [_kto(d / "k.parquet", 11)],
        dict(max_len=256, carry=["prompt_length", "score"], overlong="split"),
    ),
}


def _output_hashes(out: Path) -> dict:
    """sha256 of every shard and boundary index (the manifest holds timings)."""
    files = sorted(out.glob("part-*.parquet")) + sorted(out.rglob("_index-part-*.arrow"))
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _pack_case(name: str, tmp: Path, threads: int) -> dict:
    build, kwargs = CASES[name]
    corpus = tmp / "in"
    corpus.mkdir(exist_ok=True)
    files = build(corpus)
    kwargs = dict(kwargs)
    max_len = kwargs.pop("max_len")
    out = tmp / f"out-{threads}"
    tokpack.pack_files(files, out, max_len, threads=threads, **kwargs)
    return _output_hashes(out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_bytes_match_the_golden_hashes(name, tmp_path):
    got = _pack_case(name, tmp_path, threads=3)
    assert got == _pack_case(name, tmp_path, threads=1)
    if os.environ.get("TOKPACK_REGEN_GOLDEN"):
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[name] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")
    assert got == json.loads(GOLDEN.read_text())[name]
