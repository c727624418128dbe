"""Atomic output directories and the manifest cache shared by pack and tokenize."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import tokpack
from tokpack._outdir import (
    MANIFEST_NAME,
    atomic_output_dir,
    cache_key,
    describe_inputs,
    is_cache_hit,
    write_json_atomic,
)


def test_complete_run_replaces_the_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
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
        from tokpack._outdir import atomic_output_dir
        with atomic_output_dir({str(out)!r}) as tmp:
            (tmp / "part").write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], check=False)
    assert proc.returncode == -9
    assert not out.exists()
    assert len(list(tmp_path.iterdir())) == 1  # the dead run's temporary
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
    out = tmp_path / "out"
    out.mkdir()
    write_json_atomic(out / MANIFEST_NAME, {"cache_key": key})
    assert is_cache_hit(out, key) == {"cache_key": key}
    assert is_cache_hit(out, "other") is None
    (out / MANIFEST_NAME).write_text("{broken")
    assert is_cache_hit(out, key) is None
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
