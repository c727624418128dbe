"""Preference and KTO data from ``tokpack pack`` to the loss: packed shards read by the torch
readers (map-style and streaming, DataLoader workers too), collated with ``return_pairs=True``,
give per-sequence log-probs equal to each chosen and rejected sequence run alone (float64 toy
transformer, SDPA mask), and carried columns arrive per segment."""

from __future__ import annotations

import pytest
import torch

import tokpack
from tokpack.torch import PackedCollator, PackedDataset, PackedIterableDataset, sequence_logps

from .test_pack_pairs import gen_pairs, write_pairs
from .test_torch_contamination import VOCAB, TinyCausalLM
from .test_torch_pairs import alone, run, sdpa, toy

MAX_LEN = 96


@pytest.fixture(scope="module")
def pairs():
    import random

    rng = random.Random(3)
    return [
        (
            [t % (VOCAB - 1) + 1 for t in p],
            [t % (VOCAB - 1) + 1 for t in c],
            [t % (VOCAB - 1) + 1 for t in r],
        )
        for p, c, r in gen_pairs(rng, 40, longest=20)
    ]


@pytest.fixture(scope="module")
def model():
    return TinyCausalLM()


@pytest.mark.parametrize("layout", ["separate", "shared-prompt"])
@pytest.mark.parametrize("fmt", ["hf", "padded"])
def test_packed_pairs_give_the_log_probs_of_the_sequences_alone(
    tmp_path, pairs, model, layout, fmt
):
    score = [i / 8 for i in range(len(pairs))]
    source = [f"set-{i % 3}" for i in range(len(pairs))]
    shard = write_pairs(tmp_path / "pairs.parquet", pairs, score=score, source=source)
    out = tmp_path / "packed"
    manifest = tokpack.pack_files(
        [shard], out, MAX_LEN, pair_layout=layout, carry=["score", "source"]
    )
    assert manifest["figures"]["samples_packed"] == len(pairs)
    ds = PackedDataset(out)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=3, num_workers=2, collate_fn=PackedCollator(fmt, return_pairs=True)
    )
    with torch.no_grad():
        want = alone(toy(model), pairs)
        seen = 0
        for batch in loader:
            logits = run(model, batch, sdpa(batch))
            got = sequence_logps(logits, batch)
            # Pair p of the batch is input pair sample_ids[first segment of p].
            ids = batch["sample_ids"][batch["seq_roles"] == 1]
            assert torch.allclose(got, want[ids], rtol=0, atol=1e-9)
            n_segs = len(batch["seq_roles"])
            assert batch["score"].tolist() == [score[i] for i in batch["sample_ids"].tolist()]
            assert batch["source"] == [source[i] for i in batch["sample_ids"].tolist()]
            assert len(batch["source"]) == n_segs
            seen += len(ids)
    assert seen == len(pairs)


def test_kto_label_and_carried_columns_through_the_stream(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokpack.tokenize import KTO_SCHEMA

    ids = [[1 + (i * 7 + j) % 50 for j in range(3 + i % 9)] for i in range(30)]
    table = pa.table(
        {
            "input_ids": ids,
            "labels": [[-100] * 2 + x[2:] for x in ids],
            "length": [len(x) for x in ids],
            "prompt_length": [2] * len(ids),
            "label": [i % 3 != 0 for i in range(len(ids))],
        },
        schema=KTO_SCHEMA,
    ).append_column("weight", pa.array([float(i) for i in range(len(ids))]))
    pq.write_table(table, tmp_path / "kto.parquet", row_group_size=8)
    out = tmp_path / "packed"
    tokpack.pack_files([tmp_path / "kto.parquet"], out, 32, carry=["weight"])
    ds = PackedIterableDataset(
        out, batch_rows=2, seed=1, collate_fn=PackedCollator("flash", return_pairs=True)
    )
    seen = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
        sid = batch["sample_ids"].tolist()
        assert batch["label"].tolist() == [i % 3 != 0 for i in sid]
        assert batch["weight"].tolist() == [float(i) for i in sid]
        seen += sid
    assert sorted(seen) == list(range(len(ids)))
