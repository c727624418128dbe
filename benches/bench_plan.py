"""Planning benchmark: tokpack.plan on 1,000,000 lengths against numpy.argsort of the same array
(same dtype, measured in the same run).

Two tables:
- distributions (issue 13): bfd / ffd / next_fit at max_len 4096 with ``overlong="truncate"`` on
  int32 and int64 lengths of three shapes: the SFT-like lognormal mixture up to 8192, uniform in
  1..8192, and heavy-tailed (Pareto, alpha 1.2, clipped to 32768);
- max_len sweep (issue 2): the SFT-like int32 lengths with ``overlong="split"`` at max_len 2048 /
  4096 / 8192, with the rows used against the lower bound.

Goals: bfd plans in at most 1.5x the time of ``numpy.argsort(lengths, kind="stable")`` on every
row, and uses at most ``lower_bound * 1.001 + 1`` rows. Run on a release build:

    pip install . && python benches/bench_plan.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tokpack
from tokpack._io.tables import table
from tokpack.synthetic import sft_lengths

STRATEGIES = ("bfd", "ffd", "next_fit")
GOAL_RATIO = 1.5


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def distributions(n: int) -> dict:
    """Named int32 length arrays of ``n`` samples, fixed seeds."""
    rng = np.random.default_rng(1)
    pareto = (rng.pareto(1.2, n) + 1.0) * 48.0
    return {
        "sft mixture": sft_lengths(n, seed=0),
        "uniform": rng.integers(1, 8193, n).astype(np.int32),
        "pareto": np.clip(np.rint(pareto), 1, 32768).astype(np.int32),
    }


def timed(lengths, max_len: int, strategy: str, overlong: str, repeat: int):
    """Best time at threads=1 and threads=2, and the plan."""
    times = {
        threads: best_of(
            lambda t=threads: tokpack.plan(
                lengths, max_len, strategy=strategy, overlong=overlong, threads=t
            ),
            repeat,
        )
        for threads in (1, 2)
    }
    return times, tokpack.plan(lengths, max_len, strategy=strategy, overlong=overlong)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ok = True

    rows = []
    for name, lengths32 in distributions(args.samples).items():
        for lengths in (lengths32, lengths32.astype(np.int64)):
            argsort_s = best_of(lambda a=lengths: np.argsort(a, kind="stable"), args.repeat)
            for strategy in STRATEGIES:
                times, _ = timed(lengths, 4096, strategy, "truncate", args.repeat)
                ratio = min(times.values()) / argsort_s
                if strategy == "bfd":
                    ok &= ratio <= GOAL_RATIO
                row = [name, str(lengths.dtype), strategy, ms(times[1]), ms(times[2])]
                rows.append(row + [ms(argsort_s), f"{ratio:.2f}x"])
    print(
        f"{args.samples:,} samples, max_len 4096, overlong='truncate', best of {args.repeat}; "
        "argsort = numpy.argsort(lengths, kind='stable') of the same array\n"
    )
    headers = ["lengths", "dtype", "strategy", "threads=1 ms", "threads=2 ms", "argsort ms"]
    print(table(headers + ["vs argsort"], rows))

    lengths = sft_lengths(args.samples, seed=0)
    argsort_s = best_of(lambda: np.argsort(lengths, kind="stable"), args.repeat)
    print(
        f"\nmax_len sweep: SFT-like int32 lengths, {int(lengths.sum()):,} tokens, median "
        f"{int(np.median(lengths))}, max {int(lengths.max())}, overlong='split'; "
        f"argsort {ms(argsort_s)} ms\n"
    )
    rows = []
    for max_len in (2048, 4096, 8192):
        for strategy in STRATEGIES:
            times, p = timed(lengths, max_len, strategy, "split", args.repeat)
            ratio = min(times.values()) / argsort_s
            if strategy == "bfd":
                ok &= ratio <= GOAL_RATIO and p.n_bins <= p.lower_bound * 1.001 + 1
            rows.append(
                [strategy, max_len, ms(times[1]), ms(times[2]), f"{ratio:.2f}x"]
                + [f"{p.n_bins:,}", f"{p.lower_bound:,}", f"{p.efficiency:.5f}"]
            )
    headers = ["strategy", "max_len", "threads=1 ms", "threads=2 ms", "vs argsort"]
    print(table(headers + ["rows", "lower bound", "efficiency"], rows))
    print(
        f"\nbfd goals (<= {GOAL_RATIO}x argsort on every row, rows <= lower_bound*1.001+1): "
        f"{'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
