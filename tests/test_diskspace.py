"""The pre-flight disk check of ``pack_files`` and ``--spill-dir`` (issue 24): a run the disk
cannot hold is refused before any work with one line naming the need and the free space, and
the spill can live on another disk, in a subdirectory tokpack creates and always removes.

The small-disk tests mount a 20 MB tmpfs (root only; skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack.cli import main
from tokpack.errors import ConfigError, DiskSpaceError, OutputError
from tokpack.pack import files
from tokpack.pack.diskspace import estimate
from tokpack.synthetic import write_token_shards


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=20M", "tmpfs", str(mount)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """About 13M tokens with labels: a 28 MB spill and a 40 MB output."""
    d = tmp_path_factory.mktemp("big")
    return write_token_shards(d, 20_000, n_files=2, max_length=4000, seed=3)


def _tokens(paths):
    return sum(pq.ParquetFile(p).metadata.num_rows and _count(p) for p in paths)


def _count(path):
    table = pq.read_table(path, columns=["input_ids"])
    return sum(len(c.values) for c in table.column("input_ids").chunks)


def test_estimate_from_parquet_and_ipc_metadata(big, tmp_path):
    n = _tokens(big)
    spill, output = estimate(big, ["input_ids"], ["labels"], compressed=True)
    assert spill == int(n * 2.125)  # u16 ids (vocabulary 32,000) and a label bit
    assert output == sum(
        pq.ParquetFile(p).metadata.row_group(g).column(c).total_compressed_size
        for p in big
        for g in range(pq.ParquetFile(p).metadata.num_row_groups)
        for c in range(2)
    )
    assert estimate(big, ["input_ids"], ["answer_labels"], compressed=False) == (n * 2, n * 4)
    ipc = tmp_path / "a.arrow"
    table = pq.read_table(big[0]).slice(5, 3000)  # offsets not starting at 0
    with pa.ipc.new_file(ipc, table.schema) as w:
        w.write_table(table, max_chunksize=700)
    m = sum(len(v) for v in table.column("input_ids").to_pylist())
    assert estimate([ipc], ["input_ids"], ["labels"], compressed=False) == (
        int(m * 2.125),
        ipc.stat().st_size,
    )


def test_a_run_the_disk_cannot_hold_is_refused_before_any_work(big, small_disk, monkeypatch):
    """Failed before: the refusal came after every input was fingerprinted for the cache key
    (81 s for the 20 GB of a 10M-sample corpus)."""
    hashed = []
    monkeypatch.setattr(tokpack._io.outdir, "fingerprint_file", lambda p, *a: hashed.append(p))
    with pytest.raises(DiskSpaceError, match=r"needs about .* of spill files and .* of output"):
        tokpack.pack_files(big, small_disk / "out", 4096, overlong="split")
    assert hashed == [] and os.listdir(small_disk) == []
    assert issubclass(DiskSpaceError, OutputError)


def test_spill_dir_too_small_is_named(big, small_disk, tmp_path):
    with pytest.raises(DiskSpaceError, match=f"of spill files in {small_disk}, where"):
        tokpack.pack_files(big, tmp_path / "out", 4096, overlong="split", spill_dir=small_disk)
    assert os.listdir(small_disk) == [] and not (tmp_path / "out").exists()


def test_spill_on_another_disk_leaves_nothing_behind(small_disk, tmp_path, monkeypatch):
    corpus = write_token_shards(tmp_path / "in", 3000, n_files=1, max_length=3000, seed=4)
    ref = tokpack.pack_files(corpus, tmp_path / "ref", 4096, overlong="split")
    (small_disk / "theirs").write_text("not tokpack's")
    seen = []
    real = files._tokpack.pack_files

    def spying(**kw):
        seen.append(
            sorted(p.name for p in (small_disk / os.path.basename(kw["spill_dir"])).iterdir())
        )
        assert os.path.dirname(kw["spill_dir"]) == str(small_disk)
        return real(**kw)

    monkeypatch.setattr(files._tokpack, "pack_files", spying)
    got = tokpack.pack_files(corpus, tmp_path / "out", 4096, overlong="split", spill_dir=small_disk)
    assert seen == [[]]  # the spill subdirectory existed, empty, when packing started
    assert [s["checksum"] for s in got["shards"]] == [s["checksum"] for s in ref["shards"]]
    assert os.listdir(small_disk) == ["theirs"]

    def interrupted(**kw):
        real(**kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(files._tokpack, "pack_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tokpack.pack_files(corpus, tmp_path / "o2", 4096, overlong="split", spill_dir=small_disk)
    assert os.listdir(small_disk) == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out", "ref", "small"]


def test_cli_spill_dir(tmp_path, capsys):
    corpus = write_token_shards(tmp_path / "in", 200, n_files=1, max_length=300, seed=5)
    spill = tmp_path / "spill"
    spill.mkdir()
    args = ["pack", str(corpus[0]), "-o", str(tmp_path / "out"), "--spill-dir", str(spill)]
    assert main(args) == 0
    assert os.listdir(spill) == []
    missing = tmp_path / "nope"
    args = ["pack", str(corpus[0]), "-o", str(tmp_path / "o2"), "--spill-dir", str(missing)]
    assert main(args) == 2
    assert "spill_dir" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="must be an existing directory: .* does not exist"):
        tokpack.pack_files(corpus, tmp_path / "o3", 512, spill_dir=missing)
