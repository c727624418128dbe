"""``tokpack export``: Megatron-LM indexed datasets and Megatron-Bridge / NeMo packed Parquet.

The .bin/.idx files are read back by a reader written here from the format description in
``tokpack/packed/export.py`` (Megatron-LM's ``megatron/core/datasets/indexed_dataset.py``), not by
tokpack's writer; the NeMo files are checked against the contract of Megatron-Bridge's
``GPTSFTPackedParquetDataset`` / ``GPTSFTPackedDataset`` (validate_row and collate_fn).
"""

import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack._io.outdir import read_manifest
from tokpack.cli import main

from .packed_corpus import IGNORE, random_samples, write_packed_dir

MEGATRON_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


def read_megatron(prefix: Path):
    """(dtype, sequence lengths, pointers, document indices, sequences) of PREFIX.bin/.idx."""
    idx = Path(f"{prefix}.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1
    dtype = MEGATRON_CODES[code]
    offset = 9 + 8 + 1 + 8 + 8
    lengths = np.frombuffer(idx, "<i4", n_seq, offset)
    pointers = np.frombuffer(idx, "<i8", n_seq, offset + 4 * n_seq)
    docs = np.frombuffer(idx, "<i8", n_doc, offset + 12 * n_seq)
    assert len(idx) == offset + 12 * n_seq + 8 * n_doc  # no sequence modes
    data = Path(f"{prefix}.bin").read_bytes()
    itemsize = np.dtype(dtype).itemsize
    assert len(data) == itemsize * int(lengths.sum())
    seqs = [np.frombuffer(data, dtype, n, p) for n, p in zip(lengths.tolist(), pointers.tolist())]
    return dtype, lengths, pointers, docs, seqs


def packed_rows(out_dir: Path):
    """Every packed row of a directory, in order: (input_ids, labels or None, seq_lengths)."""
    manifest = read_manifest(out_dir)
    rows = []
    for shard in manifest["shards"]:
        for row in pq.read_table(out_dir / shard["file"]).to_pylist():
            rows.append((row["input_ids"], row.get("labels"), row["seq_lengths"]))
    return rows


def segments(rows):
    out = []
    for ids, _, lens in rows:
        bounds = np.concatenate(([0], np.cumsum(lens)))
        out.extend(ids[a:b] for a, b in zip(bounds[:-1], bounds[1:]))
    return out


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """300 samples with labels in several shards and row groups."""
    samples, labels = random_samples(300, 200, seed=3, vocab=50_000)
    out = tmp_path_factory.mktemp("export") / "packed"
    write_packed_dir(out, samples, labels, max_len=512, rows_per_shard=40, row_group_rows=16)
    return out


@pytest.mark.parametrize("document", ["sample", "row"])
def test_megatron_round_trip_is_the_packed_samples(packed, tmp_path, document):
    figures = tokpack.export_megatron(packed, tmp_path / "mg" / "train", document=document)
    dtype, lengths, pointers, docs, seqs = read_megatron(tmp_path / "mg" / "train")
    rows = packed_rows(packed)
    expected = segments(rows)
    assert dtype is np.uint16 and figures["dtype"] == "uint16"
    assert [s.tolist() for s in seqs] == expected
    assert lengths.tolist() == [len(s) for s in expected]
    assert pointers.tolist() == (2 * np.concatenate(([0], np.cumsum(lengths)[:-1]))).tolist()
    if document == "sample":
        assert docs.tolist() == list(range(len(expected) + 1))
    else:
        assert docs.tolist() == np.concatenate(([0], np.cumsum([len(r[2]) for r in rows]))).tolist()
        # A document's sequences are its row's tokens, contiguous in .bin.
        for r, (ids, _, _) in enumerate(rows):
            doc = np.concatenate(seqs[docs[r] : docs[r + 1]])
            assert doc.tolist() == ids
    assert figures["sequences"] == len(expected) == read_manifest(packed)["figures"]["samples_in"]
    assert figures["documents"] == len(docs) - 1
    assert figures["tokens"] == sum(map(len, expected))
    assert not [p.name for p in (tmp_path / "mg").iterdir() if p.name.startswith(".")]


def _single_sample_dir(tmp_path: Path, top_id: int) -> Path:
    out = tmp_path / f"top{top_id}"
    write_packed_dir(out, [np.array([1, top_id, 2], dtype=np.int32)], max_len=8)
    return out


@pytest.mark.parametrize(
    "top_id, auto_dtype",
    # Megatron's rule: uint16 when the vocabulary (largest id + 1) is < 65,500.
    [(65_498, np.uint16), (65_499, np.int32), (70_000, np.int32)],
)
def test_megatron_dtype_follows_the_vocabulary(tmp_path, top_id, auto_dtype):
    out = _single_sample_dir(tmp_path, top_id)
    tokpack.export_megatron(out, tmp_path / "auto")
    dtype, _, _, _, seqs = read_megatron(tmp_path / "auto")
    assert dtype is auto_dtype and seqs[0].tolist() == [1, top_id, 2]
    tokpack.export_megatron(out, tmp_path / "wide", dtype="int32")
    assert read_megatron(tmp_path / "wide")[0] is np.int32


def test_megatron_explicit_uint16_refuses_ids_that_do_not_fit(tmp_path):
    out = _single_sample_dir(tmp_path, 65_535)
    tokpack.export_megatron(out, tmp_path / "ok", dtype="uint16")
    assert read_megatron(tmp_path / "ok")[4][0].tolist() == [1, 65_535, 2]
    out = _single_sample_dir(tmp_path, 65_536)
    with pytest.raises(tokpack.DataError, match="row group 0: token id 65536 does not fit uint16"):
        tokpack.export_megatron(out, tmp_path / "bad", dtype="uint16")
    assert list(tmp_path.glob("*bad*")) == list(tmp_path.glob(".bad*")) == []


def test_bad_options_are_config_errors(packed, tmp_path):
    with pytest.raises(tokpack.ConfigError, match="dtype"):
        tokpack.export_megatron(packed, tmp_path / "x", dtype="int64")
    with pytest.raises(tokpack.ConfigError, match="document"):
        tokpack.export_megatron(packed, tmp_path / "x", document="file")
    with pytest.raises(tokpack.ConfigError, match="needs a file name"):
        tokpack.export_megatron(packed, f"{tmp_path}/")
    with pytest.raises(tokpack.ConfigError, match=r"\.parquet or \.pq"):
        tokpack.export_nemo_packed(packed, tmp_path / "x.arrow")
    assert list(tmp_path.iterdir()) == []


def test_existing_outputs_are_kept_unless_forced(packed, tmp_path):
    tokpack.export_megatron(packed, tmp_path / "train")
    with pytest.raises(tokpack.OutputExistsError, match="train.tokpack.json: exists"):
        tokpack.export_megatron(packed, tmp_path / "train")
    tokpack.export_megatron(packed, tmp_path / "train", force=True)
    n_samples = read_manifest(packed)["figures"]["samples_in"]
    assert len(read_megatron(tmp_path / "train")[4]) == n_samples
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "train.bin",
        "train.idx",
        "train.tokpack.json",
    ]
    tokpack.export_nemo_packed(packed, tmp_path / "n.idx.parquet")
    with pytest.raises(tokpack.OutputExistsError):
        tokpack.export_nemo_packed(packed, tmp_path / "n.idx.parquet")
    tokpack.export_nemo_packed(packed, tmp_path / "n.idx.parquet", force=True)
    assert pq.read_metadata(tmp_path / "n.idx.parquet").num_rows == len(packed_rows(packed))


def test_force_never_replaces_a_file_tokpack_did_not_write(packed, tmp_path):
    """Fails on the code before issue 20: --force replaced any file of the name."""
    (tmp_path / "train.idx").write_bytes(b"user data")
    for force in (False, True):
        with pytest.raises(tokpack.OutputExistsError, match="train.idx"):
            tokpack.export_megatron(packed, tmp_path / "train", force=force)
    (tmp_path / "n.idx.parquet").write_bytes(b"user data")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    for name in ("n.idx.parquet", "other.parquet"):
        with pytest.raises(tokpack.OutputExistsError, match="did not write"):
            tokpack.export_nemo_packed(packed, tmp_path / name, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "n.idx.parquet",
        "other.parquet",
        "train.idx",
    ]
    assert (tmp_path / "train.idx").read_bytes() == b"user data"
    assert (tmp_path / "n.idx.parquet").read_bytes() == b"user data"


def test_a_missing_shard_leaves_nothing_behind(tmp_path):
    samples, labels = random_samples(50, 30, seed=1)
    out = tmp_path / "packed"
    manifest = write_packed_dir(out, samples, labels, max_len=64, rows_per_shard=5)
    (out / manifest["shards"][-1]["file"]).unlink()
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(tokpack.CorruptOutputError, match="is missing"):
        tokpack.export_megatron(out, dest / "train")
    with pytest.raises(tokpack.CorruptOutputError, match="is missing"):
        tokpack.export_nemo_packed(out, dest / "train.idx.parquet")
    assert list(dest.iterdir()) == []


def test_nemo_rows_follow_the_megatron_bridge_contract(packed, tmp_path):
    dest = tmp_path / "train.idx.parquet"
    figures = tokpack.export_nemo_packed(packed, dest)
    table = pq.read_table(dest)
    assert table.schema == pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("seq_start_id", pa.list_(pa.int32())),
        ]
    )
    rows = packed_rows(packed)
    assert table.num_rows == len(rows) == figures["rows"]
    n_loss = 0
    for got, (ids, labels, lens) in zip(table.to_pylist(), rows):
        assert got["input_ids"] == ids
        starts = got["seq_start_id"]
        # GPTSFTPackedParquetDataset.validate_row
        assert len(got["loss_mask"]) == len(ids)
        assert starts[0] == 0 and all(s < len(ids) for s in starts) and starts == sorted(starts)
        assert starts == np.concatenate(([0], np.cumsum(lens)[:-1])).tolist()
        # Megatron-Bridge's fill_packing_strategy: the mask rolled by one within each sample.
        bounds = starts + [len(ids)]
        expected_mask = []
        for b, e in zip(bounds[:-1], bounds[1:]):
            expected_mask += [int(x != IGNORE) for x in labels[b + 1 : e]] + [0]
        assert got["loss_mask"] == expected_mask
        # GPTSFTPackedDataset.collate_fn: per sample, inputs ids[b:e-1], labels ids[b+1:e] and
        # loss mask mask[b:e-1]. The trained targets must be those tokpack's labels train on
        # (a sample's first token is nobody's target).
        for b, e in zip(bounds[:-1], bounds[1:]):
            targets = ids[b + 1 : e]
            trained = [t for t, m in zip(targets, got["loss_mask"][b : e - 1]) if m]
            assert trained == [x for x in labels[b + 1 : e] if x != IGNORE]
        n_loss += sum(expected_mask)
    assert figures["sequences"] == sum(len(r[2]) for r in rows)
    assert figures["tokens"] == read_manifest(packed)["figures"]["tokens"]
    assert figures["loss_tokens"] == n_loss


def test_nemo_without_labels_trains_on_every_target(tmp_path):
    samples, _ = random_samples(40, 30, seed=2)
    out = tmp_path / "packed"
    write_packed_dir(out, samples, max_len=64, rows_per_shard=5, row_group_rows=2)
    tokpack.export_nemo_packed(out, tmp_path / "n.parquet")
    for row in pq.read_table(tmp_path / "n.parquet").to_pylist():
        bounds = row["seq_start_id"] + [len(row["input_ids"])]
        assert row["loss_mask"] == sum(
            ([1] * (e - b - 1) + [0] for b, e in zip(bounds, bounds[1:])), []
        )


def test_cli_exit_codes(packed, tmp_path, capsys):
    assert main(["export", "megatron", str(packed), str(tmp_path / "train")]) == 0
    out = capsys.readouterr().out
    assert "train.bin" in out and "sequences" in out and "(uint16)" in out
    assert main(["export", "megatron", str(packed), str(tmp_path / "train")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokpack export: error: ") and err.count("\n") == 1
    argv = ["export", "megatron", str(packed), str(tmp_path / "train"), "--force"]
    assert main(argv + ["--document", "row", "--dtype", "int32"]) == 0
    assert read_megatron(tmp_path / "train")[0] is np.int32
    capsys.readouterr()
    assert main(["export", "nemo", str(packed), str(tmp_path / "t.idx.parquet")]) == 0
    assert "trained on" in capsys.readouterr().out
    assert main(["export", "nemo", str(tmp_path), str(tmp_path / "u.parquet")]) == 2
    err = capsys.readouterr().err
    assert "not a packed directory" in err and "Traceback" not in err


def test_megatron_core_reads_the_export(packed, tmp_path):
    pytest.importorskip("megatron.core")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    tokpack.export_megatron(packed, tmp_path / "train", document="row")
    ds = IndexedDataset(str(tmp_path / "train"))
    expected = segments(packed_rows(packed))
    assert len(ds) == len(expected)
    assert [ds[i].tolist() for i in range(len(ds))] == expected
    assert ds.document_indices.tolist() == read_megatron(tmp_path / "train")[3].tolist()


@pytest.mark.parametrize("bad_lengths", [[0, 3], [1, 1]])
def test_seq_lengths_that_do_not_cover_the_row_are_corrupt(tmp_path, bad_lengths):
    """A rewritten shard fails its checksums before its lengths are looked at (the lengths
    check stays for a manifest rewritten with it)."""
    out = tmp_path / "packed"
    manifest = write_packed_dir(out, [np.array([1, 2, 3], dtype=np.int32)], max_len=8)
    shard = out / manifest["shards"][0]["file"]
    table = pq.read_table(shard)
    column = pa.array([bad_lengths], type=table.schema.field("seq_lengths").type)
    pq.write_table(
        table.set_column(table.schema.get_field_index("seq_lengths"), "seq_lengths", column), shard
    )
    with pytest.raises(tokpack.CorruptOutputError, match="part-00000.parquet"):
        tokpack.export_megatron(out, tmp_path / "train")
    with pytest.raises(tokpack.CorruptOutputError, match="part-00000.parquet"):
        tokpack.export_nemo_packed(out, tmp_path / "train.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed", "packed-tokens.parquet"]


def _flip_a_token_byte(out: Path) -> None:
    """Flips one byte inside the first row group's data pages (not the footer)."""
    shard = read_manifest(out)["shards"][0]
    path = out / shard["file"]
    data = bytearray(path.read_bytes())
    first = shard["row_group_bytes"][0]
    data[first["offset"] + first["length"] // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_a_shard_is_not_exported(tmp_path):
    """Fails on the code before issue 20: export read the shards with plain pyarrow, and a
    flipped byte (uncompressed data) was exported as a wrong token with exit 0."""
    samples, labels = random_samples(40, 30, seed=5)
    out = tmp_path / "packed"
    write_packed_dir(out, samples, labels, max_len=64, compression="none")
    _flip_a_token_byte(out)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(tokpack.CorruptOutputError, match="part-00000.parquet"):
        tokpack.export_megatron(out, dest / "train")
    with pytest.raises(tokpack.CorruptOutputError, match="part-00000.parquet"):
        tokpack.export_nemo_packed(out, dest / "train.parquet")
    assert main(["export", "nemo", str(out), str(dest / "t.parquet")]) == 2
    assert list(dest.iterdir()) == []


def _pack_preference(tmp_path: Path) -> Path:
    from tokpack.tokenize import PREFERENCE_SCHEMA

    prompt, chosen, rejected = [5, 6], [7, 8], [9]
    table = pa.table(
        {
            "chosen_input_ids": [prompt + chosen],
            "chosen_labels": [[IGNORE] * 2 + chosen],
            "rejected_input_ids": [prompt + rejected],
            "rejected_labels": [[IGNORE] * 2 + rejected],
            "prompt_length": [2],
            "length": [7],
        },
        schema=PREFERENCE_SCHEMA,
    )
    pq.write_table(table, tmp_path / "pairs.parquet")
    out = tmp_path / "pairs-packed"
    tokpack.pack_files([tmp_path / "pairs.parquet"], out, 16)
    return out


def _pack_kto(tmp_path: Path) -> Path:
    kto = pa.schema(
        [
            ("input_ids", pa.list_(pa.int32())),
            ("labels", pa.list_(pa.int32())),
            ("label", pa.bool_()),
        ],
        metadata={b"tokpack.kind": b"kto"},
    )
    table = pa.table(
        {"input_ids": [[1, 2, 3]], "labels": [[IGNORE, 2, 3]], "label": [False]}, schema=kto
    )
    pq.write_table(table, tmp_path / "kto.parquet")
    out = tmp_path / "kto-packed"
    tokpack.pack_files([tmp_path / "kto.parquet"], out, 16)
    return out


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_preference_and_kto_outputs_are_refused(tmp_path, kind):
    """Fails on the code before issue 20: pairs were exported as independent SFT documents,
    rejected completions marked as trained (exit 0)."""
    out = (_pack_preference if kind == "preference" else _pack_kto)(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(tokpack.ConfigError, match=f"holds {kind} samples"):
        tokpack.export_megatron(out, dest / "train")
    with pytest.raises(tokpack.ConfigError, match=f"holds {kind} samples"):
        tokpack.export_nemo_packed(out, dest / "train.parquet")
    assert list(dest.iterdir()) == []


def test_a_pair_torn_by_an_interrupted_force_is_detected(packed, tmp_path, monkeypatch, capsys):
    """Fails on the code before issue 20: a kill between the .bin and .idx renames of --force
    left a mismatched pair that nothing could tell from a whole one."""
    import tokpack._io.outdir as outdir

    prefix = tmp_path / "train"
    tokpack.export_megatron(packed, prefix, document="sample")
    assert tokpack.packed.export.check_megatron(prefix)["format"] == "megatron"
    assert main(["verify", str(prefix)]) == 0
    capsys.readouterr()
    real_replace = os.replace

    def killed_before_the_idx(src, dst):
        if str(dst).endswith(".idx"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(outdir.os, "replace", killed_before_the_idx)
    with pytest.raises(KeyboardInterrupt):
        tokpack.export_megatron(packed, prefix, dtype="int32", force=True)
    monkeypatch.setattr(outdir.os, "replace", real_replace)
    with pytest.raises(tokpack.CorruptOutputError, match=r"train\.idx: does not match"):
        tokpack.packed.export.check_megatron(prefix)
    assert main(["verify", str(prefix)]) == 2
    assert "train.idx: does not match" in capsys.readouterr().err
    tokpack.export_megatron(packed, prefix, dtype="int32", force=True)
    tokpack.packed.export.check_megatron(prefix)
    assert read_megatron(prefix)[0] is np.int32
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "train.bin",
        "train.idx",
        "train.tokpack.json",
    ]
