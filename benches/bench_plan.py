"""Planning benchmark: tokpack.plan on 1,000,000 SFT-like lengths against numpy.argsort of the
same lengths (measured in the same run), at max_len 2048 / 4096 / 8192.

Goals (issue 2): bfd plans in at most 2x the time of ``numpy.argsort(lengths, kind="stable")``
and uses at most ``lower_bound * 1.001 + 1`` rows. Run on a release build:

    pip install . && python benches/bench_plan.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tokpack
from tokpack.report import table
from tokpack.synthetic import sft_lengths


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    lengths = sft_lengths(args.samples, seed=0)
    lengths64 = lengths.astype(np.int64)
    argsort_s = best_of(lambda: np.argsort(lengths64, kind="stable"), args.repeat)
    print(
        f"{args.samples:,} samples, {int(lengths.sum()):,} tokens, median "
        f"{int(np.median(lengths))}, max {int(lengths.max())}; "
        f"numpy.argsort(kind='stable') of int64 lengths: {argsort_s * 1e3:.1f} ms\n"
    )
    rows = []
    ok = True
    for max_len in (2048, 4096, 8192):
        for strategy in ("bfd", "ffd", "next_fit"):
            times = {}
            for threads in (1, 2):
                times[threads] = best_of(
                    lambda t=threads, m=max_len, s=strategy: tokpack.plan(
                        lengths, m, strategy=s, overlong="split", threads=t
                    ),
                    args.repeat,
                )
            p = tokpack.plan(lengths, max_len, strategy=strategy, overlong="split")
            ratio = min(times.values()) / argsort_s
            rows_ok = p.n_bins <= p.lower_bound * 1.001 + 1
            if strategy == "bfd":
                ok &= ratio <= 2.0 and rows_ok
            rows.append(
                [
                    strategy,
                    max_len,
                    f"{times[1] * 1e3:.1f}",
                    f"{times[2] * 1e3:.1f}",
                    f"{ratio:.2f}x",
                    f"{p.n_bins:,}",
                    f"{p.lower_bound:,}",
                    f"{p.efficiency:.5f}",
                ]
            )
    print(
        table(
            [
                "strategy",
                "max_len",
                "threads=1 ms",
                "threads=2 ms",
                "vs argsort",
                "rows",
                "lower bound",
                "efficiency",
            ],
            rows,
        )
    )
    print(f"\nbfd goals (<= 2x argsort, rows <= lower_bound*1.001+1): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
