"""Export benchmark: ``tokpack export megatron`` against a plain copy of the same tokens.

Builds a packed directory from a synthetic SFT corpus (``write_token_shards`` + ``pack_files``,
max_len 4096), then times, in the same run and over the same shards: the Megatron export
(``PREFIX.bin`` + ``PREFIX.idx``) and the baseline, reading the ``input_ids`` of every row group
with pyarrow and writing them with ``numpy.tofile`` in the dtype the export chose (so both read
the shards and write the same token bytes). The NeMo packed-Parquet export is timed for
information. Best of ``--repeat`` runs each, interleaved, page cache warm. Goal (issue 12,
part 4): the Megatron export within 2x of the baseline.

    pip install -e ".[test]" && python benches/bench_export.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

import tokpack
from tokpack._io.outdir import read_manifest
from tokpack._io.tables import table
from tokpack.packed.export import MEGATRON_DTYPES
from tokpack.synthetic import write_token_shards

MAX_LEN = 4096


def baseline(packed: Path, dest: Path, dtype: str) -> int:
    """Reads every row group's input_ids and writes the tokens with numpy.tofile; the bytes
    written."""
    np_dtype = MEGATRON_DTYPES[dtype][0]
    with open(dest, "wb") as f:
        for shard in read_manifest(packed)["shards"]:
            pf = pq.ParquetFile(packed / shard["file"])
            for g in range(pf.num_row_groups):
                ids = pf.read_row_group(g, columns=["input_ids"]).column(0).combine_chunks()
                ids.flatten().to_numpy().astype(np_dtype, copy=False).tofile(f)
    return dest.stat().st_size


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--vocab", type=int, default=32_000, help="32,000: uint16; 128,256: int32")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tokpack-bench-export-") as tmp:
        root = Path(tmp)
        files = write_token_shards(
            root / "tokens", args.samples, max_length=MAX_LEN, vocab_size=args.vocab
        )
        packed = root / "packed"
        manifest = tokpack.pack_files(files, packed, MAX_LEN)
        tokens = manifest["figures"]["tokens"]
        out = root / "out"
        out.mkdir()

        figures = tokpack.export_megatron(packed, out / "train")
        dtype = figures["dtype"]
        assert baseline(packed, out / "copy.bin", dtype) == (out / "train.bin").stat().st_size

        contenders = {
            "baseline: read + numpy.tofile": lambda: baseline(packed, out / "copy.bin", dtype),
            "tokpack export megatron": lambda: tokpack.export_megatron(
                packed, out / "train", force=True
            ),
            "tokpack export nemo (Parquet)": lambda: tokpack.export_nemo_packed(
                packed, out / "t.idx.parquet", force=True
            ),
        }
        best = dict.fromkeys(contenders, float("inf"))
        for _ in range(args.repeat):  # interleaved, so load changes hit every contender
            for name, fn in contenders.items():
                best[name] = min(best[name], timed(fn))
        t_copy = best["baseline: read + numpy.tofile"]

        print(
            f"{args.samples:,} samples, {tokens:,} tokens in {manifest['figures']['rows']:,} rows "
            f"(max_len {MAX_LEN}), {len(manifest['shards'])} shards, vocab {args.vocab:,} -> "
            f"{dtype}; best of {args.repeat}\n"
        )
        rows = [
            [name, f"{t:.2f}", f"{tokens / t / 1e6:.0f}", f"{t / t_copy:.2f}x"]
            for name, t in best.items()
        ]
        print(table(["", "seconds", "M tokens/s", "vs baseline"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
