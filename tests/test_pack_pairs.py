"""Packing preference pairs and KTO records, and carrying per-sample columns.

Pairs come from preference token shards (``PREFERENCE_SCHEMA``) written here from generated
prompts and completions; every packed output is read back and checked against them: each pair
packed once (or listed as dropped), never split across rows, chosen before rejected in one row,
its tokens and labels those of the input (a prefix of each completion when truncated), rows
within max_len.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokpack
from tokpack import ConfigError, DataError, OverlongError, SchemaError
from tokpack.cli import main
from tokpack.errors import CorruptOutputError
from tokpack.packed.integrity import pair_problem
from tokpack.tokenize import PREFERENCE_SCHEMA, TOKEN_SCHEMA

IGNORE = -100
ROLES = {"separate": [1, 2], "shared-prompt": [3, 1, 2]}


def gen_pairs(rng: random.Random, n: int, longest: int = 40):
    """(prompt, chosen completion, rejected completion) token lists, completions non-empty."""
    out = []
    for _ in range(n):
        prompt = [rng.randrange(1000) for _ in range(rng.randint(1, longest))]
        c = [rng.randrange(1000) for _ in range(rng.randint(1, longest))]
        r = [rng.randrange(1000) for _ in range(rng.randint(1, longest))]
        out.append((prompt, c, r))
    return out


def pair_table(pairs, **extra) -> pa.Table:
    cols = {}
    for k, role in ((1, "chosen"), (2, "rejected")):
        cols[f"{role}_input_ids"] = [p + x[k] for x in pairs for p in [x[0]]]
        cols[f"{role}_labels"] = [[IGNORE] * len(x[0]) + x[k] for x in pairs]
    cols["prompt_length"] = [len(x[0]) for x in pairs]
    cols["length"] = [2 * len(x[0]) + len(x[1]) + len(x[2]) for x in pairs]
    table = pa.table(cols, schema=PREFERENCE_SCHEMA)
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values))
    return table


def write_pairs(path: Path, pairs, row_group_size: int = 16, **extra) -> Path:
    pq.write_table(pair_table(pairs, **extra), path, row_group_size=row_group_size)
    return path


def rows_of(out: Path):
    files = sorted(out.glob("part-*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def check_pairs(out: Path, pairs, max_len: int, layout: str):
    """Every invariant of a packed preference output; returns (packed ids, truncated ids)."""
    manifest = tokpack.verify(out)
    assert manifest["ok"]
    seen, truncated = [], []
    width = len(ROLES[layout])
    for row in rows_of(out):
        assert row["num_tokens"] == len(row["input_ids"]) == sum(row["seq_lengths"]) <= max_len
        assert row["seq_roles"] == ROLES[layout] * row["num_pairs"]
        assert row["num_seqs"] == len(row["seq_lengths"]) == width * row["num_pairs"]
        assert sum(row["seq_loss_tokens"]) == row["num_loss_tokens"]
        pos = 0
        for k in range(row["num_pairs"]):
            ids = row["sample_ids"][k * width : (k + 1) * width]
            assert len(set(ids)) == 1
            prompt, chosen, rejected = pairs[ids[0]]
            segs = []
            for n in row["seq_lengths"][k * width : (k + 1) * width]:
                segs.append((row["input_ids"][pos : pos + n], row["labels"][pos : pos + n]))
                pos += n
            if layout == "separate":
                (ct, cl), (rt, rl) = segs
                p = len(prompt)
                assert ct[:p] == rt[:p] == prompt and cl[:p] == rl[:p] == [IGNORE] * p
                got_c, got_r, labels_c, labels_r = ct[p:], rt[p:], cl[p:], rl[p:]
            else:
                (pt, pl), (got_c, labels_c), (got_r, labels_r) = segs
                assert pt == prompt and pl == [IGNORE] * len(prompt)
            assert got_c == chosen[: len(got_c)] == labels_c and len(got_c) >= 1
            assert got_r == rejected[: len(got_r)] == labels_r and len(got_r) >= 1
            if (len(got_c), len(got_r)) != (len(chosen), len(rejected)):
                truncated.append(ids[0])
            seen.append(ids[0])
        assert pos == row["num_tokens"]
    assert len(seen) == len(set(seen))  # never twice, never split across rows
    return seen, truncated


def dropped_ids(out: Path):
    with pa.memory_map(str(out / "__tokpack__" / "_dropped.arrow")) as f:
        return pa.ipc.open_file(f).read_all().column("sample_id").to_pylist()


def footprint(pair, layout):
    p, c, r = (len(x) for x in pair)
    return (2 * p if layout == "separate" else p) + c + r


@pytest.mark.parametrize("layout", ["separate", "shared-prompt"])
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 60),
    max_len=st.integers(8, 120),
    overlong=st.sampled_from(["truncate", "drop"]),
    strategy=st.sampled_from(["bfd", "ffd", "next_fit", "padding"]),
)
def test_every_pair_once_whole_and_in_order(
    tmp_path_factory, layout, seed, n, max_len, overlong, strategy
):
    pairs = gen_pairs(random.Random(seed), n)
    tmp = tmp_path_factory.mktemp("pairs")
    src = write_pairs(tmp / "p.parquet", pairs)
    out = tmp / "out"
    m = tokpack.pack_files(
        src, out, max_len, overlong=overlong, strategy=strategy, pair_layout=layout, threads=1
    )
    seen, truncated = check_pairs(out, pairs, max_len, layout)
    dropped = dropped_ids(out)
    assert sorted(seen + dropped) == list(range(n))
    fits = [i for i, x in enumerate(pairs) if footprint(x, layout) <= max_len]
    f = m["figures"]
    assert m["sample_kind"] == "preference" and m["config"]["pair_layout"] == layout
    assert f["samples_in"] == n and f["samples_split"] == 0
    assert f["samples_packed"] + f["samples_truncated"] + f["samples_dropped"] == n
    assert f["samples_dropped"] == len(dropped) and f["samples_truncated"] == len(truncated)
    if overlong == "drop":
        assert sorted(seen) == fits and not truncated
    else:
        # Truncation keeps every pair whose prompt(s) leave room for a token of each completion.
        prompts = 2 if layout == "separate" else 1
        keep = [i for i, x in enumerate(pairs) if prompts * len(x[0]) + 2 <= max_len]
        assert sorted(seen) == keep and set(truncated) == set(keep) - set(fits)


def test_truncation_fills_the_row_by_water_level(tmp_path):
    pairs = [([1] * 10, [2] * 30, [3] * 5)]
    src = write_pairs(tmp_path / "p.parquet", pairs)
    for layout, (c, r) in (("separate", (15, 5)), ("shared-prompt", (25, 5))):
        out = tmp_path / layout
        m = tokpack.pack_files(src, out, 40, overlong="truncate", pair_layout=layout)
        (row,) = rows_of(out)
        completions = row["seq_lengths"][-2:]
        if layout == "separate":
            completions = [x - 10 for x in completions]
        assert completions == [c, r] and row["num_tokens"] == 40
        assert m["figures"]["samples_truncated"] == 1
        assert row["num_loss_tokens"] == c + r == sum(row["seq_loss_tokens"])


@pytest.mark.parametrize("layout", ["separate", "shared-prompt"])
def test_threads_give_identical_bytes(tmp_path, layout):
    pairs = gen_pairs(random.Random(7), 700)
    src = [write_pairs(tmp_path / f"p{i}.parquet", pairs[i::2], row_group_size=50) for i in (0, 1)]
    outs = []
    for threads in (1, 2, 3):
        out = tmp_path / f"out{threads}"
        tokpack.pack_files(
            src,
            out,
            256,
            pair_layout=layout,
            threads=threads,
            row_group_rows=16,
            rows_per_shard=40,
            overlong="truncate",
            carry=["prompt_length"],
        )
        outs.append(
            {f.name: f.read_bytes() for f in sorted(out.rglob("*.*")) if "manifest" not in f.name}
        )
    assert outs[0] == outs[1] == outs[2]


def test_overlong_error_names_file_and_row(tmp_path):
    pairs = gen_pairs(random.Random(1), 30, longest=10)
    pairs[17] = ([5] * 10, [6] * 30, [7] * 3)
    src = write_pairs(tmp_path / "p.parquet", pairs, row_group_size=8)
    with pytest.raises(OverlongError, match=r"p\.parquet, row 17: sample 17 has 53 tokens"):
        tokpack.pack_files(src, tmp_path / "out", 50)
    # In the shared-prompt layout the same pair takes 43 tokens: it fits.
    m = tokpack.pack_files(src, tmp_path / "out", 50, pair_layout="shared-prompt")
    assert m["figures"]["samples_packed"] == 30


def test_pairs_are_never_cut(tmp_path):
    src = write_pairs(tmp_path / "p.parquet", gen_pairs(random.Random(2), 5))
    with pytest.raises(ConfigError, match="split.*preference pair"):
        tokpack.pack_files(src, tmp_path / "out", 64, overlong="split")
    with pytest.raises(ConfigError, match="random.*never cut"):
        tokpack.pack_files(src, tmp_path / "out", 64, strategy="random")
    with pytest.raises(ConfigError, match='unknown pair layout "interleaved"'):
        tokpack.pack_files(src, tmp_path / "out", 64, pair_layout="interleaved")
    assert not (tmp_path / "out").exists()


def test_shared_prompt_must_be_shared(tmp_path):
    pairs = gen_pairs(random.Random(3), 20, longest=8)
    table = pair_table(pairs)
    rejected = table.column("rejected_input_ids").to_pylist()
    rejected[13][0] += 1  # the rejected sequence's prompt differs at its first token
    table = table.set_column(2, "rejected_input_ids", pa.array(rejected, pa.list_(pa.int32())))
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=5)
    with pytest.raises(
        DataError, match=r"p\.parquet, row group 2, row 3, column \"rejected_input_ids\": differs"
    ):
        tokpack.pack_files(
            tmp_path / "p.parquet", tmp_path / "out", 64, pair_layout="shared-prompt"
        )
    # The separate layout writes each whole sequence: nothing needs to be shared.
    tokpack.pack_files(tmp_path / "p.parquet", tmp_path / "out", 64)


@pytest.mark.parametrize(
    "prompt_length, layout, message",
    [
        (99, "separate", "is 99, not between 0 and the shorter"),
        (-1, "separate", "is -1, not between 0"),
        (0, "shared-prompt", "is 0: the shared-prompt layout needs a prompt"),
    ],
)
def test_bad_prompt_length_named(tmp_path, prompt_length, layout, message):
    pairs = gen_pairs(random.Random(4), 6, longest=8)
    table = pair_table(pairs)
    lengths = table.column("prompt_length").to_pylist()
    lengths[4] = prompt_length
    table = table.set_column(4, "prompt_length", pa.array(lengths, pa.int32()))
    pq.write_table(table, tmp_path / "p.parquet")
    match = rf"p\.parquet, row group 0, row 4, column \"prompt_length\": {message}"
    with pytest.raises(DataError, match=match):
        tokpack.pack_files(tmp_path / "p.parquet", tmp_path / "out", 64, pair_layout=layout)


def test_empty_completion_pair_is_dropped_as_empty(tmp_path):
    pairs = gen_pairs(random.Random(5), 4, longest=6)
    pairs[2] = (pairs[2][0], pairs[2][1], [])
    src = write_pairs(tmp_path / "p.parquet", pairs)
    m = tokpack.pack_files(src, tmp_path / "out", 64)
    assert m["figures"]["samples_empty"] == 1 and dropped_ids(tmp_path / "out") == [2]
    with pa.memory_map(str(tmp_path / "out/__tokpack__/_dropped.arrow")) as f:
        assert pa.ipc.open_file(f).read_all().column("reason").to_pylist() == ["empty"]


def test_verify_checks_the_pairs(tmp_path):
    pairs = gen_pairs(random.Random(6), 40)
    src = write_pairs(tmp_path / "p.parquet", pairs)
    for layout in ("separate", "shared-prompt"):
        out = tmp_path / layout
        tokpack.pack_files(src, out, 256, pair_layout=layout)
        assert tokpack.verify(out)["ok"]
        table = pq.read_table(out / "part-00000.parquet")
        cols = {
            name: (
                (
                    np.asarray(table.column(name).combine_chunks().flatten()),
                    np.asarray(table.column(name).combine_chunks().offsets),
                )
                if pa.types.is_list(table.schema.field(name).type)
                else table.column(name).to_numpy()
            )
            for name in ("seq_roles", "seq_lengths", "sample_ids", "num_pairs")
        }
        assert pair_problem(cols, layout) is None
        roles, offsets = cols["seq_roles"]
        swapped = roles.copy()
        swapped[[0, 1]] = swapped[[1, 0]]
        assert "not" in pair_problem({**cols, "seq_roles": (swapped, offsets)}, layout)
        ids, id_offsets = cols["sample_ids"]
        other = ids.copy()
        other[1] += 1
        assert "different sample ids" in pair_problem(
            {**cols, "sample_ids": (other, id_offsets)}, layout
        )
        assert "num_pairs" in pair_problem({**cols, "num_pairs": cols["num_pairs"] + 1}, layout)
    # A damaged shard is found by its checksums.
    shard = tmp_path / "separate" / "part-00000.parquet"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptOutputError):
        tokpack.verify(tmp_path / "separate")


def test_mixed_kinds_and_layout_on_sft_are_refused(tmp_path):
    src = write_pairs(tmp_path / "p.parquet", gen_pairs(random.Random(8), 3))
    sft = tmp_path / "s.parquet"
    pq.write_table(
        pa.table(
            {"input_ids": [[1, 2, 3]], "labels": [[1, 2, 3]], "length": [3]}, schema=TOKEN_SCHEMA
        ),
        sft,
    )
    with pytest.raises(ConfigError, match="mix kinds of samples"):
        tokpack.pack_files([src, sft], tmp_path / "out", 64)
    with pytest.raises(ConfigError, match='pair_layout "shared-prompt" applies to preference'):
        tokpack.pack_files(sft, tmp_path / "out", 64, pair_layout="shared-prompt")


# --- carried columns ---------------------------------------------------------------------------


def sft_table(n: int, rng: random.Random, **extra) -> pa.Table:
    ids = [[rng.randrange(500) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    table = pa.table(
        {"input_ids": ids, "labels": ids, "length": [len(x) for x in ids]}, schema=TOKEN_SCHEMA
    )
    for name, values in extra.items():
        table = table.append_column(name, values)
    return table


@pytest.mark.parametrize("overlong", ["split", "truncate"])
def test_carry_keeps_type_and_value_per_segment(tmp_path, overlong):
    rng = random.Random(9)
    n = 80
    extra = {
        "source": pa.array([rng.choice(["a", "bb", "ccc"]) for _ in range(n)]),
        "weight": pa.array([rng.random() for _ in range(n)], pa.float32()),
        "score": pa.array([rng.randrange(-5, 5) for _ in range(n)], pa.int16()),
        "keep": pa.array([rng.random() < 0.5 for _ in range(n)]),
    }
    table = sft_table(n, rng, **extra)
    pq.write_table(table, tmp_path / "s.parquet", row_group_size=16)
    out = tmp_path / "out"
    m = tokpack.pack_files(tmp_path / "s.parquet", out, 20, overlong=overlong, carry=list(extra))
    assert m["config"]["carry"] == list(extra) and tokpack.verify(out)["ok"]
    schema = pq.read_schema(out / "part-00000.parquet")
    for name, values in extra.items():
        assert schema.field(name).type.value_type == values.type
    for row in rows_of(out):
        for name, values in extra.items():
            want = [values[s].as_py() for s in row["sample_ids"]]
            assert row[name] == want


def test_kto_label_is_carried(tmp_path):
    rng = random.Random(10)
    n = 50
    labels = [rng.random() < 0.5 for _ in range(n)]
    table = sft_table(n, rng)
    kto = pa.schema(
        list(TOKEN_SCHEMA) + [("prompt_length", pa.int32()), ("label", pa.bool_())],
        metadata={b"tokpack.kind": b"kto"},
    )
    table = pa.table(
        {
            **{c: table.column(c) for c in TOKEN_SCHEMA.names},
            "prompt_length": pa.array([0] * n, pa.int32()),
            "label": labels,
        },
        schema=kto,
    )
    pq.write_table(table, tmp_path / "k.parquet")
    m = tokpack.pack_files(tmp_path / "k.parquet", tmp_path / "out", 64, carry=["prompt_length"])
    assert m["sample_kind"] == "kto" and m["config"]["carry"] == ["label", "prompt_length"]
    seen = []
    for row in rows_of(tmp_path / "out"):
        assert row["label"] == [labels[s] for s in row["sample_ids"]]
        assert "seq_roles" not in row
        seen += row["sample_ids"]
    assert sorted(seen) == list(range(n))


def test_bad_carry_columns_named(tmp_path):
    rng = random.Random(11)
    n = 20
    nulls = pa.array([None if i == 13 else 1.0 for i in range(n)], pa.float64())
    lists = pa.array([[i] for i in range(n)])
    pq.write_table(sft_table(n, rng, w=nulls, l=lists), tmp_path / "s.parquet", row_group_size=5)
    src, out = tmp_path / "s.parquet", tmp_path / "out"
    with pytest.raises(SchemaError, match=r"s\.parquet: no column \"missing\""):
        tokpack.pack_files(src, out, 64, carry=["missing"])
    with pytest.raises(
        SchemaError, match=r"s\.parquet, column \"l\": cannot carry a column of type List"
    ):
        tokpack.pack_files(src, out, 64, carry=["l"])
    with pytest.raises(DataError, match=r"s\.parquet, row group 2, row 3, column \"w\": is null"):
        tokpack.pack_files(src, out, 64, carry=["w"])
    with pytest.raises(ConfigError, match="list of column names"):
        tokpack.pack_files(src, out, 64, carry="w")
    assert not out.exists()


def test_cli_packs_pairs_with_carry(tmp_path, capsys):
    pairs = gen_pairs(random.Random(12), 30)
    write_pairs(tmp_path / "p.parquet", pairs, source=[f"s{i % 3}" for i in range(30)])
    out = tmp_path / "out"
    argv = ["pack", str(tmp_path / "p.parquet"), "-o", str(out), "--max-len", "100"]
    argv += ["--pair-layout", "shared-prompt", "--carry", "source", "--overlong", "drop", "--quiet"]
    assert main(argv) == 0
    seen, _ = check_pairs(out, pairs, 100, "shared-prompt")
    for row in rows_of(out):
        assert row["source"] == [f"s{s % 3}" for s in row["sample_ids"]]
    assert (
        main(
            ["pack", str(tmp_path / "p.parquet"), "-o", str(tmp_path / "o2"), "--overlong", "split"]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokpack pack: error:") and "split" in err[0]


def pairs_of_shards(tokens: Path):
    """(prompt, chosen completion, rejected completion) of each row of preference token shards."""
    table = pq.read_table(sorted(tokens.glob("part-*.parquet")))
    out = []
    for row in table.to_pylist():
        p = row["prompt_length"]
        c, r = row["chosen_input_ids"], row["rejected_input_ids"]
        out.append((c[:p], c[p:], r[p:]))
    return out


def test_one_step_pack_of_preference_records(tmp_path):
    from ._tokenizer_factory import CHATML_GEN, build_tokenizer, write_jsonl
    from .test_tokenize_preference import preference_records

    tok = build_tokenizer(tmp_path / "tok", CHATML_GEN)
    path = write_jsonl(tmp_path / "pref.jsonl", preference_records("conversational")[:120])
    tokens = tmp_path / "tokens"
    tokpack.tokenize_files(path, tokens, tok, threads=1)
    pairs = pairs_of_shards(tokens)
    for layout in ("separate", "shared-prompt"):
        kw = dict(pair_layout=layout, overlong="truncate", threads=1)
        one = tokpack.pack_files(path, tmp_path / f"one-{layout}", 160, tokenizer=tok, **kw)
        two = tokpack.pack_files(tokens, tmp_path / f"two-{layout}", 160, **kw)
        assert one["sample_kind"] == "preference" and one["figures"] == {
            **two["figures"],
            "wall_time_s": one["figures"]["wall_time_s"],
        }
        assert rows_of(tmp_path / f"one-{layout}") == rows_of(tmp_path / f"two-{layout}")
        check_pairs(tmp_path / f"one-{layout}", pairs, 160, layout)
    # overlong="error": the first pair too long for a row is named by its JSONL line, even when
    # each of its sequences fits.
    longest = max(len(p) + max(len(c), len(r)) for p, c, r in pairs)
    first = next(i for i, x in enumerate(pairs) if footprint(x, "separate") > longest)
    with pytest.raises(OverlongError, match=rf"pref\.jsonl:{first + 1}: pair of \d+ tokens"):
        tokpack.pack_files(path, tmp_path / "err", longest, tokenizer=tok)


# -- record fields carried through tokenizing (issue 20, item 17) ------------------------------


def _shard_bytes(out: Path):
    return [f.read_bytes() for f in sorted(out.glob("part-*.parquet"))]


@pytest.fixture(scope="module")
def carry_corpus(tmp_path_factory):
    """A tokenizer and SFT, preference and KTO records, each with a string ``source`` and an
    integer ``n`` field (and a float ``score`` on the SFT ones)."""
    from ._tokenizer_factory import CHATML_GEN, build_tokenizer, conversations, write_jsonl
    from .test_tokenize_preference import kto_records, preference_records

    root = tmp_path_factory.mktemp("carry")
    tok = build_tokenizer(root / "tok", CHATML_GEN)
    rng = random.Random(4)
    sft = [
        {"messages": m, "source": rng.choice(["wiki", "code"]), "n": i, "score": rng.random()}
        for i, m in enumerate(conversations(150, seed=3))
    ]
    paths = {"sft": write_jsonl(root / "chat.jsonl", sft)}
    for kind, records in (("preference", preference_records("conversational")[:80]),):
        paths[kind] = write_jsonl(
            root / f"{kind}.jsonl",
            [{**r, "source": f"s{i % 3}", "n": i} for i, r in enumerate(records)],
        )
    kto = [{**r, "source": f"k{i % 2}", "n": i} for i, r in enumerate(kto_records("standard")[:80])]
    paths["kto"] = write_jsonl(root / "kto.jsonl", kto)
    return tok, paths


@pytest.mark.parametrize(
    "kind, layout",
    [
        ("sft", "separate"),
        ("preference", "separate"),
        ("preference", "shared-prompt"),
        ("kto", "separate"),
    ],
)
def test_one_step_pack_carries_record_fields_as_tokenize_then_pack(
    carry_corpus, tmp_path, kind, layout
):
    """`pack --tokenizer --carry source n` tokenized everything, then failed naming the deleted
    staged file (`.spill/tokenized.arrow: no column "source"`). The fields now travel through
    tokenizing: the packed shards are the bytes of `tokenize --carry` then `pack --carry`, for
    every layout and thread count (KTO's label is carried either way)."""
    tok, paths = carry_corpus
    carry = ["source", "n"] + (["label"] if kind == "kto" else [])
    kw = dict(carry=carry, overlong="drop", pair_layout=layout)
    tokens = tmp_path / "tokens"
    tokpack.tokenize_files(paths[kind], tokens, tok, threads=1, carry=["source", "n"])
    two = tokpack.pack_files(tokens, tmp_path / "two", 256, **kw)
    for threads in (1, 2):
        one = tokpack.pack_files(
            paths[kind], tmp_path / f"one-{threads}", 256, tokenizer=tok, threads=threads, **kw
        )
        assert one["sample_kind"] == two["sample_kind"] == kind
        assert one["config"]["carry"] == two["config"]["carry"]
        assert _shard_bytes(tmp_path / f"one-{threads}") == _shard_bytes(tmp_path / "two")
    rows = rows_of(tmp_path / "two")
    # One value per segment: the record's (here each record is one sample, its n its id).
    assert rows and all(
        r["n"] == r["sample_ids"] == [int(s) for s in r["sample_ids"]] for r in rows
    )
    assert all(len(r["source"]) == len(r["sample_ids"]) for r in rows)


def test_carried_record_fields_in_token_shards(carry_corpus, tmp_path, capsys):
    tok, paths = carry_corpus
    out = tmp_path / "tokens"
    args = ["tokenize", str(paths["sft"]), "-o", str(out), "--tokenizer", str(tok), "--quiet"]
    assert main([*args, "--carry", "source", "score", "n"]) == 0
    manifest = tokpack.tokenize_files(paths["sft"], out, tok, carry=["source", "score", "n"])
    assert manifest["cache_hit"] and manifest["config"]["carry"] == ["source", "score", "n"]
    assert {k: manifest["columns"][k] for k in ("source", "score", "n")} == {
        "source": "string",
        "score": "double",
        "n": "int64",
    }
    table = pq.read_table(sorted(out.glob("part-*.parquet")))
    assert table.column("n").to_pylist() == list(range(150))
    # Without carry nothing changes: no carry key in the config, the Rust records path.
    plain = tokpack.tokenize_files(paths["sft"], tmp_path / "plain", tok)
    assert "carry" not in plain["config"] and plain["renderer"].get("records") == "rust"
    other = pq.read_table(sorted((tmp_path / "plain").glob("part-*.parquet")))
    assert other.equals(table.select(other.column_names))


@pytest.mark.parametrize(
    "record, message",
    [
        ({"source": None}, "carried field 'source' is null"),
        ({}, "carried field 'source' is missing"),
        ({"source": ["a"]}, "carried field 'source' must be a bool, number or string, got list"),
        ({"source": 2**64}, "carried field 'source' is an integer beyond 64 bits"),
    ],
)
def test_a_record_without_a_carried_value_is_invalid(tmp_path, carry_corpus, record, message):
    from ._tokenizer_factory import write_jsonl

    tok, _ = carry_corpus
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    good = {"messages": chat, "source": "a"}
    path = write_jsonl(tmp_path / "in.jsonl", [good, {"messages": chat, **record}, good])
    with pytest.raises(tokpack.InvalidRecordError, match=rf"in\.jsonl:2: {re.escape(message)}"):
        tokpack.tokenize_files(path, tmp_path / "out", tok, carry=["source"])
    manifest = tokpack.tokenize_files(
        path, tmp_path / "skip", tok, carry=["source"], skip_invalid=True
    )
    assert manifest["counts"]["rejected"] == 1 and manifest["counts"]["samples_out"] == 2


def test_a_carried_field_has_one_type_and_no_token_column_name(tmp_path, carry_corpus):
    from ._tokenizer_factory import write_jsonl

    tok, _ = carry_corpus
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    records = [{"messages": chat, "source": "a"}] * 3 + [{"messages": chat, "source": 7}]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    with pytest.raises(
        tokpack.InvalidRecordError,
        match=r"in\.jsonl:4: carried field 'source' is of type int64, not string as at .*\.jsonl:1",
    ):
        tokpack.tokenize_files(path, tmp_path / "out", tok, carry=["source"], batch_size=2)
    for name in ("length", "labels", "source_line"):
        # labels is also a column of packed shards: refused as reserved first.
        refused = "is a column of packed shards" if name == "labels" else "would replace a column"
        with pytest.raises(ConfigError, match=f"carry: '{name}' {refused}"):
            tokpack.pack_files(path, tmp_path / "packed", 64, tokenizer=tok, carry=[name])
    assert not (tmp_path / "packed").exists()


@pytest.mark.parametrize("name", ["num_tokens", "sample_ids", "seq_roles", "label"])
def test_a_carried_column_may_not_take_an_output_columns_name(tmp_path, name):
    """Fails on the code before issue 20 (item 4): `--carry num_tokens` wrote a shard with two
    columns of that name (exit 0), and `--carry seq_roles` on SFT data fed the pair readers."""
    rng = random.Random(12)
    n = 20
    extra = pa.array(list(range(n)), pa.int32())
    pq.write_table(sft_table(n, rng, **{name: extra}), tmp_path / "s.parquet")
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=f"carry: '{name}' is a column of packed shards"):
        tokpack.pack_files(tmp_path / "s.parquet", out, 64, carry=[name])
    assert not out.exists()
    assert main(["pack", str(tmp_path / "s.parquet"), "-o", str(out), "--max-len", "64",
                 "--carry", name]) == 2  # fmt: skip
    assert not out.exists()
