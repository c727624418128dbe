"""tokpack.tree's layout: each sequence's path is exactly its tokens at positions 0..n, the
intervals nest, every sequence is packed once; the caps, the step's balance and its map back
to rollout order."""

import numpy as np
import pytest
import torch
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from tokpack import ConfigError, DataError, OverlongError
from tokpack.tree import attention_pairs, block_mask, dense_mask, pack_step, pack_trees


def path_of(batch, i):
    """Sequence ``i``'s (row, packed indices) from its end node up the parents."""
    row = int(batch["tree_seq_row"][i])
    base = int(batch["tree_node_offsets"][row])
    u = int(batch["tree_seq_end_node"][i])
    nodes = []
    while u >= 0:
        nodes.append(base + u)
        u = int(batch["tree_node_parent"][base + u])
    idx = []
    for n in reversed(nodes):
        tin, length = int(batch["tree_node_tin"][n]), int(batch["tree_node_len"][n])
        idx += range(tin, tin + length)
    return row, idx


def check_layout(batch, seqs, max_tokens):
    assert batch["tree_seq_index"].tolist() == list(range(len(seqs)))
    ids, pos, tout = batch["input_ids"], batch["position_ids"], batch["tree_tout"]
    real = batch["tree_node"] >= 0
    assert int(real.sum(1).max()) <= max_tokens
    mask = dense_mask(batch)[:, 0]
    for i, s in enumerate(seqs):
        row, idx = path_of(batch, i)
        assert ids[row, idx].tolist() == list(s)
        assert pos[row, idx].tolist() == list(range(len(s)))
        # The path's tokens see exactly their path before them.
        sub = mask[row][idx][:, idx]
        assert torch.equal(sub, torch.tril(torch.ones(len(s), len(s), dtype=torch.bool)))
        assert int(mask[row, idx[-1]].sum()) == len(s)
    offsets = batch["tree_node_offsets"]
    for r in range(ids.shape[0]):
        for u in range(int(offsets[r]), int(offsets[r + 1])):
            p = int(batch["tree_node_parent"][u])
            tin, t_out = int(batch["tree_node_tin"][u]), int(batch["tree_node_tout"][u])
            if p >= 0:
                p += int(offsets[r])
                assert (
                    int(batch["tree_node_tin"][p]) < tin <= t_out <= int(batch["tree_node_tout"][p])
                )
                assert int(batch["tree_node_depth"][u]) == int(batch["tree_node_depth"][p]) + int(
                    batch["tree_node_len"][p]
                )
    assert attention_pairs(batch) == int((mask & real[:, :, None]).sum())
    assert int(tout[real].max()) <= ids.shape[1]


token_lists = st.lists(
    st.lists(st.integers(0, 3), min_size=1, max_size=10), min_size=1, max_size=20
)


@seed(37)
@settings(max_examples=60, deadline=None)
@given(seqs=token_lists, cap_extra=st.integers(0, 12), min_shared=st.integers(1, 3))
def test_layout_invariants(seqs, cap_extra, min_shared):
    cap = 10 + cap_extra
    batch = pack_trees(seqs, max_tokens=cap, min_shared=min_shared)
    check_layout(batch, seqs, cap)
    stats = batch["tree_stats"]
    assert stats.sequences == len(seqs) and stats.flat_tokens == sum(map(len, seqs))
    assert stats.unique_tokens <= stats.forward_tokens <= stats.flat_tokens


@seed(38)
@settings(max_examples=30, deadline=None)
@given(seqs=token_lists)
def test_the_tree_loss_weights_count_each_sequence(seqs):
    """Predictions are distinct, and their weights sum to every sequence's trained targets."""
    batch = pack_trees(seqs, max_tokens=16)
    keys = set(
        zip(
            batch["tree_pred_row"].tolist(),
            batch["tree_pred_pos"].tolist(),
            batch["tree_pred_token"].tolist(),
        )
    )
    assert len(keys) == len(batch["tree_pred_pos"])
    assert int(batch["tree_pred_weight"].sum()) == sum(len(s) - 1 for s in seqs)
    assert batch["tree_completion_lengths"].tolist() == [len(s) - 1 for s in seqs]


def test_inputs_as_padded_tensors_match_lists():
    seqs = [[5, 6, 7, 8], [5, 6, 9], [1, 2]]
    padded = torch.zeros(3, 4, dtype=torch.int64)
    mask = torch.zeros(3, 4, dtype=torch.int64)
    for i, s in enumerate(seqs):
        padded[i, 4 - len(s) :] = torch.tensor(s)  # left-padded, as verl's prompts
        mask[i, 4 - len(s) :] = 1
    a = pack_trees(seqs, max_tokens=16)
    b = pack_trees(padded, mask=mask, max_tokens=16)
    c = pack_trees(padded[:, :], lengths=[4, 3, 2], max_tokens=16)
    for k in ("input_ids", "position_ids", "tree_tout", "tree_pred_pos"):
        assert torch.equal(a[k], b[k]), k
    assert c["tree_stats"].flat_tokens == 9  # lengths read from the left: other tokens


def test_the_same_inputs_give_the_same_batch():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 4, int(rng.integers(1, 30))).tolist() for _ in range(300)]
    a = pack_trees(seqs, max_tokens=64, threads=1)
    b = pack_trees(seqs, max_tokens=64, threads=2)
    assert a.keys() == b.keys()
    for k in a:
        if k != "tree_stats":
            assert torch.equal(a[k], b[k]), k
    assert a["tree_stats"] == b["tree_stats"]


def test_caps_and_inputs_are_checked():
    with pytest.raises(OverlongError, match="sequence 1 has 5 tokens, more than max_tokens=4"):
        pack_trees([[1, 2], [1, 2, 3, 4, 5]], max_tokens=4)
    with pytest.raises(OverlongError, match="max_path=3"):
        pack_trees([[1, 2, 3, 4]], max_tokens=8, max_path=3)
    with pytest.raises(ConfigError, match="pad_to_multiple_of"):
        pack_trees([[1, 2]], max_tokens=10, pad_to_multiple_of=4)
    with pytest.raises(DataError, match="empty"):
        pack_trees([[1, 2], []], max_tokens=8)
    with pytest.raises(DataError, match=r"labels\[1\]"):
        pack_trees([[1, 2], [3, 4]], [[1, 2], [3]], max_tokens=8)
    with pytest.raises(DataError, match="one run of ones"):
        pack_trees(torch.ones(1, 3, dtype=torch.int64), mask=[[1, 0, 1]], max_tokens=8)


def test_a_step_balances_ranks_and_maps_back_to_rollouts():
    rng = np.random.default_rng(5)
    prompts, completions = [], []
    for _ in range(16):
        p = rng.integers(0, 50, int(rng.integers(20, 40))).tolist()
        for _ in range(4):
            prompts.append(p)
            completions.append(rng.integers(0, 50, int(rng.integers(1, 12))).tolist())
    steps = [pack_step(prompts, completions, max_tokens=128, world_size=2, rank=r) for r in (0, 1)]
    # Both ranks compute the same plan; together they hold every rollout once.
    assert steps[0].stats == steps[1].stats
    held = np.concatenate([np.concatenate(s.rollout_index) for s in steps])
    assert sorted(held.tolist()) == list(range(64))
    stats = steps[0].stats
    assert stats.trees == 16 and stats.sequences == 64
    assert stats.forward_tokens < stats.flat_tokens
    assert steps[0].imbalance < 1.2
    # Per-micro-batch results come back in rollout order.
    step = steps[0]
    values = [b["tree_seq_index"].to(torch.float64) * 10 for b in step.micro_batches]
    index, got = step.gather(values)
    assert torch.equal(got, index.to(torch.float64) * 10)
    assert index.tolist() == sorted(index.tolist())
    for batch in step.micro_batches:
        for row, i in enumerate(batch["tree_seq_index"].tolist()):
            r, idx = path_of(batch, row)
            assert batch["input_ids"][r, idx].tolist() == prompts[i] + completions[i]
        assert batch["input_ids"].shape[0] == 1


def test_a_step_takes_padded_tensors_with_masks_and_a_loss_mask():
    prompts = torch.tensor([[0, 7, 8, 9], [0, 7, 8, 9], [4, 5, 6, 3]])
    prompt_mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]])
    completions = torch.tensor([[1, 2, 0], [1, 3, 3], [2, 0, 0]])
    lengths = torch.tensor([2, 3, 1])
    loss_mask = torch.tensor([[1, 1, 0], [1, 0, 1], [1, 0, 0]])
    step = pack_step(
        prompts,
        completions,
        prompt_mask=prompt_mask,
        completion_lengths=lengths,
        loss_mask=loss_mask,
        max_tokens=32,
    )
    assert step.stats.trees == 2
    # Rollouts 0 and 1 share [7 8 9 1]: 4 + 1 + 2 tokens; rollout 2 on its own: 5.
    assert step.stats.unique_tokens == 12 and step.stats.flat_tokens == 5 + 6 + 5
    (batch,) = step.micro_batches
    assert batch["tree_completion_lengths"].tolist() == [2, 2, 1]


def test_completions_listed_per_prompt():
    step = pack_step([[1, 2, 3]], [[4], [5], [6, 7]], max_tokens=16)
    assert step.stats.flat_tokens == 4 + 4 + 5 and step.stats.forward_tokens == 3 + 4
    with pytest.raises(DataError, match="3 completions for 2 prompts"):
        pack_step([[1], [2]], [[4], [5], [6]], max_tokens=16)


def test_the_block_mask_attends_as_the_dense_mask():
    from torch.nn.attention.flex_attention import flex_attention

    batch = pack_trees([[1, 2, 3, 4, 5], [1, 2, 3, 6], [9, 8]], max_tokens=16)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 8, dtype=torch.float64, generator=gen) for _ in range(3))
    flex = flex_attention(q, k, v, block_mask=block_mask(batch, block_size=4))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(batch))
    torch.testing.assert_close(flex, sdpa, rtol=1e-12, atol=1e-14)


def test_a_step_carries_per_rollout_values_in_each_batch_order():
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, 50, int(rng.integers(5, 30))).tolist() for _ in range(12)]
    completions = [rng.integers(0, 50, int(rng.integers(1, 9))).tolist() for _ in range(48)]
    rewards = rng.normal(size=48)
    advantages = torch.from_numpy(rng.normal(size=48)).to(torch.float32)
    old_logps = torch.from_numpy(rng.normal(size=(48, 8)))
    extras = {"rewards": rewards, "advantages": advantages, "old_logps": old_logps}
    held = []
    for rank in (0, 1):
        step = pack_step(
            prompts, completions, max_tokens=64, world_size=2, rank=rank, extras=extras
        )
        assert len(step.micro_batches) > 1
        for batch in step.micro_batches:
            index = batch["tree_seq_index"]
            assert torch.equal(batch["rewards"], torch.from_numpy(rewards)[index])
            assert batch["advantages"].dtype == torch.float32
            assert torch.equal(batch["advantages"], advantages[index])
            assert torch.equal(batch["old_logps"], old_logps[index])
            held += index.tolist()
    assert sorted(held) == list(range(48))
    with pytest.raises(DataError, match="one entry per rollout"):
        pack_step(prompts, completions, max_tokens=64, extras={"rewards": rewards[:5]})
    for name in ("input_ids", "tree_seq_row", 3):
        with pytest.raises(ConfigError, match="not a tree batch's key"):
            pack_step(prompts, completions, max_tokens=64, extras={name: rewards})
