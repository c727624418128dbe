"""Atomic output directories and the manifest cache shared by pack and tokenize."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import tokpack
from tokpack._io.outdir import (
    MANIFEST_NAME,
    atomic_output_dir,
    cache_key,
    describe_inputs,
    write_json_atomic,
)
from tokpack.cli import main
from tokpack.synthetic import write_token_shards

from ._tree import tree


def test_complete_run_replaces_the_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    manifest = {"tokpack_version": "0", "shards": [{"file": "old.txt"}]}
    write_json_atomic(out / MANIFEST_NAME, manifest)  # a tokpack output, so replaceable
    with atomic_output_dir(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out
        (tmp / "new.txt").write_text("new")
        assert (out / "old.txt").exists()
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failed_run_leaves_the_old_directory_untouched(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_output_dir(out) as tmp:
            (tmp / "half.txt").write_text("x")
            raise RuntimeError("boom")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_killed_run_leaves_nothing_and_the_next_run_cleans_up(tmp_path):
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import os, signal
        from tokpack._io.outdir import atomic_output_dir
        with atomic_output_dir({str(out)!r}) as tmp:
            (tmp / "part").write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -9
    assert not out.exists()
    leftovers = sorted(p.name for p in tmp_path.iterdir())  # the dead run's temporary and lock
    assert len(leftovers) == 2 and leftovers[0] == ".out.lock"
    with atomic_output_dir(out) as tmp:
        (tmp / "ok").write_text("1")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_cache_key_tracks_inputs_and_config(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc")
    inputs = describe_inputs([f])
    assert inputs[0]["size"] == 3 and len(inputs[0]["fingerprint"]) == 32
    key = cache_key("pack", inputs, {"max_len": 8})
    assert key == cache_key("pack", describe_inputs([f]), {"max_len": 8})
    assert key != cache_key("pack", inputs, {"max_len": 9})
    f.write_bytes(b"abd")
    assert key != cache_key("pack", describe_inputs([f]), {"max_len": 8})
    assert json.loads(json.dumps(inputs)) == inputs


def test_missing_input_is_a_file_not_found_tokpack_error(tmp_path):
    with pytest.raises(tokpack.InputNotFoundError, match="no such file") as info:
        describe_inputs([tmp_path / "nope.parquet"])
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, tokpack.TokpackError)


def test_output_path_that_is_a_file_is_rejected(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(tokpack.ConfigError, match="not a directory"):
        with atomic_output_dir(f):
            pass
    assert os.path.isfile(f)


# --- what an output directory may be (the CLI refuses with exit 2 and one line) ---------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    write_token_shards(d, 200, n_files=1, max_length=60, seed=3)
    return d


def pack_cli(capsys, *args):
    code = main(["pack", *map(str, args), "--max-len", "64", "--quiet", "--overlong", "split"])
    err = capsys.readouterr().err
    return code, err


def assert_refused(capsys, root, *args, match):
    """The run exits 2 with one line naming the problem, and nothing under ``root`` changed."""
    before = tree(root)
    code, err = pack_cli(capsys, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("tokpack pack: error:"), err
    assert re.search(match, err), err
    assert tree(root) == before


def test_packing_into_the_input_directory_deletes_nothing(shards, tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(shards / "shard-00000.parquet", d / "good.parquet")
    (d / "README.txt").write_text("x\n")
    assert_refused(capsys, tmp_path, d, "-o", d, match="did not write")


def test_a_directory_tokpack_did_not_write_is_refused(shards, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.txt").write_text("mine\n")
    (out / ".hidden").write_text("mine too\n")
    assert_refused(capsys, tmp_path, shards, "-o", out, match="did not write")
    with pytest.raises(tokpack.OutputExistsError) as info:
        tokpack.pack_files(shards, out, 64, overlong="split")
    assert isinstance(info.value, FileExistsError)
    assert tree(out) == {"README.txt": b"mine\n", ".hidden": b"mine too\n"}


def test_a_tokpack_directory_with_foreign_files_is_refused(shards, tmp_path, capsys):
    out = tmp_path / "out"
    assert pack_cli(capsys, shards, "-o", out)[0] == 0
    (out / "notes.txt").write_text("my notes\n")
    assert_refused(capsys, tmp_path, shards, "-o", out, "--force", match=r"notes\.txt")
    (out / "notes.txt").unlink()
    (out / "part-00000.parquet").unlink()
    (out / "part-00000.parquet").mkdir()  # a listed name, but not the file tokpack wrote
    (out / "part-00000.parquet" / "x").write_text("x")
    assert_refused(capsys, tmp_path, shards, "-o", out, "--force", match="did not write")
    shutil.rmtree(out / "part-00000.parquet")
    (out / MANIFEST_NAME).write_text("{broken")
    assert_refused(capsys, tmp_path, shards, "-o", out, "--force", match="unreadable")


def test_empty_and_tokpack_directories_are_replaced(shards, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    assert pack_cli(capsys, shards, "-o", out)[0] == 0
    assert pack_cli(capsys, shards, "-o", out, "--force")[0] == 0
    # A `tokenize` output: its shards and side folder.
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    shutil.copy(shards / "shard-00000.parquet", tokens / "part-00000.parquet")
    write_json_atomic(
        tokens / MANIFEST_NAME,
        {
            "kind": "tokenize",
            "tokpack_version": tokpack.__version__,
            "cache_key": "k",
            "shards": [{"file": "part-00000.parquet", "rows": 200, "tokens": 1}],
            "rejected_file": None,
        },
    )
    assert pack_cli(capsys, shards, "-o", tokens)[0] == 0
    assert json.loads((tokens / MANIFEST_NAME).read_text())["format"] == "tokpack-packed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tokens"]


def test_output_overlapping_the_inputs_is_refused(shards, tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(shards / "shard-00000.parquet", d / "a.parquet")
    # Inside an input directory: each rerun would pack the previous output again.
    assert_refused(capsys, tmp_path, d, "-o", d / "packed", match="inside the input directory")
    assert_refused(capsys, tmp_path, tmp_path, "-o", d / "packed", match="inside the input")
    # An input file as OUT, an input inside OUT (replacing OUT would delete it).
    assert_refused(capsys, tmp_path, d / "a.parquet", "-o", d / "a.parquet", match="not a dir")
    out = tmp_path / "out"
    assert pack_cli(capsys, d, "-o", out)[0] == 0
    part = out / "part-00000.parquet"
    assert_refused(capsys, tmp_path, part, "-o", out, match="inside the output directory")
    assert_refused(capsys, tmp_path, out, "-o", out, match="is the input directory")
    # A link to an input inside OUT, and an input reached through a linked OUT.
    (tmp_path / "link.parquet").symlink_to(part)
    assert_refused(capsys, tmp_path, tmp_path / "link.parquet", "-o", out, match="inside the out")
    (tmp_path / "out-link").symlink_to(out)
    assert_refused(capsys, tmp_path, part, "-o", tmp_path / "out-link", match="inside the out")


@pytest.mark.parametrize("target", [".", ""])
def test_current_directory_is_refused_before_any_work(tmp_path, monkeypatch, capsys, target):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")  # any work would fail on it with another message
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert_refused(capsys, tmp_path, junk, "-o", target, match="empty path|current directory")
    monkeypatch.chdir(tmp_path)
    assert_refused(capsys, tmp_path, junk, "-o", "..", match="current directory")


def test_output_paths_that_cannot_be_directories(shards, tmp_path, capsys):
    f = tmp_path / "regular_file"
    f.write_text("x")
    assert_refused(capsys, tmp_path, shards, "-o", f / "sub", match="is a file, not a directory")
    if sys.platform == "linux":
        assert_refused(capsys, tmp_path, shards, "-o", "/proc/tokpack-out", match="cannot")


def test_symlinked_output_is_written_through(shards, tmp_path, capsys):
    target = tmp_path / "target"
    link = tmp_path / "link"
    link.symlink_to(target)  # dangling at first: the target is created
    for extra in ([], ["--force"]):
        assert pack_cli(capsys, shards, "-o", link, *extra)[0] == 0
        assert link.is_symlink() and (target / MANIFEST_NAME).is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "target"]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert_refused(capsys, tmp_path, shards, "-o", loop, match="symlink loop")


def test_a_run_refuses_an_output_another_run_is_writing(shards, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tokpack", "pack", str(shards), "-o", str(out), "--quiet"]
    cmd += ["--max-len", "64", "--overlong", "split"]
    with atomic_output_dir(out) as tmp:
        (tmp / "mine").write_text("x")
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "another tokpack run" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.name for p in out.iterdir()] == ["mine"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_concurrent_runs_into_one_output_end_cleanly(shards, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tokpack", "pack", str(shards), "-o", str(out), "--quiet"]
    cmd += ["--max-len", "64", "--overlong", "split", "--force", "--threads", "1"]
    reference = None
    for _ in range(10):
        procs = [
            subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
            for _ in range(2)
        ]
        for proc in procs:
            err = proc.communicate(timeout=120)[1]
            assert "Traceback" not in err
            assert proc.returncode == 0 or (
                proc.returncode == 2 and "another tokpack run" in err
            ), err
        assert 0 in [p.returncode for p in procs]
        manifest = json.loads((out / MANIFEST_NAME).read_text())
        shards_now = [(s["file"], s["checksum"]) for s in manifest["shards"]]
        reference = reference or shards_now
        assert shards_now == reference
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_interrupt_while_the_spill_is_removed_leaves_nothing(tmp_path, monkeypatch):
    """A Ctrl-C / SIGTERM landing while `pack` removes its spill files (CI found one left
    next to OUT after a SIGTERM): the spill lives in the run's temporary, removed with it."""
    (path,) = write_token_shards(tmp_path / "in", 500, n_files=1, max_length=300, seed=1)
    real = shutil.rmtree
    calls = []

    def interrupted_once(target, *args, **kwargs):
        calls.append(str(target))
        if len(calls) == 1:
            raise KeyboardInterrupt  # before removing anything
        real(target, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        tokpack.pack_files([path], tmp_path / "out", max_len=512)
    assert "spill" in calls[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


# --- every writer follows the same rules: export ------------------------------------------------


def export_cli(capsys, *args):
    code = main(["export", *map(str, args)])
    return code, capsys.readouterr().err


@pytest.fixture
def packed_out(shards, tmp_path, capsys):
    out = tmp_path / "out"
    assert pack_cli(capsys, shards, "-o", out)[0] == 0
    return out


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_export_never_writes_into_the_packed_directory(packed_out, tmp_path, capsys, force):
    """Fails on the code before issue 20: `export nemo OUT OUT/part-00000.parquet --force`
    replaced a shard of the directory it read (exit 0), and without --force wrote a foreign
    file into OUT; `export megatron` wrote into it too."""
    link = tmp_path / "link"
    link.symlink_to(packed_out)
    before = tree(tmp_path)
    for dest in (packed_out / "part-00000.parquet", packed_out / "x.parquet", link / "y.pq"):
        code, err = export_cli(capsys, "nemo", packed_out, dest, *force)
        assert code == 2 and "inside the input" in err and err.count("\n") == 1, err
    for prefix in (packed_out / "train", link / "__tokpack__" / "train"):
        code, err = export_cli(capsys, "megatron", packed_out, prefix, *force)
        assert code == 2 and "inside the input" in err, err
    assert tree(tmp_path) == before
    tokpack.verify(packed_out)


def test_export_keeps_the_mode_and_group_of_a_replaced_file(packed_out, tmp_path):
    """Fails on the code before issue 20: a replaced export became 0644."""
    dest = tmp_path / "n.parquet"
    tokpack.export_nemo_packed(packed_out, dest)
    os.chmod(dest, 0o600)
    tokpack.export_nemo_packed(packed_out, dest, force=True)
    assert dest.stat().st_mode & 0o777 == 0o600
    tokpack.export_megatron(packed_out, tmp_path / "train")
    for suffix in (".bin", ".idx", ".tokpack.json"):
        os.chmod(tmp_path / f"train{suffix}", 0o640)
    tokpack.export_megatron(packed_out, tmp_path / "train", force=True)
    for suffix in (".bin", ".idx", ".tokpack.json"):
        assert (tmp_path / f"train{suffix}").stat().st_mode & 0o777 == 0o640


# --- permissions: a rebuilt output is as private as the one it replaces --------------------------


def modes(root):
    return {str(p.relative_to(root)): p.stat().st_mode & 0o7777 for p in root.rglob("*")}


@pytest.mark.parametrize("dir_mode, file_mode", [(0o700, 0o600), (0o750, 0o640), (0o2770, 0o660)])
def test_an_existing_output_keeps_its_mode(shards, tmp_path, capsys, dir_mode, file_mode):
    """Fails on the code before issue 20: a `mkdir -m 700` OUT (or a 0700 output rebuilt with
    --force) became 0755 with 0644 files, readable by every user."""
    old_umask = os.umask(0o002)  # files 0664 by default: the directory's bits must win
    try:
        out = tmp_path / "out"
        out.mkdir()
        os.chmod(out, dir_mode)
        for extra in ([], ["--force"]):
            assert pack_cli(capsys, shards, "-o", out, *extra)[0] == 0
            assert out.stat().st_mode & 0o7777 == dir_mode
            got = modes(out)
            assert got[MANIFEST_NAME.split("/")[0]] == dir_mode
            files = {k: v for k, v in got.items() if (out / k).is_file()}
            assert files and set(files.values()) == {file_mode}, files
    finally:
        os.umask(old_umask)


def test_a_symlinked_output_keeps_its_targets_mode_and_group(shards, tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    gid = 4242 if os.geteuid() == 0 else os.getgid()
    os.chown(target, -1, gid)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert pack_cli(capsys, shards, "-o", link)[0] == 0
    assert target.stat().st_mode & 0o777 == 0o700 and target.stat().st_gid == gid
    for p in target.rglob("*"):
        assert p.stat().st_gid == gid and not p.stat().st_mode & 0o077, p


def test_every_directory_writer_keeps_the_mode(tmp_path):
    """`tokenize`, Ray's local outputs and `pack` all commit through atomic_output_dir."""
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    with atomic_output_dir(out) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "f").write_text("x")
        os.chmod(tmp / "sub" / "f", 0o755)
    assert modes(out) == {"sub": 0o700, "sub/f": 0o600}


# --- manifest paths stay inside the directory ----------------------------------------------------


@pytest.mark.parametrize("key", ["file", "index", "dropped_file"])
@pytest.mark.parametrize("where", ["../elsewhere", "absolute"])
def test_manifest_paths_outside_the_directory_are_refused(shards, tmp_path, capsys, key, where):
    """Fails on the code before issue 20: `verify` followed a shard, index or dropped file named
    `../../elsewhere/...` or by an absolute path (and reported the directory intact), as did
    PackedDataset and export."""
    out = tmp_path / "out"
    assert pack_cli(capsys, shards, "-o", out)[0] == 0
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out, elsewhere)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    entry = manifest if key == "dropped_file" else manifest["shards"][0]
    name = entry[key]
    entry[key] = f"../elsewhere/{name}" if where != "absolute" else str(elsewhere / name)
    write_json_atomic(out / MANIFEST_NAME, manifest)
    from tokpack.packed.reader import PackedDir

    readers = [
        lambda: tokpack.verify(out),
        lambda: tokpack.verify(out, full=False),
    ]
    if key != "dropped_file":
        readers += [
            lambda: PackedDir(out),
            lambda: tokpack.export_nemo_packed(out, tmp_path / "n.parquet"),
        ]
    for read in readers:
        with pytest.raises(tokpack.CorruptOutputError, match="outside the directory"):
            read()
    for command in (["verify", str(out)], ["inspect", str(out)]):
        assert main(command) == 2
        assert "outside the directory" in capsys.readouterr().err
    assert not (tmp_path / "n.parquet").exists()


# --- every writer follows the same rules: tokpack.ray's destinations ----------------------------


def _bucket(root):
    """An object store stand-in: a pyarrow file system given explicitly (no directory renames)."""
    import pyarrow.fs as pafs

    root.mkdir(exist_ok=True)
    return pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())


def test_an_object_store_prefix_holding_another_dataset_is_refused_untouched(tmp_path):
    """Fails on the code before issue 20: the prefix's part-N.parquet objects (the names
    pyarrow.dataset.write_dataset gives) were deleted without looking for a tokpack manifest."""
    pytest.importorskip("ray")
    import pyarrow as pa
    import pyarrow.dataset as pads

    from tokpack._io.store import committed_output

    fs = _bucket(tmp_path / "bucket")
    table = pa.table({"input_ids": pa.array([[1, 2], [3]], pa.list_(pa.int32()))})
    pads.write_dataset(table, "data", format="parquet", filesystem=fs)
    before = tree(tmp_path)
    assert "bucket/data/part-0.parquet" in before
    with pytest.raises(tokpack.OutputExistsError, match="part-0.parquet"):
        with committed_output("data", fs):
            raise AssertionError("not reached")
    # Its own input: refused before anything is looked at.
    with pytest.raises(tokpack.ConfigError, match="input"):
        with committed_output("data", fs, ["data/part-0.parquet"]):
            raise AssertionError("not reached")
    assert tree(tmp_path) == before


def test_an_object_store_run_claims_its_prefix_and_a_dead_runs_objects_are_its(tmp_path):
    pytest.importorskip("ray")
    from tokpack._io.store import RUN_MARKER, committed_output

    fs = _bucket(tmp_path / "bucket")
    out = tmp_path / "bucket" / "packed"
    with pytest.raises(KeyboardInterrupt):
        with committed_output("packed", fs) as (store, _):
            assert (out / RUN_MARKER).is_file()  # claimed before anything is written
            (out / "part-00000.parquet").write_bytes(b"half")
            raise KeyboardInterrupt
    assert [p for p in out.rglob("*") if p.is_file()] == []
    # A run killed outright (no cleanup) leaves its claim: the next run may remove its objects.
    (out / RUN_MARKER).parent.mkdir(parents=True, exist_ok=True)
    (out / RUN_MARKER).write_text("1\n")
    (out / "part-00003.parquet").write_bytes(b"half")
    with committed_output("packed", fs) as (store, local):
        assert not (out / "part-00003.parquet").exists()
        (local / MANIFEST_NAME).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(local / MANIFEST_NAME, {"tokpack_version": "x", "shards": []})
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert names == [MANIFEST_NAME]
    # Without the claim, an unlisted shard-like object is someone else's.
    (out / "part-00009.parquet").write_bytes(b"theirs")
    with pytest.raises(tokpack.OutputExistsError, match="part-00009.parquet"):
        with committed_output("packed", fs):
            raise AssertionError("not reached")
    assert (out / "part-00009.parquet").read_bytes() == b"theirs"


@pytest.mark.parametrize("how", ["uri", "filesystem"])
def test_a_file_uri_or_a_local_filesystem_is_a_local_directory(tmp_path, monkeypatch, how):
    """Fails on the code before issue 20: `file:///abs/out` became a local folder `file:`."""
    pytest.importorskip("ray")
    import pyarrow.fs as pafs

    from tokpack._io.store import committed_output, read_manifest_at

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    dest, fs = (f"file://{out}", None) if how == "uri" else (str(out), pafs.LocalFileSystem())
    with committed_output(dest, fs) as (_, local):
        write_json_atomic(local / MANIFEST_NAME, {"tokpack_version": "x", "shards": []})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert read_manifest_at(dest, fs)[0] == {"tokpack_version": "x", "shards": []}
    # The local rules hold: a directory tokpack did not write is refused.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    mine = f"file://{tmp_path / 'mine'}" if how == "uri" else str(tmp_path / "mine")
    with pytest.raises(tokpack.OutputExistsError, match="did not write"):
        with committed_output(mine, fs):
            raise AssertionError("not reached")


def test_a_signal_during_a_commit_waits_for_its_end_whatever_thread_receives_it():
    """Failed before (test_interruptions, now and then under load: an OUT moved aside and left
    as .OUT.old-*): the commit blocked SIGINT / SIGTERM in the main thread only, so the kernel
    gave a signal sent to the process to another thread (the progress thread, Rust's pools),
    and Python raised it in the main thread in the middle of the renames."""
    import signal
    import threading
    import time

    from tokpack._io.outdir import _signals_deferred

    other = threading.Thread(target=time.sleep, args=(2,))  # a thread that does not block them
    other.start()
    reached_end = False
    with pytest.raises(KeyboardInterrupt):
        with _signals_deferred():
            # What the kernel may do with a signal sent to the process: give it to that thread.
            assert other.ident is not None
            signal.pthread_kill(other.ident, signal.SIGINT)
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:  # bytecode runs: a pending handler would fire
                pass
            reached_end = True
    assert reached_end
    other.join()
