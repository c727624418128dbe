"""Input fingerprints: ``pack`` takes them while it reads the inputs (one pass over a corpus
that does not fit in memory), and they equal the fingerprint of the file taken alone."""

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack import _tokpack
from tokpack._io import outdir


def _table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, n)
    ids = [rng.integers(0, 1000, k).tolist() for k in lengths]
    return pa.table(
        {
            "input_ids": pa.array(ids, pa.list_(pa.int32())),
            "labels": pa.array([[-100] + x[1:] for x in ids], pa.list_(pa.int32())),
            # A column the packer does not read: still part of the file's fingerprint.
            "text": [f"sample {i} " * 5 for i in range(n)],
        }
    )


@pytest.fixture
def inputs(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    # Several row groups, uncompressed plain values (so a value can change in place below).
    pq.write_table(
        _table(300, 1), d / "a.parquet", row_group_size=64, compression="none", use_dictionary=False
    )
    pq.write_table(_table(50, 2), d / "b.parquet", row_group_size=1000)
    feather.write_feather(_table(40, 3), d / "c.arrow", compression="uncompressed")
    return d


def _counting(monkeypatch):
    calls = []
    real = outdir.fingerprint_file

    def counted(path):
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(outdir, "fingerprint_file", counted)
    return calls


def test_pack_records_the_fingerprints_it_took_while_reading(inputs, tmp_path):
    m = tokpack.pack_files(inputs, tmp_path / "out", 64)
    files = sorted(inputs.iterdir())
    assert [i["path"] for i in m["inputs"]] == [str(f.resolve()) for f in files]
    for described, f in zip(m["inputs"], files):
        assert described["fingerprint"] == _tokpack.file_fingerprint(str(f))[1]
        assert described["size"] == f.stat().st_size


def test_a_fresh_pack_does_not_hash_its_inputs_before_the_work(inputs, tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    out = tmp_path / "out"
    first = tokpack.pack_files(inputs, out, 64)
    assert calls == [] and not first["cache_hit"]
    # Another config cannot be current: no hashing before the work either.
    tokpack.pack_files(inputs, out, 48)
    assert calls == []
    again = tokpack.pack_files(inputs, out, 48)
    assert again["cache_hit"] and len(calls) == 3
    assert again["cache_key"] == tokpack.pack_files(inputs, tmp_path / "other", 48)["cache_key"]


def test_changed_content_of_the_same_size_is_rebuilt(inputs, tmp_path):
    out = tmp_path / "out"
    first = tokpack.pack_files(inputs, out, 64)
    path = inputs / "a.parquet"
    data = bytearray(path.read_bytes())
    table = pq.read_table(path)
    old = table.column("input_ids")[0].as_py()
    needle = np.array(old, np.int32).tobytes()
    at = bytes(data).find(needle)
    assert at > 0
    new = [(t + 1) % 1000 for t in old]
    data[at : at + len(needle)] = np.array(new, np.int32).tobytes()
    path.write_bytes(bytes(data))
    assert pq.read_table(path).column("input_ids")[0].as_py() == new
    second = tokpack.pack_files(inputs, out, 64)
    assert not second["cache_hit"]
    assert second["inputs"][0]["size"] == first["inputs"][0]["size"]
    assert second["inputs"][0]["fingerprint"] != first["inputs"][0]["fingerprint"]
    assert second["inputs"][1:] == first["inputs"][1:]


def test_the_fingerprint_is_a_function_of_the_bytes(inputs, tmp_path):
    a = inputs / "a.parquet"
    copy = tmp_path / "copy.parquet"
    shutil.copy(a, copy)
    size, fp = _tokpack.file_fingerprint(str(a))
    assert (size, fp) == _tokpack.file_fingerprint(str(copy)) and len(fp) == 32
    # The last byte of the footer's length field: still hashed, as part of the gap after the
    # row groups.
    data = bytearray(copy.read_bytes())
    data[-5] ^= 1
    copy.write_bytes(bytes(data))
    assert _tokpack.file_fingerprint(str(copy))[1] != fp
    # Not Parquet (the footer is unreadable now): hashed in even parts, still a fingerprint.
    other = tmp_path / "x.bin"
    other.write_bytes(b"PAR1" + b"\0" * 100)
    assert len(_tokpack.file_fingerprint(str(other))[1]) == 32
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert _tokpack.file_fingerprint(str(empty))[0] == 0
    with pytest.raises(tokpack.TokpackError, match="nope"):
        _tokpack.file_fingerprint(str(tmp_path / "nope"))
