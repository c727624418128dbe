"""tokenize_files / ``tokpack tokenize``: shards, manifest, cache rules, determinism across
thread counts, rejected records, CLI errors."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack._io.outdir import MANIFEST_NAME
from tokpack.cli import main
from tokpack.tokenize.writer import REJECTED_NAME

from ._interrupt import interrupt_after_first_shard, signal_with_workers, survivors
from ._tokenizer_factory import (
    CHATML_GEN,
    CHATML_PLAIN,
    build_tokenizer,
    conversations,
    write_jsonl,
)

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "gen", CHATML_GEN)


@pytest.fixture()
def corpus(tmp_path):
    convs = conversations(300, seed=11)
    return write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in convs])


def read_dir(out):
    files = sorted(out.glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]), files


def test_shards_and_manifest(tmp_path, tok_dir, corpus):
    out = tmp_path / "tokens"
    manifest = tokpack.tokenize_files(corpus, out, tok_dir, shard_rows=128)
    table, files = read_dir(out)
    assert [f.name for f in files] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert [s["rows"] for s in manifest["shards"]] == [128, 128, 44]
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("labels").type == pa.list_(pa.int32())
    assert table.schema.field("length").type == pa.int32()
    on_disk = json.loads((out / MANIFEST_NAME).read_text())
    assert on_disk == manifest
    counts = manifest["counts"]
    assert counts["records"] == counts["samples_in"] == counts["samples_out"] == 300
    assert counts["tokens"] == sum(table.column("length").to_pylist())
    trained = sum(x != -100 for row in table.column("labels").to_pylist() for x in row)
    assert counts["trained_tokens"] == trained
    assert 0 < counts["trained_share"] < 1
    assert manifest["template"]["source"] == "tokenizer_config"
    assert set(manifest["tokenizer"]) >= {"path", "tokenizer.json", "tokenizer_config.json"}
    assert manifest["inputs"][0]["fingerprint"]
    assert manifest["rejected_file"] is None and not (out / REJECTED_NAME).exists()
    # Same batches as the in-memory stream.
    stream = tokpack.tokenize_to_batches(corpus, tok_dir)
    assert pa.Table.from_batches(list(stream)).equals(table)


def test_identical_bytes_for_any_thread_count(tmp_path, tok_dir, corpus):
    blobs = []
    for threads in (1, 2, 3):
        out = tmp_path / f"t{threads}"
        tokpack.tokenize_files(corpus, out, tok_dir, threads=threads, shard_rows=100)
        blobs.append([f.read_bytes() for f in sorted(out.glob("part-*.parquet"))])
    assert blobs[0] == blobs[1] == blobs[2]


def test_one_options_object_for_api_manifest_and_pack(tmp_path, tok_dir, corpus):
    options = tokpack.TokenizeOptions(train_on="last", max_len=64, overlong="split")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.train_on = "all"
    by_object = tokpack.tokenize_files(corpus, tmp_path / "a", tok_dir, options=options)
    by_keywords = tokpack.tokenize_files(
        corpus, tmp_path / "b", tok_dir, train_on="last", max_len=64, overlong="split"
    )
    assert by_object["cache_key"] == by_keywords["cache_key"]
    recorded = by_object["config"]
    assert {k: recorded[k] for k in options.config()} == options.config()
    packed = tokpack.pack_files(corpus, tmp_path / "p", 64, tokenizer=tok_dir, tokenize=options)
    assert packed["config"]["tokenize"]["train_on"] == "last"
    with pytest.raises(tokpack.ConfigError, match='unknown train_on "none"'):
        tokpack.TokenizeOptions(train_on="none")


def test_cache_rules(tmp_path, tok_dir, corpus):
    out = tmp_path / "tokens"
    first = tokpack.tokenize_files(corpus, out, tok_dir)
    assert "cache_hit" not in first
    assert tokpack.tokenize_files(corpus, out, tok_dir)["cache_hit"] is True
    assert "cache_hit" not in tokpack.tokenize_files(corpus, out, tok_dir, force=True)
    # Config, template, tokenizer and input changes all rebuild.
    assert "cache_hit" not in tokpack.tokenize_files(corpus, out, tok_dir, train_on="last")
    template = tmp_path / "t.jinja"
    template.write_text(CHATML_PLAIN, encoding="utf-8")
    rebuilt = tokpack.tokenize_files(corpus, out, tok_dir, chat_template=template)
    assert "cache_hit" not in rebuilt and rebuilt["template"]["source"] == "file"
    template.write_text(CHATML_PLAIN + " ", encoding="utf-8")
    again = tokpack.tokenize_files(corpus, out, tok_dir, chat_template=template)
    assert "cache_hit" not in again
    assert again["template"]["hash"] != rebuilt["template"]["hash"]
    other_tok = build_tokenizer(tmp_path / "tok2", CHATML_GEN, vocab_size=500)
    assert "cache_hit" not in tokpack.tokenize_files(corpus, out, other_tok)
    assert tokpack.tokenize_files(corpus, out, other_tok)["cache_hit"] is True
    with open(corpus, "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    assert tokpack.tokenize_files(corpus, out, other_tok)["counts"]["records"] == 301


def test_failed_run_leaves_previous_output(tmp_path, tok_dir, corpus):
    out = tmp_path / "tokens"
    tokpack.tokenize_files(corpus, out, tok_dir)
    before = sorted(p.name for p in out.iterdir())
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": []}])
    with pytest.raises(tokpack.InvalidRecordError):
        tokpack.tokenize_files([corpus, bad], out, tok_dir)
    assert sorted(p.name for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tokens")] == []


def test_skip_invalid_writes_rejected_file(tmp_path, tok_dir):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}]}
    lines = [good, '{"messages": [', good, {"messages": [{"role": "bot", "content": "x"}]}]
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "tokens"
    manifest = tokpack.tokenize_files(path, out, tok_dir, skip_invalid=True)
    assert manifest["counts"]["rejected"] == 2 and manifest["counts"]["samples_out"] == 2
    assert manifest["rejected_file"] == REJECTED_NAME
    rejected = [json.loads(x) for x in (out / REJECTED_NAME).read_text().splitlines()]
    assert [r["line"] for r in rejected] == [2, 4]
    assert rejected[0]["raw"] == '{"messages": ['
    assert "unknown role 'bot'" in rejected[1]["error"]


def test_all_rejected_still_writes_an_empty_shard(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "in.jsonl", ['{"messages": []}'])
    out = tmp_path / "tokens"
    manifest = tokpack.tokenize_files(path, out, tok_dir, skip_invalid=True)
    table, files = read_dir(out)
    assert len(files) == 1 and table.num_rows == 0
    assert manifest["counts"]["rejected"] == 1


def test_cli_tokenize(tmp_path, tok_dir, corpus, capsys):
    out = tmp_path / "tokens"
    args = ["tokenize", str(corpus), "-o", str(out), "--tokenizer", str(tok_dir)]
    assert main(args + ["--max-len", "64", "--overlong", "split"]) == 0
    text = capsys.readouterr().out
    assert "shard(s)" in text and "over-long split" in text
    assert main(args + ["--max-len", "64", "--overlong", "split"]) == 0
    assert "up to date" in capsys.readouterr().out
    parquet = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"chat": c} for c in conversations(3)]), parquet)
    out2 = tmp_path / "tokens2"
    cmd = ["tokenize", str(parquet), "-o", str(out2), "--tokenizer", str(tok_dir), "--quiet"]
    assert main(cmd + ["--column", "messages=chat", "--train-on", "all", "--no-add-eos"]) == 0
    assert capsys.readouterr().out == ""
    assert read_dir(out2)[0].num_rows == 3


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tokenizer", "/nonexistent/tok"], "no such tokenizer"),
        (["--column", "messages"], "expects FIELD=NAME"),
        (["--max-len", "0"], "max_len must be at least 1"),
    ],
)
def test_cli_errors_exit_2_without_traceback(tmp_path, tok_dir, corpus, capsys, extra, message):
    args = ["tokenize", str(corpus), "-o", str(tmp_path / "o")]
    if "--tokenizer" not in extra:
        args += ["--tokenizer", str(tok_dir)]
    assert main(args + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_bad_record_names_file_and_line(tmp_path, tok_dir, capsys):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "ok"}, '{"messages": [{"role": 1}]}'])
    args = ["tokenize", str(path), "-o", str(tmp_path / "o"), "--tokenizer", str(tok_dir)]
    assert main(args) == 2
    assert f"{path}:2: messages[0] has unknown role 1" in capsys.readouterr().err


def test_progress_bar_shows_rate_and_eta():
    import io

    from tokpack._io.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bar = Progress(True, stream, total_bytes=1000)
    bar.advance(500)
    bar.add_samples(10)
    bar.close()
    text = stream.getvalue()
    assert "100.0%" in text and "10 samples" in text and "/s" in text and "ETA" in text
    quiet = Terminal()
    Progress(False, quiet).close()
    assert quiet.getvalue() == ""


def _mixed_records(n: int):
    """Conversations with a bad record every 37th line (unknown role, invalid JSON)."""
    records = []
    for i, conv in enumerate(conversations(n, seed=5)):
        if i % 37 == 5:
            records.append('{"messages": [{"role": "robot", "content": "x"}]}')
        elif i % 37 == 20:
            records.append("{not json")
        else:
            records.append({"messages": conv})
    return records


def test_worker_processes_match_one_process(tmp_path, tok_dir):
    from tokpack.tokenize import tokenize_to_batches

    path = write_jsonl(tmp_path / "mixed.jsonl", _mixed_records(700))
    runs = {}
    for threads in (1, 3):
        stream = tokenize_to_batches(
            path,
            tok_dir,
            threads=threads,
            batch_size=64,
            skip_invalid=True,
            max_len=60,
            overlong="split",
        )
        batches = list(stream)
        runs[threads] = (batches, stream.stats.as_dict(), stream.rejected)
    (b1, s1, r1), (b3, s3, r3) = runs[1], runs[3]
    assert len(b1) == len(b3) == 11
    assert all(x.equals(y) for x, y in zip(b1, b3))
    assert s1 == s3 and s1["records"] == 700 and s1["rejected"] == 38 and s1["split"] > 0
    assert r1 == r3 and [r["line"] for r in r1][:3] == [6, 21, 43]


def test_spawned_workers_build_their_own_stream(tmp_path, tok_dir, monkeypatch):
    # The start method of platforms without fork: workers load tokenizer and template anew.
    from tokpack.tokenize import pipeline, tokenize_to_batches

    path = write_jsonl(tmp_path / "mixed.jsonl", _mixed_records(200))
    one = list(tokenize_to_batches(path, tok_dir, threads=1, batch_size=50, skip_invalid=True))
    monkeypatch.setattr(pipeline, "_START_METHOD", "spawn")
    stream = tokenize_to_batches(path, tok_dir, threads=2, batch_size=50, skip_invalid=True)
    two = list(stream)
    assert len(one) == len(two) == 4 and all(a.equals(b) for a, b in zip(one, two))
    assert stream.stats.rejected == 11


def test_worker_process_errors_name_file_and_line(tmp_path, tok_dir):
    from tokpack.tokenize import tokenize_to_batches

    path = write_jsonl(tmp_path / "mixed.jsonl", _mixed_records(300)[7:])
    stream = tokenize_to_batches(path, tok_dir, threads=2, batch_size=8)
    with pytest.raises(tokpack.InvalidRecordError, match=r"mixed.jsonl:14: invalid JSON") as exc:
        list(stream)
    assert exc.value.line == 14 and exc.value.path == str(path)


def test_ctrl_c_stops_tokenize_cleanly(tmp_path, tok_dir):
    corpus = write_jsonl(tmp_path / "big.jsonl", [{"messages": c} for c in conversations(60000)])
    out = tmp_path / "out"
    args = ["tokenize", str(corpus), "-o", str(out), "--tokenizer", str(tok_dir)]
    returncode, err = interrupt_after_first_shard(args + ["--threads", "2", "--quiet"], out)
    assert returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    return write_jsonl(path, [{"messages": c} for c in conversations(60000)])


@pytest.mark.parametrize("raw_pack", [False, True], ids=["tokenize", "pack-tokenizer"])
def test_sigterm_cleans_up_and_stops_the_workers(tmp_path, tok_dir, big_corpus, raw_pack):
    # SIGTERM used to leave the workers alive (under init) and OUT's temporaries behind.
    # (The tokenizers encoder keeps the worker processes: JSONL chats otherwise go to Rust.)
    pytest.importorskip("psutil")
    out = tmp_path / "out"
    args = ["tokenize", str(big_corpus), "-o", str(out), "--tokenizer", str(tok_dir)]
    args += ["--encoder", "tokenizers"]
    if raw_pack:
        args[0] = "pack"
        args += ["--max-len", "4096"]
    returncode, err, workers = signal_with_workers(
        args + ["--threads", "2", "--quiet"], signal.SIGTERM, 2
    )
    left = survivors(workers)
    for p in left:
        p.kill()
    assert not left
    assert returncode == 143, err
    assert "terminated" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_sigterm_stops_the_rust_records_path_cleanly(tmp_path, tok_dir, big_corpus):
    """JSONL chats tokenized in Rust (no worker processes): SIGTERM during the run exits 143
    with one line and leaves nothing behind."""
    out = tmp_path / "out"
    args = ["tokenize", str(big_corpus), "-o", str(out), "--tokenizer", str(tok_dir)]
    returncode, err = interrupt_after_first_shard(
        args + ["--threads", "2", "--quiet", "--shard-rows", "2048"], out, signal.SIGTERM
    )
    assert returncode == 143, err
    assert "terminated" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_kill_9_of_the_parent_kills_the_workers(tmp_path, tok_dir, big_corpus):
    pytest.importorskip("psutil")
    args = ["tokenize", str(big_corpus), "-o", str(tmp_path / "out"), "--tokenizer", str(tok_dir)]
    args += ["--encoder", "tokenizers"]  # worker processes (see above)
    returncode, _, workers = signal_with_workers(
        args + ["--threads", "2", "--quiet"], signal.SIGKILL, 2
    )
    assert returncode == -signal.SIGKILL
    left = survivors(workers)
    for p in left:
        p.kill()
    assert not left


def test_disk_full_is_one_line_exit_2(tmp_path, tok_dir, corpus, capsys, monkeypatch):
    # ENOSPC from a shard write used to escape as a traceback.
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq.ParquetWriter, "write_batch", full)
    out = tmp_path / "out"
    args = ["tokenize", str(corpus), "-o", str(out), "--tokenizer", str(tok_dir), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tokpack tokenize: error: ")
    assert "part-00000.parquet: cannot write (No space left on device)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


def test_undecodable_file_name_in_rejected_file(tmp_path, tok_dir):
    # A file name that is not UTF-8 used to fail the write of _rejected.jsonl.
    name = os.fsdecode(b"bad\xff.jsonl")
    path = write_jsonl(tmp_path / name, [{"text": "ok"}, {"messages": []}])
    out = tmp_path / "out"
    m = tokpack.tokenize_files(path, out, tok_dir, skip_invalid=True)
    assert m["counts"]["rejected"] == 1
    rejected = json.loads((out / REJECTED_NAME).read_text(encoding="utf-8"))
    assert rejected["file"] == str(tmp_path / "bad\\xff.jsonl") and rejected["line"] == 2


def test_undecodable_output_directory_name(tmp_path, tok_dir, corpus):
    # pyarrow cannot open such a name: the shards (and one-step pack's staged tokens) used to
    # fail with a UnicodeEncodeError traceback.
    out = tmp_path / os.fsdecode(b"tokens\xff")
    m = tokpack.tokenize_files(corpus, out, tok_dir)
    shard = pq.read_table(pa.OSFile(os.fsencode(out / "part-00000.parquet")))
    assert shard.num_rows == m["counts"]["samples_out"] == 300
    packed = tmp_path / os.fsdecode(b"packed\xff")
    m = tokpack.pack_files(corpus, packed, 64, overlong="drop", tokenizer=tok_dir)
    assert m["figures"]["samples_dropped"] > 0
    dropped = pa.ipc.open_file(pa.memory_map(os.fsencode(packed / "__tokpack__/_dropped.arrow")))
    assert set(dropped.read_all().column("file").to_pylist()) == {str(corpus)}


def test_tokenize_flags_come_from_the_options_fields():
    """``tokenize``'s flags and one-step ``pack --tokenizer``'s are made from TokenizeOptions'
    fields (help, defaults, choices in one place), as pack's are from PackConfig's."""
    from tokpack.cli import build_parser
    from tokpack.tokenize.options import FLAGS, OWN, TokenizeOptions, from_args

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    defaults = {f.name: f.default for f in dataclasses.fields(TokenizeOptions)}
    assert set(FLAGS) <= set(defaults) and set(OWN) <= set(FLAGS)
    for command in ("tokenize", "pack"):
        flags: dict = {}
        for action in commands[command]._actions:
            flags.setdefault(action.dest, action)  # (--add-eos before --no-add-eos)
        for name, (help_text, _) in FLAGS.items():
            if name not in OWN or command == "tokenize":
                flag = flags["column" if name == "columns" else name]
                assert flag.help == help_text, (command, name)
                assert name == "columns" or flag.default == defaults[name], (command, name)
    argv = ["in", "-o", "out", "--tokenizer", "t", "--format", "text", "--column", "text=body"]
    args = parser.parse_args(["tokenize", *argv, "--no-add-eos", "--max-len", "64", "--carry", "a"])
    assert from_args(args, own=True) == TokenizeOptions(
        format="text", columns={"text": "body"}, add_eos=False, max_len=64, carry=("a",)
    )
    assert from_args(parser.parse_args(["pack", *argv])) == TokenizeOptions(
        format="text", columns={"text": "body"}
    )
