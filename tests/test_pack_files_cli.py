"""tokpack pack / stats / inspect from the command line; cache rules; kill -9 mid-write."""

import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from tokpack._io.outdir import MANIFEST_NAME
from tokpack.cli import main
from tokpack.synthetic import write_token_shards

from ._interrupt import interrupt_after_first_shard


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    write_token_shards(d, 2000, n_files=2, max_length=900, row_group_rows=500, seed=5)
    return d


def test_pack_inspect_stats(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["pack", str(corpus), "-o", str(out), "--max-len", "1024", "--overlong", "split"]
    assert main(args + ["--rows-per-shard", "300"]) == 0
    text = capsys.readouterr().out
    assert "efficiency" in text and "padding saved" in text and "samples in" in text
    assert len(list(out.glob("part-*.parquet"))) > 1
    assert main(["inspect", str(out), "--rows", "2"]) == 0
    text = capsys.readouterr().out
    assert "samples_in" in text and text.count("sample ") >= 2
    plot = tmp_path / "lengths.png"
    assert main(["stats", str(corpus), "--max-len", "1024", "--plot", str(plot)]) == 0
    text = capsys.readouterr().out
    for word in ("median", "p99", "bfd", "padding", "Pack:"):
        assert word in text
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_cache_hit_force_and_rebuild_rules(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["pack", str(corpus), "-o", str(out), "--max-len", "1024", "--overlong", "drop"]
    assert main(base + ["--quiet"]) == 0
    shard = out / "part-00000.parquet"
    first = shard.stat().st_mtime_ns
    capsys.readouterr()
    assert main(base) == 0
    assert "up to date (cache hit" in capsys.readouterr().err
    assert shard.stat().st_mtime_ns == first  # no work done
    time.sleep(0.01)
    assert main(base + ["--quiet", "--force"]) == 0
    assert "cache hit" not in capsys.readouterr().err
    assert shard.stat().st_mtime_ns != first
    for changed in (["--max-len", "2048"], ["--compression", "snappy"], ["--strategy", "ffd"]):
        mtime = shard.stat().st_mtime_ns
        assert main(base + ["--quiet"] + changed) == 0
        assert "cache hit" not in capsys.readouterr().err
        assert shard.stat().st_mtime_ns != mtime
    # Changing an input rebuilds.
    mtime = shard.stat().st_mtime_ns
    extra = tmp_path / "more"
    write_token_shards(extra, 10, n_files=1, seed=9, max_length=50)
    assert main(["pack", str(corpus), str(extra)] + base[2:] + ["--quiet"]) == 0
    assert "cache hit" not in capsys.readouterr().err
    assert pq.ParquetFile(shard).metadata.num_rows >= 1 and shard.stat().st_mtime_ns != mtime


def test_bad_input_exits_2_without_traceback(tmp_path):
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"nope")
    proc = subprocess.run(
        [sys.executable, "-m", "tokpack", "pack", str(junk), "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "junk.parquet" in proc.stderr and "Traceback" not in proc.stderr


def test_kill_9_mid_write_leaves_out_dir_absent_then_next_run_is_clean(tmp_path):
    corpus = tmp_path / "corpus"
    write_token_shards(corpus, 30000, n_files=2, seed=1)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tokpack", "pack", str(corpus), "-o", str(out), "--quiet"]
    cmd += ["--overlong", "split"]
    proc = subprocess.Popen(
        cmd + ["--rows-per-shard", "64", "--row-group-rows", "16", "--threads", "1"]
    )
    # Wait until shards are being written into the temporary directory, then kill.
    deadline = time.time() + 120
    while time.time() < deadline:
        tmps = [
            p
            for p in tmp_path.iterdir()
            if p.name.startswith(".out.tmp-") and "spill" not in p.name
        ]
        if tmps and any(tmps[0].glob("part-*.parquet")):
            break
        time.sleep(0.01)
    else:
        proc.kill()
        pytest.fail("the run never started writing shards")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -9
    assert not out.exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert leftovers  # the dead run's temporaries (output and spill)
    assert subprocess.run(cmd, check=False).returncode == 0
    assert (out / MANIFEST_NAME).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out"]


def test_ctrl_c_cancels_cleanly(tmp_path):
    corpus = tmp_path / "corpus"
    write_token_shards(corpus, 30000, n_files=2, seed=2)
    out = tmp_path / "out"
    args = ["pack", str(corpus), "-o", str(out), "--quiet", "--overlong", "split"]
    args += ["--rows-per-shard", "64", "--row-group-rows", "16", "--threads", "1"]
    returncode, err = interrupt_after_first_shard(args, out)
    assert returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
