"""Integrity of packed directories: damaged shards are detected when a row group is read, by
``tokpack verify`` and by the cache-hit check of ``pack``."""

import json
import shutil

import pyarrow.parquet as pq
import pytest
import torch

import tokpack
from tokpack._io.outdir import MANIFEST_NAME
from tokpack.cli import main
from tokpack.torch import PackedDataset, PackedIterableDataset

from .packed_corpus import random_samples, write_packed_dir

MAX_LEN = 64


@pytest.fixture(scope="module", params=["zstd", "none"])
def corpus(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"packed-{request.param}")
    samples, labels = random_samples(400, 40, seed=3)
    manifest = write_packed_dir(
        out,
        samples,
        labels,
        max_len=MAX_LEN,
        rows_per_shard=40,
        row_group_rows=16,
        compression=request.param,
    )
    return out, manifest


def _column_chunk(path, group, column):
    """(start, length) of a column chunk's bytes in the file."""
    meta = pq.ParquetFile(path).metadata.row_group(group)
    names = [meta.column(i).path_in_schema for i in range(meta.num_columns)]
    col = meta.column(names.index(f"{column}.list.item"))
    start = col.dictionary_page_offset or col.data_page_offset
    return start, col.total_compressed_size


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def _damaged_copy(src, dst, shard, offset_of):
    shutil.copytree(src, dst)
    path = dst / shard
    _flip(path, offset_of(path))
    return dst


# (name, shard, row group, where in the file): inside the token data pages, in the middle of a
# labels column chunk, at the first byte of a column chunk (a page header).
PLACES = [
    ("ids-middle", "part-00000.parquet", 1, lambda p: sum(_column_chunk(p, 1, "input_ids")) - 40),
    ("labels-middle", "part-00001.parquet", 0, lambda p: _mid(_column_chunk(p, 0, "labels"))),
    ("ids-header", "part-00002.parquet", 2, lambda p: _column_chunk(p, 2, "input_ids")[0]),
]


def _mid(chunk):
    start, length = chunk
    return start + length // 2


@pytest.mark.parametrize("name,shard,group,offset_of", PLACES, ids=[p[0] for p in PLACES])
def test_flipped_byte_raises_naming_shard_and_row_group(
    corpus, tmp_path, name, shard, group, offset_of
):
    src, manifest = corpus
    bad = _damaged_copy(src, tmp_path / name, shard, offset_of)
    ds = PackedDataset(bad)
    k = [s["file"] for s in manifest["shards"]].index(shard)
    first = sum(s["rows"] for s in manifest["shards"][:k]) + 16 * group
    with pytest.raises(tokpack.CorruptOutputError, match=rf"{shard}.*row group {group}\b"):
        ds[first]
    # Other row groups are intact and still read.
    assert torch.equal(
        ds[0 if k else 40]["input_ids"], PackedDataset(src)[0 if k else 40]["input_ids"]
    )
    it = PackedIterableDataset(bad, batch_rows=4, rank=0, world_size=1)
    with pytest.raises(tokpack.CorruptOutputError, match=rf"{shard}.*row group {group}\b"):
        for _ in it:
            pass
    device_mode = pytest.raises(tokpack.CorruptOutputError, match=rf"{shard}.*row group {group}\b")
    with device_mode:
        PackedDataset(bad, device="cpu")


@pytest.mark.parametrize("name,shard,group,offset_of", PLACES, ids=[p[0] for p in PLACES])
def test_verify_reports_a_flipped_byte(corpus, tmp_path, capsys, name, shard, group, offset_of):
    src, _ = corpus
    assert main(["verify", str(src)]) == 0
    capsys.readouterr()
    bad = _damaged_copy(src, tmp_path / name, shard, offset_of)
    assert main(["verify", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{shard}" in err and "Traceback" not in err
    with pytest.raises(tokpack.CorruptOutputError, match=rf"{shard}.*row group {group}\b"):
        tokpack.verify(bad)
    # --quick checks presence and sizes only: a flipped byte keeps the size.
    assert main(["verify", "--quick", str(bad)]) == 0


def test_flipped_footer_byte_is_detected(corpus, tmp_path):
    src, _ = corpus

    def in_footer(path):
        size = path.stat().st_size
        return size - 8 - 20  # inside the Thrift footer (its length and magic are the last 8)

    bad = _damaged_copy(src, tmp_path / "footer", "part-00000.parquet", in_footer)
    with pytest.raises(tokpack.CorruptOutputError, match="part-00000.parquet"):
        PackedDataset(bad)[0]
    with pytest.raises(tokpack.CorruptOutputError, match="part-00000.parquet"):
        tokpack.verify(bad)


def test_verify_checks_presence_sizes_side_files_and_figures(corpus, tmp_path, capsys):
    src, _ = corpus
    report = tokpack.verify(src)
    assert report["ok"] and report["shards"] == 4 and report["row_groups"] == 10
    cases = {
        "missing": lambda d: (d / "part-00003.parquet").unlink(),
        "truncated": lambda d: (d / "part-00003.parquet").write_bytes(
            (d / "part-00003.parquet").read_bytes()[:-1]
        ),
        "index": lambda d: (d / "__tokpack__/_index-part-00003.arrow").unlink(),
        "dropped": lambda d: (d / "__tokpack__/_dropped.arrow").write_bytes(b"junk"),
    }
    for name, edit in cases.items():
        bad = tmp_path / name
        shutil.copytree(src, bad)
        edit(bad)
        assert main(["verify", "--quick", str(bad)]) == 2, name
        assert "tokpack verify: error:" in capsys.readouterr().err
    bad = tmp_path / "figures"
    shutil.copytree(src, bad)
    manifest = json.loads((bad / MANIFEST_NAME).read_text())
    manifest["figures"]["samples_packed"] += 1
    (bad / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(tokpack.CorruptOutputError, match="samples_in"):
        tokpack.verify(bad, full=False)


def test_inspect_notices_a_missing_or_wrong_size_shard(corpus, tmp_path, capsys):
    src, _ = corpus
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    shard = bad / "part-00003.parquet"
    shard.write_bytes(shard.read_bytes() + b"\0")
    assert main(["inspect", str(bad), "--rows", "1"]) == 2
    assert "part-00003.parquet" in capsys.readouterr().err
    shard.unlink()
    assert main(["inspect", str(bad), "--rows", "1"]) == 2
    assert "part-00003.parquet" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["rm", "truncate", "flip"])
def test_a_damaged_output_is_not_a_cache_hit(tmp_path, capsys, damage):
    samples, labels = random_samples(200, 40, seed=4)
    out = tmp_path / "out"
    write_packed_dir(out, samples, labels, max_len=MAX_LEN, rows_per_shard=40, row_group_rows=16)
    source = str(tmp_path / "out-tokens.parquet")
    args = ["pack", source, "-o", str(out), "--max-len", str(MAX_LEN), "--quiet"]
    args += ["--rows-per-shard", "40", "--row-group-rows", "16"]
    assert main(args) == 0
    assert "up to date (cache hit" in capsys.readouterr().err
    shard = out / "part-00001.parquet"
    if damage == "rm":
        shard.unlink()
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-3])
    else:
        _flip(shard, _mid(_column_chunk(shard, 0, "input_ids")))
        # A flipped byte keeps the size: only the full check (--verify-cache) notices.
        assert main(args) == 0
        assert "up to date (cache hit" in capsys.readouterr().err
        args.append("--verify-cache")
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "cache hit" not in err and "part-00001.parquet" in err and "rebuil" in err
    assert tokpack.verify(out)["ok"]
    # The API: the same check, and verify_cache=True for checksums.
    again = tokpack.pack_files([source], out, MAX_LEN, rows_per_shard=40, row_group_rows=16)
    assert again["cache_hit"]


def test_a_damaged_tokenize_output_is_not_a_cache_hit(tmp_path):
    pytest.importorskip("tokenizers")
    from ._tokenizer_factory import CHATML_GEN, build_tokenizer, conversations, write_jsonl

    tok = build_tokenizer(tmp_path / "tok", CHATML_GEN)
    corpus = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in conversations(60)])
    out = tmp_path / "tokens"
    tokpack.tokenize_files(corpus, out, tok, shard_rows=20)
    assert tokpack.tokenize_files(corpus, out, tok, shard_rows=20)["cache_hit"]
    (out / "part-00001.parquet").unlink()
    assert "cache_hit" not in tokpack.tokenize_files(corpus, out, tok, shard_rows=20)
    assert (out / "part-00001.parquet").is_file()
    shard = out / "part-00002.parquet"
    shard.write_bytes(shard.read_bytes()[:-5])  # footer gone: its row count cannot be read
    assert "cache_hit" not in tokpack.tokenize_files(corpus, out, tok, shard_rows=20)


def test_every_sample_dropped_gives_an_empty_shard_that_reads_and_verifies(tmp_path):
    import numpy as np
    import pyarrow as pa

    source = tmp_path / "long.parquet"
    ids = pa.array([np.arange(1, 50, dtype=np.int32)] * 3, type=pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": ids}), source)
    manifest = tokpack.pack_files([source], tmp_path / "out", 10, overlong="drop")
    assert manifest["figures"]["samples_dropped"] == 3 and manifest["shards"][0]["row_groups"] == 0
    assert len(PackedDataset(tmp_path / "out")) == 0
    assert tokpack.verify(tmp_path / "out")["rows"] == 0


def test_tokpack_verify_is_the_function_after_any_import():
    # A submodule named like the function replaced it on the package once imported.
    import tokpack.pack.files  # noqa: F401  (imports the integrity module)

    assert callable(tokpack.verify)


def test_verify_checks_a_tokenize_output(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from ._tokenizer_factory import CHATML_GEN, build_tokenizer, conversations, write_jsonl

    tok = build_tokenizer(tmp_path / "tok", CHATML_GEN)
    corpus = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in conversations(60)])
    out = tmp_path / "tokens"
    tokpack.tokenize_files(corpus, out, tok, shard_rows=20)
    report = tokpack.verify(out)
    assert report["ok"] and report["shards"] == 3 and report["rows"] == 60
    assert main(["verify", str(out)]) == 0
    shard = out / "part-00001.parquet"
    _flip(shard, shard.stat().st_size // 2)
    assert tokpack.verify(out, full=False)["ok"]  # same size: only the checksum sees it
    with pytest.raises(tokpack.CorruptOutputError, match="part-00001.parquet"):
        tokpack.verify(out)
    shard.unlink()
    with pytest.raises(tokpack.CorruptOutputError, match="part-00001.parquet is missing"):
        tokpack.verify(out, full=False)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 2
    assert "part-00001.parquet is missing" in capsys.readouterr().err


def _flip_a_loss_count(index_path) -> None:
    """Adds one to a row's num_loss_tokens in an index side file, in place (same size)."""
    import numpy as np
    import pyarrow as pa

    with pa.memory_map(str(index_path)) as source:
        column = pa.ipc.open_file(source).read_all().column("num_loss_tokens")
        values = np.asarray(column.to_numpy(), dtype="<i4")
    data = bytearray(index_path.read_bytes())
    at = bytes(data).find(values.tobytes())
    assert at > 0 and bytes(data).find(values.tobytes(), at + 1) < 0
    data[at] ^= 0x01
    index_path.write_bytes(bytes(data))


@pytest.mark.parametrize("side", ["index", "dropped"])
def test_a_damaged_side_file_is_refused_by_every_reader_and_the_cache(tmp_path, capsys, side):
    """Fails on the code before issue 20: the index side files and the dropped list had no
    checksum, so a flipped bit in num_loss_tokens changed global_num_loss_tokens and mix-stats,
    and a cache hit, even with --verify-cache, accepted it."""
    from tokpack.packed.reader import PackedDir
    from tokpack.packed.row_counts import row_counts

    samples, labels = random_samples(200, 40, seed=4)
    samples[5] = samples[5][:0]  # an empty sample: the dropped list has a row
    labels[5] = labels[5][:0]
    out = tmp_path / "out"
    write_packed_dir(out, samples, labels, max_len=MAX_LEN, rows_per_shard=40, row_group_rows=16)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["shards"][1]["index_checksum"].startswith("xxh3_128:")
    assert manifest["dropped_checksum"].startswith("xxh3_128:")
    source = str(tmp_path / "out-tokens.parquet")
    args = ["pack", source, "-o", str(out), "--max-len", str(MAX_LEN), "--quiet"]
    args += ["--rows-per-shard", "40", "--row-group-rows", "16"]
    if side == "index":
        damaged = out / manifest["shards"][1]["index"]
        _flip_a_loss_count(damaged)
    else:
        damaged = out / manifest["dropped_file"]
        data = bytearray(damaged.read_bytes())
        data[len(data) // 2] ^= 0x01
        damaged.write_bytes(bytes(data))
    name = damaged.name
    with pytest.raises(tokpack.CorruptOutputError, match=name):
        tokpack.verify(out, full=False)
    if side == "index":
        with pytest.raises(tokpack.CorruptOutputError, match=name):
            row_counts(PackedDir(out))
    assert main(["verify", "--quick", str(out)]) == 2
    assert name in capsys.readouterr().err
    # Same size: a plain cache hit trusts it; --verify-cache checks the checksums and rebuilds.
    assert main(args) == 0
    assert "up to date (cache hit" in capsys.readouterr().err
    assert main(args + ["--verify-cache"]) == 0
    err = capsys.readouterr().err
    assert "cache hit" not in err and name in err and "rebuil" in err
    assert tokpack.verify(out)["ok"]
    # A side file of another size is not a cache hit even without --verify-cache.
    damaged.write_bytes(damaged.read_bytes() + b"\0")
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "cache hit" not in err and name in err
    assert tokpack.verify(out)["ok"]


def test_a_directory_without_side_file_checksums_stays_readable(tmp_path, capsys):
    """format_version 2 directories written before index_size / index_checksum and
    dropped_size / dropped_checksum: read as before (unchecked side files); --verify-cache,
    which cannot check them, rebuilds them."""
    samples, labels = random_samples(60, 40, seed=2)
    out = tmp_path / "out"
    write_packed_dir(out, samples, labels, max_len=MAX_LEN, rows_per_shard=20, row_group_rows=8)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    for shard in manifest["shards"]:
        del shard["index_size"], shard["index_checksum"]
    del manifest["dropped_size"], manifest["dropped_checksum"]
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert tokpack.verify(out)["ok"] and tokpack.verify(out, full=False)["ok"]
    assert len(PackedDataset(out)) == manifest["figures"]["rows"]
    source = str(tmp_path / "out-tokens.parquet")
    args = ["pack", source, "-o", str(out), "--max-len", str(MAX_LEN), "--quiet"]
    args += ["--rows-per-shard", "20", "--row-group-rows", "8"]
    assert main(args) == 0
    assert "up to date (cache hit" in capsys.readouterr().err
    assert main(args + ["--verify-cache"]) == 0
    assert "older tokpack" in capsys.readouterr().err
    assert "index_checksum" in json.loads((out / MANIFEST_NAME).read_text())["shards"][0]
