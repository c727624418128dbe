"""PackedDataset and the packed-directory reader: contents, zero-copy rows, samplers, errors."""

import json
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import tokpack
from tokpack._io.outdir import MANIFEST_NAME
from tokpack.torch import PackedCollator, PackedDataset

from .packed_corpus import random_samples, write_packed_dir

MAX_LEN = 64


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("packed")
    samples, labels = random_samples(300, 40, seed=1)
    manifest = write_packed_dir(
        out, samples, labels, max_len=MAX_LEN, rows_per_shard=40, row_group_rows=16
    )
    return out, samples, labels, manifest


def _check_rows(ds, samples, labels):
    seen = []
    for i in range(len(ds)):
        row = ds[i]
        assert row["input_ids"].dtype == torch.int32 and row["sample_ids"].dtype == torch.int64
        pos = 0
        for sid, n in zip(row["sample_ids"].tolist(), row["seq_lengths"].tolist()):
            assert row["input_ids"][pos : pos + n].tolist() == samples[sid].tolist()
            assert row["labels"][pos : pos + n].tolist() == labels[sid].tolist()
            pos += n
        assert pos == len(row["input_ids"]) <= MAX_LEN
        seen.extend(row["sample_ids"].tolist())
    assert sorted(seen) == list(range(len(samples)))


def test_rows_match_the_samples(corpus):
    path, samples, labels, manifest = corpus
    ds = PackedDataset(path)
    assert len(ds) == manifest["figures"]["rows"]
    assert len(manifest["shards"]) > 1 and ds.packed.num_groups > len(manifest["shards"])
    _check_rows(ds, samples, labels)
    assert ds[-1]["input_ids"].tolist() == ds[len(ds) - 1]["input_ids"].tolist()
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_device_mode_gives_the_same_rows(corpus):
    path, samples, labels, _ = corpus
    ds = PackedDataset(path, device="cpu")
    _check_rows(ds, samples, labels)
    plain = PackedDataset(path)
    assert all(torch.equal(ds[i]["input_ids"], plain[i]["input_ids"]) for i in (0, 7, len(ds) - 1))


def test_pickles_without_decoded_data(corpus):
    ds = PackedDataset(corpus[0])
    ds[0]
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000
    again = pickle.loads(blob)
    assert torch.equal(again[5]["input_ids"], ds[5]["input_ids"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_distributed_sampler_through_dataloader(corpus, num_workers):
    path, samples, _, _ = corpus
    ds = PackedDataset(path)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
        loader = DataLoader(
            ds,
            batch_size=4,
            sampler=sampler,
            collate_fn=PackedCollator("flash", return_seq_idx=True),
            num_workers=num_workers,
        )
        for batch in loader:
            assert batch["input_ids"].dim() == 1
            seen.append(int(batch["num_seqs"]))
    assert sum(seen) >= len(samples)


def test_hf_trainer_runs_on_packed_dataset(corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=MAX_LEN,
        use_cache=False,  # a KV cache disables transformers' position_ids packing detection
    )
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        report_to=[],
        use_cpu=True,
        remove_unused_columns=False,  # keep seq_lengths for the collator
        save_strategy="no",
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=PackedDataset(corpus[0]),
        data_collator=PackedCollator(),
    )
    result = trainer.train()
    assert result.global_step == 2 and np.isfinite(result.training_loss)


def test_bad_paths(tmp_path):
    with pytest.raises(tokpack.InputNotFoundError, match="no such packed directory"):
        PackedDataset(tmp_path / "missing")
    with pytest.raises(tokpack.InputNotFoundError, match="no __tokpack__/_manifest.json"):
        PackedDataset(tmp_path)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(tokpack.InputNotFoundError, match="not a directory"):
        PackedDataset(f)


def _corrupt_copy(src, dst, edit):
    import shutil

    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    text = edit(manifest, dst)
    if not isinstance(text, str):
        text = json.dumps(manifest)
    (dst / MANIFEST_NAME).write_text(text)
    return dst


@pytest.mark.parametrize(
    "name,edit,match",
    [
        ("json", lambda m, d: "{not json", "invalid JSON"),
        ("format", lambda m, d: m.update(format="other"), "not a 'tokpack-packed' manifest"),
        ("version", lambda m, d: m.update(format_version=99), "format_version 99"),
        ("nofield", lambda m, d: m.pop("shards"), "missing or invalid field 'shards'"),
        ("rows", lambda m, d: m["shards"][1].update(rows=3), r"shard 1 \(part-00001.parquet\)"),
        ("total", lambda m, d: m["figures"].update(rows=1), "figures.rows is 1"),
        ("missing", lambda m, d: (d / "part-00001.parquet").unlink(), "shard 1: .* is missing"),
        (
            "garbage",
            lambda m, d: (d / "part-00001.parquet").write_bytes(b"garbage"),
            "part-00001.parquet: the file has 7 bytes, the manifest says",
        ),
        (
            "garbage-same-size",
            lambda m, d: (d / "part-00001.parquet").write_bytes(bytes(m["shards"][1]["size"])),
            "part-00001.parquet: not a readable Parquet file",
        ),
        ("version1", lambda m, d: m.update(format_version=1), "no row-group checksums; rebuild"),
    ],
)
def test_corrupted_directories(corpus, tmp_path, name, edit, match):
    bad = _corrupt_copy(corpus[0], tmp_path / name, edit)
    with pytest.raises(tokpack.CorruptOutputError, match=match):
        PackedDataset(bad)


def test_import_tokpack_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, tokpack; assert 'torch' not in sys.modules; tokpack.streaming_dataset_reader"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert tokpack.PackedDataset is PackedDataset


def test_damaged_shard_data_names_file_and_row_group(corpus, tmp_path):
    import shutil

    bad = tmp_path / "damaged"
    shutil.copytree(corpus[0], bad)
    shard = bad / "part-00000.parquet"
    data = bytearray(shard.read_bytes())
    data[4:2000] = bytes(1996)  # page data of the first row groups; the footer stays intact
    shard.write_bytes(bytes(data))
    ds = PackedDataset(bad)
    with pytest.raises(
        tokpack.CorruptOutputError, match="part-00000.parquet: cannot decode row group 0"
    ):
        ds[0]


def test_rows_are_not_shared_with_later_reads(corpus):
    for ds in (PackedDataset(corpus[0]), PackedDataset(corpus[0], device="cpu")):
        before = ds[0]["input_ids"][0].item()
        row = ds[0]
        row["input_ids"][0] = 12345
        row["labels"][:] = 7
        row["seq_lengths"][0] = 0
        again = ds[0]
        assert again["input_ids"][0].item() == before != 12345
        assert (again["labels"] != 7).any() and again["seq_lengths"][0] > 0


@pytest.mark.parametrize("index", [1.5, "3", True, np.bool_(True), torch.tensor(True), None])
def test_only_integers_are_row_indices(corpus, index):
    ds = PackedDataset(corpus[0])
    with pytest.raises(TypeError, match="integer"):
        ds[index]


@pytest.mark.parametrize("index", [3, np.int64(3), np.int32(3), torch.tensor(3)])
def test_integer_like_indices(corpus, index):
    ds = PackedDataset(corpus[0])
    assert torch.equal(ds[index]["input_ids"], ds[3]["input_ids"])


@pytest.mark.parametrize("device", [None, "cpu"])
def test_open_dataset_never_mixes_a_rebuilt_directory(tmp_path, device):
    samples, labels = random_samples(300, 40, seed=1)
    out = tmp_path / "packed"
    write_packed_dir(out, samples, labels, max_len=MAX_LEN, rows_per_shard=40, row_group_rows=16)
    ds = PackedDataset(out, device=device)
    old = [ds[i]["input_ids"].tolist() for i in (0, len(ds) - 1)]
    n = len(ds)
    write_packed_dir(out, samples, labels, max_len=48, rows_per_shard=40, row_group_rows=16)
    assert len(ds) == n and ds.max_len == MAX_LEN
    for i, want in zip((0, n - 1), old):
        try:
            row = ds[i]
        except tokpack.CorruptOutputError as exc:
            assert "changed since the dataset was opened" in str(exc)
        else:
            assert row["input_ids"].tolist() == want  # the snapshot it opened, never the new one
    fresh = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker gets
    try:
        row = fresh[n - 1]
    except tokpack.CorruptOutputError as exc:
        assert "changed since the dataset was opened" in str(exc)
    else:
        assert row["input_ids"].tolist() == old[1]
