"""`pack` / `tokenize` into and from object storage (moto's S3 server, and a GCS emulator where
a test takes ``store``): the objects are
`pack`'s local bytes, the manifest is written last, a rerun is a cache hit, what tokpack did not
write is refused and never deleted, and a run that fails leaves the previous output as it was.
Inputs given as URIs are packed from local copies with `pack`'s bytes and named by their URIs.

moto keeps its buckets for the whole process: each test writes under its own prefix."""

import json
from pathlib import Path

import pytest

import tokpack
from tokpack._io.outdir import MANIFEST_NAME
from tokpack._io.store import RUN_MARKER
from tokpack.synthetic import write_token_shards

# Under a prefix of its own: moto keeps its objects for the whole process.
BUCKET = "tokpack-test/object-io"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return write_token_shards(d, 1200, n_files=2, max_length=500, row_group_rows=300, seed=5)


def objects(fs, prefix):
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    return {i.path[len(prefix) + 1 :]: i for i in infos if i.type == pafs.FileType.File}


def read_object(fs, key):
    with fs.open_input_stream(key) as f:
        return f.read()


def local_files(root: Path):
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}


def test_pack_to_a_store_uploads_packs_bytes_with_the_manifest_last(corpus, store, tmp_path):
    local = tokpack.pack_files(corpus, tmp_path / "local", 512, rows_per_shard=200)
    remote = tokpack.pack_files(
        corpus, f"{BUCKET}/packed", 512, rows_per_shard=200, filesystem=store
    )
    assert not remote["cache_hit"]
    assert remote["figures"]["rows"] == local["figures"]["rows"]
    assert remote["cache_key"] == local["cache_key"]
    stored = objects(store, f"{BUCKET}/packed")
    files = local_files(tmp_path / "local")
    assert set(stored) == set(files)  # the claim is gone, nothing staged is left
    for name, path in files.items():
        if name != MANIFEST_NAME:
            assert read_object(store, f"{BUCKET}/packed/{name}") == path.read_bytes(), name
    manifest = json.loads(read_object(store, f"{BUCKET}/packed/{MANIFEST_NAME}"))
    assert manifest["shards"] == local["shards"]
    # The manifest commits the output: it was the last object written.
    assert stored[MANIFEST_NAME].mtime >= max(i.mtime for i in stored.values())


def test_rerun_is_a_cache_hit_and_a_damaged_object_is_rebuilt(corpus, store):
    out = f"{BUCKET}/again"
    tokpack.pack_files(corpus, out, 512, filesystem=store)
    assert tokpack.pack_files(corpus, out, 512, filesystem=store)["cache_hit"]
    shard = tokpack.pack_files(corpus, out, 512, filesystem=store)["shards"][0]["file"]
    with store.open_output_stream(f"{out}/{shard}") as f:
        f.write(b"truncated")
    rerun = tokpack.pack_files(corpus, out, 512, filesystem=store)
    assert not rerun["cache_hit"]
    assert "bytes, the manifest says" in rerun["rebuilt_because"]
    assert tokpack.pack_files(corpus, out, 512, filesystem=store)["cache_hit"]
    # Another config is another key: rebuilt.
    assert not tokpack.pack_files(corpus, out, 1024, filesystem=store)["cache_hit"]


def test_a_prefix_holding_foreign_objects_is_refused_and_kept(corpus, store):
    with store.open_output_stream(f"{BUCKET}/theirs/part-0.parquet") as f:
        f.write(b"not ours")
    with pytest.raises(tokpack.OutputExistsError, match="tokpack did not write"):
        tokpack.pack_files(corpus, f"{BUCKET}/theirs", 512, filesystem=store)
    assert list(objects(store, f"{BUCKET}/theirs")) == ["part-0.parquet"]


def test_a_failed_run_leaves_the_previous_output_as_it_was(corpus, store):
    out = f"{BUCKET}/kept"
    tokpack.pack_files(corpus, out, 512, filesystem=store)
    before = {k: read_object(store, f"{out}/{k}") for k in objects(store, out)}
    # Samples longer than 64 tokens with overlong="error": the build fails before any upload.
    with pytest.raises(tokpack.OverlongError):
        tokpack.pack_files(corpus, out, 64, filesystem=store)
    after = {k: read_object(store, f"{out}/{k}") for k in objects(store, out)}
    assert after == before
    assert RUN_MARKER not in after
    assert tokpack.pack_files(corpus, out, 512, filesystem=store)["cache_hit"]


def test_a_dead_runs_objects_stay_claimed_after_a_failed_run(corpus, store):
    """A run killed mid-upload leaves shards and its claim; a later run that fails must keep
    the claim, or the dead run's objects would read as foreign and block every rerun."""
    out = f"{BUCKET}/dead"
    with store.open_output_stream(f"{out}/part-00000.parquet") as f:
        f.write(b"half a shard")
    with store.open_output_stream(f"{out}/{RUN_MARKER}") as f:
        f.write(b"1\n")
    with pytest.raises(tokpack.OverlongError):
        tokpack.pack_files(corpus, out, 64, filesystem=store)
    assert RUN_MARKER in objects(store, out)
    manifest = tokpack.pack_files(corpus, out, 512, filesystem=store)
    assert set(objects(store, out)) == {
        MANIFEST_NAME,
        manifest["dropped_file"],
        *(s["file"] for s in manifest["shards"]),
        *(s["index"] for s in manifest["shards"]),
    }


def test_tokenize_to_a_store_uploads_its_bytes(store, tmp_path):
    from ._tokenizer_factory import build_tokenizer, conversations, write_jsonl

    tok = build_tokenizer(tmp_path / "tok")
    records = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations(80)])
    local = tokpack.tokenize_files([records], tmp_path / "tokens", tok)
    remote = tokpack.tokenize_files([records], f"{BUCKET}/tokenized", tok, filesystem=store)
    assert remote["counts"] == local["counts"]
    for shard in local["shards"]:
        name = shard["file"]
        assert (
            read_object(store, f"{BUCKET}/tokenized/{name}")
            == (tmp_path / "tokens" / name).read_bytes()
        )
    assert tokpack.tokenize_files([records], f"{BUCKET}/tokenized", tok, filesystem=store)[
        "cache_hit"
    ]


def test_an_unknown_scheme_is_a_config_error(corpus):
    with pytest.raises(tokpack.ConfigError, match="not a usable output location"):
        tokpack.pack_files(corpus, "nosuchscheme://bucket/x", 512)


def upload(fs, files, prefix):
    for f in files:
        with fs.open_output_stream(f"{prefix}/{Path(f).name}") as out:
            out.write(Path(f).read_bytes())


def test_pack_from_s3_inputs_is_packs_bytes_and_names_the_objects(corpus, s3_env, tmp_path):
    upload(s3_env, corpus, f"{BUCKET}/tokens")
    tokpack.pack_files(corpus, tmp_path / "local", 512, overlong="drop")
    uri = f"s3://{BUCKET}/tokens/"
    remote = tokpack.pack_files(uri, tmp_path / "remote", 512, overlong="drop")
    for name, path in local_files(tmp_path / "local").items():
        if name.endswith(".parquet") or "index" in name:
            assert (tmp_path / "remote" / name).read_bytes() == path.read_bytes(), name
    names = [f"s3://{BUCKET}/tokens/{Path(f).name}" for f in corpus]
    assert [i["path"] for i in remote["inputs"]] == names
    # A rerun with the objects unchanged is a cache hit (their copies are not downloaded again).
    assert tokpack.pack_files(uri, tmp_path / "remote", 512, overlong="drop")["cache_hit"]
    # A glob of keys, and a single key, name the same objects.
    glob_run = tokpack.pack_files(f"s3://{BUCKET}/tokens/*.parquet", tmp_path / "g", 512)
    assert [i["path"] for i in glob_run["inputs"]] == names


def test_errors_name_the_object_not_its_copy(s3_env, tmp_path):
    files = write_token_shards(tmp_path / "c", 50, n_files=1, max_length=900, seed=1)
    upload(s3_env, files, f"{BUCKET}/long")
    uri = f"s3://{BUCKET}/long/{Path(files[0]).name}"
    with pytest.raises(tokpack.OverlongError) as err:
        tokpack.pack_files(uri, tmp_path / "out", 64)
    assert str(err.value).startswith(uri), str(err.value)
    with pytest.raises(tokpack.InputNotFoundError, match="no such object or prefix"):
        tokpack.pack_files(f"s3://{BUCKET}/nothing-here", tmp_path / "out", 64)
    with pytest.raises(tokpack.InputNotFoundError, match="no object matches"):
        tokpack.pack_files(f"s3://{BUCKET}/long/*.arrow", tmp_path / "out", 64)


def test_a_changed_object_is_downloaded_again(s3_env, tmp_path):
    a = write_token_shards(tmp_path / "a", 40, n_files=1, max_length=200, seed=1)
    b = write_token_shards(tmp_path / "b", 60, n_files=1, max_length=200, seed=2)
    key = f"{BUCKET}/changing/shard.parquet"
    upload(s3_env, a, f"{BUCKET}/changing")
    s3_env.move(f"{BUCKET}/changing/{Path(a[0]).name}", key)
    first = tokpack.pack_files(f"s3://{key}", tmp_path / "out", 256)
    assert first["figures"]["samples_in"] == 40
    with s3_env.open_output_stream(key) as out:
        out.write(Path(b[0]).read_bytes())
    second = tokpack.pack_files(f"s3://{key}", tmp_path / "out", 256)
    assert not second["cache_hit"]
    assert second["figures"]["samples_in"] == 60


def test_s3_in_s3_out(corpus, s3_env):
    upload(s3_env, corpus, f"{BUCKET}/in")
    manifest = tokpack.pack_files(f"s3://{BUCKET}/in/", f"s3://{BUCKET}/out", 512)
    assert MANIFEST_NAME in objects(s3_env, f"{BUCKET}/out")
    assert manifest["inputs"][0]["path"].startswith(f"s3://{BUCKET}/in/")


def test_ray_refuses_object_uris_as_input_files(tmp_path):
    """Copies would be on the driver only; the message says how to give Ray the objects."""
    pytest.importorskip("ray")
    from tokpack.ray._pack import _input_files

    with pytest.raises(tokpack.ConfigError, match=r"pass a dataset: tokpack.ray.pack\(ray.data"):
        _input_files(["s3://bucket/tokens/"], tmp_path / "out", None)


def test_export_megatron_from_s3_is_the_local_export(corpus, s3_env, tmp_path):
    from tokpack.packed.export import export_megatron

    tokpack.pack_files(corpus, tmp_path / "packed", 512)
    tokpack.pack_files(corpus, f"s3://{BUCKET}/exported", 512)
    local = export_megatron(tmp_path / "packed", tmp_path / "local" / "ds")
    remote = export_megatron(f"s3://{BUCKET}/exported", tmp_path / "remote" / "ds")
    assert remote == {**local, "bin": remote["bin"], "idx": remote["idx"]}
    for suffix in (".bin", ".idx"):
        a = (tmp_path / "local" / f"ds{suffix}").read_bytes()
        assert (tmp_path / "remote" / f"ds{suffix}").read_bytes() == a


def test_stats_and_the_streaming_reader_take_uris(corpus, s3_env, tmp_path):
    from tokpack.cli import main
    from tokpack.pack.files import read_lengths

    upload(s3_env, corpus, f"{BUCKET}/stats")
    uri = f"s3://{BUCKET}/stats/"
    assert read_lengths(uri).tolist() == read_lengths(corpus).tolist()
    assert main(["stats", uri, "--max-len", "512"]) == 0
    remote = list(tokpack.streaming_dataset_reader(uri, batch_size=500))
    local = list(tokpack.streaming_dataset_reader(corpus, batch_size=500))
    assert remote == local


def test_export_to_s3_writes_the_local_bytes_under_the_ownership_rule(corpus, s3_env, tmp_path):
    from tokpack.packed.export import export_megatron, export_nemo_packed

    tokpack.pack_files(corpus, tmp_path / "packed", 512)
    export_megatron(tmp_path / "packed", tmp_path / "local" / "ds")
    prefix = f"s3://{BUCKET}/megatron/ds"
    export_megatron(tmp_path / "packed", prefix)
    for suffix in (".bin", ".idx"):
        stored = read_object(s3_env, f"{BUCKET}/megatron/ds{suffix}")
        assert stored == (tmp_path / "local" / f"ds{suffix}").read_bytes()
    with pytest.raises(tokpack.OutputExistsError, match="pass force=True"):
        export_megatron(tmp_path / "packed", prefix)
    export_megatron(tmp_path / "packed", prefix, force=True)  # tokpack's: replaced
    with s3_env.open_output_stream(f"{BUCKET}/theirs/ds.bin") as f:
        f.write(b"someone else's")
    with pytest.raises(tokpack.OutputExistsError, match="did not write"):
        export_megatron(tmp_path / "packed", f"s3://{BUCKET}/theirs/ds", force=True)
    assert read_object(s3_env, f"{BUCKET}/theirs/ds.bin") == b"someone else's"

    local = export_nemo_packed(tmp_path / "packed", tmp_path / "nemo.parquet")
    remote = export_nemo_packed(tmp_path / "packed", f"s3://{BUCKET}/nemo/train.parquet")
    assert {k: v for k, v in remote.items() if k != "file"} == {
        k: v for k, v in local.items() if k != "file"
    }
    stored = read_object(s3_env, f"{BUCKET}/nemo/train.parquet")
    assert stored == (tmp_path / "nemo.parquet").read_bytes()
    export_nemo_packed(tmp_path / "packed", f"s3://{BUCKET}/nemo/train.parquet", force=True)
