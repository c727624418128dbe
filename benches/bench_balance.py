"""tokpack.balance against verl's own planner, measured in the same run (issue 21).

- partitions: ``verl.utils.seqlen_balancing.get_seqlen_balanced_partitions`` (Karmarkar-Karp in
  Python) against ``tokpack.balance.compat.verl.get_seqlen_balanced_partitions`` on lognormal
  RL-like lengths (median ~1.1k tokens, clipped to 16..32,768), their attention workloads
  ``24576·L + L²`` as the costs (what verl balances), n = 1k/16k/64k, k = 8/64/128, both
  ``equal_size``; time and max/mean of the parts' sums.
- micro-batches under a token cap: KK into ``ceil(tokens / max_tokens)`` parts (verl before its
  retry loop, and the copies in OpenRLHF and others) counts parts over the cap; verl 0.9's
  ``rearrange_micro_batches`` (retries with more parts until none is over) and
  ``tokpack.balance.micro_batches``: micro-batches, max/mean compute, time.
- packed SFT: per-step compute imbalance of ``PackedBatchSampler`` with and without
  ``balance="compute"`` on an SFT-like corpus.

Goals: >= 100x faster at 16k x 64, imbalance <= KK's, zero micro-batches over the cap.

verl 0.9.1 imports on CPU with two of its dependencies (the rest, GPU stack included, is not
needed to import ``verl.utils.seqlen_balancing``)::

    pip install --no-deps verl==0.9.1 && pip install tensordict omegaconf
    python benches/bench_balance.py [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import tempfile
import time

import numpy as np

from tokpack._io.tables import table
from tokpack.balance import micro_batches
from tokpack.balance.compat import verl as tv


def rl_lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(7.0, 1.0, n), 16, 32_768).astype(np.int64)


def workload(lengths: np.ndarray) -> np.ndarray:
    return 24576 * lengths + lengths**2


def timed(fn, repeat: int):
    best, out = math.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def max_over_mean(values, parts) -> float:
    sums = np.array([values[p].sum() for p in parts], dtype=np.float64)
    return float(sums.max() / sums.mean())


def partitions(sb, sizes, ks, repeat: int) -> str:
    rows = []
    for n in sizes:
        costs = workload(rl_lengths(n, seed=n))
        as_list = costs.tolist()
        for k in ks:
            for equal in (False, True):
                args = (as_list, k, equal)
                t_verl, p_verl = timed(lambda a=args: sb.get_seqlen_balanced_partitions(*a), 1)
                t_ours, p_ours = timed(lambda a=args: tv.get_seqlen_balanced_partitions(*a), repeat)
                rows.append(
                    [
                        f"{n:,}",
                        str(k),
                        str(equal),
                        f"{t_verl * 1e3:,.1f}",
                        f"{t_ours * 1e3:,.2f}",
                        f"{t_verl / t_ours:,.0f}x",
                        f"{max_over_mean(costs, p_verl):.6f}",
                        f"{max_over_mean(costs, p_ours):.6f}",
                    ]
                )
                print(rows[-1], flush=True)
    head = ["n", "k", "equal_size", "verl ms", "tokpack ms", "speed-up"]
    return table(head + ["verl max/mean", "tokpack max/mean"], rows)


def capped(sb, sizes, cap: int, repeat: int) -> str:
    import torch
    from tensordict import TensorDict

    rows = []
    for n in sizes:
        lengths = np.minimum(rl_lengths(n, seed=n + 1), cap)
        costs = workload(lengths)
        k = -(-int(lengths.sum()) // cap)
        kk = sb.get_seqlen_balanced_partitions(costs.tolist(), k, False)
        kk_over = sum(int(lengths[p].sum() > cap) for p in kk)
        width = int(lengths.max())
        mask = torch.arange(width)[None, :] < torch.from_numpy(lengths)[:, None]
        # verl reads input_ids only to see whether it is nested: a 1-wide stand-in.
        ids = torch.zeros(n, 1, dtype=torch.int8)
        batch = TensorDict({"attention_mask": mask, "input_ids": ids}, batch_size=[n])
        t_verl, (_, v_idx) = timed(lambda b=batch: sb.rearrange_micro_batches(b, cap), 1)
        t_ours, plan = timed(lambda x=lengths: micro_batches(x, cap), repeat)
        ours = plan.ranks[0]
        rows.append(
            [
                f"{n:,}",
                f"{k} / {kk_over} ({max_over_mean(costs, kk):.3f})",
                f"{len(v_idx)} / {sum(int(lengths[p].sum() > cap) for p in v_idx)}",
                f"{max_over_mean(costs, v_idx):.4f}",
                f"{t_verl * 1e3:,.1f}",
                f"{len(ours)} / {sum(int(lengths[p].sum() > cap) for p in ours)}",
                f"{plan.micro_batch_imbalance:.4f}",
                f"{t_ours * 1e3:,.2f}",
            ]
        )
        print(rows[-1], flush=True)
    head = ["n", "KK: parts / over cap (max/mean)", "verl 0.9: mbs / over", "max/mean", "ms"]
    return table(head + ["tokpack: mbs / over", "max/mean", "ms"], rows)


def packed_sft(n: int, world: int, batch_rows: int) -> str:
    import sys
    from pathlib import Path

    import torch  # noqa: F401 (the sampler needs it)

    # The test suite's corpus helper, from the repository this script is in (any cwd).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.packed_corpus import write_packed_dir
    from tokpack.synthetic import sft_lengths
    from tokpack.torch import PackedBatchSampler, PackedDataset

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lengths = sft_lengths(n, seed=3)
        rng = np.random.default_rng(3)
        samples = [rng.integers(0, 1000, int(length)).tolist() for length in lengths]
        write_packed_dir(os.path.join(tmp, "sft"), samples, None, max_len=8192)
        ds = PackedDataset(os.path.join(tmp, "sft"))
        for balance in (None, "compute"):
            sampler = PackedBatchSampler(
                ds, batch_rows, world_size=world, rank=0, balance=balance, seed=0
            )
            imb = sampler.step_imbalance()
            rows.append(
                [
                    str(balance),
                    f"{imb.mean():.4f}",
                    f"{np.percentile(imb, 90):.4f}",
                    f"{imb.max():.4f}",
                ]
            )
    return table(["balance", "mean max/mean", "p90", "max"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n up to 16k only")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import verl.utils.seqlen_balancing as sb

    sizes = [1024, 16_384] if args.quick else [1024, 16_384, 65_536]
    print(f"{datetime.date.today()}, load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    print(partitions(sb, sizes, (8, 64, 128), args.repeat))
    print()
    print(capped(sb, [1024], 16_384, args.repeat))
    print()
    print(packed_sft(20_000, 8, 4))


if __name__ == "__main__":
    main()
