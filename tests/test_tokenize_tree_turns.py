"""Per-turn samples of multi-turn chats (``each_turn``): a chat with k trained assistant turns
becomes k rows of the tree kind, row j the chat up to assistant turn j rendered by the template
on those messages and trained on that turn alone (exactly what tokenizing the prefix chat with
``train_on="last"`` gives), grouped by chat; the history of a chat's rows is one shared prefix
where the template renders it so; the same bytes for any number of workers."""

from __future__ import annotations

import hashlib
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
import tokpack.kinds
from tokpack import ConfigError, InvalidRecordError
from tokpack.cli import main
from tokpack.tokenize import TREE_SCHEMA, tokenize_to_batches
from tokpack.tokenize.schema import KIND_KEY

from ._tokenizer_factory import CHATML_GEN, CHATML_PLAIN, build_tokenizer, sentence, write_jsonl

pytest.importorskip("tokenizers")
# The tree sample kind is the core's (SampleKind::Tree); until a build has it, nothing to test.
pytestmark = pytest.mark.skipif(
    "tree" not in tokpack.kinds.SAMPLE_KINDS, reason="this build has no tree sample kind"
)

IGNORE = -100

# Qwen3-style: an assistant turn's reasoning is rendered only in the last message, so each
# turn's sample holds its own reasoning and the later ones a history without it.
STRIPS_REASONING = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' and loop.last and message.get('reasoning_content') %}"
    "{{ '<think>' + message['reasoning_content'] + '</think>' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEMPLATES = {"markers": CHATML_GEN, "plain": CHATML_PLAIN, "reasoning": STRIPS_REASONING}


@pytest.fixture(scope="module", params=list(TEMPLATES))
def tok(request, tmp_path_factory):
    return request.param, build_tokenizer(
        tmp_path_factory.mktemp("tok") / "t", TEMPLATES[request.param]
    )


def chats(n: int, seed: int = 1):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        messages = []
        if i % 3 == 0:
            messages.append({"role": "system", "content": sentence(rng, rng.randint(1, 6))})
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": sentence(rng, rng.randint(1, 10))})
            answer = {"role": "assistant", "content": sentence(rng, rng.randint(1, 12))}
            if rng.random() < 0.5:
                answer["reasoning_content"] = sentence(rng, rng.randint(1, 8))
            messages.append(answer)
        if rng.random() < 0.2:
            messages.append({"role": "user", "content": sentence(rng, 3)})  # no answer
        out.append({"messages": messages})
    return out


def _rows(paths, tok_dir, **options):
    stream = tokenize_to_batches(paths, tok_dir, **options)
    return pa.Table.from_batches(list(stream), schema=stream.schema).to_pylist(), stream


def _prefixes(records):
    """Each chat's per-turn prefix chats, and the chat each comes from."""
    out = []
    for i, r in enumerate(records):
        m = r["messages"]
        ends = [j + 1 for j, x in enumerate(m) if x["role"] == "assistant"]
        out += [(i, {"messages": m[:end]}) for end in ends]
    return out


def test_each_turn_is_the_prefix_chat_trained_on_its_last_turn(tmp_path, tok):
    name, tok_dir = tok
    records = chats(150)
    path = write_jsonl(tmp_path / "chats.jsonl", records)
    rows, stream = _rows(path, tok_dir, each_turn=True, threads=1, batch_size=16)
    prefixes = _prefixes(records)
    ref = write_jsonl(tmp_path / "prefixes.jsonl", [p for _, p in prefixes])
    want, _ = _rows(ref, tok_dir, train_on="last", threads=1)
    unanswered = [i for i, r in enumerate(records) if r["messages"][-1]["role"] != "assistant"]
    assert len(rows) == len(want) == len(prefixes) and unanswered
    for row, (chat, _), expected in zip(rows, prefixes, want):
        assert (row["input_ids"], row["labels"]) == (expected["input_ids"], expected["labels"])
        assert row["group"] == chat and row["length"] == len(row["input_ids"])
    # The trained tokens are the turn's: its content and end of turn, after every other token.
    for row in rows:
        trained = [k for k, x in enumerate(row["labels"]) if x != IGNORE]
        assert trained and trained == list(range(trained[0], trained[-1] + 1))
    # Within a chat, the history is one prefix the trie shares (all of it when the template
    # renders a prefix chat as a prefix of the text; without the earlier reasoning otherwise).
    by_chat = {}
    for row in rows:
        by_chat.setdefault(row["group"], []).append(row["input_ids"])
    shared = [a == b[: len(a)] for ids in by_chat.values() for a, b in zip(ids, ids[1:])]
    if name == "reasoning":
        assert not all(shared) and any(shared)
    else:
        assert all(shared)
    s = stream.stats
    assert s.records == s.samples_in == len(records) and s.formats == {"chat": len(records)}
    assert s.sequences == s.samples_out == len(rows) and s.untrained_samples == 0


def test_a_chat_without_an_assistant_turn_is_one_untrained_row(tmp_path, tok):
    _, tok_dir = tok
    records = [
        {"messages": [{"role": "user", "content": "the a of"}]},
        chats(1, seed=4)[0],
        {"text": "plain text is one sample"},
    ]
    path = write_jsonl(tmp_path / "chats.jsonl", records)
    rows, stream = _rows(path, tok_dir, each_turn=True, threads=1)
    plain, _ = _rows(path, tok_dir, threads=1)
    assert (rows[0]["input_ids"], rows[0]["labels"]) == (plain[0]["input_ids"], plain[0]["labels"])
    assert all(x == IGNORE for x in rows[0]["labels"]) and rows[0]["group"] == 0
    assert (rows[-1]["input_ids"], rows[-1]["labels"]) == (
        plain[-1]["input_ids"],
        plain[-1]["labels"],
    )
    assert [r["group"] for r in rows] == [0] + [1] * (len(rows) - 2) + [2]
    s = stream.stats
    assert s.untrained_samples == 1 and s.samples_in == s.records == 3
    assert s.formats == {"chat": 2, "text": 1}


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_shards_identical_for_any_workers(tmp_path, tok):
    _, tok_dir = tok
    path = write_jsonl(tmp_path / "chats.jsonl", chats(90, seed=2))
    parquet = tmp_path / "more.parquet"
    pq.write_table(pa.Table.from_pylist(chats(40, seed=3)), parquet)
    got = {}
    for threads in (1, 2):
        out = tmp_path / f"tokens{threads}"
        manifest = tokpack.tokenize_files(
            [path, parquet],
            out,
            tok_dir,
            each_turn=True,
            threads=threads,
            batch_size=6,
            shard_rows=100,
        )
        got[threads] = manifest["counts"], [_sha(p) for p in sorted(out.glob("part-*.parquet"))]
    assert got[1] == got[2] and len(got[1][1]) > 1
    table = pq.read_table(tmp_path / "tokens1")
    assert table.schema.names == TREE_SCHEMA.names and table.schema.metadata[KIND_KEY] == b"tree"
    assert sorted(set(table.column("group").to_pylist())) == list(range(130))


def test_options_each_turn_refuses(tmp_path, tok):
    _, tok_dir = tok
    path = write_jsonl(tmp_path / "chats.jsonl", chats(5))
    for train_on in ("last", "all"):
        with pytest.raises(ConfigError, match=f"train_on '{train_on}' does not apply to each_turn"):
            _rows(path, tok_dir, each_turn=True, train_on=train_on)
    with pytest.raises(ConfigError, match="'split' cannot apply to each_turn samples"):
        _rows(path, tok_dir, each_turn=True, max_len=8, overlong="split")
    prefs = write_jsonl(
        tmp_path / "prefs.jsonl", [{"prompt": "a", "chosen": " b", "rejected": " c"}]
    )
    with pytest.raises(ConfigError, match="each_turn applies to chats, not to preference"):
        _rows(prefs, tok_dir, each_turn=True)
    with pytest.raises(ConfigError, match="each_turn must be True or False"):
        _rows(path, tok_dir, each_turn="yes")


def test_overlong_turns_are_dropped_alone(tmp_path, tok):
    _, tok_dir = tok
    path = write_jsonl(tmp_path / "chats.jsonl", chats(60, seed=6))
    full, _ = _rows(path, tok_dir, each_turn=True, threads=1)
    max_len = sorted(r["length"] for r in full)[len(full) // 2]
    kept, stream = _rows(path, tok_dir, each_turn=True, threads=1, max_len=max_len, overlong="drop")
    assert kept == [r for r in full if r["length"] <= max_len]
    s = stream.stats
    assert s.dropped == s.overlong == len(full) - len(kept) > 0
    assert s.samples_out == s.sequences - s.dropped and s.samples_in == s.records == 60


def test_a_template_marking_only_the_last_turn_is_named(tmp_path):
    last_only = CHATML_GEN.replace(
        "{% if message['role'] == 'assistant' %}",
        "{% if message['role'] == 'assistant' and loop.last %}",
    )
    tok_dir = build_tokenizer(tmp_path / "tok", last_only)
    turn = [{"role": "user", "content": "the a"}, {"role": "assistant", "content": "of to"}]
    path = write_jsonl(tmp_path / "chats.jsonl", [{"messages": turn * 2}])  # two turns
    with pytest.raises(
        InvalidRecordError, match="chats.jsonl:1: each_turn: .*assistant turn 2 with 1 trained span"
    ):
        _rows(path, tok_dir, each_turn=True, threads=1)


def test_cli_each_turn(tmp_path, tok, capsys):
    _, tok_dir = tok
    path = write_jsonl(tmp_path / "chats.jsonl", chats(20, seed=8))
    out = tmp_path / "tokens"
    argv = ["tokenize", str(path), "-o", str(out), "--tokenizer", str(tok_dir)]
    assert main(argv + ["--each-turn"]) == 0
    assert "sequences of 20 records (tree kind)" in capsys.readouterr().out
    manifest = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    assert manifest["sample_kind"] == "tree" and manifest["config"]["each_turn"] is True
    assert manifest["counts"]["samples_out"] == len(_prefixes(chats(20, seed=8)))
    # Without it: SFT shards, and a config (the cache key) without the option.
    assert main(argv + ["--force"]) == 0
    manifest = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    assert manifest["sample_kind"] == "sft" and "each_turn" not in manifest["config"]
    assert "completions" not in manifest["config"]["columns"]


def test_an_empty_render_is_named_as_without_each_turn(tmp_path):
    """A chat the template renders as no text is rejected, with a turn or without (was: an
    error object in place of the chat's texts)."""
    assistant_only = (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}{% generation %}"
        "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% endif %}{% endfor %}"
    )
    tok_dir = build_tokenizer(tmp_path / "tok", assistant_only)
    path = write_jsonl(tmp_path / "chats.jsonl", [{"messages": [{"role": "user", "content": "a"}]}])
    for each_turn in (False, True):
        with pytest.raises(
            InvalidRecordError, match="chats.jsonl:1: the chat template rendered an empty"
        ):
            _rows(path, tok_dir, each_turn=each_turn, threads=1)
