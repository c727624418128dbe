"""End-to-end tests of tokpack.pack_files on generated token shards."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack import _tokpack
from tokpack._io.outdir import MANIFEST_NAME
from tokpack.errors import (
    ConfigError,
    CorruptInputError,
    DataError,
    InputNotFoundError,
    OverlongError,
    SchemaError,
)
from tokpack.pack.files import DROPPED_NAME, pack_files
from tokpack.synthetic import write_token_shards

MAX_LEN = 512


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    files = write_token_shards(d, 3000, n_files=3, max_length=700, row_group_rows=400, seed=3)
    return files


def read_inputs(files, labels=True):
    tables = [pq.read_table(f) for f in files]
    ids = [x for t in tables for x in t.column("input_ids").to_pylist()]
    labs = [x for t in tables for x in t.column("labels").to_pylist()] if labels else None
    return ids, labs


def read_output(out):
    return pads.dataset(out).to_table()


def _chunk_start(sample, piece):
    """Where ``piece`` starts in ``sample``: at a multiple of MAX_LEN (ValueError if nowhere)."""
    for start in range(0, max(len(sample), 1), MAX_LEN):
        if sample[start : start + len(piece)] == piece:
            return start
    raise ValueError(f"a piece of {len(piece)} tokens is not a max_len chunk of its sample")


def check_every_sample(out, files, manifest, labels=True):
    ids, labs = read_inputs(files, labels)
    t = read_output(out)
    seen = {}
    rows_ids = t.column("input_ids").to_pylist()
    rows_labels = t.column("labels").to_pylist() if labels else None
    for r, (seqs, sids) in enumerate(
        zip(t.column("seq_lengths").to_pylist(), t.column("sample_ids").to_pylist())
    ):
        assert sum(seqs) == len(rows_ids[r]) <= MAX_LEN
        pos = 0
        for n, s in zip(seqs, sids):
            seen.setdefault(s, []).append(
                (rows_ids[r][pos : pos + n], rows_labels and rows_labels[r][pos : pos + n])
            )
            pos += n
    dropped = set(pa.ipc.open_file(out / DROPPED_NAME).read_all().column("sample_id").to_pylist())
    for s, sample in enumerate(ids):
        if s in dropped:
            assert s not in seen
            continue
        # A split sample's pieces are its max_len chunks, in rows of any order (the rows are
        # shuffled): put them back in the order of where each starts in the sample.
        pieces = sorted(seen.pop(s), key=lambda piece: _chunk_start(sample, piece[0]))
        got = [x for p, _ in pieces for x in p]
        if len(sample) <= MAX_LEN:
            assert len(pieces) == 1
        assert got == sample[: len(got)]
        if manifest["config"]["overlong"] == "split":
            assert got == sample
        if labels:
            assert [x for _, p in pieces for x in p] == labs[s][: len(got)]
    assert not seen
    return t


def test_every_sample_once_and_unchanged(corpus, tmp_path):
    out = tmp_path / "out"
    m = pack_files(corpus, out, MAX_LEN, overlong="split", rows_per_shard=300, row_group_rows=64)
    assert not m["cache_hit"] and m["format"] == "tokpack-packed" and m["has_labels"]
    t = check_every_sample(out, corpus, m)
    f = m["figures"]
    assert f["samples_in"] == 3000 == sum(i["rows"] for i in m["inputs"])
    assert f["samples_split"] > 0 and f["samples_dropped"] == 0
    assert f["samples_packed"] + f["samples_split"] == 3000
    assert f["rows"] == t.num_rows == sum(s["rows"] for s in m["shards"])
    assert f["tokens"] == sum(t.column("num_tokens").to_pylist()) == f["input_tokens"]
    assert f["padding_tokens"] == f["rows"] * MAX_LEN - f["tokens"]
    labels = np.concatenate([np.asarray(x) for x in t.column("labels").to_pylist()])
    assert (
        f["loss_tokens"]
        == int((labels != -100).sum())
        == sum(t.column("num_loss_tokens").to_pylist())
    )
    assert len(m["shards"]) == -(-f["rows"] // 300) > 1
    # Row groups of at most row_group_rows, index beside each shard matches the rows.
    for s in m["shards"]:
        meta = pq.ParquetFile(out / s["file"]).metadata
        assert meta.num_row_groups == s["row_groups"]
        assert all(meta.row_group(i).num_rows <= 64 for i in range(meta.num_row_groups))
        shard = pq.read_table(out / s["file"])
        idx = pa.ipc.open_file(out / s["index"]).read_all()
        assert idx.column("num_tokens").to_pylist() == shard.column("num_tokens").to_pylist()
        assert idx.column("num_seqs").to_pylist() == shard.column("num_seqs").to_pylist()
        offs = idx.column("offset").to_numpy()
        assert offs[0] == 0 and np.all(np.diff(offs) == idx.column("num_tokens").to_numpy()[:-1])
        seq_loss = shard.column("seq_loss_tokens").to_pylist()
        assert [sum(x) for x in seq_loss] == shard.column("num_loss_tokens").to_pylist()
    on_disk = json.loads((out / MANIFEST_NAME).read_text())
    assert on_disk["figures"] == f and on_disk["shards"] == m["shards"]


def test_loads_with_huggingface_datasets(corpus, tmp_path):
    # HF datasets skips only dot-files and "__" directories, so the shards are named with a
    # glob: data_dir=OUT_DIR would also feed it the "_"-named side files (see README).
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "out"
    m = pack_files(corpus, out, MAX_LEN, overlong="truncate", rows_per_shard=500)
    ds = datasets.load_dataset(
        "parquet",
        data_dir=str(out),
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    assert len(ds) == m["figures"]["rows"]
    assert set(ds.column_names) >= {"input_ids", "labels", "seq_lengths", "sample_ids"}
    assert ds[0]["num_tokens"] == len(ds[0]["input_ids"])


def test_bytes_identical_for_any_thread_count(corpus, tmp_path):
    outs = []
    for threads in (1, 2):
        out = tmp_path / f"out{threads}"
        pack_files(corpus, out, MAX_LEN, overlong="drop", rows_per_shard=200, threads=threads)
        outs.append(out)

    def files(out):
        return sorted(
            str(p.relative_to(out))
            for p in out.rglob("*")
            if p.is_file() and p.name != "_manifest.json"
        )

    names = files(outs[0])
    assert names == files(outs[1])
    assert any(n.startswith("__tokpack__/_index-part-") for n in names)
    assert any(n.startswith("part-") for n in names)
    for n in names:
        assert (outs[0] / n).read_bytes() == (outs[1] / n).read_bytes(), n


def test_drop_and_truncate_account_for_every_sample(corpus, tmp_path):
    out = tmp_path / "drop"
    m = pack_files(corpus, out, MAX_LEN, overlong="drop")
    check_every_sample(out, corpus, m)
    dropped = pa.ipc.open_file(out / DROPPED_NAME).read_all().to_pylist()
    assert len(dropped) == m["figures"]["samples_dropped"] > 0
    ids, _ = read_inputs(corpus)
    assert all(len(ids[d["sample_id"]]) > MAX_LEN and d["reason"] == "overlong" for d in dropped)
    bounds = np.cumsum([0] + [pq.ParquetFile(f).metadata.num_rows for f in corpus])
    for d in dropped:
        f = int(np.searchsorted(bounds, d["sample_id"], side="right")) - 1
        assert (d["file"], d["row"]) == (str(corpus[f]), d["sample_id"] - bounds[f])
    out = tmp_path / "trunc"
    m = pack_files(corpus, out, MAX_LEN, overlong="truncate")
    check_every_sample(out, corpus, m)
    assert m["figures"]["samples_truncated"] > 0


def test_overlong_error_names_file_and_row(corpus, tmp_path):
    with pytest.raises(OverlongError, match=r"shard-00000\.parquet, row \d+.*max_len=512"):
        pack_files(corpus, tmp_path / "o", MAX_LEN)
    assert not (tmp_path / "o").exists()


def test_ipc_input_other_int_types_and_loss_mask(tmp_path):
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 40, size=200)
    seqs = [rng.integers(0, 2**31 - 1, size=n).tolist() for n in lens]
    mask = [rng.integers(0, 2, size=n).tolist() for n in lens]
    a = tmp_path / "a.arrow"
    feather.write_feather(
        pa.table(
            {
                "tok": pa.array(seqs[:120], pa.large_list(pa.uint32())),
                "m": pa.array(mask[:120], pa.list_(pa.int8())),
            }
        ),
        a,
        chunksize=50,
    )
    b = tmp_path / "b.parquet"
    pq.write_table(
        pa.table(
            {
                "tok": pa.array(seqs[120:], pa.list_(pa.int64())),
                "m": pa.array([[bool(x) for x in m] for m in mask[120:]], pa.list_(pa.bool_())),
            }
        ),
        b,
    )
    out = tmp_path / "out"
    m = pack_files([a, b], out, 64, tokens_column="tok", loss_mask_column="m", strategy="ffd")
    assert m["has_labels"] and m["figures"]["samples_empty"] == int((lens == 0).sum())
    t = read_output(out)
    got = {}
    for ids, labs, seqs_, sids in zip(
        *(t.column(c).to_pylist() for c in ("input_ids", "labels", "seq_lengths", "sample_ids"))
    ):
        pos = 0
        for n, s in zip(seqs_, sids):
            got[s] = (ids[pos : pos + n], labs[pos : pos + n])
            pos += n
    for s, (seq, mk) in enumerate(zip(seqs, mask)):
        if not seq:
            assert s not in got
            continue
        assert got[s][0] == seq
        assert got[s][1] == [x if k else -100 for x, k in zip(seq, mk)]


def test_without_labels(tmp_path):
    files = write_token_shards(tmp_path / "in", 500, n_files=1, labels=False, max_length=300)
    out = tmp_path / "out"
    m = pack_files(files, out, 512)
    assert not m["has_labels"]
    t = check_every_sample(out, files, m, labels=False)
    assert "labels" not in t.column_names
    assert t.column("num_loss_tokens").to_pylist() == t.column("num_tokens").to_pylist()
    with pytest.raises(SchemaError, match='no column "answer_labels"'):
        pack_files(files, tmp_path / "x", 512, labels_column="answer_labels")


def test_read_row_group(corpus):
    got = _tokpack.read_row_group(path=str(corpus[1]), row_group=1, columns=["labels", "input_ids"])
    want = pq.ParquetFile(corpus[1]).read_row_group(1)
    values, offsets = got["input_ids"]
    assert values.dtype == np.int32 and offsets.dtype == np.int64
    assert offsets[0] == 0 and len(offsets) == want.num_rows + 1
    flat = want.column("input_ids").combine_chunks()
    assert np.array_equal(values, flat.flatten().to_numpy())
    assert np.array_equal(offsets, flat.offsets.to_numpy())
    assert list(got) == ["labels", "input_ids"]
    with pytest.raises(ConfigError, match="row group 99"):
        _tokpack.read_row_group(path=str(corpus[1]), row_group=99, columns=["input_ids"])
    with pytest.raises(SchemaError, match='no column "nope"'):
        _tokpack.read_row_group(path=str(corpus[1]), row_group=0, columns=["nope"])


def test_read_row_group_primitive_and_ipc(tmp_path):
    path = tmp_path / "x.arrow"
    feather.write_feather(pa.table({"n": pa.array([3, 1, 2], pa.int32())}), path)
    got = _tokpack.read_row_group(path=str(path), row_group=0, columns=["n"])
    assert got["n"].tolist() == [3, 1, 2]


def _bad(tmp_path, name, table):
    path = tmp_path / name
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize(
    "table, error, pattern",
    [
        (pa.table({"text": ["a"]}), SchemaError, r'bad\.parquet: no column "input_ids"'),
        (
            pa.table({"input_ids": pa.array([[1.5]], pa.list_(pa.float32()))}),
            SchemaError,
            r'column "input_ids" has type List\(.*Float32',
        ),
        (
            pa.table({"input_ids": pa.array([[1], None], pa.list_(pa.int32()))}),
            DataError,
            r'row group 0, row 1, column "input_ids": the list is null',
        ),
        (
            pa.table({"input_ids": pa.array([[1], [2, None]], pa.list_(pa.int32()))}),
            DataError,
            r'row 1, column "input_ids": holds a null value',
        ),
        (
            pa.table({"input_ids": pa.array([[1], [2, -5]], pa.list_(pa.int32()))}),
            DataError,
            r'row 1, column "input_ids": token id -5 is out of range',
        ),
        (
            pa.table({"input_ids": pa.array([[1], [2**40]], pa.list_(pa.int64()))}),
            DataError,
            r'row 1, column "input_ids": token id 1099511627776 is out of range',
        ),
        (
            pa.table(
                {
                    "input_ids": pa.array([[1, 2], [3]], pa.list_(pa.int32())),
                    "labels": pa.array([[1, 2], [3, 4]], pa.list_(pa.int32())),
                }
            ),
            DataError,
            r'row 1, column "labels": has 2 entries but the tokens have 1',
        ),
        (
            pa.table({"input_ids": pa.array([], pa.list_(pa.int32()))}),
            DataError,
            r"the inputs hold no samples",
        ),
    ],
)
def test_bad_input_names_file_row_group_row_column(tmp_path, table, error, pattern):
    path = _bad(tmp_path, "bad.parquet", table)
    with pytest.raises(error, match=pattern) as info:
        pack_files(path, tmp_path / "out", 16)
    assert "bad.parquet" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_missing_and_corrupt_files(corpus, tmp_path):
    with pytest.raises(InputNotFoundError, match="nope.parquet"):
        pack_files(tmp_path / "nope.parquet", tmp_path / "out", 16)
    with pytest.raises(InputNotFoundError, match="no file matches"):
        pack_files(str(tmp_path / "*.parquet"), tmp_path / "out", 16)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"hello, not parquet")
    with pytest.raises(CorruptInputError, match="junk.parquet: not a Parquet or Arrow IPC"):
        pack_files(junk, tmp_path / "out", 16)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(corpus[0].read_bytes()[:5000])
    with pytest.raises(CorruptInputError, match="cut.parquet"):
        pack_files(cut, tmp_path / "out", 16)
    broken = tmp_path / "broken.parquet"
    data = bytearray(corpus[0].read_bytes())
    data[4:64] = bytes(60)  # zero the first page header
    broken.write_bytes(bytes(data))
    with pytest.raises(CorruptInputError, match=r"broken\.parquet, row group 0"):
        pack_files(broken, tmp_path / "out", 16)
    assert not (tmp_path / "out").exists()


def test_public_api():
    assert tokpack.pack_files is pack_files
