"""Data-loading benchmark: packed rows delivered per second to a training loop, max_len 4096.

Compares, in the same run and over the same packed rows, tokpack's PackedDataset + PackedCollator
through a DataLoader, PackedDataset(device="cpu") (in-memory mode, main process only) and
PackedIterableDataset, against a Hugging Face ``datasets`` Dataset of the rows with
``set_format("torch")`` and transformers' ``DataCollatorWithFlattening``, at each ``--workers``
count (0, 1, 2, 4). Every reader goes through a full pass of the corpus in order (no shuffle for
the map-style readers, the iterable dataset's own windowed shuffle for it); each is timed
``--repeats`` times (a new DataLoader each time with persistent workers, warm-up pass then timed
pass), the readers interleaved, and the best pass of each is kept. ``--before`` adds, in the same
run, the worker rows of tokpack's readers as before issue 13: torch's own transport of batches
(one shared-memory block per tensor) and every worker decoding every row group it reads (no row
groups shared between workers). Goal (issue 13): at least 5x the baseline's tokens/s at every
worker count.

Section ``mixture`` (issue 12): ``PackedMixture`` of two directories (the same samples split in
two), context-parallel collation (``PackedCollator(cp_size=2)``, rank 0's slice) and the global
loss normalisers (``grad_accum_steps``) against the single-directory ``PackedIterableDataset +
PackedCollator`` over the same samples; each reader is timed ``--repeats`` times (a new
DataLoader each time, warm-up pass then timed pass), the readers interleaved, and the best pass
of each is kept (the machine's load varies between passes).
Goal: at least 0.9x the baseline's rows/s.

It also times decoding every row group of the corpus with and without the integrity checks (the
row group's bytes and the footer hashed with xxh3 and compared with the manifest before decoding),
the cost the readers pay for them.

    pip install -e ".[test,torch]" datasets && python benches/bench_torch.py
    python benches/bench_torch.py --section loaders --samples 4000 --repeats 3 --before
    python benches/bench_torch.py --section mixture --samples 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from tokpack._io.tables import table
from tokpack.packed.reader import PackedDir
from tokpack.synthetic import sft_lengths
from tokpack.torch import (
    PackedCollator,
    PackedDataset,
    PackedIterableDataset,
    PackedMixture,
    _stream,
)
from tokpack.torch import _rows as rows_module
from tokpack.torch import collate as collate_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from packed_corpus import write_packed_dir  # noqa: E402

MAX_LEN = 4096


def build_corpus(out: Path, n_samples: int, parts: Tuple[slice, ...] = ()) -> int:
    """Pack ``n_samples`` SFT-like samples into ``out`` (and each slice of them in ``parts`` into
    ``out-0``, ``out-1``, ...); returns the tokens of ``out``."""
    rng = np.random.default_rng(0)
    lengths = sft_lengths(n_samples, seed=0, max_length=MAX_LEN)
    samples = [rng.integers(1, 32000, size=int(n), dtype=np.int32) for n in lengths]
    labels = []
    for s in samples:
        lab = s.copy()
        lab[: len(s) // 3] = -100
        labels.append(lab)
    options = dict(max_len=MAX_LEN, rows_per_shard=1024, row_group_rows=256)
    manifest = write_packed_dir(out, samples, labels, **options)
    for k, part in enumerate(parts):
        write_packed_dir(out.parent / f"{out.name}-{k}", samples[part], labels[part], **options)
    return manifest["figures"]["tokens"]


def timed_pass(loader) -> tuple:
    """(seconds, rows, tokens) of one full pass after a warm-up pass (workers are persistent, as
    in a training run, so their start-up is not counted); tokens from the batch's input_ids."""
    for _ in loader:
        pass
    start = time.perf_counter()
    rows = tokens = 0
    for batch in loader:
        ids = batch["input_ids"]
        tokens += ids.numel()
        rows += batch["num_rows"] if "num_rows" in batch else 0
    return time.perf_counter() - start, rows, tokens


class Counting:
    """Wraps a collator to report the rows of each batch (the collators only report tokens)."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, rows):
        out = self.collate(rows)
        out["num_rows"] = len(rows)
        return out


def check_cost(path: Path) -> str:
    """Best of 3 passes decoding every row group, unchecked and checked (as the readers do)."""
    from tokpack import _tokpack

    packed = PackedDir(path)

    def one_pass(checked: bool) -> float:
        start = time.perf_counter()
        for g in range(packed.num_groups):
            shard = int(packed.group_shard[g])
            check = (packed.shard_sizes[shard], packed.shard_footers[shard], packed.group_bytes[g])
            _tokpack.read_row_group(
                path=packed.shard_paths[shard],
                row_group=int(packed.group_index[g]),
                columns=list(packed.columns),
                check=check if checked else None,
            )
        return time.perf_counter() - start

    plain = min(one_pass(False) for _ in range(3))
    checked = min(one_pass(True) for _ in range(3))
    return (
        f"decoding all {packed.num_groups} row groups: {plain * 1e3:.1f} ms unchecked, "
        f"{checked * 1e3:.1f} ms with checksums ({checked / plain - 1:+.1%})"
    )


@contextlib.contextmanager
def before_issue_13():
    """Workers as before issue 13: batches cross as torch moves them (one shared-memory block
    and descriptor per tensor; tokpack's worker batches are left plain dicts), and each worker
    decodes every row group it reads (no shared row groups, no readahead)."""
    saved = _stream.ship, collate_module.ship, rows_module.worker_slot
    _stream.ship = collate_module.ship = lambda batch: batch
    rows_module.worker_slot = lambda: (0, 1)  # the caches take workers for the main process
    try:
        yield
    finally:
        _stream.ship, collate_module.ship, rows_module.worker_slot = saved


def loaders_section(n_samples: int, batch_rows: int, repeats: int, workers, before: bool) -> bool:
    """tokpack's readers against the Hugging Face baseline at each worker count (issues 4, 13)."""
    import datasets
    from transformers import DataCollatorWithFlattening

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "packed"
        total_tokens = build_corpus(path, n_samples)
        n_rows = len(PackedDataset(path))
        hf = datasets.Dataset.from_parquet(
            [str(p) for p in sorted(path.glob("part-*.parquet"))],
            columns=["input_ids", "labels"],
            cache_dir=str(Path(tmp) / "hf_cache"),
        )
        hf.set_format("torch")
        print(
            f"{n_rows:,} packed rows, {total_tokens:,} tokens (max_len {MAX_LEN}),"
            f" batches of {batch_rows} rows, best of {repeats} interleaved passes;"
            f" torch {torch.__version__}, datasets {datasets.__version__}\n"
        )
        b = batch_rows

        def loader(ds, w, **kw):
            return DataLoader(ds, num_workers=w, persistent_workers=w > 0, **kw)

        readers = {
            "HF Dataset + DataCollatorWithFlattening": lambda w: loader(
                hf, w, batch_size=b, collate_fn=Counting(DataCollatorWithFlattening())
            ),
            "PackedDataset + PackedCollator": lambda w: loader(
                PackedDataset(path), w, batch_size=b, collate_fn=Counting(PackedCollator("hf"))
            ),
            "PackedDataset(device='cpu') + PackedCollator": lambda w: loader(
                PackedDataset(path, device="cpu"),
                w,
                batch_size=b,
                collate_fn=Counting(PackedCollator("hf")),
            ),
            "PackedIterableDataset (shuffled) + PackedCollator": lambda w: loader(
                PackedIterableDataset(
                    path, batch_rows=b, rank=0, world_size=1, collate_fn=Counting(PackedCollator())
                ),
                w,
                batch_size=None,
            ),
        }
        cases = []  # (name, workers, before issue 13)
        for w in workers:
            for name in readers:
                if "device=" in name and w > 0:
                    continue  # device mode is for the main process
                cases.append((name, w, False))
                if before and w > 0 and not name.startswith("HF"):
                    cases.append((name, w, True))
        cost = check_cost(path)
        best = dict.fromkeys(cases, float("inf"))
        for r in range(repeats):
            # A different reader goes first each time; one loader's workers alive at a time.
            for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
                name, w, old = case
                with before_issue_13() if old else contextlib.nullcontext():
                    it = readers[name](w)
                    seconds, rows, tokens = timed_pass(it)
                    del it
                assert rows == n_rows and tokens == total_tokens, (case, rows, tokens)
                best[case] = min(best[case], seconds)
    ok = True
    out = []
    for (name, w, old), seconds in best.items():
        ratio = best[("HF Dataset + DataCollatorWithFlattening", w, False)] / seconds
        if not name.startswith("HF") and not old:
            ok &= ratio >= 5.0
        label = f"{name}, workers={w}" + (" (before issue 13)" if old else "")
        out.append(
            [
                label,
                f"{seconds:.2f}",
                f"{n_rows / seconds:,.0f}",
                f"{total_tokens / seconds / 1e6:,.1f}",
                f"{ratio:.1f}x",
            ]
        )
    print(table(["reader", "pass s", "rows/s", "Mtokens/s", "vs HF (same workers)"], out))
    print(f"\n{cost}")
    verdict = "met" if ok else "NOT met"
    print(f"\ngoal (>= 5x the baseline's tokens/s in every tokpack row): {verdict}")
    return ok


def collation_only(path: Path, batch_rows: int, repeats: int) -> list:
    """Rows/s of the collators alone over the corpus's batches, in memory (best of ``repeats``
    interleaved passes): the CP slice against the plain collator, without the reader."""
    ds = PackedDataset(path)
    rows = [ds[i] for i in range(len(ds))]
    batches = [rows[i : i + batch_rows] for i in range(0, len(rows), batch_rows)]
    collators = {
        "PackedCollator() alone": PackedCollator(),
        "PackedCollator(cp_size=2) alone": PackedCollator(cp_size=2, cp_rank=0),
        "PackedCollator(cp_size=4) alone": PackedCollator(cp_size=4, cp_rank=1),
    }
    best = dict.fromkeys(collators, float("inf"))
    for _ in range(repeats):
        for name, collate in collators.items():
            start = time.perf_counter()
            for batch in batches:
                collate(batch)
            best[name] = min(best[name], time.perf_counter() - start)
    base = best["PackedCollator() alone"]
    return [[name, f"{len(rows) / t:,.0f}", f"{base / t:.2f}x"] for name, t in best.items()]


def mixture_section(samples: int, batch_rows: int, repeats: int, workers: Tuple[int, ...]) -> bool:
    """PackedMixture, CP collation and the global normalisers against PackedIterableDataset +
    PackedCollator over the same samples; best of ``repeats`` interleaved passes each."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "packed"
        half = samples // 2
        build_corpus(path, samples, (slice(0, half), slice(half, samples)))
        parts = {"a": Path(tmp) / "packed-0", "b": Path(tmp) / "packed-1"}
        n_rows = PackedDir(path).num_rows
        sizes = {k: PackedDir(p).num_rows for k, p in parts.items()}
        print(
            f"{samples:,} samples: {n_rows:,} rows in one directory, {sizes} in the two halves;"
            f" batches of {batch_rows} rows, best of {repeats} interleaved passes"
        )

        def single(collate, **kw):
            return PackedIterableDataset(
                path, batch_rows=batch_rows, rank=0, world_size=1, collate_fn=collate, **kw
            )

        def mixture(collate):
            # Weights proportional to the sizes, every row of both once: the same rows as `single`.
            return PackedMixture(
                parts, sizes, batch_rows=batch_rows, rank=0, world_size=1, collate_fn=collate
            )

        readers = {
            "PackedIterableDataset + PackedCollator": lambda: single(Counting(PackedCollator())),
            "PackedMixture (2 directories) + PackedCollator": lambda: mixture(
                Counting(PackedCollator())
            ),
            "PackedIterableDataset + PackedCollator(cp_size=2)": lambda: single(
                Counting(PackedCollator(cp_size=2, cp_rank=0))
            ),
            "PackedIterableDataset(grad_accum_steps=4) + PackedCollator": lambda: single(
                Counting(PackedCollator()), grad_accum_steps=4
            ),
        }
        ok = True
        out = []
        for w in workers:
            best = {name: float("inf") for name in readers}
            names = list(readers)
            for r in range(repeats):
                # A different reader goes first each time (the first after a pause is favoured).
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    make = readers[name]
                    # One reader's workers at a time: persistent workers of another loader would
                    # prefetch its next pass while this one is timed.
                    loader = DataLoader(
                        make(), batch_size=None, num_workers=w, persistent_workers=w > 0
                    )
                    seconds, rows, _ = timed_pass(loader)
                    del loader
                    assert rows in (n_rows, sum(sizes.values())), (name, rows)
                    best[name] = min(best[name], seconds / rows)
            base = best["PackedIterableDataset + PackedCollator"]
            for name, per_row in best.items():
                ratio = base / per_row
                ok &= ratio >= 0.9
                out.append([f"{name}, workers={w}", f"{1 / per_row:,.0f}", f"{ratio:.2f}x"])
        out.extend(collation_only(path, batch_rows, repeats))
    print(table(["reader", "rows/s (best pass)", "vs first row (same workers)"], out))
    print(f"\ngoal (>= 0.9x the rows/s of PackedIterableDataset): {'met' if ok else 'NOT met'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--batch-rows", type=int, default=8)
    parser.add_argument(
        "--section", choices=("all", "loaders", "mixture"), default="all", help="what to run"
    )
    parser.add_argument("--repeats", type=int, default=3, help="passes per reader (best kept)")
    parser.add_argument("--workers", default="0,1,2,4", help="num_workers values to time")
    parser.add_argument(
        "--before",
        action="store_true",
        help="also time tokpack's worker rows as before issue 13 (torch's transport, no sharing)",
    )
    args = parser.parse_args()
    workers = tuple(int(w) for w in args.workers.split(","))
    ok = True
    if args.section in ("all", "loaders"):
        ok &= loaders_section(args.samples, args.batch_rows, args.repeats, workers, args.before)
    if args.section in ("all", "mixture"):
        ok &= mixture_section(args.samples, args.batch_rows, args.repeats, workers)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
