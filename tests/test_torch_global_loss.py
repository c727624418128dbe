"""Exact global loss normalisation: ``global_num_loss_tokens`` / ``global_num_samples`` of every
batch, for the single-directory stream and the mixture, with and without context parallelism.

World size ``W`` data-parallel ranks (each with ``C`` context-parallel ranks) and ``G``
gradient-accumulation steps are simulated in one process in float64: every rank-step's loss is
scaled as the README says, backpropagated, accumulated over the steps and averaged over the
ranks as DDP does; the result must equal the loss and gradient of the whole global batch
computed at once, within 1e-12.
"""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tokpack
from tokpack.torch import (
    PackedBatchSampler,
    PackedCollator,
    PackedDataset,
    PackedIterableDataset,
    PackedMixture,
)

from .packed_corpus import random_samples, write_packed_dir

VOCAB = 1000


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("global_loss")
    out = {}
    # random_samples masks a random prompt, sometimes empty: some samples' first label is
    # trained (the collator masks it, the index counts it), some samples have no loss term.
    for seed, (name, labelled, n) in enumerate((("sft", True, 240), ("text", False, 100))):
        samples, labels = random_samples(n, 24, seed=seed + 11)
        write_packed_dir(
            root / name,
            samples,
            labels if labelled else None,
            max_len=40,
            rows_per_shard=30,
            row_group_rows=4,
        )
        out[name] = str(root / name)
    return out


def _params():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(VOCAB, 6, generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.randn(6, VOCAB, generator=g, dtype=torch.float64, requires_grad=True)
    return emb, head


def _token_loss(batch, params):
    """Per-token cross-entropy of a token-local model, its targets' weights and trained mask,
    aligned with the targets (``shift_labels`` for a CP slice, else labels shifted by one)."""
    emb, head = params
    logits = (emb[batch["input_ids"]] @ head).log_softmax(-1)
    if "shift_labels" in batch:
        target, weights = batch["shift_labels"], batch["loss_weights"]
    else:
        logits, target, weights = logits[:-1], batch["labels"][1:], batch["loss_weights"][1:]
    trained = target != -100
    ce = -logits.gather(1, target.clamp(min=0)[:, None])[:, 0]
    # loss_weights are float32 1/n_s: recover n_s exactly for a float64 comparison.
    w = weights.to(torch.float64)
    w = torch.where(w > 0, 1 / torch.round(1 / w.clamp(min=1e-30)), torch.zeros_like(w))
    return torch.where(trained, ce, torch.zeros_like(ce)), w, trained


def _rows(batch):
    return [
        {k: batch[k][i] for k in batch if isinstance(batch[k], list)}
        for i in range(len(batch["input_ids"]))
    ]


def _reference(rows, params):
    """Token mean and mean of per-sample means of the whole global batch, computed directly."""
    batch = PackedCollator("flash")(rows)
    emb, head = params
    logits = (emb[batch["input_ids"]] @ head).log_softmax(-1)
    labels = batch["labels"]
    cu = batch["cu_seqlens"].tolist()
    token_sum, terms, sample_means = 0.0, 0, []
    for a, b in zip(cu[:-1], cu[1:]):
        # Loss terms of one sample: token t predicts label t + 1, both inside the sample.
        t = torch.arange(a, b - 1)
        keep = labels[t + 1] != -100
        ce = -logits[t[keep], labels[t + 1][keep]]
        token_sum = token_sum + ce.sum()
        terms += int(keep.sum())
        sample_means.append(ce.mean() if keep.any() else torch.zeros((), dtype=torch.float64))
    return token_sum / terms, torch.stack(sample_means).mean(), terms, len(sample_means)


def _dataset(kind, corpora, **kw):
    if kind == "single":
        return PackedIterableDataset(corpora["sft"], batch_rows=2, seed=3, **kw)
    return PackedMixture(corpora, {"sft": 0.6, "text": 0.4}, batch_rows=2, seed=3, **kw)


@pytest.mark.parametrize("balance", [None, "compute"])
@pytest.mark.parametrize("kind", ["single", "mixture"])
@pytest.mark.parametrize("world_size, grad_accum, cp", [(1, 1, 1), (3, 2, 1), (2, 3, 2), (2, 2, 4)])
def test_global_normalisers_give_the_global_batch_loss(
    corpora, kind, world_size, grad_accum, cp, balance
):
    per_rank = []
    for rank in range(world_size):
        ds = _dataset(
            kind,
            corpora,
            rank=rank,
            world_size=world_size,
            grad_accum_steps=grad_accum,
            balance=balance,
        )
        per_rank.append([(_rows(b), _counts(b)) for b in ds])
    _check_steps(per_rank, world_size, grad_accum, cp)


def _rank_samplers(ds, world_size, grad_accum, drop_last, balance, *, seed, epoch):
    """Every rank's PackedBatchSampler (two rows per batch) of one run, set to ``epoch``."""
    samplers = []
    for rank in range(world_size):
        bs = PackedBatchSampler(
            ds,
            2,
            grad_accum_steps=grad_accum,
            rank=rank,
            world_size=world_size,
            seed=seed,
            drop_last=drop_last,
            balance=balance,
        )
        bs.set_epoch(epoch)
        samplers.append(bs)
    return samplers


@pytest.mark.parametrize("balance", [None, "compute"])
@pytest.mark.parametrize(
    "world_size, grad_accum, cp, drop_last",
    [(1, 1, 1, False), (3, 2, 1, False), (2, 3, 2, True), (2, 2, 4, False)],
)
def test_map_style_batch_sampler_gives_the_global_batch_loss(
    corpora, world_size, grad_accum, cp, drop_last, balance
):
    ds = PackedDataset(corpora["sft"])
    per_rank = []
    for bs in _rank_samplers(ds, world_size, grad_accum, drop_last, balance, seed=5, epoch=1):
        batches = list(bs)
        assert len(batches) == len(bs)
        per_rank.append([(ds.__getitems__(b), b.step_counts) for b in batches])
    _check_steps(per_rank, world_size, grad_accum, cp)


def _counts(batch):
    return batch["global_num_loss_tokens"], batch["global_num_samples"]


def _check_steps(per_rank, world_size, grad_accum, cp):
    """``per_rank``: each rank's batches as (rows, step counts). Every step's counts are those of
    the collator over the whole global batch, and the DDP-scaled losses give its loss."""
    n_batches = len(per_rank[0])
    assert all(len(b) == n_batches for b in per_rank)
    params = _params()
    averaged = world_size * cp  # the ranks DDP averages gradients over (data x context parallel)
    n_steps = -(-n_batches // grad_accum)
    assert n_steps >= 3
    # Counts are checked for every step; the losses for the first two and the last, partial one.
    for m in range(n_steps):
        step = [b[m * grad_accum : (m + 1) * grad_accum] for b in per_rank]
        fields = {counts for bs in step for _, counts in bs}
        assert len(fields) == 1  # every rank and micro-step of the step knows the same counts
        n_tokens, n_samples = fields.pop()
        rows = [row for bs in step for b, _ in bs for row in b]
        whole = PackedCollator("flash")(rows)
        assert (n_tokens, n_samples) == (whole["num_loss_tokens"], whole["num_seqs"])
        if 1 < m < n_steps - 1:
            continue
        ref_token, ref_sample, terms, samples = _reference(rows, params)
        assert (n_tokens, n_samples) == (terms, samples)
        # DDP: each rank accumulates its micro-steps' gradients, then the ranks are averaged.
        for convention, reference in (("token", ref_token), ("sample", ref_sample)):
            grads = [torch.zeros_like(p) for p in params]
            total = 0.0
            for bs in step:
                for c in range(cp):
                    for b, _ in bs:
                        collate = PackedCollator(
                            "flash", return_loss_weights=True, cp_size=cp, cp_rank=c
                        )
                        ce, weights, _ = _token_loss(collate(b), params)
                        if convention == "token":
                            loss = ce.sum() / n_tokens * averaged
                        else:
                            loss = (ce * weights).sum() / n_samples * averaged
                        for acc, g in zip(grads, torch.autograd.grad(loss, params)):
                            acc += g
                        total += float(loss.detach())
            want = torch.autograd.grad(reference, params, retain_graph=True)
            assert abs(total / averaged - float(reference.detach())) < 1e-12
            for acc, w in zip(grads, want):
                assert torch.allclose(acc / averaged, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sampler_counts_reach_the_collated_batches(corpora, num_workers):
    """Through a DataLoader (workers too) with PackedCollator; a custom sampler factory giving
    the ranks uneven rows: a step counts what every rank has for it."""
    ds = PackedDataset(corpora["sft"])
    world_size, grad_accum = 3, 2

    def strided(rank):
        return range(rank, len(ds) // (2 if rank == 2 else 1), world_size)  # rank 2: fewer

    samplers = [
        PackedBatchSampler(
            ds, 3, grad_accum_steps=grad_accum, sampler=strided, rank=r, world_size=world_size
        )
        for r in range(world_size)
    ]
    batches = [list(s) for s in samplers]
    assert len(batches[2]) < len(batches[0])
    for m in range(-(-len(batches[0]) // grad_accum)):
        rows = [
            ds[i] for bs in batches for b in bs[m * grad_accum : (m + 1) * grad_accum] for i in b
        ]
        whole = PackedCollator()(rows)
        for bs in batches:
            for b in bs[m * grad_accum : (m + 1) * grad_accum]:
                assert b.step_counts == (whole["num_loss_tokens"], whole["num_seqs"])
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=samplers[1], collate_fn=PackedCollator("padded"), num_workers=num_workers
    )
    got = [_counts(b) for b in loader]
    assert got == [b.step_counts for b in batches[1]]
    plain = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=PackedCollator())
    assert "global_num_loss_tokens" not in next(iter(plain))


def test_batch_sampler_refuses_rows_out_of_range(corpora):
    ds = PackedDataset(corpora["sft"])
    bs = PackedBatchSampler(ds, 2, sampler=lambda r: [0, len(ds)], rank=0, world_size=1)
    with pytest.raises(tokpack.ConfigError, match=f"gave row {len(ds)} of a packed directory"):
        list(bs)


def test_counts_match_the_collated_batches_and_need_grad_accum(corpora):
    ds = PackedIterableDataset(
        corpora["text"], batch_rows=3, seed=1, grad_accum_steps=1, collate_fn=PackedCollator()
    )
    for batch in ds:
        assert batch["global_num_loss_tokens"] == batch["num_loss_tokens"]
        assert batch["global_num_samples"] == batch["num_seqs"]
    plain = PackedIterableDataset(corpora["text"], batch_rows=3, collate_fn=PackedCollator())
    assert "global_num_loss_tokens" not in next(iter(plain))


def test_counts_after_resume_with_another_world_size(corpora):
    state = _dataset("single", corpora, rank=0, world_size=2).state_dict(batches_consumed=3)
    ranks = []
    for rank in range(3):
        ds = _dataset("single", corpora, rank=rank, world_size=3, grad_accum_steps=2)
        ds.load_state_dict(state)
        ranks.append(list(ds))
    for m in range(0, len(ranks[0]), 2):
        step = [b for bs in ranks for b in bs[m : m + 2]]
        rows = [row for b in step for row in _rows(b)]
        batch = PackedCollator()(rows)
        assert {b["global_num_loss_tokens"] for b in step} == {batch["num_loss_tokens"]}
        assert {b["global_num_samples"] for b in step} == {batch["num_seqs"]}
    assert np.sum([len(bs) for bs in ranks]) > 0


@pytest.mark.parametrize("world_size, grad_accum, drop_last", [(3, 2, False), (4, 1, True)])
def test_balanced_steps_hold_the_same_rows_with_even_compute(
    corpora, world_size, grad_accum, drop_last
):
    """balance="compute" re-deals each step's rows: the same rows as often, the same batch
    sizes and counts, a per-step imbalance never above the plain sampler's (and lower in all)."""
    ds = PackedDataset(corpora["sft"])

    def ranks(balance):
        samplers = _rank_samplers(ds, world_size, grad_accum, drop_last, balance, seed=7, epoch=2)
        return [list(bs) for bs in samplers], samplers[-1].step_imbalance()

    (plain, plain_imb), (even, even_imb) = ranks(None), ranks("compute")
    assert [[len(b) for b in r] for r in even] == [[len(b) for b in r] for r in plain]
    for m in range(0, len(plain[0]), grad_accum):
        rows = [
            sorted(i for r in x for b in r[m : m + grad_accum] for i in b) for x in (plain, even)
        ]
        assert rows[0] == rows[1]
        counts = {b.step_counts for x in (plain, even) for r in x for b in r[m : m + grad_accum]}
        assert len(counts) == 1
    assert np.all(even_imb <= plain_imb + 1e-12)
    assert even_imb.mean() < plain_imb.mean()


def test_balance_option_is_checked(corpora):
    with pytest.raises(tokpack.ConfigError, match='balance must be None or "compute"'):
        PackedBatchSampler(PackedDataset(corpora["sft"]), 2, balance="tokens", world_size=1, rank=0)


def _same_steps_as_plain(ds, grad_accum, **kw):
    """Every rank's balanced batches against the plain sampler's: the same batch sizes, each
    step the same rows (as often) and counts, a per-step imbalance never above the plain one."""

    def run(balance):
        samplers = [
            PackedBatchSampler(ds, grad_accum_steps=grad_accum, rank=r, balance=balance, **kw)
            for r in range(kw["world_size"])
        ]
        return [list(bs) for bs in samplers], samplers[0].step_imbalance()

    (plain, plain_imb), (even, even_imb) = run(None), run("compute")
    assert [[len(b) for b in r] for r in even] == [[len(b) for b in r] for r in plain]
    for m in range(0, max(len(r) for r in plain), grad_accum):
        steps = [[b for r in x for b in r[m : m + grad_accum]] for x in (plain, even)]
        assert sorted(i for b in steps[0] for i in b) == sorted(i for b in steps[1] for i in b)
        counts = {b.step_counts for step in steps for b in step}
        assert len(counts) == 1
    assert np.all(even_imb <= plain_imb + 1e-12)


@pytest.mark.parametrize("batch_rows", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_balanced_sampler_keeps_a_short_last_step_as_the_plain_one(corpora, batch_rows, drop_last):
    """Every (world_size, grad_accum_steps) of 1..4 x 1..5 with DistributedSampler: a last step
    with fewer rows per rank than grad_accum_steps (or batches of fewer rows) failed before
    ("cannot split 2 items into 3 non-empty parts"); now its whole batches are dealt, its short
    batch keeps its rows, as PackedIterableDataset's tail."""
    ds = PackedDataset(corpora["sft"])
    short = 0
    for world_size in range(1, 5):
        for grad_accum in range(1, 6):
            per_rank = -(-len(ds) // world_size)
            if drop_last:
                per_rank -= per_rank % batch_rows
            short += 0 < per_rank % (grad_accum * batch_rows) < grad_accum
            _same_steps_as_plain(
                ds, grad_accum, world_size=world_size, batch_rows=batch_rows, drop_last=drop_last
            )
    assert short  # the sweep holds the case of the issue


@given(
    world_size=st.integers(1, 4),
    grad_accum=st.integers(1, 5),
    batch_rows=st.integers(1, 4),
    counts=st.lists(st.integers(0, 40), min_size=4, max_size=4),
    equal=st.booleans(),
)
def test_balanced_sampler_holds_the_plain_steps_for_any_rows_per_rank(
    corpora, world_size, grad_accum, batch_rows, counts, equal
):
    """Ranks of any row counts (equal: the last step short on every rank; unequal: a custom
    sampler giving some ranks fewer rows, so some lack the step's later batches)."""
    ds = PackedDataset(corpora["sft"])
    counts = [counts[0]] * world_size if equal else counts[:world_size]

    def sampler(rank):
        return [(rank * 41 + 7 * k) % len(ds) for k in range(counts[rank])]

    kw = dict(world_size=world_size, batch_rows=batch_rows, sampler=sampler)
    _same_steps_as_plain(ds, grad_accum, **kw)
