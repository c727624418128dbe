"""GRPO-style records (``prompt`` + ``completions``, with per-completion ``rewards`` /
``advantages``) tokenized into token shards of the tree kind: one row per completion, labelled
on the completion only, the prompt tokens of a group's rows one identical prefix (what the trie
of ``tokpack pack`` stores once), groups distinct across records and files and the same for any
number of workers, the per-completion values carried, bad records named by file and line, and
every record accounted for."""

from __future__ import annotations

import hashlib
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
import tokpack.kinds
from tokpack import ConfigError, InvalidRecordError, OverlongError
from tokpack.cli import main
from tokpack.tokenize import TREE_SCHEMA, tokenize_to_batches
from tokpack.tokenize.schema import KIND_KEY
from tokpack.tokenize.writer import REJECTED_NAME

from ._tokenizer_factory import (
    CHATML_GEN,
    CHATML_PLAIN,
    build_tokenizer,
    hf_tokenizer,
    sentence,
    write_jsonl,
)

pytest.importorskip("tokenizers")
# The tree sample kind is the core's (SampleKind::Tree); until a build has it, nothing to test.
pytestmark = pytest.mark.skipif(
    "tree" not in tokpack.kinds.SAMPLE_KINDS, reason="this build has no tree sample kind"
)

IGNORE = -100


@pytest.fixture(scope="module", params=[CHATML_GEN, CHATML_PLAIN], ids=["markers", "plain"])
def tok_dir(request, tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "t", request.param)


def _reference(tok_dir):
    hf = hf_tokenizer(tok_dir)
    hf.chat_template = json.loads((tok_dir / "tokenizer_config.json").read_text())["chat_template"]
    return hf


def grpo_records(n: int, shape: str, seed: int = 3, values=("rewards", "advantages")):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        g = rng.randint(1, 5)
        if shape == "conversational":
            prompt = [{"role": "user", "content": sentence(rng, rng.randint(1, 12))}]
            if rng.random() < 0.3:
                prompt.insert(0, {"role": "system", "content": sentence(rng, rng.randint(1, 6))})
            completions = [
                [{"role": "assistant", "content": sentence(rng, rng.randint(1, 15))}]
                for _ in range(g)
            ]
        else:
            prompt = sentence(rng, rng.randint(1, 12)) + rng.choice(["", " ", ":"])
            completions = [
                rng.choice(["", " "]) + sentence(rng, rng.randint(0, 15)) for _ in range(g)
            ]
        if g > 1 and rng.random() < 0.2:
            completions[1] = completions[0]  # GRPO groups often hold equal completions
        record = {"prompt": prompt, "completions": completions, "id": rng.randrange(10**6)}
        for name in values:
            record[name] = [round(rng.uniform(-2, 2), 3) for _ in range(g)]
        out.append(record)
    return out


def _rows(paths, tok_dir, **options):
    stream = tokenize_to_batches(paths, tok_dir, **options)
    batches = list(stream)
    return pa.Table.from_batches(batches, schema=stream.schema).to_pylist(), stream


def _chat_ids(hf, messages, **kw):
    return list(hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kw))


def _expected(record, hf, eos):
    """Per completion: its ids, labels, and the prompt's ids (as the preference formats
    tokenize a prompt and its completions: TRL's common prefix, taken per completion)."""
    out = []
    if isinstance(record["prompt"], str):
        prompt = hf(record["prompt"])["input_ids"]
        fulls = [hf(record["prompt"] + c + eos)["input_ids"] for c in record["completions"]]
    else:
        prompt = _chat_ids(hf, record["prompt"], add_generation_prompt=True)
        fulls = [_chat_ids(hf, record["prompt"] + c) for c in record["completions"]]
    for full in fulls:
        n = next(
            (i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full))
        )
        out.append((full, [IGNORE] * n + full[n:], prompt[:n]))
    return out


@pytest.mark.parametrize("shape", ["conversational", "standard"])
def test_each_completion_is_a_row_trained_on_the_completion_only(tmp_path, tok_dir, shape):
    records = grpo_records(120, shape)
    path = write_jsonl(tmp_path / "grpo.jsonl", records)
    rows, stream = _rows(path, tok_dir, threads=1, batch_size=16)
    assert stream.encoding.options.format == "grpo"  # detected from the first record
    hf = _reference(tok_dir)
    want = [(i, r, e) for i, r in enumerate(records) for e in _expected(r, hf, "<|im_end|>")]
    assert len(rows) == len(want) == sum(len(r["completions"]) for r in records)
    at = {}
    for row, (index, record, (ids, labels, prompt)) in zip(rows, want):
        assert (row["input_ids"], row["labels"], row["length"]) == (ids, labels, len(ids))
        assert row["group"] == index
        if shape == "conversational":  # the template's generation prompt ends the prompt
            assert ids[: len(prompt)] == _chat_ids(hf, record["prompt"], add_generation_prompt=True)
        k = at[index] = at.get(index, -1) + 1
        assert row["reward"] == record["rewards"][k]
        assert row["advantage"] == record["advantages"][k]
    # The untrained prompt of a group's rows is one prefix: the trie shares it.
    groups = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    for members in groups.values():
        start = min(_first_trained(r) for r in members)
        assert len({tuple(r["input_ids"][:start]) for r in members}) == 1
    s = stream.stats
    assert s.records == s.samples_in == len(records) and s.rejected == 0
    assert s.sequences == s.samples_out == len(rows)
    assert s.formats == {"grpo": len(records)}
    assert s.tokens == sum(r["length"] for r in rows)


def _first_trained(row):
    return next((i for i, x in enumerate(row["labels"]) if x != IGNORE), len(row["labels"]))


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_groups_unique_across_files_and_shards_identical_for_any_workers(tmp_path, tok_dir):
    a = write_jsonl(tmp_path / "a.jsonl", grpo_records(70, "conversational", seed=1))
    b = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist(grpo_records(50, "conversational", seed=2)), b)
    outs = {}
    for threads in (1, 2):
        out = tmp_path / f"tokens{threads}"
        manifest = tokpack.tokenize_files(
            [a, b], out, tok_dir, threads=threads, batch_size=7, shard_rows=90
        )
        outs[threads] = (manifest, {p.name: _sha(p) for p in sorted(out.glob("part-*.parquet"))})
    (one, one_files), (two, two_files) = outs[1], outs[2]
    assert one_files == two_files and len(one_files) > 1
    assert one["counts"] == two["counts"] and one["sample_kind"] == "tree"
    table = pq.read_table(tmp_path / "tokens1")
    assert table.schema.metadata[KIND_KEY] == b"tree"
    assert table.schema.names == TREE_SCHEMA.names + ["reward", "advantage"]
    groups = table.column("group").to_pylist()
    # Each record's position among the run's records: files continue the count.
    assert sorted(set(groups)) == list(range(120))
    assert groups == sorted(groups)


def test_values_are_optional_but_one_rule_per_run(tmp_path, tok_dir):
    bare = grpo_records(20, "standard", values=())
    rows, stream = _rows(write_jsonl(tmp_path / "bare.jsonl", bare), tok_dir, threads=1)
    assert stream.schema.names == TREE_SCHEMA.names and set(rows[0]) == set(TREE_SCHEMA.names)
    rewards = grpo_records(20, "standard", values=("rewards",))
    rows, stream = _rows(write_jsonl(tmp_path / "r.jsonl", rewards), tok_dir, threads=1)
    assert stream.schema.names == TREE_SCHEMA.names + ["reward"]
    assert [r["reward"] for r in rows] == [x for r in rewards for x in r["rewards"]]
    # A record without the field its run's first record gives (or the other way round).
    for first, later, reason in (
        (rewards, bare, "no 'rewards' field"),
        (bare, rewards, "'rewards' given"),
    ):
        path = write_jsonl(tmp_path / "mixed.jsonl", first[:5] + later[:1])
        with pytest.raises(
            InvalidRecordError,
            match=f"mixed.jsonl:6: {reason}, unlike the run's first record \\(.*mixed.jsonl:1\\)",
        ):
            _rows(path, tok_dir, threads=2, batch_size=2)
    # The record fields are renamed as any other; integers become floats.
    renamed = [{"q": "a b", "completions": [" c", " d"], "score": [1, 2]}]
    rows, _ = _rows(
        write_jsonl(tmp_path / "renamed.jsonl", renamed),
        tok_dir,
        format="grpo",
        columns={"prompt": "q", "rewards": "score"},
        threads=1,
    )
    assert [r["reward"] for r in rows] == [1.0, 2.0]


CHAT = [{"role": "user", "content": "hi"}]
ANSWER = [{"role": "assistant", "content": "hello"}]
GOOD = {"prompt": "a question", "completions": [" yes", " no"], "rewards": [1.0, 0.0]}

BAD = [
    ({"prompt": "q", "completions": []}, "'completions' must be a non-empty list"),
    ({"prompt": "q", "completions": " a"}, "'completions' must be a non-empty list"),
    ({"completions": [" a"]}, "missing field 'prompt'"),
    ({"prompt": "q", "completions": [" a", 3]}, "'completions\\[1\\]' must be a string"),
    ({"prompt": CHAT, "completions": [ANSWER, " a"]}, "must all be strings or all lists"),
    ({"prompt": "q", "completions": [ANSWER]}, "must all be strings or all lists"),
    ({"prompt": CHAT, "completions": [[]]}, "empty conversation"),
    (
        {"prompt": "q", "completions": [" a", " b"], "rewards": [1.0]},
        "'rewards' must be a list of one number per completion \\(2 in 'completions'\\), got 1",
    ),
    ({"prompt": "q", "completions": [" a"], "advantages": 0.5}, "got float"),
    ({"prompt": "q", "completions": [" a"], "rewards": [True]}, "rewards\\[0\\] is not a finite"),
    ({"prompt": "q", "completions": [" a"], "rewards": [float("nan")]}, "not a finite number"),
    ({"messages": CHAT + ANSWER}, "missing field 'completions'"),
]


@pytest.mark.parametrize("record, reason", BAD)
def test_bad_record_named_by_file_and_line(tmp_path, tok_dir, record, reason):
    path = tmp_path / "bad.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps(GOOD) + "\n\n" + json.dumps(record) + "\n")  # a blank line between
    with pytest.raises(InvalidRecordError, match=f"bad.jsonl:3: .*{reason}") as info:
        list(tokenize_to_batches(path, tok_dir, threads=1))  # the format: the first record's
    assert info.value.line == 3


def test_every_record_accounted_for(tmp_path, tok_dir):
    """Bad records and records of another kind are rejected, counted and written to the
    rejected-records file; the others give one row per completion."""
    sft = {"messages": CHAT + ANSWER}
    lines = [GOOD, sft, {"prompt": "q", "completions": [" a"], "rewards": [1, 2]}, GOOD]
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    out = tmp_path / "tokens"
    manifest = tokpack.tokenize_files(path, out, tok_dir, skip_invalid=True, threads=1)
    c = manifest["counts"]
    assert (c["records"], c["rejected"], c["samples_in"]) == (4, 2, 2)
    assert c["sequences"] == c["samples_out"] == 4
    rejected = [json.loads(r) for r in (out / REJECTED_NAME).read_text().splitlines()]
    assert [r["line"] for r in rejected] == [2, 3]
    assert rejected[0]["error"] == "missing field 'completions'"
    table = pq.read_table(out)
    assert table.column("group").to_pylist() == [0, 0, 3, 3]
    # An SFT run names a GRPO record among its records.
    path = write_jsonl(tmp_path / "sft.jsonl", [sft, GOOD])
    with pytest.raises(InvalidRecordError, match="sft.jsonl:2: a grpo record among SFT"):
        list(tokenize_to_batches(path, tok_dir, threads=1))


def test_overlong_completions(tmp_path, tok_dir):
    records = grpo_records(60, "conversational", seed=5)
    path = write_jsonl(tmp_path / "grpo.jsonl", records)
    full, _ = _rows(path, tok_dir, threads=1)
    max_len = sorted(r["length"] for r in full)[len(full) // 2]
    with pytest.raises(OverlongError, match='grpo.jsonl:\\d+: sample of .*"drop", or filter'):
        _rows(path, tok_dir, threads=1, max_len=max_len)
    # drop: each over-long sequence alone (its group keeps the others)
    kept, stream = _rows(path, tok_dir, threads=1, max_len=max_len, overlong="drop")
    assert kept == [r for r in full if r["length"] <= max_len]
    s = stream.stats
    assert s.samples_out == s.sequences - s.dropped == len(kept) and s.dropped == s.overlong
    assert s.samples_in == s.records == len(records)
    # truncate: each keeps its start (the shared prompt stays a prefix)
    cut, stream = _rows(path, tok_dir, threads=1, max_len=max_len, overlong="truncate")
    want = [
        {**r, "input_ids": r["input_ids"][:max_len], "labels": r["labels"][:max_len]} for r in full
    ]
    for r in want:
        r["length"] = len(r["input_ids"])
    assert cut == want and stream.stats.truncated == stream.stats.overlong > 0
    with pytest.raises(ConfigError, match="'split' cannot apply to GRPO records"):
        _rows(path, tok_dir, threads=1, max_len=max_len, overlong="split")
    with pytest.raises(ConfigError, match="train_on 'last' does not apply to GRPO records"):
        _rows(path, tok_dir, threads=1, train_on="last")
    with pytest.raises(ConfigError, match="carry: 'reward' would replace a column"):
        _rows(path, tok_dir, threads=1, carry=["reward"])


def test_cli_detects_grpo_and_carries_record_fields(tmp_path, tok_dir, capsys):
    records = grpo_records(30, "standard", seed=7)
    path = write_jsonl(tmp_path / "grpo.jsonl", records)
    out = tmp_path / "tokens"
    assert (
        main(["tokenize", str(path), "-o", str(out), "--tokenizer", str(tok_dir), "--carry", "id"])
        == 0
    )
    assert "sequences" in capsys.readouterr().out
    manifest = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    assert manifest["sample_kind"] == "tree" and manifest["config"]["format"] == "grpo"
    names = TREE_SCHEMA.names + ["reward", "advantage", "id"]
    assert sorted(manifest["columns"]) == sorted(names) and manifest["columns"]["group"] == "int64"
    table = pq.read_table(out)
    assert table.schema.names == names
    assert table.column("id").to_pylist() == [r["id"] for r in records for _ in r["completions"]]


def test_a_ray_dataset_of_grpo_records_is_refused(tok_dir):
    """Its blocks number no records, so no group would be the run's (``tokpack tokenize
    --ray`` numbers them where they are read)."""
    pytest.importorskip("ray")
    import tokpack.ray

    refused = "tokpack.ray.tokenize holds tree samples.*does not support"
    with pytest.raises(ConfigError, match=refused):
        tokpack.ray.tokenize(None, tok_dir, format="grpo")
    with pytest.raises(ConfigError, match=refused):
        tokpack.ray.tokenize(None, tok_dir, format="messages", each_turn=True)
