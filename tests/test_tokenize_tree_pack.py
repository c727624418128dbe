"""End to end: GRPO records and per-turn chats tokenized into tree token shards, then packed by
``tokpack pack`` as prefix trees: every sequence packed once, each group's shared prefix
computed once per row (forward tokens fewer than the same sequences packed flat), the
per-completion values carried."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import tokpack
import tokpack.kinds
from tokpack.cli import main
from tokpack.kinds import kind_of_shards

from ._tokenizer_factory import CHATML_GEN, build_tokenizer, write_jsonl
from .test_tokenize_tree import grpo_records
from .test_tokenize_tree_turns import chats

pytest.importorskip("tokenizers")
# The tree sample kind is the core's (SampleKind::Tree); until a build has it, nothing to test.
pytestmark = pytest.mark.skipif(
    "tree" not in tokpack.kinds.SAMPLE_KINDS, reason="this build has no tree sample kind"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "t", CHATML_GEN)


def _packed(tokens, out, tokenized, **options):
    manifest = tokpack.pack_files(tokens, out, 512, **options)
    assert manifest["sample_kind"] == "tree"
    f = manifest["figures"]
    assert f["samples_in"] == f["tree_sequences"] == tokenized["counts"]["samples_out"]
    assert f["samples_packed"] == f["samples_in"]
    assert f["tree_forward_tokens"] < f["tree_flat_tokens"] == tokenized["counts"]["tokens"]
    return manifest


def test_grpo_records_pack_as_prefix_trees(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "grpo.jsonl", grpo_records(80, "conversational", seed=11))
    tokens = tmp_path / "tokens"
    tokenized = tokpack.tokenize_files(path, tokens, tok_dir, threads=1)
    assert kind_of_shards(sorted(tokens.glob("part-*.parquet"))) == "tree"
    manifest = _packed(tokens, tmp_path / "packed", tokenized, carry=["reward", "advantage"])
    table = pq.read_table(tmp_path / "packed")
    assert {"reward", "advantage", "sample_ids"} <= set(table.column_names)
    rewards = [x for r in grpo_records(80, "conversational", seed=11) for x in r["rewards"]]
    by_sample = {}
    for ids, values in zip(
        table.column("sample_ids").to_pylist(), table.column("reward").to_pylist()
    ):
        by_sample.update(zip(ids, values))
    assert [by_sample[i] for i in range(len(rewards))] == rewards
    assert manifest["figures"]["tree_token_ratio"] < 1.0


def test_each_turn_chats_pack_as_prefix_trees_from_the_cli(tmp_path, tok_dir, capsys):
    path = write_jsonl(tmp_path / "chats.jsonl", chats(80, seed=12))
    tokens, packed = tmp_path / "tokens", tmp_path / "packed"
    argv = ["tokenize", str(path), "-o", str(tokens), "--tokenizer", str(tok_dir), "--each-turn"]
    assert main(argv + ["--quiet"]) == 0
    tokenized = json.loads((tokens / "__tokpack__" / "_manifest.json").read_text())
    assert main(["pack", str(tokens), "-o", str(packed), "--max-len", "512"]) == 0
    capsys.readouterr()
    manifest = json.loads((packed / "__tokpack__" / "_manifest.json").read_text())
    f = manifest["figures"]
    assert manifest["sample_kind"] == "tree"
    assert f["tree_sequences"] == tokenized["counts"]["samples_out"]
    assert f["tree_forward_tokens"] < f["tree_flat_tokens"]


@pytest.mark.parametrize("source", ["grpo", "each_turn"])
def test_one_step_pack_of_tree_records_packs_prefix_trees(tmp_path, tok_dir, source):
    # A one-step pack (tokenizer=) of GRPO records or per-turn chats took its kind from the
    # record format alone: it packed them flat, as SFT samples, the trees lost.
    if source == "grpo":
        path = write_jsonl(tmp_path / "r.jsonl", grpo_records(40, "conversational", seed=13))
        tokenize = {}
    else:
        path = write_jsonl(tmp_path / "r.jsonl", chats(40, seed=14))
        tokenize = {"each_turn": True}
    manifest = tokpack.pack_files(
        path, tmp_path / "packed", 512, tokenizer=tok_dir, tokenize=tokenize, threads=1
    )
    assert manifest["sample_kind"] == "tree"
    f = manifest["figures"]
    assert f["samples_packed"] == f["tree_sequences"] > 40
    assert f["tree_forward_tokens"] < f["tree_flat_tokens"]
    tokpack.verify(tmp_path / "packed")
