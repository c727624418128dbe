"""One step from raw data: ``tokpack pack --tokenizer`` tokenizes chat data and packs it in the
same run, with the same result as tokenize-then-pack and no token shards left behind."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack._outdir import MANIFEST_NAME
from tokpack.cli import main
from tokpack.tokenize.writer import REJECTED_NAME

from ._tokenizer_factory import CHATML_GEN, build_tokenizer, conversations, write_jsonl

pytest.importorskip("tokenizers")

MAX_LEN = 512


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "gen", CHATML_GEN)


@pytest.fixture()
def corpus(tmp_path):
    convs = conversations(200, seed=5)
    (tmp_path / "raw").mkdir()
    return write_jsonl(tmp_path / "raw" / "chat.jsonl", [{"messages": c} for c in convs])


def shards(out):
    return pa.concat_tables([pq.read_table(f) for f in sorted(out.glob("part-*.parquet"))])


def test_one_step_equals_tokenize_then_pack(tmp_path, tok_dir, corpus):
    two_step_tokens = tmp_path / "tokens"
    tokpack.tokenize_files(corpus, two_step_tokens, tok_dir)
    two = tmp_path / "two"
    tokpack.pack_files(two_step_tokens, two, MAX_LEN, overlong="split")
    one = tmp_path / "one"
    m = tokpack.pack_files(corpus, one, MAX_LEN, overlong="split", tokenizer=tok_dir)
    assert shards(one).equals(shards(two))
    assert m["figures"]["samples_in"] == 200 and m["tokenize"]["counts"]["samples_out"] == 200
    assert m["inputs"][0]["path"] == str(corpus.resolve())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "raw", "tokens", "two"]


def test_cli_cache_and_rebuild_on_tokenize_option(tmp_path, tok_dir, corpus, capsys):
    out = tmp_path / "packed"
    args = ["pack", str(corpus), "-o", str(out), "--max-len", str(MAX_LEN), "--overlong", "split"]
    args += ["--tokenizer", str(tok_dir), "--quiet"]
    assert main(args) == 0
    first = json.loads((out / MANIFEST_NAME).read_text())
    assert main(args) == 0
    assert "cache hit" in capsys.readouterr().err
    assert main(args + ["--train-on", "all"]) == 0
    second = json.loads((out / MANIFEST_NAME).read_text())
    assert second["cache_key"] != first["cache_key"]
    assert second["figures"]["loss_tokens"] > first["figures"]["loss_tokens"]


def test_rejected_records_are_reported(tmp_path, tok_dir):
    convs = conversations(20, seed=2)
    records = [{"messages": c} for c in convs] + [{"messages": []}]
    raw = write_jsonl(tmp_path / "bad.jsonl", records)
    out = tmp_path / "packed"
    with pytest.raises(tokpack.InvalidRecordError, match="bad.jsonl:21"):
        tokpack.pack_files(raw, out, MAX_LEN, overlong="split", tokenizer=tok_dir)
    assert not out.exists()
    m = tokpack.pack_files(
        raw, out, MAX_LEN, overlong="split", tokenizer=tok_dir, tokenize={"skip_invalid": True}
    )
    assert m["tokenize"]["counts"]["rejected"] == 1 and m["figures"]["samples_in"] == 20
    assert m["tokenize"]["rejected_file"] == REJECTED_NAME
    assert len((out / REJECTED_NAME).read_text().splitlines()) == 1
