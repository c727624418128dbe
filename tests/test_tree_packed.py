"""Packed tree directories read for training: ``tokpack pack`` of tree token shards (GRPO-like
groups with labels on the completions, multi-turn histories training their turns, trees cut
across rows), read by ``PackedDataset`` / the streaming readers with ``PackedTreeCollator`` in
DataLoader workers. Every sequence's log-probs and losses equal the sequence run alone within
1e-12 relative on float64 tiny Llama and Qwen3 (sdpa); a flat causal mask misses. Flat
collators, mixed-kind mixtures, export and Ray refuse tree data; verify checks it."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import tokpack
from tokpack import ConfigError, CorruptOutputError, PackingError
from tokpack.torch import (
    PackedBatchSampler,
    PackedCollator,
    PackedDataset,
    PackedIterableDataset,
    PackedMixture,
)
from tokpack.tree import PackedTreeCollator, model_inputs, sequence_logps, token_logps, tree_loss

from .test_tree_models import alone, tiny
from .test_tree_packed_collate import check_batch

transformers = pytest.importorskip("transformers")
if "tree" not in tokpack.kinds.SAMPLE_KINDS:  # until the core's tree kind (h-treepack) lands
    pytest.skip("tokpack pack has no tree kind in this build", allow_module_level=True)

VOCAB = 64
MAX_LEN = 40


def corpus(seed=0, n_grpo=6, n_chats=3):
    """Token sequences with their labels and groups: GRPO groups (a prompt, 4 completions, two
    sharing their start; completions trained) and chats (one sample per turn repeating the
    history; every assistant turn so far trained). The groups' rows interleaved."""
    rng = np.random.default_rng(seed)
    samples = []
    for g in range(n_grpo):
        prompt = rng.integers(1, VOCAB, int(rng.integers(6, 16))).tolist()
        outs = [rng.integers(1, VOCAB, int(rng.integers(2, 10))).tolist() for _ in range(4)]
        outs[1][:2] = outs[0][:2]
        samples += [(prompt + c, [-100] * len(prompt) + c, g) for c in outs]
    for c in range(n_chats):
        tokens, labels = [], []
        for _ in range(3):
            user = rng.integers(1, VOCAB, int(rng.integers(2, 6))).tolist()
            reply = rng.integers(1, VOCAB, int(rng.integers(2, 6))).tolist()
            tokens, labels = tokens + user + reply, labels + [-100] * len(user) + reply
            samples.append((list(tokens), list(labels), 1000 + c))
    order = rng.permutation(len(samples))
    return [samples[i] for i in order]


def write_tree_shards(path, samples, n_files=2, reward=None):
    """``samples`` as tree token shards (``tokpack.kind = "tree"``) in ``n_files`` files."""
    path.mkdir(parents=True)
    cols = {
        "input_ids": pa.array([s[0] for s in samples], pa.list_(pa.int32())),
        "labels": pa.array([s[1] for s in samples], pa.list_(pa.int32())),
        "length": pa.array([len(s[0]) for s in samples], pa.int32()),
        "group": pa.array([s[2] for s in samples], pa.int64()),
    }
    if reward is not None:
        cols["reward"] = pa.array(reward, pa.float64())
    table = pa.table(cols).replace_schema_metadata({b"tokpack.kind": b"tree"})
    cut = np.linspace(0, table.num_rows, n_files + 1).astype(int)
    for k in range(n_files):
        pq.write_table(table.slice(cut[k], cut[k + 1] - cut[k]), path / f"part-{k}.parquet")
    return path


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree-packed")
    samples = corpus()
    reward = np.random.default_rng(1).normal(size=len(samples))
    shards = write_tree_shards(root / "trees", samples, reward=reward)
    out = root / "packed"
    manifest = tokpack.pack_files([shards], out, MAX_LEN, carry=["reward"], row_group_rows=3)
    return out, samples, reward, manifest


def flags_of(samples):
    return [[x != -100 for x in s[1]] for s in samples]


def test_the_directory_is_a_tree_kind_one(packed):
    out, samples, _, manifest = packed
    assert manifest["sample_kind"] == "tree"
    ds = PackedDataset(out)
    assert ds.packed.kind == "tree" and len(ds) > 1
    report = tokpack.verify(out)
    assert report["ok"] and report["rows"] == len(ds)
    held = sorted(int(i) for r in range(len(ds)) for i in ds[r]["sample_ids"])
    assert held == list(range(len(samples)))
    # Trees were cut across rows, and the rows hold fewer tokens than the sequences.
    tokens = sum(int(ds[r]["input_ids"].numel()) for r in range(len(ds)))
    assert tokens < sum(len(s[0]) for s in samples)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_each_sequence_of_a_packed_tree_directory_is_exact(packed, family):
    out, samples, reward, _ = packed
    model = tiny(family, "sdpa")
    flags = flags_of(samples)
    loader = torch.utils.data.DataLoader(
        PackedDataset(out), batch_size=3, collate_fn=PackedTreeCollator(), num_workers=2
    )
    seen = []
    for batch in loader:
        with torch.no_grad():
            logits = model(**model_inputs(batch, model), use_cache=False).logits
        per_token, per_seq = token_logps(logits, batch), sequence_logps(logits, batch)
        want_total = 0.0
        for k, i in enumerate(batch["tree_seq_index"].tolist()):
            want = alone(model, samples[i][0], flags[i])
            n = want.numel()
            assert int(batch["tree_completion_lengths"][k]) == n
            torch.testing.assert_close(per_token[k, :n], want, rtol=1e-12, atol=0)
            torch.testing.assert_close(per_seq[k], want.sum(), rtol=1e-12, atol=0)
            want_total -= float(want.sum())
        got = float(tree_loss(logits, batch, "sum"))
        assert abs(got - want_total) <= 1e-12 * abs(want_total)
        index = batch["tree_seq_index"]
        assert torch.equal(batch["reward"], torch.from_numpy(reward)[index])
        assert batch["group"].tolist() == [samples[i][2] for i in index.tolist()]
        seen += index.tolist()
    assert sorted(seen) == list(range(len(samples)))


def test_a_flat_causal_mask_misses(packed):
    out, samples, _, _ = packed
    model = tiny("llama", "sdpa")
    ds = PackedDataset(out)
    batch = PackedTreeCollator()([ds[r] for r in range(len(ds))])
    with torch.no_grad():
        good = sequence_logps(model(**model_inputs(batch, model), use_cache=False).logits, batch)
        length = batch["input_ids"].shape[1]
        causal = torch.tril(torch.ones(length, length, dtype=torch.bool))[None, None]
        mixed = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=causal.expand(batch["input_ids"].shape[0], 1, -1, -1),
            use_cache=False,
        ).logits
    bad = sequence_logps(mixed, batch)
    assert float(((bad - good).abs() / good.abs()).max()) > 1e-6


def test_the_streaming_reader_takes_the_tree_collator_in_workers(packed):
    out, samples, _, _ = packed
    seqs = [s[0] for s in samples]
    ds = PackedIterableDataset(out, batch_rows=2, collate_fn=PackedTreeCollator(), seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen = []
    for batch in loader:
        check_batch(batch, seqs, flags_of(samples))
        seen += batch["tree_seq_index"].tolist()
    assert sorted(seen) == list(range(len(samples)))


def test_the_batch_sampler_counts_a_steps_tree_targets(packed):
    out, _, _, _ = packed
    ds = PackedDataset(out)
    sampler = PackedBatchSampler(ds, batch_rows=2, grad_accum_steps=2, rank=0, world_size=1)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=PackedTreeCollator())
    batches = list(loader)
    for m in range(0, len(batches), 2):
        step = batches[m : m + 2]
        targets = sum(int(b["tree_completion_lengths"].sum()) for b in step)
        sequences = sum(int(b["tree_seq_index"].numel()) for b in step)
        for b in step:
            assert (b["global_num_loss_tokens"], b["global_num_samples"]) == (targets, sequences)


def test_flat_readers_of_a_tree_directory_are_refused(packed, tmp_path):
    out, _, _, _ = packed
    with pytest.raises(ConfigError, match="PackedTreeCollator"):
        PackedIterableDataset(out, batch_rows=2, collate_fn=PackedCollator())
    loader = torch.utils.data.DataLoader(
        PackedDataset(out), batch_size=2, collate_fn=PackedCollator()
    )
    with pytest.raises(PackingError, match="PackedTreeCollator"):
        next(iter(loader))
    # A tree collator on a flat directory, and a mixture of kinds, are refused too.
    flat = tmp_path / "flat"
    tokpack.synthetic.write_token_shards(tmp_path / "sft", 40, max_length=30, vocab_size=VOCAB)
    tokpack.pack_files([tmp_path / "sft"], flat, MAX_LEN)
    with pytest.raises(ConfigError, match="reads packed tree directories"):
        PackedIterableDataset(flat, batch_rows=2, collate_fn=PackedTreeCollator())
    with pytest.raises(ConfigError, match="cannot mix them"):
        PackedMixture({"t": out, "f": flat}, {"t": 1, "f": 1}, batch_rows=2)


def test_a_mixture_of_tree_directories_reads_both(packed, tmp_path):
    out, samples, _, _ = packed
    other = corpus(seed=5, n_grpo=3, n_chats=1)
    shards = write_tree_shards(tmp_path / "trees", other, n_files=1)
    tokpack.pack_files([shards], tmp_path / "packed", MAX_LEN)
    mix = PackedMixture(
        {"a": out, "b": tmp_path / "packed"},
        {"a": 1, "b": 1},
        batch_rows=2,
        stop="all",
        collate_fn=PackedTreeCollator(),
    )
    seen = {0: [], 1: []}
    for batch in mix:
        rows = batch["tree_seq_row"].tolist()
        for k, i in enumerate(batch["tree_seq_index"].tolist()):
            seen[batch["sources"][rows[k]]].append(i)
        # Sequences by sample id (each source's own ids).
        assert batch["tree_seq_index"].tolist() == sorted(batch["tree_seq_index"].tolist())
    # stop="all": each source delivers every row at least once (the smaller one wraps around).
    assert sorted(set(seen[0])) == list(range(len(samples)))
    assert sorted(set(seen[1])) == list(range(len(other)))


def test_export_is_refused(packed, tmp_path):
    out, _, _, _ = packed
    with pytest.raises(ConfigError, match="holds tree"):
        tokpack.export_megatron(out, tmp_path / "mg" / "train")
    with pytest.raises(ConfigError, match="holds tree"):
        tokpack.export_nemo_packed(out, tmp_path / "nemo.parquet")
    assert not (tmp_path / "mg").exists() and not (tmp_path / "nemo.parquet").exists()


def test_verify_names_a_damaged_tree_column(packed, monkeypatch):
    out, _, _, _ = packed
    from tokpack.packed.reader import PackedDir

    decode = PackedDir.decode

    def damaged(self, group, columns=None):
        cols = decode(self, group, columns)
        if group == 1 and "tree_node_depth" in cols:
            values, offsets = cols["tree_node_depth"]
            values = values.copy()
            values[offsets[1]] += 1  # row 1 of the group: its first node
            cols["tree_node_depth"] = (values, offsets)
        return cols

    monkeypatch.setattr(PackedDir, "decode", damaged)
    with pytest.raises(CorruptOutputError, match=r"row group \d+, row \d+ of the shard: column"):
        tokpack.verify(out)
    with pytest.raises(CorruptOutputError, match=r"'tree_node_depth'"):
        tokpack.verify(out)


def test_compute_balance_costs_tree_rows_by_their_tokens_positions(packed):
    # Tree rows were costed by seq_lengths (every sequence whole, as if flat): their shared
    # tokens counted once per sequence. A token at position p costs a + b (2p + 1) (a flat
    # segment of L tokens: a L + b L^2).
    from tokpack.balance.packed import row_compute
    from tokpack.packed.reader import PackedDir

    out, _, _, _ = packed
    ds = PackedDataset(out)
    a, b = 3.0, 0.5
    got = row_compute(PackedDir(out), (a, b))
    collate = PackedTreeCollator()
    for i in range(len(ds)):
        pos = collate([ds[i]])["position_ids"][0, : len(ds[i]["input_ids"])].double()
        assert got[i] == pytest.approx(float(a * pos.numel() + b * (2 * pos + 1).sum()))


def test_inspect_shows_each_sequence_by_its_path(packed, capsys):
    # inspect printed a tree row's sequences as contiguous slices of the row (they are not:
    # shared tokens are stored once), the slices running past the row's end.
    from tokpack.cli import main

    out, samples, _, _ = packed
    assert main(["inspect", str(out), "--rows", "4"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  sample ")]
    assert len(lines) >= 4
    for line in lines:
        sid, rest = line[len("  sample ") :].split(":", 1)
        head = rest.rsplit(":", 1)[1].replace("...", "").split()
        assert [int(t) for t in head] == list(samples[int(sid)][0][:8])
        assert f"{len(samples[int(sid)][0])} tokens" in rest
