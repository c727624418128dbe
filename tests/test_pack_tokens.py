"""tokpack.pack_tokens: materialised rows hold every sample's tokens and labels exactly once."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokpack


def make_corpus(lengths, seed=0):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(0, 50_000, n).astype(np.int32) for n in lengths]
    labels = [np.where(rng.random(n) < 0.3, -100, t).astype(np.int32) for t, n in zip(ids, lengths)]
    return ids, labels


def unpack(table, plan):
    """sample id -> its (start, tokens, labels) pieces, read back through the boundary columns."""
    out = {}
    seg = 0
    for row in table.to_pylist():
        pos = 0
        for sid, n in zip(row["sample_ids"], row["seq_lengths"]):
            assert sid == plan.sample_ids[seg] and n == plan.lengths[seg]
            piece = (
                int(plan.starts[seg]),
                row["input_ids"][pos : pos + n],
                row["labels"][pos : pos + n],
            )
            out.setdefault(sid, []).append(piece)
            pos += n
            seg += 1
        assert pos == len(row["input_ids"])
    assert seg == plan.n_segments
    return out


@given(
    st.lists(st.integers(0, 80), max_size=120),
    st.integers(1, 64),
    st.sampled_from(["bfd", "ffd", "next_fit", "padding", "random"]),
)
def test_tokens_and_labels_survive_packing(lengths, max_len, strategy):
    ids, labels = make_corpus(lengths)
    table, plan = tokpack.pack_tokens(
        ids, max_len, labels=labels, strategy=strategy, overlong="split", return_plan=True
    )
    assert table.num_rows == plan.n_bins
    assert all(len(r) <= max_len for r in table.column("input_ids").to_pylist())
    got = unpack(table, plan)
    for i, n in enumerate(lengths):
        if n == 0:
            assert i not in got and i in plan.dropped
            continue
        pieces = sorted(got[i], key=lambda p: p[0])
        assert sum((p[1] for p in pieces), []) == ids[i].tolist()
        assert sum((p[2] for p in pieces), []) == labels[i].tolist()


def test_schema_and_types():
    ids, labels = make_corpus([5, 3, 7, 1])
    t = tokpack.pack_tokens(pa.array([x.tolist() for x in ids]), 8, labels=labels)
    assert t.schema.field("input_ids").type == pa.list_(pa.int32())
    assert t.schema.field("labels").type == pa.list_(pa.int32())
    assert t.schema.field("seq_lengths").type == pa.list_(pa.int32())
    assert t.schema.field("sample_ids").type == pa.list_(pa.int64())
    meta = json.loads(t.schema.metadata[b"tokpack"])
    assert meta["n_bins"] == t.num_rows == 2 and meta["total_tokens"] == 16


def test_without_labels_there_is_no_labels_column():
    t = tokpack.pack_tokens([[1, 2], [3]], 4)
    assert t.column_names == ["input_ids", "seq_lengths", "sample_ids"]


@pytest.mark.parametrize("value_type", [pa.int32(), pa.int64(), pa.uint32()])
@pytest.mark.parametrize("list_type", ["list", "large_list"])
def test_input_types(value_type, list_type):
    make = pa.list_ if list_type == "list" else pa.large_list
    arr = pa.array([[1, 2, 3], [4], [5, 6]], type=make(value_type))
    t = tokpack.pack_tokens(arr, 3, row_order="plan")
    assert t.column("sample_ids").to_pylist() == [[0], [2, 1]]


def test_sliced_and_chunked_inputs():
    arr = pa.array([[9, 9], [1, 2, 3], [4], [5, 6], [9]])[1:4]
    t = tokpack.pack_tokens(arr, 3, strategy="next_fit", row_order="plan")
    assert t.column("input_ids").to_pylist() == [[1, 2, 3], [4, 5, 6]]
    chunked = pa.chunked_array([arr[:1], arr[1:]])
    assert tokpack.pack_tokens(chunked, 3, strategy="next_fit", row_order="plan").equals(t)


@pytest.mark.parametrize(
    "ids, labels, match",
    [
        ([[1, 2], [3]], [[1, 2], [3, 4]], 'row 1, column "labels": has 2 entries but the tok'),
        ([[1, 2], [3]], [[1, 2]], "labels have 1 rows but input_ids have 2"),
        ([[1, 2], [-3]], None, r'row 1, column "input_ids": token id -3 is out of range'),
        ([[1, 2], [2**31]], None, 'row 1, column "input_ids": token id 2147483648 is out of'),
        ([[1, 2], [3]], [[1, 2], [-5]], r'row 1, column "labels": label -5 is neither -100 nor'),
        ([[1, 2], [3]], [[1, 2], [-(2**40)]], "row 1, .*: label -1099511627776 is neither"),
        (pa.array([[1], None]), None, 'row 1, column "input_ids": the list is null'),
        (pa.array([[1], [2, None]]), None, "row 1, .*: holds a null value"),
        (pa.array([1, 2]), None, 'column "input_ids" has type Int64; expected a list'),
        ([[1.0, 2.0]], None, "has values of type Float64; expected a list or large_list of int"),
        (pa.table({"ids": [[1]]}), None, 'the table has no column "input_ids"'),
    ],
)
def test_bad_data_raises_data_error(ids, labels, match):
    with pytest.raises(tokpack.DataError, match=match):
        tokpack.pack_tokens(ids, 4, labels=labels)


def test_same_bytes_for_any_thread_count():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 3000, 20_000)
    values = rng.integers(0, 32_000, int(lengths.sum()), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    a = tokpack.pack_tokens(arr, 4096, labels=arr, threads=1)
    b = tokpack.pack_tokens(arr, 4096, labels=arr, threads=2)
    assert a.equals(b)


@pytest.mark.parametrize("label", [-5, -1, -101])
def test_labels_follow_one_rule_in_every_entry_point(tmp_path, label):
    """-100 or a token id, in pack_tokens as in pack_files (pack_tokens once accepted -5)."""
    ids, labels = [[1, 2], [3, 4]], [[1, -100], [label, 4]]
    match = f'row 1, column "labels": label {label} is neither -100 nor a token id'
    table = pa.table({"input_ids": ids, "labels": labels})
    pa.parquet.write_table(table, tmp_path / "in.parquet")
    with pytest.raises(tokpack.DataError, match=match):
        tokpack.pack_files(tmp_path / "in.parquet", tmp_path / "out", 8)
    with pytest.raises(tokpack.DataError, match=match):
        tokpack.pack_tokens(ids, 8, labels=labels)


def test_sliced_away_rows_are_not_checked():
    labels = pa.array([[-7], [1, -100], [2]])[1:]
    table = tokpack.pack_tokens(pa.array([[9], [1, 2], [3]])[1:], 8, labels=labels)
    assert table.column("labels").to_pylist() == [[1, -100, 2]]


def test_an_empty_python_list_does_not_decide_the_value_type():
    """``[]`` is a float64 array to numpy; ``[[1, 2], []]`` was refused as not integers."""
    table = tokpack.pack_tokens([[1, 2], []], 4, return_plan=True)[0]
    assert table.column("input_ids").to_pylist() == [[1, 2]]


IDS = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]
LABELS = [[1, -100, 3], [4], [-100, 6], [7, 8, -100, 10]]


def _polars():
    return pytest.importorskip("polars")


def _nanoarrow():
    return pytest.importorskip("nanoarrow")


ARROW_INPUTS = {
    "arrays": lambda: (pa.array(IDS), pa.array(LABELS)),
    "chunked": lambda: (pa.chunked_array([IDS[:1], IDS[1:3], IDS[3:]]), LABELS),
    "large_list_uint32": lambda: (pa.array(IDS, pa.large_list(pa.uint32())), LABELS),
    "table": lambda: (pa.table({"text": list("abcd"), "input_ids": IDS, "labels": LABELS}), None),
    "table_chunks": lambda: (
        pa.Table.from_batches(pa.table({"input_ids": IDS, "labels": LABELS}).to_batches(3)),
        None,
    ),
    "record_batch": lambda: (pa.record_batch({"input_ids": IDS, "labels": LABELS}), None),
    "table_and_labels": lambda: (pa.table({"input_ids": IDS}), pa.table({"labels": LABELS})),
    "nanoarrow": lambda: (_nanoarrow().Array(pa.array(IDS)), _nanoarrow().Array(pa.array(LABELS))),
    "polars_series": lambda: (_polars().Series("x", IDS), _polars().Series("y", LABELS)),
    "polars_frame": lambda: (_polars().DataFrame({"input_ids": IDS, "labels": LABELS}), None),
}


@pytest.mark.parametrize("make", ARROW_INPUTS.values(), ids=ARROW_INPUTS.keys())
def test_any_arrow_c_interface_input_packs_like_lists(make):
    input_ids, labels = make()
    expected = tokpack.pack_tokens(IDS, 5, labels=LABELS, strategy="next_fit")
    assert tokpack.pack_tokens(input_ids, 5, labels=labels, strategy="next_fit").equals(expected)


def test_a_table_without_labels_packs_without_labels():
    table = tokpack.pack_tokens(pa.table({"input_ids": IDS}), 5)
    assert "labels" not in table.column_names


@pytest.mark.parametrize(
    "empty",
    [pa.array([], pa.list_(pa.int32())), pa.chunked_array([], pa.list_(pa.int64())), []],
)
def test_empty_inputs_give_no_rows(empty):
    table, plan = tokpack.pack_tokens(empty, 4, labels=empty, return_plan=True)
    assert table.num_rows == 0 and plan.n_samples == 0


def test_rows_are_counted_across_chunks_in_errors():
    chunked = pa.chunked_array([[[1], [2]], [[3], [-4]]])
    with pytest.raises(tokpack.DataError, match='row 3, column "input_ids": token id -4'):
        tokpack.pack_tokens(chunked, 4)
