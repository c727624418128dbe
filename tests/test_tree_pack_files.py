"""Tree token shards packed on disk as prefix trees (``sample_kind: "tree"``): every sequence's
path in its row reproduces its tokens, the row arrays are consistent, every sample is accounted
for, the bytes do not depend on the thread count, and what cannot be packed as trees is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack.errors import ConfigError, DataError, OutputExistsError, OverlongError, SchemaError

IGNORE = -100


def grpo_groups(
    rng: np.random.Generator,
    groups: int,
    size: int,
    prompt: tuple,
    completion: tuple,
    vocab: int = 50,
) -> List[Dict[str, Any]]:
    """Rows of GRPO-like groups: one prompt each, ``size`` completions after it (prompt
    untrained), a few of them identical or a prefix of another; rows shuffled."""
    rows = []
    for g in range(groups):
        p = rng.integers(1, vocab, rng.integers(*prompt)).tolist()
        completions = [
            rng.integers(1, vocab, rng.integers(*completion)).tolist() for _ in range(size)
        ]
        if size >= 3:
            completions[1] = list(completions[0])  # identical
            completions[2] = completions[0][: max(1, len(completions[0]) // 2)]  # a prefix
        for c in completions:
            ids = p + c
            labels = [IGNORE] * len(p) + c
            rows.append(
                dict(input_ids=ids, labels=labels, group=g * 7 + 3, reward=float(rng.random()))
            )
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def write_shard(
    path: Path,
    rows: Sequence[Dict[str, Any]],
    kind: Optional[str] = "tree",
    group_type: Any = None,
) -> Path:
    table = pa.table(
        {
            "input_ids": pa.array([r["input_ids"] for r in rows], pa.list_(pa.int32())),
            "labels": pa.array([r["labels"] for r in rows], pa.list_(pa.int32())),
            "length": pa.array([len(r["input_ids"]) for r in rows], pa.int32()),
            "group": pa.array([r["group"] for r in rows], group_type or pa.int64()),
            "reward": pa.array([r.get("reward", 0.0) for r in rows], pa.float64()),
        }
    )
    if kind is not None:
        table = table.replace_schema_metadata({"tokpack.kind": kind})
    pq.write_table(table, path, row_group_size=7)
    return path


def read_rows(out: Path) -> pa.Table:
    shards = sorted(out.glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(s) for s in shards])


def check_rows(
    out: Path,
    rows: Sequence[Dict[str, Any]],
    max_len: int,
    has_labels: bool = True,
    max_path: Optional[int] = None,
) -> Dict[str, Any]:
    """Asserts the theorems of tree rows against the input ``rows`` (truncated to ``max_path``,
    default ``max_len``); returns the manifest."""
    cap = max_len if max_path is None else max_path
    manifest = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    assert manifest["sample_kind"] == "tree"
    table = read_rows(out).to_pylist()
    seen: Dict[int, int] = {}
    for r, row in enumerate(table):
        ids = row["input_ids"]
        n_tokens, n_nodes = len(ids), len(row["tree_node_parent"])
        assert row["num_tokens"] == n_tokens <= max_len
        assert row["num_seqs"] == len(row["sample_ids"]) == len(row["tree_seq_end_node"])
        assert row["sample_ids"] == sorted(row["sample_ids"])
        assert len(row["tree_node"]) == n_tokens
        parent, depth = row["tree_node_parent"], row["tree_node_depth"]
        tin, tout, nlen = row["tree_node_tin"], row["tree_node_tout"], row["tree_node_len"]
        for u in range(n_nodes):
            assert row["tree_node"][tin[u] : tin[u] + nlen[u]] == [u] * nlen[u]
            assert tin[u] + nlen[u] <= tout[u] <= n_tokens
            p = parent[u]
            if p == -1:
                assert depth[u] == 0
            else:
                assert p < u and depth[u] == depth[p] + nlen[p]
                assert tin[p] < tin[u] and tout[u] <= tout[p]  # intervals nest
        offsets = np.cumsum([0] + row["seq_loss_tokens"])
        assert row["num_loss_tokens"] == offsets[-1] == len(row["tree_target_pred"])
        weights = np.zeros(len(row["tree_pred_pos"]), dtype=np.int64)
        groups_of_node: Dict[int, set] = {}
        for i, (s, end) in enumerate(zip(row["sample_ids"], row["tree_seq_end_node"])):
            assert s not in seen, f"sample {s} in rows {seen.get(s)} and {r}"
            seen[s] = r
            path = []
            u = end
            while u != -1:
                path.append(u)
                groups_of_node.setdefault(u, set()).add(row["group"][i])
                u = parent[u]
            path.reverse()
            tokens = [t for u in path for t in ids[tin[u] : tin[u] + nlen[u]]]
            want = rows[s]["input_ids"][:cap]
            assert tokens == want, f"sample {s}"
            assert row["seq_lengths"][i] == len(want)
            assert row["group"][i] == rows[s]["group"]
            if "reward" in row:
                assert row["reward"][i] == rows[s]["reward"]
            # Its targets: each trained token j >= 1, scored at the position of token j - 1.
            positions = [tin[u] + k for u in path for k in range(nlen[u])]
            labels = rows[s]["labels"][:cap] if has_labels else want
            expected = [
                (positions[j - 1], want[j]) for j in range(1, len(want)) if labels[j] != IGNORE
            ]
            preds = row["tree_target_pred"][offsets[i] : offsets[i + 1]]
            got = [(row["tree_pred_pos"][p], row["tree_pred_token"][p]) for p in preds]
            assert got == expected, f"sample {s}"
            weights[preds] += 1
        assert weights.tolist() == row["tree_pred_weight"]
        assert all(len(g) == 1 for g in groups_of_node.values()), "groups share a node"
    dropped = pa.ipc.open_file(str(out / "__tokpack__" / "_dropped.arrow")).read_all()
    dropped_ids = set(dropped.column("sample_id").to_pylist())
    assert set(seen) | dropped_ids == set(range(len(rows)))
    assert not set(seen) & dropped_ids
    return manifest


@pytest.fixture
def grpo(tmp_path: Path) -> List[Dict[str, Any]]:
    return grpo_groups(
        np.random.default_rng(7), groups=9, size=5, prompt=(5, 30), completion=(1, 25)
    )


def test_tree_shards_pack_into_rows_whose_paths_are_the_sequences(tmp_path: Path, grpo) -> None:
    src = write_shard(tmp_path / "in.parquet", grpo)
    manifest = tokpack.pack_files(
        src, tmp_path / "out", 64, carry=["reward"], rows_per_shard=3, row_group_rows=2
    )
    check_rows(tmp_path / "out", grpo, 64)
    f = manifest["figures"]
    assert f["samples_in"] == f["samples_packed"] == f["tree_sequences"] == len(grpo)
    assert f["tree_forward_tokens"] == f["tokens"] < f["tree_flat_tokens"]
    assert f["tree_flat_tokens"] == sum(len(r["input_ids"]) for r in grpo)
    assert f["tree_token_ratio"] == pytest.approx(f["tokens"] / f["tree_flat_tokens"])
    assert manifest["config"]["carry"] == ["group", "reward"]
    assert manifest["has_labels"] is False
    schema = pq.read_schema(tmp_path / "out" / "part-00000.parquet")
    assert "labels" not in schema.names and schema.names[-2:] == ["group", "reward"]


def test_trees_larger_than_a_row_are_cut_into_pieces(tmp_path: Path) -> None:
    rows = grpo_groups(
        np.random.default_rng(3), groups=4, size=8, prompt=(10, 20), completion=(10, 30)
    )
    src = write_shard(tmp_path / "in.parquet", rows)
    manifest = tokpack.pack_files(src, tmp_path / "out", 60, strategy="ffd", row_group_rows=3)
    check_rows(tmp_path / "out", rows, 60)
    f = manifest["figures"]
    assert f["tree_pieces"] > 4  # every group's tree is larger than a row


def test_edge_groups(tmp_path: Path) -> None:
    """A group of one sequence, identical sequences, a sequence that is a prefix of another
    (ending at an internal node), a group whose only sequence is empty (dropped)."""
    seqs = [
        ([1, 2, 3], 0),
        ([1, 2, 3], 1),
        ([1, 2, 3], 1),
        ([1, 2], 1),
        ([1, 2, 3, 4, 5], 1),
        ([], 2),
        ([9], 3),
        ([1, 2], 1),
        ([4, 5, 6], 1),
    ]
    rows = [dict(input_ids=s, labels=s, group=g) for s, g in seqs]
    src = write_shard(tmp_path / "in.parquet", rows)
    manifest = tokpack.pack_files(src, tmp_path / "out", 8)
    check_rows(tmp_path / "out", rows, 8)
    assert manifest["figures"]["samples_empty"] == 1
    dropped = pa.ipc.open_file(str(tmp_path / "out" / "__tokpack__" / "_dropped.arrow")).read_all()
    assert dropped.column("reason").to_pylist() == ["empty"]


def test_bytes_do_not_depend_on_threads(tmp_path: Path, grpo) -> None:
    src = write_shard(tmp_path / "in.parquet", grpo)
    outs = []
    for threads in (1, 2):
        out = tmp_path / f"out{threads}"
        tokpack.pack_files(
            src, out, 48, threads=threads, rows_per_shard=4, row_group_rows=2, overlong="truncate"
        )
        outs.append(out)
    files = sorted(
        p.relative_to(outs[0])
        for p in outs[0].rglob("*")
        if p.is_file() and "manifest" not in p.name
    )
    assert len(files) > 4
    for name in files:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_no_sharing_packs_as_many_tokens_as_flat(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rows = [
        dict(input_ids=[i + 1] + rng.integers(1, 50, 9).tolist(), labels=[IGNORE] * 10, group=i % 4)
        for i in range(20)
    ]
    src = write_shard(tmp_path / "in.parquet", rows)
    manifest = tokpack.pack_files(src, tmp_path / "out", 40)
    check_rows(tmp_path / "out", rows, 40)
    f = manifest["figures"]
    assert f["tree_forward_tokens"] == f["tree_flat_tokens"] == 200
    assert f["tree_token_ratio"] == 1.0 and f["loss_tokens"] == 0


def test_overlong_policies(tmp_path: Path, grpo) -> None:
    src = write_shard(tmp_path / "in.parquet", grpo)
    longest = max(len(r["input_ids"]) for r in grpo)
    with pytest.raises(OverlongError, match=r"in\.parquet"):
        tokpack.pack_files(src, tmp_path / "err", longest - 1)
    m = tokpack.pack_files(src, tmp_path / "trunc", 30, overlong="truncate")
    check_rows(tmp_path / "trunc", grpo, 30)
    n_long = sum(len(r["input_ids"]) > 30 for r in grpo)
    assert n_long > 0 and m["figures"]["samples_truncated"] == n_long
    m = tokpack.pack_files(src, tmp_path / "drop", 30, overlong="drop")
    check_rows(tmp_path / "drop", grpo, 30)
    assert m["figures"]["samples_dropped"] == n_long
    dropped = pa.ipc.open_file(str(tmp_path / "drop" / "__tokpack__" / "_dropped.arrow")).read_all()
    assert set(dropped.column("reason").to_pylist()) == {"overlong"}


def test_without_labels_every_token_but_the_first_is_trained(tmp_path: Path, grpo) -> None:
    src = tmp_path / "in.parquet"
    table = pq.read_table(write_shard(src, grpo)).drop_columns(["labels"])
    pq.write_table(table, src)
    tokpack.pack_files(src, tmp_path / "out", 64)
    check_rows(tmp_path / "out", grpo, 64, has_labels=False)


def test_tree_group_packs_plain_shards_as_trees(tmp_path: Path, grpo) -> None:
    rows = [dict(r, prompt_id=r["group"]) for r in grpo]
    src = write_shard(tmp_path / "in.parquet", rows, kind=None)
    flat = tokpack.pack_files(src, tmp_path / "flat", 64)
    assert flat["sample_kind"] == "sft"
    m = tokpack.pack_files(src, tmp_path / "out", 64, tree_group="group", tree_min_shared=4)
    assert m["config"]["tree_group"] == "group" and m["config"]["tree_min_shared"] == 4
    check_rows(tmp_path / "out", rows, 64)
    assert m["figures"]["tokens"] < flat["figures"]["tokens"]


def test_refusals(tmp_path: Path, grpo) -> None:
    src = write_shard(tmp_path / "in.parquet", grpo)
    for fields, match in [
        (dict(overlong="split"), "split"),
        (dict(strategy="random"), "random"),
        (dict(max_segments_per_row=4), "max_segments_per_row"),
        (dict(align_segments=2), "align_segments"),
        (dict(carry=["tree_node"]), "reserved"),
    ]:
        with pytest.raises(ConfigError, match=match):
            tokpack.pack_files(src, tmp_path / "out", 64, **fields)
    assert not (tmp_path / "out").exists()
    bad = write_shard(
        tmp_path / "bad.parquet",
        [dict(r, group=float(r["group"])) for r in grpo],
        group_type=pa.float64(),
    )
    with pytest.raises(SchemaError, match=r"bad\.parquet.*group"):
        tokpack.pack_files(bad, tmp_path / "out", 64)
    shifted = [dict(r, labels=r["input_ids"][1:] + [IGNORE]) for r in grpo]
    with pytest.raises(tokpack.errors.DataError, match=r"shifted\.parquet.*labels"):
        tokpack.pack_files(write_shard(tmp_path / "shifted.parquet", shifted), tmp_path / "out", 64)


def test_pack_tokens_refuses_trees(grpo) -> None:
    ids = [r["input_ids"] for r in grpo]
    table = pa.table({"input_ids": ids, "group": list(range(len(ids)))})
    table = table.replace_schema_metadata({"tokpack.kind": "tree"})
    with pytest.raises(ConfigError, match="pack_tokens"):
        tokpack.pack_tokens(table, 64)
    with pytest.raises(ConfigError, match="pack_tokens"):
        tokpack.pack_tokens(
            [r["input_ids"] for r in grpo], config=tokpack.PackConfig(64, tree_group="group")
        )
    with pytest.raises(ConfigError, match="pack_tokens"):
        tokpack.pack_tokens(
            [r["input_ids"] for r in grpo], config=tokpack.PackConfig(64, tree_max_path=8)
        )


def test_export_refuses_trees(tmp_path: Path, grpo) -> None:
    from tokpack.packed.export import export_megatron

    tokpack.pack_files(write_shard(tmp_path / "in.parquet", grpo), tmp_path / "out", 64)
    with pytest.raises(ConfigError, match="tree samples"):
        export_megatron(tmp_path / "out", tmp_path / "mega")


def test_ray_refuses_trees(tmp_path: Path, grpo) -> None:
    pytest.importorskip("ray")
    from tokpack.ray._blocks import file_columns

    src = write_shard(tmp_path / "in.parquet", grpo)
    with pytest.raises(ConfigError, match="tree samples"):
        file_columns([src], tokpack.PackConfig(64))


def test_output_already_there(tmp_path: Path, grpo) -> None:
    src = write_shard(tmp_path / "in.parquet", grpo)
    first = tokpack.pack_files(src, tmp_path / "out", 64)
    again = tokpack.pack_files(src, tmp_path / "out", 64)
    assert not first["cache_hit"] and again["cache_hit"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "mine.txt").write_text("not tokpack's")
    with pytest.raises(OutputExistsError):
        tokpack.pack_files(src, other, 64)
    assert (other / "mine.txt").read_text() == "not tokpack's"


def test_cli_summary_shows_forward_against_flat(tmp_path: Path, grpo, capsys) -> None:
    from tokpack.cli import main

    src = write_shard(tmp_path / "in.parquet", grpo)
    args = [
        "pack",
        str(src),
        "-o",
        str(tmp_path / "out"),
        "--max-len",
        "64",
        "--tree-min-shared",
        "2",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "forward tokens vs flat" in out


def test_tree_max_path_caps_each_sequence_below_the_row(tmp_path: Path, grpo) -> None:
    # The second cap: rows of max_len tokens, each root-to-leaf path (the model's context) at
    # most tree_max_path.
    src = write_shard(tmp_path / "in.parquet", grpo)
    n_long = sum(len(r["input_ids"]) > 20 for r in grpo)
    assert 0 < n_long < len(grpo)
    with pytest.raises(DataError, match=r"in\.parquet.*tree_max_path=20"):
        tokpack.pack_files(src, tmp_path / "err", 64, tree_max_path=20)
    assert not (tmp_path / "err").exists()
    m = tokpack.pack_files(src, tmp_path / "trunc", 64, tree_max_path=20, overlong="truncate")
    check_rows(tmp_path / "trunc", grpo, 64, max_path=20)
    assert m["figures"]["samples_truncated"] == n_long
    assert m["config"]["tree_max_path"] == 20
    m = tokpack.pack_files(src, tmp_path / "drop", 64, tree_max_path=20, overlong="drop")
    check_rows(tmp_path / "drop", grpo, 64, max_path=20)
    assert m["figures"]["samples_dropped"] == n_long
    # Rows still hold more than one path's worth of tokens.
    assert max(read_rows(tmp_path / "drop").column("num_tokens").to_pylist()) > 20
    with pytest.raises(ConfigError, match="tree_max_path"):
        tokpack.PackConfig(64, tree_max_path=65)
    sft = tmp_path / "sft.parquet"
    pq.write_table(pq.read_table(src).drop_columns(["group"]).replace_schema_metadata(None), sft)
    with pytest.raises(ConfigError, match="tree_max_path=20 caps the paths of prefix trees"):
        tokpack.pack_files(sft, tmp_path / "sft", 64, tree_max_path=20)
    from tokpack.cli import main

    out = tmp_path / "cli"
    assert (
        main(
            [
                "pack",
                str(src),
                "-o",
                str(out),
                "--max-len",
                "64",
                "--tree-max-path",
                "20",
                "--overlong",
                "drop",
                "--quiet",
            ]
        )
        == 0
    )
    check_rows(out, grpo, 64, max_path=20)
