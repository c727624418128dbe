"""tokpack.balance: balanced partitions and token-capped micro-batches (properties under the
derandomized hypothesis profile of conftest.py), verl's contract, and the errors."""

import heapq
import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokpack
from tokpack._contract import MICRO_BATCH_ORDERS, OVER_CAP_POLICIES, PARTITION_METHODS
from tokpack.balance import cost_coefficients, micro_batches, partition
from tokpack.balance.compat import verl as tv

costs_lists = st.lists(st.integers(0, 10_000), min_size=1, max_size=300)


def _lpt_max(costs, k):
    """The textbook LPT's largest part: the quality floor every method must reach."""
    heap = [(0, p) for p in range(k)]
    for c in sorted(costs, reverse=True):
        s, p = heapq.heappop(heap)
        heapq.heappush(heap, (s + c, p))
    return max(s for s, _ in heap)


def _sums(costs, parts):
    costs = np.asarray(costs, dtype=np.float64)
    return [costs[p].sum() for p in parts]


def test_names_come_from_the_core():
    assert PARTITION_METHODS == ("best", "kk", "lpt")
    assert MICRO_BATCH_ORDERS == ("descending", "pp", "input")
    assert OVER_CAP_POLICIES == ("error", "alone")
    assert cost_coefficients("attention") == (24576.0, 1.0)


@given(costs_lists, st.integers(1, 40), st.booleans(), st.sampled_from(PARTITION_METHODS))
def test_partition_properties(costs, k, equal_size, method):
    k = min(k, len(costs))
    parts = partition(costs, k, equal_size=equal_size, method=method)
    assert len(parts) == k
    assert all(len(p) > 0 and np.all(np.diff(p) > 0) for p in parts)
    assert sorted(itertools.chain.from_iterable(p.tolist() for p in parts)) == list(
        range(len(costs))
    )
    if equal_size:
        counts = [len(p) for p in parts]
        assert max(counts) - min(counts) <= 1
    sums = _sums(costs, parts)
    assert sums == sorted(sums, reverse=True)
    if method == "best":
        assert sums[0] <= _lpt_max(costs, k) or equal_size
        kk = partition(costs, k, equal_size=equal_size, method="kk")
        lpt = partition(costs, k, equal_size=equal_size, method="lpt")
        assert sums[0] <= min(max(_sums(costs, kk)), max(_sums(costs, lpt)))


@given(costs_lists, st.integers(1, 40), st.booleans())
def test_partition_is_deterministic_across_thread_counts(costs, k, equal_size):
    k = min(k, len(costs))
    one = partition(costs, k, equal_size=equal_size, threads=1)
    two = partition(costs, k, equal_size=equal_size, threads=2)
    assert [p.tolist() for p in one] == [p.tolist() for p in two]


def test_best_beats_karmarkar_karp_on_a_classic_case():
    costs = [8, 7, 6, 5, 4]
    assert max(_sums(costs, partition(costs, 2, method="kk"))) == 16
    assert max(_sums(costs, partition(costs, 2))) == 15


@given(
    st.lists(st.integers(0, 4096), min_size=1, max_size=300),
    st.integers(1, 8),
    st.sampled_from([4096, 6000, 10_000]),
    st.booleans(),
    st.sampled_from([None, 2, 3]),
    st.sampled_from([None, 1, 4]),
    st.sampled_from(MICRO_BATCH_ORDERS),
)
def test_micro_batches_properties(lengths, dp, cap, same, divisible, minimum, order):
    try:
        plan = micro_batches(
            lengths,
            cap,
            dp_size=dp,
            same_count_across_dp=same,
            divisible_by=divisible,
            min_micro_batches=minimum,
            order=order,
        )
    except tokpack.ConfigError as exc:
        # Only when there are too few samples to fill the micro-batches the options ask for.
        assert "cannot fill" in str(exc)
        assert len(lengths) < dp * max(minimum or 1, divisible or 1, -(-sum(lengths) // cap // dp))
        return
    lengths = np.asarray(lengths)
    flat = [mb for rank in plan.ranks for mb in rank]
    assert all(len(mb) > 0 and np.all(np.diff(mb) > 0) for mb in flat)
    assert sorted(np.concatenate(flat).tolist()) == list(range(len(lengths)))
    assert all(lengths[mb].sum() <= cap for mb in flat)
    assert [t.tolist() for t in plan.tokens] == [
        [lengths[mb].sum() for mb in r] for r in plan.ranks
    ]
    counts = plan.num_micro_batches
    assert sum(counts) >= -(-lengths.sum() // cap)
    assert min(counts) >= (minimum or 1)
    if same or divisible:
        assert len(set(counts)) == 1
    else:
        assert max(counts) - min(counts) <= 1
    if divisible:
        assert all(c % divisible == 0 for c in counts)
    a, b = cost_coefficients("attention")
    expected = [
        sum(a * lengths[mb].sum() + b * (lengths[mb] ** 2).sum() for mb in r) for r in plan.ranks
    ]
    np.testing.assert_allclose(plan.rank_compute, expected)
    again = micro_batches(
        lengths,
        cap,
        dp_size=dp,
        same_count_across_dp=same,
        divisible_by=divisible,
        min_micro_batches=minimum,
        order=order,
    )
    assert [[m.tolist() for m in r] for r in again.ranks] == [
        [m.tolist() for m in r] for r in plan.ranks
    ]


def test_pp_order_puts_light_micro_batches_at_both_ends():
    plan = micro_batches([10, 8, 6, 4, 2], 10, cost="tokens", min_micro_batches=5, order="pp")
    assert plan.tokens[0].tolist() == [2, 6, 10, 8, 4]
    plan = micro_batches([10, 8, 6, 4, 2], 10, cost="tokens", min_micro_batches=5)
    assert plan.tokens[0].tolist() == [10, 8, 6, 4, 2]


def test_karmarkar_karp_overflows_the_cap_where_micro_batches_does_not():
    # Balancing attention workloads over ceil(tokens / cap) parts, as verl did before its retry
    # loop, overfills 26 of 76 parts; micro_batches needs one more micro-batch and fills none.
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(7, 1, 200), 1, 4096).astype(np.int64)
    cap = 4096
    k = -(-int(lengths.sum()) // cap)
    kk = partition(24576 * lengths + lengths**2, k, method="kk")
    assert sum(int(lengths[p].sum() > cap) for p in kk) == 26
    plan = micro_batches(lengths, cap)
    assert plan.num_micro_batches == [k + 1]
    assert max(int(t.max()) for t in plan.tokens) <= cap


def test_over_cap_samples_error_or_go_alone():
    with pytest.raises(tokpack.OverlongError, match=r"sample 1 has 12 tokens.*max_tokens=10"):
        micro_batches([3, 12, 4], 10)
    plan = micro_batches([3, 12, 4], 10, overlong="alone", cost="tokens")
    assert [m.tolist() for m in plan.ranks[0]] == [[1], [0, 2]]


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: partition([1, 2], 3), tokpack.ConfigError, "cannot split 2 items into 3"),
        (lambda: partition([1, -2], 1), tokpack.DataError, "cost 1 is -2"),
        (lambda: partition([1, float("nan")], 1), tokpack.DataError, "cost 1 is NaN"),
        (lambda: partition([1, 2], 0), tokpack.ConfigError, "k must be at least 1"),
        (lambda: partition([1, 2], 1, method="x"), tokpack.ConfigError, "unknown partition method"),
        (lambda: partition([[1, 2]], 1), tokpack.DataError, "one-dimensional"),
        (lambda: micro_batches([1, -1], 4), tokpack.DataError, "sample 1 has a negative length"),
        (lambda: micro_batches([1.5], 4), tokpack.DataError, "must be integers"),
        (lambda: micro_batches([1], 0), tokpack.ConfigError, "max_tokens must be at least 1"),
        (lambda: micro_batches([1], 4, cost="flops"), tokpack.ConfigError, "unknown cost"),
        (lambda: micro_batches([1], 4, cost=(1, -1)), tokpack.ConfigError, "non-negative"),
        (lambda: micro_batches([1], 4, order="x"), tokpack.ConfigError, "micro-batch order"),
        (lambda: micro_batches([1], 4, overlong="x"), tokpack.ConfigError, "over-cap policy"),
        (lambda: micro_batches([1, 1], 4, dp_size=3), tokpack.ConfigError, "cannot fill 3"),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@given(st.lists(st.integers(1, 4096), min_size=8, max_size=200), st.integers(1, 8), st.booleans())
def test_verl_drop_in_contract(seqlens, k, equal_size):
    parts = tv.get_seqlen_balanced_partitions(seqlens, k, equal_size)
    assert isinstance(parts, list) and len(parts) == k
    assert all(isinstance(p, list) and p and p == sorted(p) for p in parts)
    assert all(type(i) is int for p in parts for i in p)
    assert sorted(i for p in parts for i in p) == list(range(len(seqlens)))


def test_verl_drop_in_is_never_worse_than_verl():
    sb = pytest.importorskip("verl.utils.seqlen_balancing")
    rng = np.random.default_rng(0)
    for n, k in ((256, 8), (1024, 64)):
        seqlens = np.clip(rng.lognormal(7, 1, n), 16, 32_768).astype(int).tolist()
        for equal_size in (False, True):
            ours = tv.get_seqlen_balanced_partitions(seqlens, k, equal_size)
            theirs = sb.get_seqlen_balanced_partitions(seqlens, k, equal_size)
            assert max(_sums(seqlens, ours)) <= max(_sums(seqlens, theirs))


def test_rearrange_micro_batches_on_torch_tensors():
    torch = pytest.importorskip("torch")
    lengths = torch.tensor([30, 5, 20, 12, 7, 25, 3])
    mask = (torch.arange(32)[None, :] < lengths[:, None]).long()
    batch = {"attention_mask": mask, "input_ids": torch.arange(7 * 32).view(7, 32)}
    mbs, idx = tv.rearrange_micro_batches(batch, max_token_len=40)
    assert all(int(mb["attention_mask"].sum()) <= 40 for mb in mbs)
    flat = list(itertools.chain.from_iterable(idx))
    assert sorted(flat) == list(range(7))
    stacked = torch.cat([mb["input_ids"] for mb in mbs])
    assert torch.equal(stacked[tv.get_reverse_idx(flat)], batch["input_ids"])
    mbs2, idx2 = tv.rearrange_micro_batches(mask, 40)
    assert idx2 == idx and all(torch.equal(a, b["attention_mask"]) for a, b in zip(mbs2, mbs))
    _, idx3 = tv.rearrange_micro_batches(lengths, 40, num_batches_divided_by=4)
    assert len(idx3) % 4 == 0


def test_stats_report_compute_and_step_imbalance():
    from tokpack.stats.estimate import packing_stats
    from tokpack.synthetic import sft_lengths

    stats = packing_stats(sft_lengths(3000, seed=1), [2048, 8192], batch_size=32, world_size=4)
    low, high = stats.candidates
    # Splitting at 2,048 cuts long samples: less attention than at 8,192, per segment.
    assert 0 < low.compute < high.compute
    assert high.full_row_compute > high.compute
    for c in stats.candidates:
        plain, balanced = c.step_imbalance
        assert 1.0 <= balanced <= plain
    assert stats.as_dict()["candidates"][0]["step_imbalance"]["balanced"] == low.step_imbalance[1]
    with pytest.raises(tokpack.ConfigError, match="world_size must divide batch_size"):
        packing_stats([10, 20], [64], batch_size=6, world_size=4)
