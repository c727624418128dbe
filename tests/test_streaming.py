"""tokpack.streaming_dataset_reader: the guide's generator over Parquet/Arrow files."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack


def _write(tmp_path):
    rows = [{"input_ids": list(range(i % 7 + 1)), "id": i} for i in range(250)]
    t = pa.Table.from_pylist(rows)
    pq.write_table(t.slice(0, 100), tmp_path / "a.parquet", row_group_size=30)
    with pa.ipc.new_file(tmp_path / "b.arrow", t.schema) as w:
        w.write_table(t.slice(100, 80), max_chunksize=25)
    with pa.ipc.new_stream(tmp_path / "c.arrow", t.schema) as w:  # HF datasets cache layout
        w.write_table(t.slice(180, 70), max_chunksize=25)
    (tmp_path / "_manifest.json").write_text("{}")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "_index.parquet")
    return rows


def test_batches_span_files_and_keep_order(tmp_path):
    rows = _write(tmp_path)
    batches = list(tokpack.streaming_dataset_reader(tmp_path, batch_size=64))
    assert [len(b["id"]) for b in batches] == [64, 64, 64, 58]
    assert [i for b in batches for i in b["id"]] == list(range(250))
    assert batches[0]["input_ids"][3] == rows[3]["input_ids"]


def test_the_guides_buffer_loop(tmp_path):
    _write(tmp_path)
    buffer = []
    for batch in tokpack.streaming_dataset_reader(str(tmp_path / "a.parquet"), batch_size=100):
        buffer.extend(batch["input_ids"])
    assert len(buffer) == 100 and buffer[8] == [0, 1]


def test_is_lazy(tmp_path):
    _write(tmp_path)
    gen = tokpack.streaming_dataset_reader(tmp_path, batch_size=10)
    first = next(gen)
    assert first["id"] == list(range(10))


def test_errors(tmp_path):
    with pytest.raises(tokpack.InputNotFoundError):
        list(tokpack.streaming_dataset_reader(tmp_path / "nope", 10))
    with pytest.raises(tokpack.InputNotFoundError, match="no .parquet / .pq / .arrow"):
        list(tokpack.streaming_dataset_reader(tmp_path, 10))
    with pytest.raises(tokpack.ConfigError):
        list(tokpack.streaming_dataset_reader(tmp_path, 0))
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(tokpack.DataError, match="x.parquet: cannot read"):
        list(tokpack.streaming_dataset_reader(tmp_path, 10))
