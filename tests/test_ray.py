"""``tokpack.ray`` on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``): global
mode writes ``tokpack pack``'s bytes whatever the nodes and blocks; local mode accounts for
every sample within the any-fit bound; killed workers and drivers lose nothing."""

import filecmp
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'tokpack[ray]'")
pytest.importorskip("ray.data", reason="ray[data] is not installed: pip install 'tokpack[ray]'")

import tokpack  # noqa: E402
import tokpack.ray  # noqa: E402
from tokpack._io.outdir import read_manifest  # noqa: E402
from tokpack.ray._local import groups_of  # noqa: E402
from tokpack.ray._runner import RayRunner  # noqa: E402
from tokpack.ray._shards import take  # noqa: E402

from .packed_corpus import random_samples  # noqa: E402

pytestmark = pytest.mark.ray

MAX_LEN = 96
LAYOUT = {"rows_per_shard": 40, "row_group_rows": 16, "overlong": "drop"}
FILE_SIZES = (150, 260, 90)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One Ray cluster for the module: a head node of one CPU; tests add nodes."""
    from ray.cluster_utils import Cluster

    faults = tmp_path_factory.mktemp("faults")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    ray.init(
        address=c.address,
        runtime_env={
            "worker_process_setup_hook": "tests._ray_faults.install",
            # Workers import the hook from this checkout before the driver's sys.path is set.
            "env_vars": {
                "TOKPACK_TEST_FAULTS": str(faults),
                "PYTHONPATH": os.pathsep.join(
                    [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]
                ),
            },
        },
        logging_level=logging.WARNING,
        log_to_driver=False,
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    # Datasets consumed here keep their order (tokpack.ray.pack sets it for its own reads).
    context.execution_options.preserve_order = True
    yield c, faults
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three token shards (with labels, over-long and empty samples) and their ``tokpack pack``
    output."""
    root = tmp_path_factory.mktemp("corpus")
    files, tables = [], []
    for i, n in enumerate(FILE_SIZES):
        tokens, labels = random_samples(n, MAX_LEN + 20, seed=i)
        tokens[3], labels[3] = tokens[3][:0], labels[3][:0]
        table = pa.table(
            {
                "input_ids": pa.array(tokens, pa.list_(pa.int32())),
                "labels": pa.array(labels, pa.list_(pa.int32())),
            }
        )
        path = root / f"tokens-{i}.parquet"
        pq.write_table(table, path, row_group_size=64)
        files.append(path)
        tables.append(table)
    reference = tokpack.pack_files(files, root / "reference", MAX_LEN, **LAYOUT)
    return root, files, pa.concat_tables(tables), reference


def blocks(table, sizes):
    """A dataset of ``table`` cut into blocks of ``sizes`` rows (the rest in a last block)."""
    cuts = np.cumsum([0, *sizes])
    parts = [table.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]
    parts.append(table.slice(int(cuts[-1])))
    return ray.data.from_arrow([p for p in parts if p.num_rows])


def assert_same_shards(out: Path, reference_dir: Path, reference: dict) -> dict:
    manifest = read_manifest(out)
    assert [s["file"] for s in manifest["shards"]] == [s["file"] for s in reference["shards"]]
    assert manifest["shards"] == reference["shards"]
    for s in reference["shards"]:
        for key in ("file", "index"):
            assert filecmp.cmp(out / s[key], reference_dir / s[key], shallow=False), s[key]
    figures = {k: v for k, v in manifest["figures"].items() if k != "wall_time_s"}
    assert figures == {k: v for k, v in reference["figures"].items() if k != "wall_time_s"}
    listed = {s["file"] for s in manifest["shards"]} | {"__tokpack__"}
    assert set(os.listdir(out)) == listed  # nothing left by tasks
    return manifest


def dropped(out: Path) -> pa.Table:
    return pa.ipc.open_file(out / "__tokpack__" / "_dropped.arrow").read_all()


def test_global_mode_writes_tokpack_packs_bytes_on_1_2_3_nodes(cluster, corpus, tmp_path):
    c, _ = cluster
    root, files, table, reference = corpus
    layouts = [(), (7, 200, 1), (100, 100, 100, 100, 100)]
    for nodes, sizes in zip((1, 2, 3), layouts):
        while len(ray.nodes()) < nodes:
            c.add_node(num_cpus=1)
        c.wait_for_nodes()
        out = tmp_path / f"nodes-{nodes}"
        tokpack.ray.pack(blocks(table, sizes), out, MAX_LEN, **LAYOUT)
        assert_same_shards(out, root / "reference", reference)
        got, want = dropped(out), dropped(root / "reference")
        assert got.column("sample_id").equals(want.column("sample_id"))
        assert got.column("reason").equals(want.column("reason"))
    # Read from the files, the dropped list names each sample's file and row as tokpack pack.
    ds = ray.data.read_parquet([str(f) for f in files], include_paths=True)
    tokpack.ray.pack(ds, tmp_path / "files", MAX_LEN, **LAYOUT)
    assert_same_shards(tmp_path / "files", root / "reference", reference)
    got, want = dropped(tmp_path / "files"), dropped(root / "reference")
    assert got.column("row").equals(want.column("row"))
    assert [Path(f).resolve() for f in got.column("file").to_pylist()] == [
        Path(f).resolve() for f in want.column("file").to_pylist()
    ]


def accounted(out: Path, n: int) -> None:
    """Every sample id in ``0..n`` is packed (whole or in pieces) or listed as dropped, once."""
    packed = tokpack.PackedDataset(out)
    seen = np.concatenate([packed[i]["sample_ids"].numpy() for i in range(len(packed))])
    ids = np.unique(seen)
    listed = dropped(out).column("sample_id").to_numpy()
    assert len(np.intersect1d(ids, listed)) == 0
    assert np.array_equal(np.union1d(ids, listed), np.arange(n))
    assert tokpack.verify(out)["ok"]


def test_global_output_is_read_by_packed_dataset_verify_and_read_packed(cluster, corpus, tmp_path):
    _, _, table, reference = corpus
    tokpack.ray.pack(blocks(table, (128, 128)), tmp_path / "out", MAX_LEN, **LAYOUT)
    accounted(tmp_path / "out", table.num_rows)
    ds = tokpack.ray.read_packed(tmp_path / "out")
    assert ds.count() == reference["figures"]["rows"]
    from tokpack.torch import PackedCollator

    collate = tokpack.ray.rows_collate(PackedCollator(format="hf"))
    batches = ds.iter_torch_batches(batch_size=16, collate_fn=collate)
    assert sum(b["input_ids"].shape[-1] for b in batches) == reference["figures"]["tokens"]


def test_local_mode_accounts_for_every_sample_within_the_any_fit_bound(cluster, corpus, tmp_path):
    _, _, table, reference = corpus
    sizes = (70, 70, 70, 70, 70, 70)
    manifest = tokpack.ray.pack(
        blocks(table, sizes),
        tmp_path / "out",
        MAX_LEN,
        mode="local",
        min_block_samples=128,
        **LAYOUT,
    )
    accounted(tmp_path / "out", table.num_rows)
    f = manifest["figures"]
    assert f["samples_in"] == table.num_rows
    assert f["samples_dropped"] == reference["figures"]["samples_dropped"]
    # Best-fit decreasing is any-fit: in each group, no two rows could be merged, so a group
    # of T tokens uses fewer than 2T/max_len + 1 rows; and no packing beats the lower bound.
    lengths = np.array([len(x) for x in table.column("input_ids").to_pylist()])
    kept = np.where(lengths <= MAX_LEN, lengths, 0)
    block_sizes = [*sizes, table.num_rows - sum(sizes)]
    bases = np.cumsum([0, *block_sizes])
    bound = 0
    for a, b in groups_of(block_sizes, 128):
        tokens = int(kept[bases[a] : bases[b]].sum())
        bound += int(np.ceil(2 * tokens / MAX_LEN + 1)) - 1
    assert reference["figures"]["lower_bound"] <= f["rows"] <= bound


def test_local_mode_with_one_group_is_the_global_plan(cluster, corpus, tmp_path):
    root, _, table, reference = corpus
    out = tmp_path / "out"
    tokpack.ray.pack(
        blocks(table, (100, 100)), out, MAX_LEN, mode="local", min_block_samples=10**6, **LAYOUT
    )
    for s in reference["shards"]:
        for key in ("file", "index"):
            assert filecmp.cmp(out / s[key], root / "reference" / s[key], shallow=False)


@pytest.mark.parametrize("mode", ["global", "local"])
def test_static_shape_figures_are_tokpack_packs(cluster, corpus, tmp_path, mode):
    # A segment cap and aligned segments add max_row_segments / alignment_padding_tokens to
    # the figures (one group in local mode: the global plan).
    root, files, table, _ = corpus
    static = {**LAYOUT, "max_segments_per_row": 3, "align_segments": 8}
    want = tokpack.pack_files(files, tmp_path / "reference", MAX_LEN, **static)["figures"]
    got = tokpack.ray.pack(
        blocks(table, (100, 100)), tmp_path / "out", MAX_LEN, mode=mode,
        min_block_samples=10**6, **static,
    )["figures"]  # fmt: skip
    assert got["max_row_segments"] == want["max_row_segments"] <= 3
    assert got["alignment_padding_tokens"] == want["alignment_padding_tokens"] > 0
    drop = ("wall_time_s",)
    assert {k: v for k, v in got.items() if k not in drop} == {
        k: v for k, v in want.items() if k not in drop
    }


@pytest.mark.parametrize("has_labels", [True, False])
def test_take_gives_the_samples_at_rows_of_ragged_columns(has_labels):
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 5, 40):
        # Empty samples are frequent, so runs of consecutive rows start and end on them.
        sizes = rng.choice([0, 0, 1, 3, 9], size=n)
        offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        tokens = rng.integers(0, 1000, offsets[-1], dtype=np.int32)
        labels = rng.integers(-100, 1000, offsets[-1], dtype=np.int32) if has_labels else None
        for _ in range(20):
            rows = np.flatnonzero(rng.random(n) < rng.random()).astype(np.int64)
            got_tokens, got_offsets, got_labels = take(tokens, offsets, labels, rows)
            spans = [slice(offsets[r], offsets[r + 1]) for r in rows]
            assert got_tokens.dtype == np.int32
            assert got_offsets.tolist() == np.r_[0, np.cumsum(sizes[rows])].tolist()
            assert got_tokens.tolist() == [int(t) for s in spans for t in tokens[s]]
            if has_labels:
                assert got_labels.tolist() == [int(t) for s in spans for t in labels[s]]
            else:
                assert got_labels is None


def test_a_worker_killed_while_writing_a_shard_changes_nothing(cluster, corpus, tmp_path):
    _, faults = cluster
    root, _, table, reference = corpus
    (faults / "armed").touch()
    try:
        tokpack.ray.pack(blocks(table, (250,)), tmp_path / "out", MAX_LEN, **LAYOUT)
    finally:
        (faults / "armed").unlink()
    assert (faults / "fired").exists()  # a worker really died after writing a shard
    assert_same_shards(tmp_path / "out", root / "reference", reference)


DRIVER = """
import sys, time
from pathlib import Path
import ray, tokpack.ray

release = Path(sys.argv[2])

def wait_for_release(batch):
    while not release.exists():
        time.sleep(0.05)
    return batch

ray.init(address=sys.argv[1], log_to_driver=False)
ds = ray.data.from_items([{"input_ids": [1, 2, 3]}] * 10).map_batches(wait_for_release)
tokpack.ray.pack(ds, sys.argv[3], 8)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_driver_leaves_out_absent(cluster, tmp_path, sig):
    c, _ = cluster
    out, release = tmp_path / "out", tmp_path / "release"
    driver = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(DRIVER), c.address, str(release), str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # The run is under way (its temporary output exists) and cannot finish: its input waits.
        while not any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir()):
            assert driver.poll() is None, "the driver exited before starting its run"
            time.sleep(0.1)
        driver.send_signal(sig)
        driver.wait(timeout=60)
    finally:
        release.touch()
        driver.kill()
    assert not out.exists()
    # The next run into OUT completes and leaves no temporary behind.
    tokpack.ray.pack(ray.data.from_items([{"input_ids": [1, 2]}]), out, 8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "release"]


def test_read_packed_refuses_a_directory_without_manifest(cluster, tmp_path):
    (tmp_path / "part-00000.parquet").write_bytes(b"")
    with pytest.raises(tokpack.CorruptOutputError, match="no __tokpack__/_manifest.json"):
        tokpack.ray.read_packed(tmp_path)


def test_bad_values_name_the_block_and_sample(cluster, tmp_path):
    table = pa.table({"input_ids": pa.array([[1, 2], [3, -4]], pa.list_(pa.int64()))})
    ds = ray.data.from_arrow([table.slice(0, 1), table.slice(1)])
    with pytest.raises(tokpack.DataError, match=r"block 1 \(samples from 1\): row 0"):
        tokpack.ray.pack(ds, tmp_path / "out", 8)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", ["global", "local"])
def test_preference_pairs_are_refused_as_not_supported(cluster, tmp_path, mode):
    seqs = pa.array([[1, 2, 3], [4, 5]], pa.list_(pa.int32()))
    table = pa.table(
        {
            "chosen_input_ids": seqs,
            "chosen_labels": seqs,
            "rejected_input_ids": seqs,
            "rejected_labels": seqs,
        }
    )
    with pytest.raises(tokpack.ConfigError, match=r"preference samples .*\(--ray\) does not"):
        tokpack.ray.pack(ray.data.from_arrow(table), tmp_path / "out", 8, mode=mode)
    assert not (tmp_path / "out").exists()


def test_tokenize_gives_tokpack_tokenizes_ids_and_labels_and_keeps_rejects(cluster, tmp_path):
    from ._tokenizer_factory import build_tokenizer, conversations, write_jsonl

    tok = build_tokenizer(tmp_path / "tok")
    records = [{"messages": m} for m in conversations(40)]
    records[5] = {"messages": [{"role": "user"}]}  # no content: rejected
    source = write_jsonl(tmp_path / "chat.jsonl", records)
    want = pa.Table.from_batches(
        list(tokpack.tokenize_to_batches(source, tok, skip_invalid=True, threads=1))
    )
    ds = ray.data.from_items(records, override_num_blocks=3)
    tokenized = tokpack.ray.tokenize(
        ds, tok, rejected_dir=tmp_path / "rejected", skip_invalid=True, batch_size=16
    ).materialize()
    got = pa.concat_tables(ray.get(tokenized.to_arrow_refs()))
    assert got.column("input_ids").to_pylist() == want.column("input_ids").to_pylist()
    assert got.column("labels").to_pylist() == want.column("labels").to_pylist()
    rejected = [
        line for f in (tmp_path / "rejected").iterdir() for line in f.read_text().splitlines()
    ]
    assert len(rejected) == 1 and '"role": "user"' in rejected[0]
    # Packing the tokenized dataset gives tokpack pack's shards of the same tokens.
    pq.write_table(want, tmp_path / "tokens.parquet")
    reference = tokpack.pack_files([tmp_path / "tokens.parquet"], tmp_path / "ref", 64, **LAYOUT)
    tokpack.ray.pack(tokenized, tmp_path / "out", 64, **LAYOUT)
    assert_same_shards(tmp_path / "out", tmp_path / "ref", reference)


def test_cli_pack_ray_writes_tokpack_packs_bytes(cluster, corpus, tmp_path):
    from tokpack.cli import main

    root, files, _, reference = corpus
    args = [str(f) for f in files] + ["-o", str(tmp_path / "out"), "--max-len", str(MAX_LEN)]
    args += ["--rows-per-shard", "40", "--row-group-rows", "16", "--overlong", "drop"]
    assert main(["pack", *args, "--ray", c_address(cluster), "--quiet"]) == 0
    assert_same_shards(tmp_path / "out", root / "reference", reference)


def test_cli_tokenize_ray_writes_tokpack_tokenizes_bytes(cluster, tmp_path):
    """Chunks encoded by Ray tasks (on two nodes; a worker killed): shards, rejected records
    (file and line), counts and cache key are those of ``tokpack tokenize``; the local command
    then finds the output current."""
    from tokpack.cli import main

    from ._tokenizer_factory import build_tokenizer, conversations, write_jsonl

    _, faults = cluster
    tok = build_tokenizer(tmp_path / "tok")
    records = [{"messages": m} for m in conversations(300, seed=4)]
    records[7] = {"messages": [{"role": "user"}]}  # no content: rejected
    raw = tmp_path / "raw"
    raw.mkdir()
    write_jsonl(raw / "a.jsonl", records[:170])
    write_jsonl(raw / "b.jsonl", records[170:])
    common = [str(raw), "--tokenizer", str(tok), "--skip-invalid", "--shard-rows", "100", "--quiet"]
    assert main(["tokenize", *common, "-o", str(tmp_path / "ref"), "--threads", "1"]) == 0
    node = cluster[0].add_node(num_cpus=1)
    try:
        args = ["tokenize", *common, "-o", str(tmp_path / "out"), "--ray", c_address(cluster)]
        assert main(args) == 0
    finally:
        cluster[0].remove_node(node)
    # Many chunks (the CLI's chunks of 2048 records make one here), on a node whose first task
    # kills its worker once it has encoded its chunk: Ray runs the chunk again.
    (faults / "armed-encode").touch()
    faulty = cluster[0].add_node(num_cpus=1, resources={"faulty": 2})
    try:
        runner = RayRunner(ray_remote_args={"resources": {"faulty": 1}})
        small = {"skip_invalid": True, "shard_rows": 100, "batch_size": 16}
        for name, extra in (("ref16", {"threads": 1}), ("out16", {"runner": runner})):
            tokpack.tokenize_files([raw], tmp_path / name, tok, **small, **extra)
    finally:
        (faults / "armed-encode").unlink()
        cluster[0].remove_node(faulty)
    assert (faults / "fired-encode").exists()
    for ref, out in (
        (tmp_path / "ref", tmp_path / "out"),
        (tmp_path / "ref16", tmp_path / "out16"),
    ):
        _assert_same_tokenize_output(ref, out)
    # Same key: the local command finds the Ray output current.
    out = tmp_path / "out"
    assert tokpack.tokenize_files([raw], out, tok, skip_invalid=True, shard_rows=100)["cache_hit"]


def _assert_same_tokenize_output(ref, out):
    names = sorted(p.name for p in ref.glob("part-*.parquet"))
    assert len(names) == 3 and names == sorted(p.name for p in out.glob("part-*.parquet"))
    assert all(filecmp.cmp(ref / n, out / n, shallow=False) for n in names)
    rejected = "__tokpack__/_rejected.jsonl"
    assert (out / rejected).read_bytes() == (ref / rejected).read_bytes()
    assert '"line": 8' in (out / rejected).read_text()
    want, got = read_manifest(ref), read_manifest(out)
    assert got["cache_key"] == want["cache_key"] and got["counts"] == want["counts"]
    assert got["shards"] == want["shards"]


def c_address(cluster) -> str:
    return cluster[0].address


@pytest.mark.parametrize("mode", ["global", "local"])
def test_all_samples_dropped_gives_tokpack_packs_empty_shard(cluster, tmp_path, mode):
    tokens = pa.array([[1] * 9, [2] * 10, []], pa.list_(pa.int32()))
    table = pa.table({"input_ids": tokens, "labels": tokens})
    pq.write_table(table, tmp_path / "tokens.parquet")
    reference = tokpack.pack_files([tmp_path / "tokens.parquet"], tmp_path / "ref", 8, **LAYOUT)
    ds = blocks(table, (1,))
    tokpack.ray.pack(ds, tmp_path / "out", 8, mode=mode, min_block_samples=1, **LAYOUT)
    assert_same_shards(tmp_path / "out", tmp_path / "ref", reference)
    assert tokpack.verify(tmp_path / "out")["ok"]


@pytest.mark.parametrize("mode", ["global", "local"])
def test_an_overlong_sample_is_named_by_its_index_in_the_dataset(cluster, tmp_path, mode):
    table = pa.table({"input_ids": pa.array([[1], [2], [3] * 9], pa.list_(pa.int32()))})
    with pytest.raises(tokpack.OverlongError, match="sample 2 has 9 tokens"):
        tokpack.ray.pack(blocks(table, (2,)), tmp_path / "out", 8, mode=mode, min_block_samples=1)
    assert not (tmp_path / "out").exists()


# -- object storage: the manifest as the commit marker --------------------------------------


def _store(root: Path):
    """An object store stand-in every node sees: a pyarrow file system rooted at ``root`` and
    given explicitly, which tokpack must treat as object storage (no directory renames)."""
    import pyarrow.fs as pafs

    root.mkdir(exist_ok=True)
    return pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())


@pytest.mark.parametrize("mode", ["global", "local"])
def test_object_storage_output_is_committed_by_the_manifest(cluster, corpus, tmp_path, mode):
    root, _, table, reference = corpus
    fs = _store(tmp_path / "bucket")
    ds = blocks(table, (120, 200))
    manifest = tokpack.ray.pack(ds, "packed", MAX_LEN, mode=mode, filesystem=fs, **LAYOUT)
    out = tmp_path / "bucket" / "packed"
    if mode == "global":
        assert_same_shards(out, root / "reference", reference)
    else:
        accounted(out, table.num_rows)
    assert read_manifest(out) == manifest
    rows = tokpack.ray.read_packed("packed", filesystem=fs).count()
    assert rows == manifest["figures"]["rows"]
    # A rebuild over it replaces it (a stale group folder of a killed run is ours: removed).
    (out / ".group-7").mkdir()
    (out / ".group-7" / "part-00000.parquet").write_bytes(b"half")
    tokpack.ray.pack(ds, "packed", MAX_LEN, mode=mode, filesystem=fs, **LAYOUT)
    assert not (out / ".group-7").exists()
    assert read_manifest(out)["shards"] == manifest["shards"]


def test_object_storage_refuses_foreign_objects_and_a_failed_run_leaves_no_output(
    cluster, corpus, tmp_path
):
    _, _, table, _ = corpus
    fs = _store(tmp_path / "bucket")
    out = tmp_path / "bucket" / "packed"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(tokpack.OutputExistsError, match="notes.txt"):
        tokpack.ray.pack(blocks(table, ()), "packed", MAX_LEN, filesystem=fs, **LAYOUT)
    assert os.listdir(out) == ["notes.txt"]
    (out / "notes.txt").unlink()
    tokpack.ray.pack(blocks(table, ()), "packed", MAX_LEN, filesystem=fs, **LAYOUT)
    bad = pa.table({"input_ids": pa.array([[1, 2], [-3]], pa.list_(pa.int32()))})
    with pytest.raises(tokpack.DataError):
        tokpack.ray.pack(ray.data.from_arrow(bad), "packed", 8, filesystem=fs)
    # The old output was un-committed first (its manifest removed), then this run's objects.
    assert [p for p in out.rglob("*") if p.is_file()] == []
    with pytest.raises(tokpack.CorruptOutputError, match="not a complete tokpack output"):
        tokpack.ray.read_packed("packed", filesystem=fs)


def test_s3_output_is_tokpack_packs_bytes_committed_by_the_manifest(cluster, corpus, s3):
    """The S3 protocol itself (moto): objects without folders or renames, a PUT whole."""
    import pyarrow.fs as pafs

    root, _, table, reference = corpus
    ds = blocks(table, (120, 200))
    prefix = "tokpack-test/packed"
    manifest = tokpack.ray.pack(ds, prefix, MAX_LEN, filesystem=s3, **LAYOUT)
    for s in reference["shards"]:
        for key in ("file", "index"):
            with s3.open_input_stream(f"{prefix}/{s[key]}") as f:
                assert f.read() == (root / "reference" / s[key]).read_bytes(), s[key]
    assert manifest["shards"] == reference["shards"]
    assert tokpack.ray.read_packed(prefix, filesystem=s3).count() == manifest["figures"]["rows"]
    # Local mode over it: the groups' files are renamed by server-side copies, the old output
    # removed (manifest first); nothing else is left.
    again = tokpack.ray.pack(ds, prefix, MAX_LEN, mode="local", filesystem=s3, **LAYOUT)
    objects = s3.get_file_info(pafs.FileSelector(prefix, recursive=True))
    names = {i.path[len(prefix) + 1 :] for i in objects if i.type == pafs.FileType.File}
    listed = {s[k] for s in again["shards"] for k in ("file", "index")}
    assert names == listed | {"__tokpack__/_manifest.json", "__tokpack__/_dropped.arrow"}
    # A failed run leaves no output: readers refuse the prefix.
    bad = pa.table({"input_ids": pa.array([[1, 2], [-3]], pa.list_(pa.int32()))})
    with pytest.raises(tokpack.DataError):
        tokpack.ray.pack(ray.data.from_arrow(bad), prefix, 8, filesystem=s3)
    with pytest.raises(tokpack.CorruptOutputError, match="not a complete tokpack output"):
        tokpack.ray.read_packed(prefix, filesystem=s3)


def test_every_destination_follows_the_output_rule(cluster, corpus, tmp_path, monkeypatch):
    """Fails on the code before issue 20: packing a dataset into the prefix it was read from
    deleted its part-N.parquet inputs (pyarrow.dataset's names), a prefix holding another
    dataset was replaced without OutputExistsError, and `file://...` became a folder `file:`."""
    import pyarrow.dataset as pads

    _, _, table, _ = corpus
    fs = _store(tmp_path / "bucket")
    pads.write_dataset(table.slice(0, 50), "data", format="parquet", filesystem=fs)
    before = sorted((tmp_path / "bucket").rglob("*"))
    ds = ray.data.read_parquet("data", filesystem=fs)
    with pytest.raises(tokpack.ConfigError, match="input"):
        tokpack.ray.pack(ds, "data", MAX_LEN, filesystem=fs, **LAYOUT)
    with pytest.raises(tokpack.OutputExistsError, match="part-0.parquet"):
        tokpack.ray.pack(blocks(table, ()), "data", MAX_LEN, filesystem=fs, **LAYOUT)
    assert sorted((tmp_path / "bucket").rglob("*")) == before
    monkeypatch.chdir(tmp_path)
    manifest = tokpack.ray.pack(blocks(table, ()), f"file://{tmp_path}/out", MAX_LEN, **LAYOUT)
    assert not (tmp_path / "file:").exists()
    assert read_manifest(tmp_path / "out") == manifest
    assert tokpack.verify(tmp_path / "out")["ok"]
    rows = tokpack.ray.read_packed(f"file://{tmp_path}/out").count()
    assert rows == manifest["figures"]["rows"]


def test_read_packed_reads_through_the_checked_reader(cluster, corpus, tmp_path):
    """Fails on the code before issue 20: read_packed read the shards with plain
    ray.data.read_parquet, so a flipped byte came out as another token; and it followed a
    manifest naming a shard outside the directory."""
    import json

    _, _, table, _ = corpus
    out = tmp_path / "out"
    manifest = tokpack.ray.pack(blocks(table, ()), out, MAX_LEN, compression="none", **LAYOUT)
    rows = tokpack.ray.read_packed(out).take_all()
    assert len(rows) == manifest["figures"]["rows"]
    first = pq.read_table(out / manifest["shards"][0]["file"]).slice(0, 1).to_pylist()[0]
    assert list(rows[0]["input_ids"]) == first["input_ids"]
    assert list(rows[0]["seq_lengths"]) == first["seq_lengths"]
    ids = tokpack.ray.read_packed(out, columns=["sample_ids"]).take(1)[0]
    assert list(ids) == ["sample_ids"]
    shard = manifest["shards"][0]
    path = out / shard["file"]
    data = bytearray(path.read_bytes())
    group = shard["row_group_bytes"][0]
    data[group["offset"] + group["length"] // 2] ^= 0x01
    path.write_bytes(bytes(data))
    # Raised in a read task: Ray hands it on wrapped (RayTaskError), with tokpack's message.
    with pytest.raises(Exception, match=f"{shard['file']}.*do not match their checksum"):
        tokpack.ray.read_packed(out).take_all()
    bad = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    bad["shards"][0]["file"] = f"../{out.name}/{shard['file']}"
    (out / "__tokpack__" / "_manifest.json").write_text(json.dumps(bad))
    with pytest.raises(tokpack.CorruptOutputError, match="outside the directory"):
        tokpack.ray.read_packed(out)


# -- files of several large row groups: a sample's identity is its file and row -------------


@pytest.fixture(scope="module")
def row_group_corpus(tmp_path_factory):
    """Three files of four row groups of 20,000 samples (several read tasks per file), the
    first file's longer (slower to read), empty samples late in each file, with their
    ``tokpack pack`` output."""
    root = tmp_path_factory.mktemp("row-groups")
    rng = np.random.default_rng(9)
    files = []
    for i in range(3):
        n = 80_000
        lengths = rng.integers(1, 48 if i == 0 else 6, n)
        lengths[[70_001 + i, 45_000 + i]] = 0  # in the third and fourth row groups
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
        values = pa.array(rng.integers(1, 500, int(offsets[-1]), dtype=np.int32))
        tokens = pa.ListArray.from_arrays(pa.array(offsets), values)
        path = root / f"rows-{i}.parquet"
        pq.write_table(pa.table({"input_ids": tokens}), path, row_group_size=20_000)
        files.append(path)
    layout = {"rows_per_shard": 2000, "row_group_rows": 500}
    reference = tokpack.pack_files(files, root / "reference", 64, **layout)
    return root, files, layout, reference


def test_samples_of_files_of_several_row_groups_are_numbered_by_file_and_row(
    cluster, row_group_corpus, tmp_path
):
    """On three nodes, whatever order Ray's read tasks deliver a file's row groups in, sample
    ids, plan, shards and the dropped list are ``tokpack pack``'s (failed before: samples were
    numbered in arrival order)."""
    from tokpack.cli import main

    c, _ = cluster
    while len(ray.nodes()) < 3:
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    root, files, layout, reference = row_group_corpus
    args = [str(f) for f in files] + ["-o", str(tmp_path / "out"), "--max-len", "64"]
    args += ["--rows-per-shard", str(layout["rows_per_shard"])]
    args += ["--row-group-rows", str(layout["row_group_rows"])]
    # As a user's process runs it: Ray Data's default execution options (the module's
    # datasets keep their order; tokpack must not depend on that).
    options = ray.data.DataContext.get_current().execution_options
    options.preserve_order = False
    try:
        assert main(["pack", *args, "--ray", c_address(cluster), "--quiet"]) == 0
    finally:
        options.preserve_order = True
    assert_same_shards(tmp_path / "out", root / "reference", reference)
    got, want = dropped(tmp_path / "out"), dropped(root / "reference")
    assert got.column("sample_id").to_pylist() == want.column("sample_id").to_pylist()
    rows = [45_000, 70_001, 45_001, 70_002, 45_002, 70_003]
    assert got.column("row").to_pylist() == want.column("row").to_pylist() == rows
    assert got.column("file").to_pylist() == want.column("file").to_pylist()


# -- every pack option on Ray: the same bytes as tokpack pack, or refused by name ------------


def _carry_corpus(root: Path, kto: bool = False):
    """Two token files with scalar columns to carry (KTO: its ``label``, by its schema)."""
    from tokpack.tokenize.schema import KTO_SCHEMA

    files = []
    for i, n in enumerate((120, 90)):
        tokens, labels = random_samples(n, 40, seed=20 + i)
        columns = {
            "input_ids": pa.array(tokens, pa.list_(pa.int32())),
            "labels": pa.array(labels, pa.list_(pa.int32())),
            "length": pa.array([len(t) for t in tokens], pa.int32()),
            "source": pa.array([f"src-{i}-{k % 3}" for k in range(n)]),
            "weight": pa.array(np.linspace(0, 1, n), pa.float64()),
        }
        if kto:
            columns["prompt_length"] = pa.array([1] * n, pa.int32())
            columns["label"] = pa.array([k % 3 != 0 for k in range(n)])
            schema = KTO_SCHEMA.append(pa.field("source", pa.string()))
            table = pa.table({f.name: columns[f.name] for f in schema}, schema=schema)
        else:
            table = pa.table(columns)
        path = root / f"carry-{i}.parquet"
        pq.write_table(table, path, row_group_size=50)
        files.append(path)
    return files


@pytest.mark.parametrize("mode", ["global", "local"])
def test_carry_and_kto_label_are_tokpack_packs_bytes(cluster, tmp_path, mode):
    """``carry`` (failed before: TypeError) and KTO's ``label`` (dropped before) are written as
    by ``tokpack pack``; the manifest names the sample kind (missing before)."""
    layout = {"rows_per_shard": 30, "row_group_rows": 8}
    for kto, carry in ((False, ["source", "weight"]), (True, ["source"])):
        root = tmp_path / f"kto-{kto}"
        root.mkdir()
        files = _carry_corpus(root, kto)
        reference = tokpack.pack_files(files, root / "ref", 48, carry=carry, **layout)
        manifest = tokpack.ray.pack(
            files, root / "out", 48, mode=mode, min_block_samples=10**6, carry=carry, **layout
        )
        assert manifest["sample_kind"] == reference["sample_kind"] == ("kto" if kto else "sft")
        assert manifest["config"]["carry"] == reference["config"]["carry"]
        for s in reference["shards"]:
            for key in ("file", "index"):
                assert filecmp.cmp(root / "out" / s[key], root / "ref" / s[key], shallow=False)
    # From a dataset too (KTO by its schema's metadata, as tokpack pack tells it).
    ds = ray.data.from_arrow([pq.read_table(f) for f in files])
    got = tokpack.ray.pack(ds, tmp_path / "ds", 48, mode=mode, min_block_samples=10**6, **layout)
    assert (
        got["sample_kind"] == "kto"
        and "label" in pq.read_schema(tmp_path / "ds" / "part-00000.parquet").names
    )


def test_options_ray_does_not_support_are_refused_by_name(cluster, corpus, tmp_path, capsys):
    """Failed before: --pair-layout and --threads were ignored (exit 0)."""
    from tokpack.cli import main

    _, files, _, _ = corpus
    base = ["pack", *map(str, files), "-o", str(tmp_path / "out"), "--max-len", "96"]
    for flag, name in (
        (["--pair-layout", "shared-prompt"], "pair_layout (--pair-layout)"),
        (["--threads", "2"], "threads (--threads)"),
    ):
        assert main([*base, *flag, "--ray", c_address(cluster)]) == 2
        err = capsys.readouterr().err
        assert f"error: {name} is not supported with Ray" in err and len(err.splitlines()) == 1
    with pytest.raises(tokpack.ConfigError, match=r"threads \(--threads\) is not supported"):
        tokpack.ray.pack(files, tmp_path / "out", 96, threads=4)
    assert not (tmp_path / "out").exists()


def test_a_file_given_twice_is_packed_twice_as_by_tokpack_pack(cluster, corpus, tmp_path):
    """Failed before: Ray packed it once."""
    from tokpack.cli import main

    root, files, _, _ = corpus
    twice = [files[0], files[1], files[0]]
    reference = tokpack.pack_files(twice, tmp_path / "ref", MAX_LEN, **LAYOUT)
    args = [*map(str, twice), "-o", str(tmp_path / "out"), "--max-len", str(MAX_LEN)]
    args += ["--rows-per-shard", "40", "--row-group-rows", "16", "--overlong", "drop"]
    assert main(["pack", *args, "--ray", c_address(cluster), "--quiet"]) == 0
    manifest = assert_same_shards(tmp_path / "out", tmp_path / "ref", reference)
    assert [i["rows"] for i in manifest["inputs"]] == [i["rows"] for i in reference["inputs"]]
    assert dropped(tmp_path / "out").equals(dropped(tmp_path / "ref"))


def test_inputs_without_labels_beside_inputs_with_them_are_named_as_by_pack(
    cluster, corpus, tmp_path
):
    """Failed before: Ray reported "row 50, column labels: the list is null"."""
    _, files, table, _ = corpus
    bare = tmp_path / "bare.parquet"
    pq.write_table(table.select(["input_ids"]).slice(0, 80), bare)
    with pytest.raises(tokpack.SchemaError) as want:
        tokpack.pack_files([files[0], bare], tmp_path / "ref", MAX_LEN)
    with pytest.raises(tokpack.SchemaError) as got:
        tokpack.ray.pack([files[0], bare], tmp_path / "out", MAX_LEN)
    assert str(got.value) == str(want.value) and "bare.parquet" in str(got.value)


# -- the cluster: a new local one unless told, Ray's failures as one line, SIGTERM ------------


def test_ray_without_address_starts_a_local_cluster_and_failures_are_one_line(
    monkeypatch, corpus, tmp_path, capsys
):
    """Failed before: ``ray.init(address=None)`` joins RAY_ADDRESS or the latest ``ray
    start`` cluster; a Ray failure was a traceback."""
    from tokpack.cli import main
    from tokpack.commands import _ray

    _, files, _, _ = corpus
    asked = []

    def refuse(address, **kwargs):
        asked.append(address)
        raise ConnectionError("Could not find any running Ray instance.\nmore")

    monkeypatch.setattr(_ray.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(_ray.ray, "init", refuse)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    for flag, where in (([], "a new local cluster"), (["auto"], "the cluster at 'auto'")):
        out = ["-o", str(tmp_path / "out")]
        assert main(["pack", str(files[0]), *out, "--ray", *flag]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"tokpack pack: error: Ray failed on {where}: Could not find any running Ray "
            "instance.\n"
        )
    assert asked == ["local", "auto"]
    assert not (tmp_path / "out").exists()


def test_sigterm_to_pack_ray_is_terminated_143_and_leaves_nothing(
    cluster, row_group_corpus, tmp_path
):
    """Failed before: exit 134 with Ray's C++ stack dump (its driver's SIGTERM handler)."""
    _, files, _, _ = row_group_corpus
    out = tmp_path / "out"
    args = [sys.executable, "-m", "tokpack", "pack", *map(str, files), "-o", str(out)]
    driver = subprocess.Popen(
        [*args, "--max-len", "64", "--ray", c_address(cluster), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The run is under way (its temporary output exists): its tasks read and measure.
        while not any(p.name.startswith(".out.tmp-") for p in tmp_path.iterdir()):
            assert driver.poll() is None, driver.stderr.read()
            time.sleep(0.05)
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=120)
    finally:
        driver.kill()
    assert driver.returncode == 143, err
    # Ray's own threads may still log a line after tokpack's (seen under load: "Failed to push
    # error to driver"): tokpack's line is among them, Ray's C++ stack dump (absl's) is not.
    assert "tokpack pack: terminated" in err.splitlines(), err
    assert "*** SIGTERM received" not in err, err
    assert os.listdir(tmp_path) == []


# -- tokenize: every kind of record; rejected records and dropped samples name their source --


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_tokenize_gives_tokpack_tokenizes_preference_and_kto_rows(cluster, tmp_path, kind):
    """Failed before: ArrowInvalid inside a RayTaskError (the rows were cast to SFT's)."""
    from ._tokenizer_factory import build_tokenizer, write_jsonl
    from .test_tokenize_preference import kto_records, preference_records

    tok = build_tokenizer(tmp_path / "tok")
    records = (preference_records if kind == "preference" else kto_records)("standard")[:60]
    source = write_jsonl(tmp_path / "records.jsonl", records)
    want = pa.Table.from_batches(list(tokpack.tokenize_to_batches(source, tok, threads=1)))
    ds = ray.data.from_items(records, override_num_blocks=3)
    got = tokpack.ray.tokenize(ds, tok, batch_size=16).materialize()
    got = pa.concat_tables(ray.get(got.to_arrow_refs()))
    assert got.schema == want.schema
    assert got.equals(want)


def test_rejected_records_and_local_mode_dropped_samples_name_their_files(
    cluster, corpus, tmp_path
):
    """Failed before: rejected records said ``<ray.data.Dataset>`` with their row in their
    batch; local mode's dropped list said ``<ray.data.Dataset>`` despite a ``path`` column."""
    from ._tokenizer_factory import build_tokenizer, conversations

    tok = build_tokenizer(tmp_path / "tok")
    records = [{"messages": m} for m in conversations(40)]
    records[25] = {"messages": [{"role": "user"}]}  # no content (null in Arrow): rejected
    # As ray.data.read_json(..., include_paths=True) gives them (without read tasks, which
    # the tokenizer actor would wait for on this one-CPU node).
    paths = [str(tmp_path / "a.jsonl")] * 20 + [str(tmp_path / "b.jsonl")] * 20
    ds = ray.data.from_items([{**r, "path": p} for r, p in zip(records, paths)])
    rejected_dir = tmp_path / "rejected"
    tokpack.ray.tokenize(
        ds, tok, rejected_dir=rejected_dir, skip_invalid=True, batch_size=8
    ).materialize()
    (entry,) = [
        json.loads(line) for f in rejected_dir.iterdir() for line in f.read_text().splitlines()
    ]
    assert entry["file"] == str(tmp_path / "b.jsonl")
    assert "row" not in entry and "'content' is null" in entry["error"]
    assert entry["record"]["path"] == entry["file"]

    root, files, _, reference = corpus
    ds = ray.data.read_parquet([str(f) for f in files], include_paths=True)
    out = tmp_path / "local"
    tokpack.ray.pack(ds, out, MAX_LEN, mode="local", min_block_samples=10**6, **LAYOUT)
    got, want = dropped(out), dropped(root / "reference")
    assert got.column("row").equals(want.column("row"))
    assert [Path(f).resolve() for f in got.column("file").to_pylist()] == [
        Path(f).resolve() for f in want.column("file").to_pylist()
    ]


@pytest.mark.parametrize("mode", ["global", "local"])
def test_multimodal_shards_are_refused_naming_pack_files(cluster, tmp_path, mode):
    """Failed before: Ray packed the ids of multimodal token shards and dropped their media
    columns (rows with image pads and no images), silently; from a dataset too."""
    from tokpack.multimodal.tokenize import token_schema

    ids = [[1, 5, 7, 7, 6, 2], [1, 2, 3]]
    media = '[{"ref":{"path":"a.png"},"grid":[1,2,2],"span":[2,2]}]'
    table = pa.table(
        {
            "input_ids": ids,
            "labels": [[-100] * len(i) for i in ids],
            "length": [len(i) for i in ids],
            "media": [media, "[]"],
            "vision_tokens": [2, 0],
            "vision_patches": [4, 0],
        },
        schema=token_schema(),
    )
    path = tmp_path / "mm.parquet"
    pq.write_table(table, path)
    with pytest.raises(tokpack.ConfigError, match=r"tokpack.ray.pack .* tokpack.pack_files"):
        tokpack.ray.pack([path], tmp_path / "out", 16, mode=mode)
    assert not (tmp_path / "out").exists()
    with pytest.raises(tokpack.ConfigError, match=r"the ray dataset holds multimodal data"):
        tokpack.ray.pack(ray.data.from_arrow(table), tmp_path / "ds", 16, mode=mode)
    assert tokpack.pack_files([path], tmp_path / "ok", 16)["config"]["carry"][0] == "media"


# -- a dataset: a plain read of files packs as the files; any other is numbered by its rows ---


def _kinds_corpus(root: Path):
    """Two KTO token files (``label``, a column to carry) and one of preference pairs, with
    the schemas (and ``tokpack.kind`` metadata) ``tokpack tokenize`` writes."""
    from tokpack.tokenize.schema import PREFERENCE_SCHEMA

    kto = _carry_corpus(root, kto=True)
    seqs = pa.array([[1, 2, 3], [4, 5], [6]], pa.list_(pa.int32()))
    columns = {f"{r}_{c}": seqs for r in ("chosen", "rejected") for c in ("input_ids", "labels")}
    columns.update(prompt_length=pa.array([1, 1, 0], pa.int32()), length=pa.array([6, 4, 2]))
    pairs = pa.table({f.name: columns[f.name] for f in PREFERENCE_SCHEMA}, PREFERENCE_SCHEMA)
    pq.write_table(pairs, root / "pairs.parquet")
    return kto, root / "pairs.parquet"


def _identity(batch):
    return batch


@pytest.mark.parametrize("mode", ["global", "local"])
def test_kto_shards_read_as_a_dataset_keep_their_label_as_by_pack(cluster, tmp_path, mode):
    """Failed before: ``ray.data.read_parquet`` of KTO shards packed SFT rows without ``label``
    (Ray's reader drops the files' ``tokpack.kind`` from its blocks), silently. The kind now
    comes from pack's rules for the paths and a plain read, from the read's schema through a
    ``map_batches`` (the variant: the dataset's own schema has lost it too), and ``--carry``
    columns follow."""
    files, _ = _kinds_corpus(tmp_path)
    layout = dict(carry=["source"], rows_per_shard=30)
    kw = dict(mode=mode, min_block_samples=10**6, **layout)
    reference = tokpack.ray.pack(files, tmp_path / "ref", 48, **kw)
    assert reference["sample_kind"] == tokpack.pack_files(files, tmp_path / "p", 48)["sample_kind"]
    read = ray.data.read_parquet([str(f) for f in files])
    inputs = {
        "read": read,
        "read-mapped": read.map_batches(_identity, batch_format="pyarrow"),
        "in-memory": ray.data.from_arrow([pq.read_table(f) for f in files]),
    }
    for name, ds in inputs.items():
        got = tokpack.ray.pack(ds, tmp_path / name, 48, **kw)
        assert got["sample_kind"] == reference["sample_kind"] == "kto", name
        assert got["config"]["carry"] == reference["config"]["carry"] == ["label", "source"]
        shard = pq.read_table(tmp_path / name / "part-00000.parquet")
        assert {"label", "source"} <= set(shard.column_names), name
        # Each packed sample keeps its own label: ids and labels agree with the source rows.
        source = pa.concat_tables([pq.read_table(f) for f in files])
        ids = [i for row in shard.column("sample_ids").to_pylist() for i in row]
        labels = [v for row in shard.column("label").to_pylist() for v in row]
        assert labels == [source.column("label")[i].as_py() for i in ids], name
    assert_same_shards(tmp_path / "read", tmp_path / "ref", reference)


@pytest.mark.parametrize("mode", ["global", "local"])
def test_preference_pairs_are_refused_from_paths_and_every_dataset(cluster, tmp_path, mode):
    """The same rule for paths, a plain read (by the file's kind, naming it) and datasets whose
    blocks lost the metadata (by the pair columns)."""
    _, pairs = _kinds_corpus(tmp_path)
    read = ray.data.read_parquet([str(pairs)])
    for ds, where in (
        ([pairs], "pairs.parquet holds preference samples"),
        (read, "pairs.parquet holds preference samples"),
        (read.map_batches(_identity, batch_format="pyarrow"), "the ray dataset holds"),
    ):
        with pytest.raises(tokpack.ConfigError, match=rf"{where}.*--ray\) does not support"):
            tokpack.ray.pack(ds, tmp_path / "out", 16, mode=mode)
        assert not (tmp_path / "out").exists()


def _three_nodes(cluster):
    c, _ = cluster
    while len(ray.nodes()) < 3:
        c.add_node(num_cpus=1)
    c.wait_for_nodes()


@pytest.mark.parametrize("mode", ["global", "local"])
def test_a_plain_read_of_files_packs_as_the_files_on_three_nodes(cluster, corpus, tmp_path, mode):
    """``read_parquet(files, include_paths=True).repartition(11)`` (the issue's dataset) and a
    read without paths (failed before: its dropped list named ``<ray.data.Dataset>`` rows) are
    packed as the paths are: ``tokpack pack``'s shards, inputs and dropped list, file and row."""
    _three_nodes(cluster)
    root, files, _, _ = corpus
    kw = dict(mode=mode, min_block_samples=10**6, **LAYOUT)
    reference = tokpack.ray.pack(files, tmp_path / "ref", MAX_LEN, **kw)
    paths = [str(f) for f in files]
    for name, ds in (
        ("repartitioned", ray.data.read_parquet(paths, include_paths=True).repartition(11)),
        ("no-paths", ray.data.read_parquet(paths)),
    ):
        got = tokpack.ray.pack(ds, tmp_path / name, MAX_LEN, **kw)
        assert_same_shards(tmp_path / name, tmp_path / "ref", reference)
        assert got["inputs"] == reference["inputs"]
        assert dropped(tmp_path / name).equals(dropped(tmp_path / "ref")), name
    assert {Path(f).name for f in dropped(tmp_path / "ref").column("file").to_pylist()} == {
        f.name for f in files
    }


@pytest.mark.parametrize("mode", ["global", "local"])
def test_another_dataset_is_numbered_by_its_rows_the_same_on_any_layout(
    cluster, corpus, tmp_path, mode
):
    """A dataset that is not a plain read names no file or row: failed before, a ``path``
    column naming whole files had its rows counted in dataset order (here: rows reversed, so
    the file's row 3 was named row 146). Its sample ``i`` is the dataset's row ``i``: the same
    shards and dropped list on one node (one block) as on three (five blocks); a filtered read
    (the variant: another mechanism) names dataset rows too."""
    from tokpack.ray._blocks import DATASET_SOURCE

    _, files, table, _ = corpus
    first = pq.read_table(files[0])
    reversed_rows = first.take(np.arange(first.num_rows)[::-1])
    reversed_rows = reversed_rows.append_column("path", pa.array([str(files[0])] * first.num_rows))
    kw = dict(mode=mode, min_block_samples=10**6, **LAYOUT)
    one = tmp_path / "one-block"
    tokpack.ray.pack(ray.data.from_arrow(reversed_rows), one, MAX_LEN, **kw)
    _three_nodes(cluster)
    five = tmp_path / "five-blocks"
    tokpack.ray.pack(blocks(reversed_rows, (30, 30, 30, 30)), five, MAX_LEN, **kw)
    listed = dropped(one)
    assert set(listed.column("file").to_pylist()) == {DATASET_SOURCE}
    assert listed.column("row").to_pylist() == listed.column("sample_id").to_pylist()
    empty = [r["row"] for r in listed.to_pylist() if r["reason"] == "empty"]
    assert empty == [first.num_rows - 1 - 3]  # the file's row 3 (empty), the dataset's row 146
    assert dropped(five).equals(listed)
    for s in read_manifest(one)["shards"]:
        assert filecmp.cmp(one / s["file"], five / s["file"], shallow=False)

    paths = [str(f) for f in files]
    filtered = ray.data.read_parquet(paths, include_paths=True).filter(
        lambda row: len(row["input_ids"]) % 7 != 1
    )
    tokpack.ray.pack(filtered, tmp_path / "filtered", MAX_LEN, **kw)
    assert set(dropped(tmp_path / "filtered").column("file").to_pylist()) == {DATASET_SOURCE}
    assert read_manifest(tmp_path / "filtered")["inputs"][0]["path"] == DATASET_SOURCE


def test_only_a_plain_read_is_taken_for_its_files(cluster, corpus):
    """From the plan alone (nothing runs): a read, with paths, then a repartition without a
    shuffle, is its files; a shuffle, filter, projection, limit, map or in-memory data is not."""
    from tokpack.ray._read import plain_read_files

    _, files, table, _ = corpus
    paths = [str(f) for f in files]
    read = ray.data.read_parquet(paths, include_paths=True)
    for ds in (read, read.repartition(11), ray.data.read_parquet(paths).repartition(2)):
        assert plain_read_files(ds) == paths
    for ds in (
        read.repartition(11, shuffle=True),
        read.random_shuffle(seed=1),
        ray.data.read_parquet(paths, shuffle="files"),
        read.filter(lambda row: True),
        read.select_columns(["input_ids"]),
        ray.data.read_parquet(paths, columns=["input_ids"]),
        read.limit(10),
        read.map_batches(_identity, batch_format="pyarrow"),
        ray.data.from_arrow(table),
    ):
        assert plain_read_files(ds) is None
