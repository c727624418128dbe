"""One step from raw data: ``tokpack pack --tokenizer`` tokenizes chat data and packs it in the
same run, with the same result as tokenize-then-pack and no token shards left behind."""

from __future__ import annotations

import errno
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack._io.outdir import MANIFEST_NAME
from tokpack.cli import main
from tokpack.pack.files import DROPPED_NAME
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


def _long_and_short(tmp_path):
    """A JSONL file (a blank line, a bad record) and a Parquet file, with long texts at known
    places: JSONL lines 5 and 17, Parquet rows 0 and 7."""
    short, long_ = {"text": "the day"}, {"text": " ".join(["water"] * 400)}
    lines = [json.dumps(long_ if n in (5, 17) else short) for n in range(1, 21)]
    lines[9] = ""
    lines[11] = '{"messages": []}'
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    parquet = tmp_path / "b.parquet"
    rows = [long_ if r in (0, 7) else short for r in range(10)]
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    return jsonl, parquet


def test_dropped_samples_name_the_raw_file_and_line(tmp_path, tok_dir):
    # They used to name the deleted temporary tokenized file and a row of it.
    jsonl, parquet = _long_and_short(tmp_path)
    out = tmp_path / "packed"
    m = tokpack.pack_files(
        [jsonl, parquet],
        out,
        64,
        overlong="drop",
        tokenizer=tok_dir,
        tokenize={"skip_invalid": True},
    )
    assert m["figures"]["samples_dropped"] == 4 and m["tokenize"]["counts"]["rejected"] == 1
    dropped = pa.ipc.open_file(out / DROPPED_NAME).read_all().to_pylist()
    assert [(d["file"], d["line"], d["row"], d["reason"]) for d in dropped] == [
        (str(jsonl), 5, None, "overlong"),
        (str(jsonl), 17, None, "overlong"),
        (str(parquet), None, 0, "overlong"),
        (str(parquet), None, 7, "overlong"),
    ]


def test_overlong_error_names_the_raw_file_and_line(tmp_path, tok_dir):
    jsonl, parquet = _long_and_short(tmp_path)
    skip = {"skip_invalid": True}
    with pytest.raises(tokpack.OverlongError, match=r"a\.jsonl:5: sample of \d+ tokens"):
        tokpack.pack_files(jsonl, tmp_path / "o", 64, tokenizer=tok_dir, tokenize=skip)
    with pytest.raises(tokpack.OverlongError, match=r"b\.parquet:row 0: sample of \d+ tokens"):
        tokpack.pack_files(parquet, tmp_path / "o", 64, tokenizer=tok_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.parquet"]


def test_undecodable_file_name_of_a_dropped_sample(tmp_path, tok_dir, capsys):
    # A file name that is not UTF-8 used to fail the write of _dropped.arrow.
    _, parquet = _long_and_short(tmp_path)
    bad = tmp_path / os.fsdecode(b"bad\xff.parquet")
    parquet.rename(bad)
    out = tmp_path / "packed"
    args = ["pack", str(bad), "-o", str(out), "--max-len", "64", "--overlong", "drop"]
    assert main(args + ["--tokenizer", str(tok_dir), "--quiet"]) == 0
    dropped = pa.ipc.open_file(out / DROPPED_NAME).read_all().to_pylist()
    assert [(d["file"], d["row"]) for d in dropped] == [
        (str(tmp_path / "bad\\xff.parquet"), 0),
        (str(tmp_path / "bad\\xff.parquet"), 7),
    ]
    assert main(args[:-2] + ["--tokenizer", str(tok_dir), "--quiet", "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad\\xff.parquet:row 0: sample of" in err


def test_disk_full_while_staging_is_one_line_exit_2(tmp_path, tok_dir, corpus, capsys, monkeypatch):
    # ENOSPC while writing the staged tokens used to escape as a traceback.
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pa.ipc.RecordBatchFileWriter, "write_batch", full)
    out = tmp_path / "packed"
    args = ["pack", str(corpus), "-o", str(out), "--max-len", str(MAX_LEN), "--overlong", "split"]
    assert main(args + ["--tokenizer", str(tok_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tokpack pack: error: ")
    assert "tokenized.arrow: cannot write (No space left on device)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]
