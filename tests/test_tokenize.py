"""Tokenize stage: token ids equal transformers' apply_chat_template, labels mark exactly the
trained spans, every input format is detected and parsed."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack.tokenize import CHATML_TEMPLATE

from ._tokenizer_factory import (
    CHATML_GEN,
    CHATML_PLAIN,
    build_tokenizer,
    conversations,
    hf_tokenizer,
    write_jsonl,
)

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "gen", CHATML_GEN)


@pytest.fixture(scope="module")
def plain_tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "plain", CHATML_PLAIN)


@pytest.fixture(scope="module")
def hf(tok_dir):
    return hf_tokenizer(tok_dir)


def run(inputs, tokenizer, **options):
    stream = tokpack.tokenize_to_batches(inputs, tokenizer, **options)
    batches = list(stream)
    table = pa.Table.from_batches(batches, schema=tokpack.tokenize.TOKEN_SCHEMA)
    return table, stream


def runs(labels):
    """Contiguous trained runs of a label list."""
    out, cur = [], []
    for x in labels:
        if x != -100:
            cur.append(x)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def assistant_texts(conv):
    return [m["content"] + "<|im_end|>" for m in conv if m["role"] == "assistant"]


@pytest.mark.parametrize("template", [CHATML_GEN, CHATML_PLAIN], ids=["generation", "plain"])
def test_ids_equal_transformers_and_labels_are_assistant_turns(tmp_path, hf, template):
    tok = build_tokenizer(tmp_path / "tok", template)
    convs = conversations(40)
    convs.append([{"role": "user", "content": "naïve 東京?"}, {"role": "assistant", "content": ""}])
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": c} for c in convs])
    table, stream = run(path, tok)
    assert stream.template_info["source"] == "tokenizer_config"
    ids = table.column("input_ids").to_pylist()
    labels = table.column("labels").to_pylist()
    assert table.column("length").to_pylist() == [len(x) for x in ids]
    for conv, got_ids, got_labels in zip(convs, ids, labels):
        want = hf.apply_chat_template(
            conv, chat_template=template, tokenize=True, return_dict=False
        )
        assert got_ids == want
        decoded = [hf.decode(r) for r in runs(got_labels)]
        assert decoded == assistant_texts(conv)
        assert all(lab in (-100, i) for lab, i in zip(got_labels, got_ids))


def test_labels_equal_transformers_assistant_masks(tmp_path, tok_dir, hf):
    convs = conversations(30, seed=7)
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": c} for c in convs])
    table, _ = run(path, tok_dir)
    for conv, got in zip(convs, table.column("labels").to_pylist()):
        ref = hf.apply_chat_template(
            conv,
            chat_template=CHATML_GEN,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert [x != -100 for x in got] == [bool(m) for m in ref["assistant_masks"]]


@pytest.mark.parametrize("tok_fixture", ["tok_dir", "plain_tok_dir"])
def test_train_on_last_and_all(tmp_path, request, tok_fixture, hf):
    tok = request.getfixturevalue(tok_fixture)
    convs = [c for c in conversations(20, seed=3) if sum(m["role"] == "assistant" for m in c) > 1]
    assert convs
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": c} for c in convs])
    last, _ = run(path, tok, train_on="last")
    for conv, labels in zip(convs, last.column("labels").to_pylist()):
        assert [hf.decode(r) for r in runs(labels)] == assistant_texts(conv)[-1:]
    every, _ = run(path, tok, train_on="all")
    assert every.column("labels").to_pylist() == every.column("input_ids").to_pylist()


def test_special_tokens_variables_and_raise_exception(tmp_path):
    template = (
        "{% if messages[0]['role'] == 'tool' %}{{ raise_exception('no tool first') }}{% endif %}"
        "{% for m in messages %}{{ m['role'] + ': ' }}"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + eos_token }}"
        "{% endgeneration %}{% else %}{{ m['content'] + '\n' }}{% endif %}{% endfor %}"
    )
    tok = build_tokenizer(tmp_path / "tok", template)
    good = [{"role": "user", "content": "the day"}, {"role": "assistant", "content": "a word"}]
    bad = [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": good}, {"messages": bad}])
    with pytest.raises(tokpack.InvalidRecordError, match=r"in\.jsonl:2: .*no tool first"):
        run(path, tok)
    table, stream = run(path, tok, skip_invalid=True)
    want = hf_tokenizer(tok).apply_chat_template(
        good, chat_template=template, tokenize=True, return_dict=False
    )
    assert table.column("input_ids").to_pylist() == [want]
    assert stream.stats.rejected == 1 and stream.rejected[0]["line"] == 2


def test_builtin_chatml_when_tokenizer_has_no_template(tmp_path, hf):
    tok = build_tokenizer(tmp_path / "tok", chat_template=None)
    convs = conversations(5)
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": c} for c in convs])
    table, stream = run(path, tok)
    assert stream.template_info["source"] == "builtin-chatml"
    for conv, ids in zip(convs, table.column("input_ids").to_pylist()):
        want = hf.apply_chat_template(
            conv, chat_template=CHATML_TEMPLATE, tokenize=True, return_dict=False
        )
        assert ids == want


def test_chat_template_file_overrides_config(tmp_path, tok_dir, hf):
    file = tmp_path / "t.jinja"
    file.write_text(CHATML_PLAIN, encoding="utf-8")
    conv = conversations(1, seed=5)[0][1:]  # no system message: the template adds its own
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": conv}])
    table, stream = run(path, tok_dir, chat_template=file)
    assert stream.template_info["source"] == "file"
    want = hf.apply_chat_template(
        conv, chat_template=CHATML_PLAIN, tokenize=True, return_dict=False
    )
    assert table.column("input_ids").to_pylist() == [want]
    assert "You are a helpful assistant." in hf.decode(want)


def test_template_that_rewrites_content_is_reported(tmp_path):
    template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] | trim }}"
        "{{ '<|im_end|>\n' }}{% endfor %}"
    )
    tok = build_tokenizer(tmp_path / "tok", template)
    fine = [{"role": "user", "content": "hot day"}, {"role": "assistant", "content": "a word"}]
    padded = [{"role": "user", "content": "hot"}, {"role": "assistant", "content": "  a word \n"}]
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": fine}, {"messages": padded}])
    with pytest.raises(tokpack.InvalidRecordError, match=r"in\.jsonl:2: cannot locate"):
        run(path, tok)
    table, stream = run(path, tok, skip_invalid=True)
    assert table.num_rows == 1 and stream.stats.rejected == 1


def test_every_format_detected(tmp_path, tok_dir, hf):
    conv = [{"role": "user", "content": "what day"}, {"role": "assistant", "content": "the first"}]
    records = [
        {"messages": conv},
        {"messages": conv[:], "system": "be hot"},
        {
            "conversations": [
                {"from": "human", "value": "what day"},
                {"from": "gpt", "value": "the first"},
            ]
        },
        {"instruction": "what", "input": "day", "output": "the first"},
        {"instruction": "what day", "output": "the first"},
        {"text": "the long water"},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    table, stream = run(path, tok_dir)
    ids = table.column("input_ids").to_pylist()
    labels = table.column("labels").to_pylist()

    def chat(messages):
        return hf.apply_chat_template(
            messages, chat_template=CHATML_GEN, tokenize=True, return_dict=False
        )

    assert ids[0] == chat(conv)
    assert ids[1] == chat([{"role": "system", "content": "be hot"}] + conv)
    assert ids[2] == ids[0]
    assert ids[3] == chat(
        [{"role": "user", "content": "what\n\nday"}, {"role": "assistant", "content": "the first"}]
    )
    assert ids[4] == ids[0]
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    assert ids[5] == hf.encode("the long water") + [eos]
    assert labels[5] == ids[5]
    assert stream.stats.formats == {"chat": 5, "text": 1}


def test_gzip_parquet_and_column_overrides(tmp_path, tok_dir, hf):
    convs = conversations(8)
    plain = write_jsonl(tmp_path / "a.jsonl", [{"messages": c} for c in convs])
    gz = tmp_path / "b.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps({"chat": c}) + "\n")
    pq.write_table(pa.Table.from_pylist([{"chat": c} for c in convs]), tmp_path / "c.parquet")
    want, _ = run(plain, tok_dir)
    for path in (gz, tmp_path / "c.parquet"):
        got, _ = run(path, tok_dir, columns={"messages": "chat"})
        assert got.equals(want)
    with pytest.raises(tokpack.InvalidRecordError, match=r"b\.jsonl\.gz:1: cannot detect"):
        run(gz, tok_dir)
    with pytest.raises(tokpack.ConfigError, match="unknown column field"):
        run(gz, tok_dir, columns={"chats": "chat"})


def test_forced_format_and_alpaca_columns(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "in.jsonl", [{"q": "what day", "a": "the first", "text": "x"}])
    table, stream = run(path, tok_dir, format="alpaca", columns={"instruction": "q", "output": "a"})
    assert stream.stats.formats == {"chat": 1}
    assert table.num_rows == 1
    with pytest.raises(tokpack.InvalidRecordError, match="missing field 'messages'"):
        run(path, tok_dir, format="messages")


def test_add_eos_options(tmp_path, tok_dir, hf):
    conv = [{"role": "user", "content": "the day"}, {"role": "assistant", "content": "hot"}]
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": conv}, {"text": "the day"}])
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    forced, _ = run(path, tok_dir, add_eos=True)
    ids = forced.column("input_ids").to_pylist()
    assert ids[0][-1] == eos and ids[0][-2] != eos  # ChatML ends with "\n": EOS appended
    assert forced.column("labels").to_pylist()[0][-1] == eos  # ends with an assistant turn
    never, _ = run(path, tok_dir, add_eos=False)
    assert never.column("input_ids").to_pylist()[1] == hf.encode("the day")


def test_eos_token_missing_from_vocabulary_is_a_config_error(tmp_path, tok_dir):
    # It used to give plain-text samples no EOS, silently.
    bad = tmp_path / "tok"
    bad.mkdir()
    shutil.copy(tok_dir / "tokenizer.json", bad / "tokenizer.json")
    config = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["eos_token"] = "<|no-such-token|>"
    (bad / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "the day"}])
    with pytest.raises(tokpack.ConfigError, match=r"eos_token '<\|no-such-token\|>'.*vocabulary"):
        run(path, bad)
    table, _ = run(path, bad, add_eos=False)
    assert table.num_rows == 1


def test_overlong_policies(tmp_path, tok_dir):
    convs = conversations(10)
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": c} for c in convs])
    full, _ = run(path, tok_dir)
    lengths = np.array(full.column("length").to_pylist())
    max_len = int(np.median(lengths))
    n_over = int((lengths > max_len).sum())
    assert n_over > 0
    with pytest.raises(tokpack.OverlongError, match=r"in\.jsonl:\d+: sample of \d+ tokens"):
        run(path, tok_dir, max_len=max_len)
    cut, s = run(path, tok_dir, max_len=max_len, overlong="truncate")
    assert s.stats.truncated == n_over and max(cut.column("length").to_pylist()) == max_len
    dropped, s = run(path, tok_dir, max_len=max_len, overlong="drop")
    assert dropped.num_rows == len(convs) - n_over and s.stats.dropped == n_over
    split, s = run(path, tok_dir, max_len=max_len, overlong="split")
    assert s.stats.split == n_over
    assert sum(split.column("length").to_pylist()) == int(lengths.sum())
    flat = [x for row in split.column("input_ids").to_pylist() for x in row]
    assert flat == [x for row in full.column("input_ids").to_pylist() for x in row]


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"messages": [{"role": "user", "content": "hi"}', "invalid JSON"),
        ('{"messages": [{"role": "user", "content": "a \\ud800 b"}]}', "lone surrogate"),
        ('{"text": "\\udfff"}', "lone surrogate"),
        ('{"messages": [{"content": "hi"}]}', "has no 'role'"),
        ('{"messages": [{"role": "user"}]}', "has no 'content'"),
        ('{"messages": [{"role": "user", "content": null}]}', "(user) 'content' is null"),
        ('{"conversations": [{"from": "human", "value": null}]}', "(human) 'value' is null"),
        ('{"messages": [{"role": "wizard", "content": "hi"}]}', "unknown role 'wizard'"),
        ('{"messages": [{"role": ["user"], "content": "hi"}]}', "unknown role ['user']"),
        ('{"messages": []}', "empty conversation"),
        ('{"conversations": [{"from": "alien", "value": "x"}]}', "unknown speaker 'alien'"),
        ('{"conversations": []}', "empty conversation"),
        ('{"instruction": "x"}', "cannot detect the format"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path, tok_dir, line, reason):
    good = json.dumps({"text": "the day"})
    path = write_jsonl(tmp_path / "bad.jsonl", [good, "", good, line, good])
    with pytest.raises(tokpack.InvalidRecordError) as info:
        run(path, tok_dir)
    assert isinstance(info.value, tokpack.DataError)
    assert str(info.value).startswith(f"{path}:4: ")
    assert reason in str(info.value)
    table, stream = run(path, tok_dir, skip_invalid=True)
    assert table.num_rows == 3
    assert stream.stats.records == 4 and stream.stats.rejected == 1
    assert stream.rejected == [
        {"file": str(path), "line": 4, "error": info.value.reason, "raw": line}
    ]


def test_parquet_rows_count_from_0_jsonl_lines_from_1(tmp_path, tok_dir):
    # One rule with pack's messages: rows from 0 (tokenize counted them from 1), lines from 1.
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}
    bad = {"messages": [{"role": "wizard", "content": "hi"}]}
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([good, good, bad, good]), path)
    with pytest.raises(tokpack.InvalidRecordError, match=r"in\.parquet:row 2: ") as info:
        run(path, tok_dir)
    assert info.value.line == 2 and info.value.row
    _, stream = run(path, tok_dir, skip_invalid=True)
    assert [(r["file"], r["row"]) for r in stream.rejected] == [(str(path), 2)]
    lines = write_jsonl(tmp_path / "in.jsonl", [good, good, bad, good])
    _, stream = run(lines, tok_dir, skip_invalid=True)
    assert [r["line"] for r in stream.rejected] == [3]


def test_tokenizer_errors(tmp_path):
    data = write_jsonl(tmp_path / "x.jsonl", [{"text": "a"}])  # inputs are resolved first
    with pytest.raises(tokpack.InputNotFoundError, match="no such tokenizer"):
        tokpack.tokenize_to_batches([data], tmp_path / "missing")
    with pytest.raises(tokpack.InputNotFoundError, match="no tokenizer.json"):
        tokpack.tokenize_to_batches([data], tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(tokpack.ConfigError, match="not a valid tokenizer.json"):
        tokpack.tokenize_to_batches([data], tmp_path)


def test_template_syntax_error_is_config_error(tmp_path, tok_dir):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m }", encoding="utf-8")
    data = write_jsonl(tmp_path / "x.jsonl", [{"text": "a"}])
    with pytest.raises(tokpack.ConfigError, match="syntax error"):
        tokpack.tokenize_to_batches([data], tok_dir, chat_template=bad)


def test_unreadable_files_are_reported(tmp_path, tok_dir):
    broken_gz = tmp_path / "broken.jsonl.gz"
    broken_gz.write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
    with pytest.raises(tokpack.InvalidRecordError, match=r"broken\.jsonl\.gz:1: cannot read"):
        run(broken_gz, tok_dir)
    broken_pq = tmp_path / "broken.parquet"
    broken_pq.write_bytes(b"PAR1 not really")
    with pytest.raises(tokpack.InvalidRecordError, match=r"broken\.parquet: not a readable"):
        run(broken_pq, tok_dir)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(tokpack.InvalidRecordError, match=r"latin\.jsonl:2: not UTF-8"):
        run(latin, tok_dir)
    with pytest.raises(tokpack.InputNotFoundError):
        run(tmp_path / "missing.jsonl", tok_dir)


@pytest.mark.parametrize(
    "call",
    [
        lambda p: tokpack.tokenize_to_batches([p], p, max_len=10**30),
        lambda p: tokpack.tokenize_to_batches([p], p, threads=10**30),
        lambda p: tokpack.tokenize_to_batches([p], p, batch_size=10**30),
        lambda p: tokpack.tokenize_to_batches([p], p, batch_size=True),
        lambda p: tokpack.tokenize_files([p], p.parent / "out", p, shard_rows=10**30),
        lambda p: list(tokpack.streaming_dataset_reader(p, batch_size=10**30)),
    ],
)
def test_numeric_options_out_of_range_are_config_errors(tmp_path, call):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"text": "hi"}\n')
    with pytest.raises(tokpack.ConfigError, match="must be"):
        call(path)
