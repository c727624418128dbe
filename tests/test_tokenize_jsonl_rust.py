"""JSONL chat records parsed, rendered and encoded in Rust (``ChatRenderer.tokenize_jsonl``)
give exactly what the Python path gives: the same samples, counts and rejected records, for
any thread count, with the records Rust leaves (bad JSON, missing fields, wrong types, floats,
...) falling back to the Python path in the same chunk."""

from __future__ import annotations

import gzip
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack.errors import InvalidRecordError

from ._tokenizer_factory import CHATML_PLAIN, build_tokenizer, sentence

pytest.importorskip("jinja2")

RUST = {"name": "rust", "records": "rust"}


@pytest.fixture(scope="module", params=["generation", "plain"])
def tok(request, tmp_path_factory):
    """ChatML with generation markers (built in), or without (assistant contents located)."""
    template = None if request.param == "generation" else CHATML_PLAIN
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "base", template)


def _text(rng: random.Random) -> str:
    """Words with what JSON escapes and non-ASCII text now and then."""
    base = sentence(rng, rng.randint(1, 12))
    extra = rng.choice(["", "", "", ' "q" \\ /', "\n\ttab", "Zürich 東京 🙂", "e\u0301", "\x7f"])
    return base + extra


def _chat(rng: random.Random) -> dict:
    messages = []
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": _text(rng)})
        messages.append({"role": "assistant", "content": rng.choice([_text(rng), ""])})
    if rng.random() < 0.2:
        messages.append({"role": "user", "content": _text(rng)})
    record = {"messages": messages}
    if rng.random() < 0.4:
        record["system"] = rng.choice([_text(rng), "", None])
    if rng.random() < 0.1:
        messages[0]["name"] = None  # dropped before rendering
    return record


# Lines the Rust path leaves to Python: rejected there, or rendered there.
_ODD = [
    "{not json",
    "[1, 2]",
    '"a string"',
    "{}",
    '{"messages": []}',
    '{"messages": "hello"}',
    '{"messages": [1]}',
    '{"messages": [{"role": "bot", "content": "x"}]}',
    '{"messages": [{"content": "x"}]}',
    '{"messages": [{"role": "user", "content": null}]}',
    '{"messages": [{"role": "user", "content": ["x"]}]}',
    '{"messages": [{"role": "user", "content": "x"}], "system": 3}',
    '{"messages": [{"role": "user", "content": "x", "score": 1.5}]}',
    '{"messages": [{"role": "user", "content": "x", "n": 123456789012345678901234}]}',
    '{"messages": [{"role": "user", "content": "x"}], '  # a duplicated key: the last one counts
    '"messages": [{"role": "user", "content": "y"}]}',
    '{"messages": [{"role": "user", "content": "NaN"}], "x": NaN}',
    '{"messages": [{"role": "user", "content": "private \\ue000 use"}]}',
    '{"text": "plain text record"}',
    '{"instruction": "Do it", "output": "Done"}',
    '{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}',
    '{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"x": 1}]}]}',
    '{"chosen": "a", "rejected": "b", "prompt": "p"}',
    "   ",
]


def _write(path, rng: random.Random, n: int, odd: bool = True):
    with open(path, "wb") as f:
        for _ in range(n):
            if odd and rng.random() < 0.25:
                f.write(rng.choice(_ODD).encode() + b"\n")
            elif odd and rng.random() < 0.02:
                f.write(b'{"messages": "\xff\xfe"}\n')  # not UTF-8
            else:
                f.write(json.dumps(_chat(rng), ensure_ascii=rng.random() < 0.5).encode() + b"\n")
    return path


def _run(data, tok, **options):
    stream = tokpack.tokenize_to_batches(data, tok, skip_invalid=True, batch_size=37, **options)
    table = pa.Table.from_batches(list(stream), schema=tokpack.tokenize.TOKEN_SCHEMA)
    return table, stream


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"format": "messages"},
        {"train_on": "last"},
        {"train_on": "all"},
        {"add_eos": True},
        {"max_len": 48, "overlong": "split"},
        {"max_len": 48, "overlong": "truncate"},
        {"max_len": 48, "overlong": "drop"},
    ],
)
def test_rust_records_equal_the_python_path(tmp_path, tok, seed, options):
    """Mixed chunks (valid chats, malformed and odd records): the Rust path's samples, counts
    and rejections equal the Python renderer's path, for 1, 2 and 3 threads."""
    data = _write(tmp_path / "chat.jsonl", random.Random(seed), 300)
    want, slow = _run(data, tok, renderer="python", threads=1, **options)
    assert slow.renderer_info["name"] == "python"
    assert want.num_rows > 10 and slow.stats.rejected > 10
    for threads in (1, 2, 3):
        got, fast = _run(data, tok, threads=threads, **options)
        assert fast.renderer_info == RUST
        assert got.equals(want)
        assert fast.stats == slow.stats
        assert fast.rejected == slow.rejected


@pytest.mark.parametrize("gz", [False, True])
def test_a_leading_bom_is_no_part_of_the_first_record(tmp_path, tok, gz):
    """Files from Windows tools start with a UTF-8 BOM: the first record is read as if it had
    none, by the Rust and the Python records paths alike (issue 20, item 21: it was rejected
    as invalid JSON)."""
    rng = random.Random(3)
    lines = [json.dumps(_chat(rng)).encode() for _ in range(20)]
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(b"\n".join(lines) + b"\n")
    data = tmp_path / ("bom.jsonl.gz" if gz else "bom.jsonl")
    body = b"\xef\xbb\xbf" + plain.read_bytes()
    data.write_bytes(gzip.compress(body, mtime=0) if gz else body)
    want, _ = _run(plain, tok, renderer="python", threads=1)
    for options in ({"renderer": "python", "threads": 1}, {"threads": 2}):
        got, stream = _run(data, tok, **options)
        assert stream.stats.rejected == 0 and stream.rejected == []
        assert got.equals(want)
    assert stream.renderer_info == RUST


def test_first_invalid_record_raises_the_same_error(tmp_path, tok):
    """Without skip_invalid the first bad record, in input order, stops the run with the
    Python path's message."""
    rng = random.Random(5)
    records = [json.dumps(_chat(rng)) for _ in range(50)]
    records[41] = '{"messages": [{"role": "bot", "content": "x"}]}'
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(records) + "\n", encoding="utf-8")
    errors = []
    for renderer in ("auto", "python"):
        stream = tokpack.tokenize_to_batches(data, tok, renderer=renderer, batch_size=8)
        with pytest.raises(InvalidRecordError) as exc:
            list(stream)
        errors.append(str(exc.value))
    assert errors[0] == errors[1] and ":42:" in errors[0]


def test_parquet_and_the_python_renderer_keep_the_python_records_path(tmp_path, tok):
    rng = random.Random(2)
    rows = [_chat(rng) for _ in range(20)]
    for row in rows:
        row.pop("system", None)
    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    stream = tokpack.tokenize_to_batches(path, tok)
    list(stream)
    assert stream.renderer_info == {"name": "rust"}
    jsonl = _write(tmp_path / "chat.jsonl", rng, 20, odd=False)
    both = tokpack.tokenize_to_batches([jsonl, path], tok)
    assert both.renderer_info == {"name": "rust"}
    manifest = tokpack.tokenize_files(jsonl, tmp_path / "out", tok)
    assert manifest["renderer"] == RUST
