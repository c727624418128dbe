"""Object storage, ``--spill-dir`` and the last seams keep the local guarantees (issue 35), each
against moto's S3 server on 127.0.0.1 and a real process where a kill is the point:

- content identity of input objects: a replaced object is seen, a damaged local copy is never
  packed;
- one overlap rule for every destination, by path components, local and on a store;
- every scratch directory is owned: a dead run's is removed by the next run, a live run's and a
  user's files never;
- the remote readers' cache heals, and its messages name the damaged place;
- ``--spill-dir`` is checked before any work.

moto keeps its buckets for the whole process: each test writes under its own prefix."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack._io.inputs import TOKEN_SUFFIXES, resolve_inputs
from tokpack._io.objects import cache_root
from tokpack._io.outdir import read_manifest
from tokpack._io.overlap import check_apart, uri_place
from tokpack._io.scratch import SPILL_PREFIX, STAGED_PREFIX, scratch_dir
from tokpack.cli import main
from tokpack.packed.reader import PackedDir
from tokpack.synthetic import write_token_shards

from ._tree import tree

BUCKET = "tokpack-test/seams"


def put(fs, key: str, data: bytes) -> None:
    with fs.open_output_stream(key) as f:
        f.write(data)


def shards_of(out: Path):
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.parquet"))}


def same_size_tables(tmp_path: Path, n: int = 40):
    """Two token shards of the same byte size and different tokens (no compression, no
    dictionary, no statistics: the size depends on the lengths alone)."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(5, 60, n)
    files = []
    for seed in (1, 2):
        ids = np.random.default_rng(seed).integers(0, 30_000, int(lengths.sum()), dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        table = pa.table({"input_ids": pa.ListArray.from_arrays(offsets, ids)})
        path = tmp_path / f"v{seed}.parquet"
        pq.write_table(
            table, path, compression="none", use_dictionary=False, write_statistics=False
        )
        files.append(path)
    assert files[0].stat().st_size == files[1].stat().st_size
    assert files[0].read_bytes() != files[1].read_bytes()
    return files


def replace_within_its_second(fs, key: str, first: Path, second: Path) -> None:
    """Puts ``first`` at ``key``, mirrors it (the local copy and its record), then puts
    ``second`` (same size) in the same second of the store's clock: S3 gives modification
    times to the second, so (size, mtime) cannot tell them apart."""
    for _ in range(10):
        while time.time() % 1 > 0.3:  # (the three requests below take a few milliseconds)
            time.sleep(0.01)
        put(fs, key, first.read_bytes())
        before = fs.get_file_info(key).mtime_ns
        resolve_inputs(f"s3://{key}", TOKEN_SUFFIXES)
        put(fs, key, second.read_bytes())
        if fs.get_file_info(key).mtime_ns == before:
            return
    pytest.fail("could not replace the object within one second of the store's clock")


# --- 1, 2: content identity of input objects ----------------------------------------------------


def test_an_object_replaced_within_its_second_by_one_of_its_size_is_seen(s3_env, tmp_path):
    """Fails on the code before issue 35: the mirror and the fingerprint were (URI, size,
    mtime), so a fresh OUT was packed from the stale copy of the first object, exit 0."""
    first, second = same_size_tables(tmp_path)
    key = f"{BUCKET}/replaced/tokens.parquet"
    replace_within_its_second(s3_env, key, first, second)
    tokpack.pack_files(second, tmp_path / "expected", 128)
    packed = tokpack.pack_files(f"s3://{key}", tmp_path / "fresh", 128)
    assert shards_of(tmp_path / "fresh") == shards_of(tmp_path / "expected")
    assert packed["figures"] == {
        **read_manifest(tmp_path / "expected")["figures"],
        "wall_time_s": packed["figures"]["wall_time_s"],
    }


def test_a_rerun_after_a_same_second_replacement_is_not_a_cache_hit(s3_env, tmp_path):
    """The variant at another moment: OUT already built from the first object; the rerun was a
    cache hit with the old tokens."""
    first, second = same_size_tables(tmp_path)
    key = f"{BUCKET}/rerun/tokens.parquet"
    put(s3_env, key, first.read_bytes())
    built = tokpack.pack_files(f"s3://{key}", tmp_path / "out", 128)
    replace_within_its_second(s3_env, key, first, second)
    rerun = tokpack.pack_files(f"s3://{key}", tmp_path / "out", 128)
    assert not rerun["cache_hit"]
    assert rerun["cache_key"] != built["cache_key"]
    tokpack.pack_files(second, tmp_path / "expected", 128)
    assert shards_of(tmp_path / "out") == shards_of(tmp_path / "expected")
    assert tokpack.pack_files(f"s3://{key}", tmp_path / "out", 128)["cache_hit"]


def _damage(copy: Path) -> None:
    """Flips bytes in the middle of a file, keeping its size and modification time."""
    st = copy.stat()
    data = bytearray(copy.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0x01
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_damaged_local_copy_of_an_object_is_fetched_again_not_packed(s3_env, tmp_path):
    """Fails on the code before issue 35: only the copy's size was compared, so the damaged
    bytes were packed (or the run failed on them), exit 0 with tokens the store never had."""
    files = same_size_tables(tmp_path)[:1]  # (plain values: damaged bytes decode as other ids)
    key = f"{BUCKET}/damaged/{Path(files[0]).name}"
    put(s3_env, key, Path(files[0]).read_bytes())
    tokpack.pack_files(f"s3://{key}", tmp_path / "first", 256)
    copy = cache_root() / "s3" / key
    _damage(copy)
    tokpack.pack_files(files, tmp_path / "expected", 256)
    tokpack.pack_files(f"s3://{key}", tmp_path / "second", 256)
    assert shards_of(tmp_path / "second") == shards_of(tmp_path / "expected")
    assert copy.read_bytes() == Path(files[0]).read_bytes()  # the copy was healed


def test_a_damaged_local_copy_is_not_read_by_another_command(s3_env, tmp_path):
    """The variant through another command (stats' lengths reader) and a damage that keeps
    the copy's record."""
    from tokpack.pack.files import read_lengths

    files = write_token_shards(tmp_path / "c", 200, n_files=1, max_length=200, compression="none")
    key = f"{BUCKET}/damaged-stats/{Path(files[0]).name}"
    put(s3_env, key, Path(files[0]).read_bytes())
    want = read_lengths(files).tolist()
    assert read_lengths(f"s3://{key}").tolist() == want
    _damage(cache_root() / "s3" / key)
    assert read_lengths(f"s3://{key}").tolist() == want


# --- 3, 5: one overlap rule ---------------------------------------------------------------------


def test_places_overlap_by_path_components_not_by_string_prefix():
    out = uri_place("s3://B/tokens-packed/")
    check_apart(out, [(uri_place("s3://B/tok/"), True)])  # apart
    check_apart(uri_place("s3://B/tokens/packed"), [(uri_place("gs://B/tokens"), True)])
    with pytest.raises(tokpack.ConfigError, match="inside the input directory s3://B/tokens"):
        check_apart(uri_place("s3://B/tokens/packed"), [(uri_place("s3://B/tokens/"), True)])
    with pytest.raises(tokpack.ConfigError, match="inside the output directory"):
        check_apart(uri_place("s3://B/data"), [(uri_place("s3://B/data/tokens"), True)])


def test_an_object_store_out_inside_its_input_prefix_is_refused(s3_env, tmp_path, capsys):
    """Fails on the code before issue 35: `pack s3://B/tokens/ -o s3://B/tokens/packed` was
    accepted, and each rerun packed its previous output back in (samples_in grew)."""
    files = write_token_shards(tmp_path / "c", 300, n_files=2, max_length=200)
    prefix = f"{BUCKET}/overlap/tokens"
    for f in files:
        put(s3_env, f"{prefix}/{Path(f).name}", Path(f).read_bytes())
    before = sorted(s3_env.get_file_info(pa.fs.FileSelector(prefix, recursive=True)), key=str)
    for inputs in (f"s3://{prefix}/", f"s3://{prefix}/*.parquet"):
        code = main(["pack", inputs, "-o", f"s3://{prefix}/packed", "--max-len", "256", "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and "inside the input directory" in err and err.count("\n") == 1, err
    after = sorted(s3_env.get_file_info(pa.fs.FileSelector(prefix, recursive=True)), key=str)
    assert [i.path for i in after] == [i.path for i in before]
    # A sibling whose name starts with the input's is apart: accepted.
    manifest = tokpack.pack_files(f"s3://{prefix}/", f"s3://{prefix}-packed", 256)
    assert manifest["figures"]["samples_in"] == 300


def test_repacking_an_object_store_output_into_itself_is_refused(s3_env, tmp_path):
    """The variant of another name: a tokpack output on a store given as its own input (it
    replaced its own input), and an output holding the input prefix."""
    files = write_token_shards(tmp_path / "c", 200, n_files=1, max_length=200)
    prefix = f"{BUCKET}/itself"
    put(s3_env, f"{prefix}/tokens/{Path(files[0]).name}", Path(files[0]).read_bytes())
    tokpack.pack_files(f"s3://{prefix}/tokens/", f"s3://{prefix}/packed", 256)
    with pytest.raises(tokpack.ConfigError, match="is the input directory"):
        tokpack.pack_files(f"s3://{prefix}/packed/", f"s3://{prefix}/packed", 256)
    with pytest.raises(tokpack.ConfigError, match="inside the output directory"):
        tokpack.pack_files(f"s3://{prefix}/tokens/", f"s3://{prefix}", 256)
    key = f"s3://{prefix}/tokens/{Path(files[0]).name}"
    with pytest.raises(tokpack.ConfigError, match="inside the output directory"):
        tokpack.pack_files(key, f"s3://{prefix}/tokens", 256)


def test_tokenize_to_a_store_refuses_an_out_inside_its_input_prefix(s3_env, tmp_path):
    """The same rule for `tokenize` (another command, same destination)."""
    from ._tokenizer_factory import build_tokenizer, conversations, write_jsonl

    tok = build_tokenizer(tmp_path / "tok")
    records = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in conversations(10)])
    put(s3_env, f"{BUCKET}/tok-raw/chat.jsonl", Path(records).read_bytes())
    with pytest.raises(tokpack.ConfigError, match="inside the input directory"):
        tokpack.tokenize_files([f"s3://{BUCKET}/tok-raw/"], f"s3://{BUCKET}/tok-raw/tokens", tok)


@pytest.fixture
def packed_from_folder(tmp_path, capsys):
    inputs = tmp_path / "tokens"
    write_token_shards(inputs, 200, n_files=2, max_length=200)
    assert main(["pack", str(inputs), "-o", str(tmp_path / "packed"), "--max-len", "256"]) == 0
    capsys.readouterr()
    return inputs, tmp_path / "packed"


def test_export_nemo_into_a_new_folder_inside_the_packs_input_folder_is_refused(
    packed_from_folder, tmp_path, capsys
):
    """Fails on the code before issue 35: the export was written, and the next `tokpack pack`
    of the folder read it as input."""
    inputs, packed = packed_from_folder
    before = tree(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(inputs)
    for dest in (inputs / "nemo" / "train.parquet", inputs / "train.parquet", link / "x.pq"):
        code = main(["export", "nemo", str(packed), str(dest)])
        err = capsys.readouterr().err
        assert code == 2 and "inside the input directory" in err and err.count("\n") == 1, err
    link.unlink()
    assert tree(tmp_path) == before
    # Outside the input folder: written; a Megatron export (.bin / .idx, never read by pack)
    # may sit beside the inputs.
    assert main(["export", "nemo", str(packed), str(tmp_path / "nemo" / "train.parquet")]) == 0
    assert main(["export", "megatron", str(packed), str(inputs / "mega" / "train")]) == 0


def test_export_nemo_to_a_store_inside_the_packs_input_prefix_is_refused(s3_env, tmp_path):
    """The variant on object storage: inputs and export both `s3://`."""
    from tokpack.packed.export import export_nemo_packed

    files = write_token_shards(tmp_path / "c", 200, n_files=1, max_length=200)
    prefix = f"{BUCKET}/export-in"
    put(s3_env, f"{prefix}/tokens/{Path(files[0]).name}", Path(files[0]).read_bytes())
    tokpack.pack_files(f"s3://{prefix}/tokens/", tmp_path / "packed", 256)
    with pytest.raises(tokpack.ConfigError, match="inside the input directory"):
        export_nemo_packed(tmp_path / "packed", f"s3://{prefix}/tokens/nemo/train.parquet")
    export_nemo_packed(tmp_path / "packed", f"s3://{prefix}/tokens-nemo/train.parquet")


# --- 6, 7: every scratch directory is owned -----------------------------------------------------


def _big_corpus(root: Path):
    return write_token_shards(root, 60_000, n_files=2, max_length=400, row_group_rows=2048)


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    return _big_corpus(tmp_path_factory.mktemp("big"))


def _kill_when(args, env, ready, timeout=120.0):
    """Runs ``python -m tokpack *args``; SIGKILLs it once ``ready()`` is true. Returns
    whether it was killed (False: it ended first)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokpack", *map(str, args)],
        env=env,
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if ready():
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait(timeout=60)
    return proc.returncode == -signal.SIGKILL


def _subprocess_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tokpack.__file__).parents[1])] + sys.path)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _named(folder: Path, prefix: str):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(prefix))


def _spilling(folder: Path, prefix: str):
    def ready() -> bool:
        return any(p.is_dir() and any(p.iterdir()) for p in folder.glob(f"{prefix}*"))

    return ready


def test_a_killed_runs_spill_dir_is_removed_by_the_next_run(big_corpus, tmp_path):
    """Fails on the code before issue 35: kill -9 during `pack --spill-dir D` left
    D/.tokpack-spill-* (the whole spill), and no later run removed it, --force neither."""
    spill = tmp_path / "spill"
    spill.mkdir()
    (spill / ".tokpack-spill-mine").write_text("a user's file of that name stays")
    args = ["pack", *big_corpus, "--max-len", "512", "--quiet", "--spill-dir", spill]
    killed = _kill_when(
        [*args, "-o", tmp_path / "out"], _subprocess_env(), _spilling(spill, SPILL_PREFIX)
    )
    assert killed, "the run ended before its spill was seen"
    assert any(p.is_dir() for p in spill.glob(f"{SPILL_PREFIX}*"))  # the dead run's
    # The next run there, another OUT and --force: the dead run's spill goes, the user's stays.
    assert main([*map(str, args), "-o", str(tmp_path / "other"), "--force"]) == 0
    assert _named(spill, ".tokpack-spill") == [".tokpack-spill-mine"]


def test_a_live_runs_spill_dir_is_never_removed_and_a_cache_hit_cleans(big_corpus, tmp_path):
    """The variant at other moments: a scratch directory a live process holds stays while
    another run works in the same place; a cache hit (no spill of its own) still removes a
    dead run's."""
    spill = tmp_path / "spill"
    spill.mkdir()
    small = write_token_shards(tmp_path / "c", 100, n_files=1, max_length=100)
    with scratch_dir(SPILL_PREFIX, spill) as live:
        (live / "spilled").write_bytes(b"x")
        tokpack.pack_files(small, tmp_path / "out", 128, spill_dir=spill)
        assert (live / "spilled").exists()
    script = (
        "import os, signal\n"
        "from tokpack._io.scratch import scratch_dir, SPILL_PREFIX\n"
        f"with scratch_dir(SPILL_PREFIX, {str(spill)!r}) as d:\n"
        "    (d / 'spilled').write_bytes(b'x')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=_subprocess_env(), check=False)
    assert proc.returncode == -signal.SIGKILL
    assert len(_named(spill, SPILL_PREFIX)) == 2  # its directory and its lock file
    assert tokpack.pack_files(small, tmp_path / "out", 128, spill_dir=spill)["cache_hit"]
    assert _named(spill, SPILL_PREFIX) == []


@pytest.mark.parametrize("in_spill_dir", [False, True])
def test_a_killed_object_store_runs_staging_is_removed_by_the_next_run(
    big_corpus, s3_env, tmp_path, in_spill_dir
):
    """Fails on the code before issue 35: kill -9 during `pack -o s3://...` left
    tokpack-staged-* (spill and built shards) in TMPDIR or --spill-dir, for good."""
    place = tmp_path / ("spill" if in_spill_dir else "tmp")
    place.mkdir()
    extra = ["--spill-dir", place] if in_spill_dir else []
    env = _subprocess_env(TMPDIR=place)
    out = f"s3://{BUCKET}/staged-{int(in_spill_dir)}"
    args = ["pack", *big_corpus, "-o", out, "--max-len", "512", "--quiet", *extra]
    assert _kill_when(args, env, _spilling(place, STAGED_PREFIX)), "the run ended first"
    assert any(p.is_dir() for p in place.glob(f"{STAGED_PREFIX}*"))
    proc = subprocess.run(
        [sys.executable, "-m", "tokpack", *map(str, args)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert _named(place, STAGED_PREFIX) == []


def test_a_dead_runs_download_of_an_object_is_removed_by_the_next_run(s3_env, tmp_path):
    """The copies of input objects are downloaded to ``.NAME.tmp-PID-TAG`` beside them: one a
    killed run left (its pid gone) is removed by the next download there, a live run's stays."""
    files = write_token_shards(tmp_path / "c", 50, n_files=1, max_length=100)
    key = f"{BUCKET}/download/{Path(files[0]).name}"
    put(s3_env, key, Path(files[0]).read_bytes())
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    folder = cache_root() / "s3" / Path(key).parent
    folder.mkdir(parents=True)
    name = Path(key).name
    left = folder / f".{name}.tmp-{dead.stdout.strip()}-0123abcd"
    live = folder / f".{name}.tmp-{os.getpid()}-0123abcd"
    for path in (left, live):
        path.write_bytes(b"half a download")
    tokpack.pack_files(f"s3://{key}", tmp_path / "out", 128)
    assert not left.exists() and live.exists()


# --- 8: the remote readers' cache heals --------------------------------------------------------


@pytest.fixture
def remote_packed(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "tokpack")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "tokpack")
    fs, endpoint = s3_server
    files = write_token_shards(tmp_path / "c", 400, n_files=1, max_length=200)
    local = tmp_path / "packed"
    tokpack.pack_files(files, local, 256, rows_per_shard=40, row_group_rows=8)
    prefix = f"{BUCKET}/healing"
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        put(fs, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
    uri = f"s3://{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    return local, uri, tmp_path / "cache"


def _cached(cache: Path, name: str) -> Path:
    (found,) = [p for p in cache.glob(f"*/{name}")]
    return found


def test_a_damaged_range_in_the_readers_cache_is_fetched_again(remote_packed):
    """Fails on the code before issue 35: one damaged file in the readers' cache made verify
    and every reader report the intact object as corrupt, on every later run."""
    local, uri, cache = remote_packed
    tokpack.verify(uri, cache_dir=cache)  # every range cached
    packed = PackedDir(local)
    shard = packed.manifest["shards"][1]
    group = shard["row_group_bytes"][2]
    copy = _cached(cache, shard["file"])
    with open(copy, "r+b") as f:
        f.seek(group["offset"] + group["length"] // 2)
        f.write(b"\xff\xff\xff\xff")
    assert tokpack.verify(uri, cache_dir=cache)["ok"]
    assert (
        copy.read_bytes()[group["offset"] : group["offset"] + group["length"]]
        == (
            (local / shard["file"]).read_bytes()[
                group["offset"] : group["offset"] + group["length"]
            ]
        )
    )
    # And the torch reader reads the rows the store holds.
    from tokpack.torch import PackedDataset

    remote, want = PackedDataset(uri, cache_dir=cache), PackedDataset(local)
    assert all((remote[i]["input_ids"] == want[i]["input_ids"]).all() for i in range(len(want)))


def test_a_truncated_shard_and_a_damaged_side_file_in_the_cache_heal(remote_packed):
    """The variant of another mechanism: a cached shard file cut short (its footer gone) and a
    damaged cached index."""
    local, uri, cache = remote_packed
    tokpack.verify(uri, cache_dir=cache)
    packed = PackedDir(local)
    shard = packed.manifest["shards"][0]
    copy = _cached(cache, shard["file"])
    with open(copy, "r+b") as f:
        f.truncate(copy.stat().st_size // 2)
    index = _cached(cache, shard["index"])
    index.write_bytes(b"\0" * index.stat().st_size)
    assert tokpack.verify(uri, cache_dir=cache)["ok"]
    assert index.read_bytes() == (local / shard["index"]).read_bytes()


def test_a_cache_that_keeps_failing_is_named_not_the_store(remote_packed, monkeypatch):
    """Only bytes that fail when fetched are the store's; bytes that were intact when fetched
    and fail when read again name the local cache file."""
    from tokpack._io import rangecache as _cache

    local, uri, cache = remote_packed
    store = _cache.RangeCache._store

    def damaging(self, shard, path, size, want, data, keep):
        store(self, shard, path, size, want, bytes(len(data)) if want[0] != "f" else data, keep)

    monkeypatch.setattr(_cache.RangeCache, "_store", damaging)
    with pytest.raises(tokpack.CorruptOutputError) as err:
        tokpack.verify(uri, cache_dir=cache)
    message = str(err.value)
    assert message.startswith(str(cache.resolve())), message
    assert "local cache" in message and "cache_dir" in message


# --- 9: --spill-dir checked before any work ----------------------------------------------------


def _spill_cases(tmp_path: Path):
    missing = tmp_path / "missing"
    afile = tmp_path / "afile"
    afile.write_text("x")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    return [(missing, "does not exist"), (afile, "is a file"), (loop, "symlink loop")]


@pytest.mark.parametrize("remote", [False, True])
def test_a_bad_spill_dir_is_one_line_and_exit_2_before_any_work(s3_env, tmp_path, capsys, remote):
    """Fails on the code before issue 35: with an s3:// OUT, a missing spill dir, a file or a
    symlink loop was a Python traceback and exit 1 (after the inputs were read)."""
    files = write_token_shards(tmp_path / "c", 100, n_files=1, max_length=100)
    out = f"s3://{BUCKET}/bad-spill" if remote else str(tmp_path / "out")
    for spill, message in _spill_cases(tmp_path):
        before = tree(tmp_path)
        code = main(
            [
                "pack",
                *map(str, files),
                "-o",
                out,
                "--max-len",
                "128",
                "--quiet",
                "--spill-dir",
                str(spill),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert "spill_dir (--spill-dir) must be an existing directory" in err and message in err
        assert tree(tmp_path) == before


_READ_ONLY = """
mount --bind {spill} {spill} && mount -o remount,bind,ro {spill} && exec {python} -m tokpack \
pack {inputs} -o {out} --max-len 128 --quiet --spill-dir {spill}
"""


@pytest.mark.parametrize("remote", [False, True])
def test_a_read_only_spill_dir_is_one_line_and_exit_2(s3_env, tmp_path, remote):
    """The variant of another mechanism: a spill dir that exists but takes no files (a
    read-only mount as root, a 0500 directory otherwise), with a local and an s3:// OUT."""
    files = write_token_shards(tmp_path / "c", 100, n_files=1, max_length=100)
    spill = tmp_path / "ro"
    spill.mkdir()
    out = f"s3://{BUCKET}/ro-spill" if remote else str(tmp_path / "out")
    env = _subprocess_env()
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("needs unshare to mount a read-only directory as root")
        shell = _READ_ONLY.format(spill=spill, python=sys.executable, inputs=files[0], out=out)
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", shell], env=env, capture_output=True, text=True
        )
        if "mount:" in proc.stderr or "unshare:" in proc.stderr:
            pytest.skip(f"cannot mount a read-only directory here: {proc.stderr.strip()}")
    else:
        spill.chmod(0o500)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tokpack",
                "pack",
                str(files[0]),
                "-o",
                out,
                "--max-len",
                "128",
                "--quiet",
                "--spill-dir",
                str(spill),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        spill.chmod(0o700)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot create files in it" in proc.stderr
    assert not (tmp_path / "out").exists()
