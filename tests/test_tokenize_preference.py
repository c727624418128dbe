"""Preference (DPO-style) and KTO records: ids, labels and prompt lengths equal TRL's own
preprocessing for each of TRL's dataset shapes; bad records are named; a run writes one kind of
token shard, which ``pack`` packs pair by pair (or carrying KTO's label).

The reference is TRL's trainers' dataset preparation itself, ``DPOTrainer._prepare_dataset`` and
``KTOTrainer._prepare_dataset`` (TRL 1.16: ``extract_prompt``, EOS text on string completions,
``apply_chat_template`` / the tokenizer on the prompt and on prompt + completion, the prompt cut
at ``common_prefix_length``), run unbound on a ``datasets.Dataset``: no model is needed.
"""

from __future__ import annotations

import json
import random
import shutil
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack import ConfigError, InvalidRecordError, OverlongError
from tokpack.cli import main
from tokpack.tokenize import KTO_SCHEMA, PREFERENCE_SCHEMA, TOKEN_SCHEMA, tokenize_to_batches
from tokpack.tokenize.schema import KIND_KEY, describe
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

N = 300  # records per shape


@pytest.fixture(scope="module", params=[CHATML_GEN, CHATML_PLAIN], ids=["markers", "plain"])
def tok_dir(request, tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "t", request.param)


def _turns(rng: random.Random, n_exchanges: int):
    out = []
    if rng.random() < 0.3:
        out.append({"role": "system", "content": sentence(rng, rng.randint(2, 8))})
    for _ in range(n_exchanges):
        out.append({"role": "user", "content": sentence(rng, rng.randint(1, 12))})
        out.append({"role": "assistant", "content": sentence(rng, rng.randint(1, 15))})
    return out[:-1]  # ends with the user's turn: the prompt


def _answer(rng: random.Random):
    return [{"role": "assistant", "content": sentence(rng, rng.randint(1, 20))}]


def _text(rng: random.Random) -> str:
    # Prompts and completions whose boundary falls inside or outside words, with and without
    # spaces, so tokens merge across it (the case TRL's common-prefix cut is for).
    text = sentence(rng, rng.randint(1, 15))
    return rng.choice(["", " ", "\n"]) + text + rng.choice(["", " ", ":"])


def preference_records(shape: str, seed: int = 3):
    rng = random.Random(seed)
    out = []
    for _ in range(N):
        if shape == "standard":
            out.append({"prompt": _text(rng), "chosen": _text(rng), "rejected": _text(rng)})
        elif shape == "standard_implicit":
            prompt = sentence(rng, rng.randint(1, 10))
            out.append({"chosen": prompt + " " + _text(rng), "rejected": prompt + " " + _text(rng)})
        else:
            prompt = _turns(rng, rng.randint(1, 3))
            chosen, rejected = _answer(rng), _answer(rng)
            if shape == "conversational":
                out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
            elif shape == "implicit":
                out.append({"chosen": prompt + chosen, "rejected": prompt + rejected})
            else:  # UltraFeedback: a string prompt beside whole conversations
                full = {"chosen": prompt + chosen, "rejected": prompt + rejected}
                out.append({"prompt": prompt[-1]["content"], **full})
    return out


def kto_records(shape: str, seed: int = 5):
    rng = random.Random(seed)
    out = []
    for _ in range(N):
        if shape == "standard":
            prompt, completion = _text(rng), _text(rng)
        else:
            prompt, completion = _turns(rng, rng.randint(1, 3)), _answer(rng)
        out.append({"prompt": prompt, "completion": completion, "label": rng.random() < 0.5})
    return out


def _reference_tokenizer(tok_dir):
    hf = hf_tokenizer(tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    hf.chat_template = config["chat_template"]
    return hf


def trl_dpo(records, tok_dir):
    """TRL's DPO preprocessing of ``records``: prompt_ids, chosen_ids, rejected_ids each."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl", reason="trl is the reference for preference tokenizing")
    hf = _reference_tokenizer(tok_dir)
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    trainer = SimpleNamespace(_tokenizer=hf)
    dataset = datasets.Dataset.from_list(records)
    if "prompt" in records[0] and isinstance(records[0]["prompt"], str) != isinstance(
        records[0]["chosen"], str
    ):
        # DPOTrainer extracts the prompt only without a prompt column; its data utility
        # maybe_extract_prompt (what the shape is for) sets the string prompt aside first.
        dataset = dataset.map(trl.maybe_extract_prompt, remove_columns=["prompt"])
    prepared = trl.DPOTrainer._prepare_dataset(trainer, dataset, hf, args, "train")
    return [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in prepared]


def trl_kto(records, tok_dir):
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl", reason="trl is the reference for KTO tokenizing")
    hf = _reference_tokenizer(tok_dir)
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    trainer = SimpleNamespace(_tokenizer=hf, calculate_KL=False)
    prepared = trl.KTOTrainer._prepare_dataset(
        trainer, datasets.Dataset.from_list(records), hf, args, "eval"
    )
    return [(r["prompt_ids"], r["completion_ids"], r["label"]) for r in prepared]


def _rows(path, tok_dir, **options):
    stream = tokenize_to_batches(path, tok_dir, **options)
    table = pa.Table.from_batches(list(stream), schema=stream.encoding.schema())
    return table.to_pylist(), stream


def _expected_sequence(prompt_ids, completion_ids):
    return prompt_ids + completion_ids, [-100] * len(prompt_ids) + completion_ids


SHAPES = ["standard", "standard_implicit", "conversational", "implicit", "string_prompt"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("encoder", ["auto", "tokenizers"])
def test_preference_equals_trl(tmp_path, tok_dir, shape, encoder):
    records = preference_records(shape)
    path = write_jsonl(tmp_path / "pref.jsonl", records)
    rows, stream = _rows(path, tok_dir, encoder=encoder, threads=1, batch_size=64)
    assert stream.encoding.options.format == "preference"  # detected from the first record
    want = trl_dpo(records, tok_dir)
    assert len(rows) == len(want) == N
    for row, (prompt_ids, chosen_ids, rejected_ids) in zip(rows, want):
        ids, labels = _expected_sequence(prompt_ids, chosen_ids)
        assert (row["chosen_input_ids"], row["chosen_labels"]) == (ids, labels)
        ids, labels = _expected_sequence(prompt_ids, rejected_ids)
        assert (row["rejected_input_ids"], row["rejected_labels"]) == (ids, labels)
        assert row["prompt_length"] == len(prompt_ids)
        assert row["length"] == len(row["chosen_input_ids"]) + len(row["rejected_input_ids"])
    counts = stream.stats
    assert counts.records == counts.samples_in == counts.samples_out == N
    assert counts.formats == {"preference": N}
    assert counts.tokens == sum(r["length"] for r in rows)


def test_standard_pairs_get_the_tokenizers_special_tokens(tmp_path, tok_dir):
    """Strings are encoded with the tokenizer's special tokens, as TRL's ``tokenizer(text)``:
    here a BOS token the post-processor adds (tokpack's encoder leaves such text to
    tokenizers); an empty prompt is the BOS token alone."""
    from tokenizers import Tokenizer, processors

    bos_dir = tmp_path / "bos"
    shutil.copytree(tok_dir, bos_dir)
    tok = Tokenizer.from_file(str(bos_dir / "tokenizer.json"))
    bos = "<|endoftext|>"
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
            ),
        ]
    )
    tok.save(str(bos_dir / "tokenizer.json"))
    records = preference_records("standard", seed=8)[:100]
    records[0] = {**records[0], "prompt": ""}
    path = write_jsonl(tmp_path / "pref.jsonl", records)
    rows, _ = _rows(path, bos_dir, threads=1)
    want = trl_dpo(records, bos_dir)
    assert want[0][0] == [tok.token_to_id(bos)]
    for row, (prompt_ids, chosen_ids, rejected_ids) in zip(rows, want):
        assert row["chosen_input_ids"] == prompt_ids + chosen_ids
        assert row["rejected_labels"] == [-100] * len(prompt_ids) + rejected_ids


@pytest.mark.parametrize("shape", ["standard", "conversational"])
def test_kto_equals_trl(tmp_path, tok_dir, shape):
    records = kto_records(shape)
    path = write_jsonl(tmp_path / "kto.jsonl", records)
    rows, stream = _rows(path, tok_dir, threads=1, batch_size=64)
    assert stream.encoding.options.format == "kto"
    want = trl_kto(records, tok_dir)
    assert len(rows) == len(want) == N
    for row, (prompt_ids, completion_ids, label) in zip(rows, want):
        ids, labels = _expected_sequence(prompt_ids, completion_ids)
        assert (row["input_ids"], row["labels"]) == (ids, labels)
        assert row["prompt_length"] == len(prompt_ids) and row["length"] == len(ids)
        assert row["label"] is label


def test_threads_and_parquet_give_the_same_rows(tmp_path, tok_dir):
    records = preference_records("conversational", seed=9)[:120]
    jsonl = write_jsonl(tmp_path / "pref.jsonl", records)
    parquet = tmp_path / "pref.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    one, _ = _rows(jsonl, tok_dir, threads=1, batch_size=16)
    two, _ = _rows(jsonl, tok_dir, threads=2, batch_size=16)
    rows, _ = _rows(parquet, tok_dir, threads=2, batch_size=16)
    assert one == two == rows


def _shard_schema(shard):
    """Columns, types and tokpack kind of a shard (or schema); Parquet renames list items."""
    schema = shard if isinstance(shard, pa.Schema) else pq.read_schema(shard)
    return describe(schema), (schema.metadata or {}).get(KIND_KEY)


def test_shards_manifest_and_pair_packing(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "pref.jsonl", preference_records("conversational")[:50])
    out = tmp_path / "tokens"
    manifest = tokpack.tokenize_files(path, out, tok_dir, shard_rows=20, threads=1)
    assert manifest["sample_kind"] == "preference" and manifest["config"]["format"] == "preference"
    assert list(manifest["columns"]) == PREFERENCE_SCHEMA.names
    shards = sorted(out.glob("part-*.parquet"))
    assert [s["rows"] for s in manifest["shards"]] == [20, 20, 10] and len(shards) == 3
    assert _shard_schema(shards[0]) == _shard_schema(PREFERENCE_SCHEMA)
    # pack packs pairs as units (tests/test_pack_pairs.py), never as SFT sequences.
    packed = tokpack.pack_files(out, tmp_path / "packed", 512)
    assert packed["sample_kind"] == "preference" and packed["figures"]["samples_in"] == 50
    # Pair columns without tokpack's metadata are pairs too.
    bare = tmp_path / "bare.parquet"
    pq.write_table(pq.read_table(shards[0]).replace_schema_metadata(None), bare)
    assert tokpack.pack_files(bare, tmp_path / "bare", 512)["sample_kind"] == "preference"


def test_kto_shards_and_cli_pack(tmp_path, tok_dir, capsys):
    path = write_jsonl(tmp_path / "kto.jsonl", kto_records("standard")[:30])
    out = tmp_path / "tokens"
    assert main(["tokenize", str(path), "-o", str(out), "--tokenizer", str(tok_dir)]) == 0
    shard = out / "part-00000.parquet"
    assert _shard_schema(shard) == _shard_schema(KTO_SCHEMA)
    assert main(["pack", str(out), "-o", str(tmp_path / "packed"), "--max-len", "128"]) == 0
    assert "label" in pq.read_schema(tmp_path / "packed" / "part-00000.parquet").names


def test_sft_shards_unchanged(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": _turns(random.Random(0), 1)}])
    out = tmp_path / "tokens"
    manifest = tokpack.tokenize_files(path, out, tok_dir)
    assert manifest["sample_kind"] == "sft"
    assert _shard_schema(out / "part-00000.parquet") == _shard_schema(TOKEN_SCHEMA)


# --- bad records ------------------------------------------------------------------------------

GOOD = {"prompt": "a question", "chosen": " yes", "rejected": " no"}
CHAT = [{"role": "user", "content": "hi"}]

BAD = [
    ({"prompt": "q", "chosen": " yes"}, "preference", "missing field 'rejected'"),
    ({"prompt": "q", "chosen": 3, "rejected": " no"}, "preference", "'chosen' must be a string"),
    (
        {"prompt": "q", "chosen": " yes", "rejected": [{"role": "assistant", "content": "no"}]},
        "preference",
        "'chosen', 'rejected' must all be strings or all lists of messages",
    ),
    ({"prompt": 5, "chosen": " yes", "rejected": " no"}, "preference", "'prompt' must be a string"),
    ({"prompt": "q", "chosen": "", "rejected": " no"}, "preference", "'chosen' is empty"),
    ({"prompt": CHAT, "chosen": [], "rejected": CHAT}, "preference", "empty conversation"),
    (
        {"prompt": CHAT, "chosen": [{"role": "robot", "content": "x"}], "rejected": CHAT},
        "preference",
        "chosen\\[0\\] has unknown role 'robot'",
    ),
    ({"chosen": "yes", "rejected": "no"}, "preference", "share no prompt"),
    ({"messages": CHAT}, "preference", "missing field 'chosen'"),
    ({"prompt": "q", "completion": " a", "label": "yes"}, "kto", "'label' must be true or false"),
    ({"prompt": "q", "completion": " a"}, "kto", "missing field 'label'"),
    ({"prompt": CHAT, "completion": " a", "label": True}, "kto", "all be strings or all lists"),
]


@pytest.mark.parametrize("record, fmt, reason", BAD)
def test_bad_record_named(tmp_path, tok_dir, record, fmt, reason):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD if fmt == "preference" else KTO_GOOD, record])
    with pytest.raises(InvalidRecordError, match=f"bad.jsonl:2: .*{reason}") as info:
        list(tokenize_to_batches(path, tok_dir, format=fmt, threads=1))
    assert info.value.line == 2


KTO_GOOD = {"prompt": "q", "completion": " a", "label": False}


def test_mixed_kinds_are_rejected_and_counted(tmp_path, tok_dir):
    """A run is of one kind (from its first record): records of another kind and bad ones go
    to the rejected-records file, counted; every record is accounted for."""
    sft = {"messages": CHAT + [{"role": "assistant", "content": "hello"}]}
    lines = [GOOD, sft, {"prompt": "q", "chosen": " yes"}, KTO_GOOD, GOOD]
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    out = tmp_path / "tokens"
    manifest = tokpack.tokenize_files(path, out, tok_dir, skip_invalid=True, threads=1)
    counts = manifest["counts"]
    assert (counts["records"], counts["rejected"], counts["samples_out"]) == (5, 3, 2)
    rejected = [json.loads(r) for r in (out / REJECTED_NAME).read_text().splitlines()]
    assert [(r["line"], r["error"]) for r in rejected] == [
        (2, "missing field 'chosen'"),
        (3, "missing field 'rejected'"),
        (4, "missing field 'chosen'"),
    ]
    assert all(r["file"] == str(path) and r["raw"] for r in rejected)
    # The other way round: preference records in an SFT run are named as such.
    path = write_jsonl(tmp_path / "sft.jsonl", [sft, GOOD])
    with pytest.raises(InvalidRecordError, match="sft.jsonl:2: a preference record among SFT"):
        list(tokenize_to_batches(path, tok_dir, threads=1))


def test_overlong_pairs(tmp_path, tok_dir):
    records = preference_records("conversational", seed=4)[:100]
    path = write_jsonl(tmp_path / "pref.jsonl", records)
    full, _ = _rows(path, tok_dir, threads=1)
    max_len = sorted(len(r["chosen_input_ids"]) for r in full)[50]
    with pytest.raises(OverlongError, match="pref.jsonl:\\d+: sample of"):
        _rows(path, tok_dir, threads=1, max_len=max_len)
    dropped, stream = _rows(path, tok_dir, threads=1, max_len=max_len, overlong="drop")
    fits = [
        r for r in full if max(len(r["chosen_input_ids"]), len(r["rejected_input_ids"])) <= max_len
    ]
    assert dropped == fits and stream.stats.dropped == len(full) - len(fits)
    cut, stream = _rows(path, tok_dir, threads=1, max_len=max_len, overlong="truncate")
    # As TRL's keep_start: each sequence keeps its first max_len tokens; a pair whose prompt
    # alone fills max_len is dropped.
    want = [
        {
            **r,
            **{
                f"{role}_{col}": r[f"{role}_{col}"][:max_len]
                for role in ("chosen", "rejected")
                for col in ("input_ids", "labels")
            },
        }
        for r in full
        if r["prompt_length"] < max_len
    ]
    for r in want:
        r["length"] = len(r["chosen_input_ids"]) + len(r["rejected_input_ids"])
    assert cut == want
    stats = stream.stats
    assert stats.truncated + stats.dropped == stats.overlong and stats.samples_out == len(want)
    with pytest.raises(ConfigError, match="'split' cannot apply to preference"):
        _rows(path, tok_dir, threads=1, max_len=max_len, overlong="split")
    with pytest.raises(ConfigError, match="train_on 'all' does not apply to preference"):
        _rows(path, tok_dir, threads=1, train_on="all")
