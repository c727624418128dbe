"""The tree kind on object storage: tree token shards read from ``s3://``, the packed tree
directory written to ``s3://`` and trained from there keep the local path's bytes and batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tokpack
from tokpack.torch import PackedDataset
from tokpack.tree import PackedTreeCollator

from .test_tree_packed import MAX_LEN, corpus, write_tree_shards

pytestmark = pytest.mark.skipif(
    "tree" not in tokpack.kinds.SAMPLE_KINDS, reason="this build has no tree sample kind"
)
BUCKET = "tokpack-test/trees"


def test_tree_kind_from_and_to_object_storage(s3_env, tmp_path):
    shards = write_tree_shards(tmp_path / "trees", corpus(seed=3), n_files=2)
    for f in sorted(shards.glob("*.parquet")):
        with s3_env.open_output_stream(f"{BUCKET}/tokens/{f.name}") as out:
            out.write(f.read_bytes())
    local = tokpack.pack_files([shards], tmp_path / "local", MAX_LEN, row_group_rows=3)
    remote = tokpack.pack_files(
        f"s3://{BUCKET}/tokens/", f"s3://{BUCKET}/packed", MAX_LEN, row_group_rows=3
    )
    assert remote["sample_kind"] == local["sample_kind"] == "tree"
    timing = ("wall_time_s",)
    figures = [{k: v for k, v in m["figures"].items() if k not in timing} for m in (remote, local)]
    assert figures[0] == figures[1]
    for path in sorted((tmp_path / "local").glob("part-*.parquet")):
        with s3_env.open_input_stream(f"{BUCKET}/packed/{path.name}") as f:
            assert f.read() == path.read_bytes(), path.name
    collate = PackedTreeCollator()
    here = PackedDataset(tmp_path / "local")
    there = PackedDataset(f"s3://{BUCKET}/packed", cache_dir=tmp_path / "cache")
    assert len(here) == len(there)
    a = collate([here[i] for i in range(len(here))])
    b = collate([there[i] for i in range(len(there))])
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
    tokpack.verify(f"s3://{BUCKET}/packed")
    assert Path(tmp_path / "local").exists()
