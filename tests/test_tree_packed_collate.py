"""PackedTreeCollator on the tree kind's contract rows (cut out of in-memory batches by
``tree_packed_rows.rows_of``): the rows of a ``pack_trees`` batch collate back to that batch
exactly; any subset of rows, in any order, is a batch whose every sequence's path is its tokens
at positions 0..n with nested intervals; damaged rows and flat collators are refused."""

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from tokpack import DataError, PackingError
from tokpack.torch import PackedCollator
from tokpack.torch import model_inputs as flat_model_inputs
from tokpack.torch.static import StaticShapes
from tokpack.tree import PackedTreeCollator, dense_mask, pack_trees

from .test_tree_layout import path_of
from .tree_packed_rows import rows_of


def groups_of(rng, n_groups, size, vocab=6):
    """Sequences sharing prefixes within each group (a prompt and its completions, some
    completions sharing their starts), and labels on the completions."""
    seqs, labels, group = [], [], []
    for g in range(n_groups):
        prompt = rng.integers(0, vocab, int(rng.integers(2, 9))).tolist()
        head = rng.integers(0, vocab, 3).tolist()
        for k in range(size):
            tail = rng.integers(0, vocab, int(rng.integers(1, 7))).tolist()
            out = (head + tail) if k % 2 else tail
            seqs.append(prompt + out)
            labels.append([-100] * len(prompt) + out)
            group.append(g)
    return seqs, labels, group


def assert_same(got, want):
    keys = [k for k in want if k != "tree_stats"]
    assert sorted(k for k in got if k in keys) == sorted(keys)
    for k in keys:
        assert got[k].dtype == want[k].dtype, k
        assert torch.equal(got[k], want[k]), k


CASES = [
    dict(max_tokens=64),
    dict(max_tokens=24, pad_to_multiple_of=8),  # trees cut across rows
    dict(max_tokens=16, pad_to_multiple_of=4),
    dict(max_tokens=40, min_shared=3),
]


@pytest.mark.parametrize("options", CASES, ids=[str(c) for c in CASES])
def test_the_rows_of_a_batch_collate_back_to_it(options):
    rng = np.random.default_rng(0)
    seqs, labels, group = groups_of(rng, 5, 4)
    batch = pack_trees(seqs, labels, groups=group, **options)
    assert batch["input_ids"].shape[0] > 1
    rows = rows_of(batch)
    collator = PackedTreeCollator(pad_to_multiple_of=options.get("pad_to_multiple_of", 1))
    assert_same(collator(rows), batch)
    # Rows as PackedDataset yields them (tensors), and int64 columns: the same batch.
    as_tensors = [{k: torch.as_tensor(v) for k, v in r.items()} for r in rows]
    assert_same(collator(as_tensors), batch)
    assert_same(collator(rows_of(batch, dtype=np.int64)), batch)


def test_sample_ids_and_carried_columns_come_in_the_batch_order():
    rng = np.random.default_rng(1)
    seqs, labels, group = groups_of(rng, 4, 5)
    batch = pack_trees(seqs, labels, groups=group, max_tokens=20)
    ids = np.sort(rng.choice(10_000, len(seqs), replace=False))
    reward = rng.normal(size=len(seqs))
    advantage = rng.normal(size=len(seqs)).astype(np.float32)
    names = [f"s{i}" for i in range(len(seqs))]
    rows = rows_of(batch, ids, carried={"reward": reward, "advantage": advantage})
    for r in rows:
        r["name"] = [names[int(np.searchsorted(ids, i))] for i in r["sample_ids"]]
    rows = rows[::-1]  # rows in any order: sequences still by sample id
    got = PackedTreeCollator()(rows)
    index = got["tree_seq_index"]
    assert index.tolist() == ids.tolist()
    assert torch.equal(got["reward"], torch.from_numpy(reward))
    assert got["advantage"].dtype == torch.float32
    assert torch.equal(got["advantage"], torch.from_numpy(advantage))
    assert got["name"] == names
    for i in range(len(seqs)):
        assert path_tokens(got, i) == seqs[i]


def path_tokens(batch, i):
    row, idx = path_of(batch, i)
    return batch["input_ids"][row, idx].tolist()


def check_batch(batch, seqs, flags):
    """Every sequence's path is its tokens at positions 0..n seeing exactly its path before
    them; its targets score its trained tokens from the position before; intervals nest."""
    ids, pos = batch["input_ids"], batch["position_ids"]
    mask = dense_mask(batch)[:, 0]
    offsets = batch["tree_target_offsets"]
    for i, s in enumerate(batch["tree_seq_index"].tolist()):
        row, idx = path_of(batch, i)
        assert ids[row, idx].tolist() == seqs[s]
        assert pos[row, idx].tolist() == list(range(len(seqs[s])))
        sub = mask[row][idx][:, idx]
        assert torch.equal(sub, torch.tril(torch.ones(len(idx), len(idx), dtype=torch.bool)))
        assert int(mask[row, idx[-1]].sum()) == len(idx)
        preds = batch["tree_target_pred"][int(offsets[i]) : int(offsets[i + 1])]
        trained = [j for j in range(1, len(seqs[s])) if flags[s][j]]
        assert batch["tree_pred_row"][preds].tolist() == [row] * len(trained)
        assert batch["tree_pred_pos"][preds].tolist() == [idx[j - 1] for j in trained]
        assert batch["tree_pred_token"][preds].tolist() == [seqs[s][j] for j in trained]
    node_off = batch["tree_node_offsets"]
    for r in range(ids.shape[0]):
        for u in range(int(node_off[r]), int(node_off[r + 1])):
            p = int(batch["tree_node_parent"][u])
            tin, tout = int(batch["tree_node_tin"][u]), int(batch["tree_node_tout"][u])
            assert tin + int(batch["tree_node_len"][u]) <= tout
            if p >= 0:
                p += int(node_off[r])
                assert int(batch["tree_node_tin"][p]) < tin <= tout
                assert tout <= int(batch["tree_node_tout"][p])
    # Weights: each prediction trained by as many of the batch's sequences as list it.
    counts = np.bincount(batch["tree_target_pred"].numpy(), minlength=len(batch["tree_pred_pos"]))
    assert counts.tolist() == batch["tree_pred_weight"].tolist()


groups_st = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=6),
        st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=5),
    ),
    min_size=1,
    max_size=6,
)


@seed(41)
@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    groups=groups_st,
    cap=st.integers(12, 30),
    multiple=st.sampled_from([1, 2, 4]),
    pick=st.randoms(use_true_random=False),
)
def test_any_rows_in_any_order_collate_to_exact_paths(groups, cap, multiple, pick):
    seqs, flags, group = [], [], []
    for g, (prompt, outs) in enumerate(groups):
        for out in outs:
            seqs.append(prompt + out)
            flags.append([j >= len(prompt) for j in range(len(prompt) + len(out))])
            group.append(g)
    cap = max(cap, max(map(len, seqs)))
    batch = pack_trees(seqs, loss_mask=flags, groups=group, max_tokens=cap)
    rows = rows_of(batch)
    chosen = pick.sample(rows, pick.randint(1, len(rows)))
    got = PackedTreeCollator(pad_to_multiple_of=multiple)(chosen)
    assert got["input_ids"].shape[1] % multiple == 0
    held = sorted(int(i) for r in chosen for i in r["sample_ids"])
    assert got["tree_seq_index"].tolist() == held
    check_batch(got, seqs, flags)


def test_damaged_or_flat_rows_are_refused_naming_row_and_column():
    batch = pack_trees([[1, 2, 3, 4], [1, 2, 5], [7, 8, 9]], max_tokens=4)
    rows = rows_of(batch)
    collator = PackedTreeCollator()
    bad = [dict(r) for r in rows]
    bad[1]["tree_node"] = bad[1]["tree_node"] + 5
    with pytest.raises(DataError, match=r"row 1: column 'tree_node' holds"):
        collator(bad)
    bad = [dict(r) for r in rows]
    bad[0]["tree_node_tin"] = bad[0]["tree_node_tin"][:-1]
    with pytest.raises(DataError, match=r"row 0: column 'tree_node_tin'"):
        collator(bad)
    bad = [dict(r) for r in rows]
    bad[0]["seq_loss_tokens"] = bad[0]["seq_loss_tokens"] + 1
    with pytest.raises(DataError, match=r"row 0: column 'tree_target_pred'"):
        collator(bad)
    flat = {"input_ids": np.arange(4), "seq_lengths": np.array([4]), "sample_ids": np.array([0])}
    with pytest.raises(DataError, match="no column 'tree_node'.*PackedCollator"):
        collator([flat])
    with pytest.raises(DataError, match="empty"):
        collator([])


def test_flat_collators_and_model_inputs_refuse_tree_rows():
    batch = pack_trees([[1, 2, 3, 4], [1, 2, 5]], max_tokens=8)
    rows = rows_of(batch)
    for collator in (
        PackedCollator(),
        PackedCollator("padded"),
        PackedCollator("flash"),
        PackedCollator(return_pairs=True),
        PackedCollator("per_sample"),
        PackedCollator(static=StaticShapes(2, 16, 4)),
    ):
        with pytest.raises(PackingError, match="PackedTreeCollator"):
            collator(rows)
    with pytest.raises(PackingError, match=r"tokpack\.tree\.model_inputs"):
        flat_model_inputs(batch)


def test_the_multimodal_collator_refuses_tree_rows():
    pytest.importorskip("transformers")
    from tokpack.torch import MultimodalCollator

    from ._vl_factory import image_processor

    rows = rows_of(pack_trees([[1, 2, 3, 4], [1, 2, 5]], max_tokens=8))
    with pytest.raises(PackingError, match="PackedTreeCollator"):
        MultimodalCollator(image_processor())(rows)


def test_the_collator_pickles_and_checks_its_options():
    c = pickle.loads(pickle.dumps(PackedTreeCollator(pad_to_multiple_of=8, pad_token_id=3)))
    assert (c.pad_to_multiple_of, c.pad_token_id) == (8, 3)
    from tokpack import ConfigError

    with pytest.raises(ConfigError, match="pad_to_multiple_of"):
        PackedTreeCollator(pad_to_multiple_of=0)
