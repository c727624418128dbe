"""End-to-end `tokpack pack` on a generated SFT-like corpus with labels, against, in the same run:

- a pyarrow round trip that reads the same Parquet files and writes the same tokens back with
  the same compression (`pyarrow.parquet.read_table` + `write_table`, file by file so that its
  memory stays bounded), the I/O floor;
- TRL's `pack_dataset(strategy="bfd")` over a `datasets.Dataset` (when trl is installed).

Each contender runs in its own child process; peak RSS is that child's ru_maxrss (os.wait4).
tokpack's spill goes to its own directory (``--spill-dir``), whose size is sampled while it runs:
the temporary disk beyond the output, reported per token. The load average (1 min) is read
before and after each run: the machine may be shared. Prints a Markdown table. Large files are
deleted at the end unless --keep.

    python benches/bench_pack_files.py --samples 1000000 --work /tmp/tokpack-bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

CHILD = {
    "tokpack": """
import json, sys, time
import tokpack
t = time.perf_counter()
m = tokpack.pack_files(sys.argv[1], sys.argv[2], int(sys.argv[3]), overlong="split",
                       compression="zstd", force=True, spill_dir=sys.argv[4],
                       row_order=sys.argv[5])
f = m["figures"]
print(json.dumps({"time": time.perf_counter() - t, "rows": f["rows"], "tokens": f["tokens"],
                  "efficiency": f["efficiency"]}))
""",
    "pyarrow": """
import json, sys, time
from pathlib import Path
import pyarrow.parquet as pq
t = time.perf_counter()
Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
rows = tokens = 0
# File by file: the whole corpus as one table does not fit in memory at 4M samples (~27 GB).
for path in sorted(Path(sys.argv[1]).glob("*.parquet")):
    table = pq.read_table(path)
    pq.write_table(table, str(Path(sys.argv[2]) / path.name), compression="zstd")
    rows += table.num_rows
    tokens += int(sum(len(c.values) for c in table.column("input_ids").chunks))
    del table
print(json.dumps({"time": time.perf_counter() - t, "rows": rows, "tokens": tokens,
                  "efficiency": None}))
""",
    "trl": """
import json, sys, time
from pathlib import Path
import datasets
from trl import pack_dataset
datasets.disable_progress_bars()
t = time.perf_counter()
files = sorted(str(p) for p in Path(sys.argv[1]).glob("*.parquet"))
ds = datasets.Dataset.from_parquet(files, cache_dir=str(Path(sys.argv[2]) / "hf-cache"))
loaded = time.perf_counter() - t
max_len = int(sys.argv[3])
packed = pack_dataset(ds, seq_length=max_len, strategy="bfd")
rows = len(packed)
tokens = sum(len(c.values) for c in packed.data.column("input_ids").chunks)
print(json.dumps({"time": time.perf_counter() - t, "load": loaded, "rows": rows,
                  "tokens": tokens, "efficiency": tokens / (rows * max_len)}))
""",
}


def tree_bytes(root: Path) -> int:
    """Bytes allocated to the files under ``root``."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def run_child(
    name: str, corpus: Path, out: Path, max_len: int, spill: Path, row_order: str = "shuffled"
) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    spill.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD[name], str(corpus), str(out), str(max_len), str(spill)]
        + [row_order],
        stdout=subprocess.PIPE,
        env=env,
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], tree_bytes(spill))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed with exit code {proc.returncode}")
    result = json.loads(text.decode().strip().splitlines()[-1])
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    result["spill_peak_bytes"] = peak[0]
    result["user_s"], result["sys_s"] = usage.ru_utime, usage.ru_stime
    result["load"] = (load, os.getloadavg()[0])
    return result


def drop_page_cache() -> None:
    """Writes dirty pages back and empties the page cache (``--cold``)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError as exc:
        sys.exit(f"--cold: cannot empty the page cache ({exc}); run as root or without --cold")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--work", default="/tmp/tokpack-bench-pack")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument(
        "--order",
        default="pyarrow,tokpack",
        help="run order of the two main contenders (the ratio is against pyarrow either way)",
    )
    parser.add_argument(
        "--row-order", default="shuffled", help="tokpack's row_order (shuffled, plan)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the corpus and outputs")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="empty the page cache before each contender (needs root): both start from disk",
    )
    args = parser.parse_args()

    from tokpack._io.tables import table
    from tokpack.synthetic import write_token_shards

    work = Path(args.work)
    # Keyed by size: a corpus left by a run of another --samples / --files is not reused.
    corpus = work / f"corpus-{args.samples}x{args.files}"
    if not corpus.exists():
        t = time.perf_counter()
        write_token_shards(corpus, args.samples, n_files=args.files, row_group_rows=8192)
        print(f"generated {args.samples:,} samples in {time.perf_counter() - t:.0f} s", flush=True)
    size = sum(p.stat().st_size for p in corpus.glob("*.parquet"))
    contenders = args.order.split(",")
    try:
        import trl  # noqa: F401

        if not args.skip_trl:
            contenders.append("trl")
    except ImportError:
        pass
    results = {}
    for name in contenders:
        out = work / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        if args.cold:
            drop_page_cache()
        results[name] = run_child(name, corpus, out, args.max_len, work / "spill", args.row_order)
        print(name, json.dumps(results[name]), flush=True)
        shutil.rmtree(out, ignore_errors=True)
    base = results["pyarrow"]["time"]
    rows = []
    for name, r in results.items():
        label = {
            "pyarrow": "pyarrow read_table + write_table (zstd)",
            "tokpack": f"tokpack pack (bfd, zstd, row_order={args.row_order})",
            "trl": "TRL pack_dataset(strategy='bfd') incl. Dataset.from_parquet",
        }[name]
        spill = r["spill_peak_bytes"] / r["tokens"] if name == "tokpack" else None
        rows.append(
            [
                label,
                f"{r['time']:.1f}",
                f"{r['time'] / base:.2f}x",
                f"{r['user_s']:.0f} / {r['sys_s']:.0f}",
                f"{r['tokens'] / r['time'] / 1e6:.1f}",
                f"{r['peak_rss_mb']:,.0f}",
                "-" if spill is None else f"{spill:.2f}",
                f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}",
                f"{r['rows']:,}",
                "-" if r["efficiency"] is None else f"{r['efficiency']:.4f}",
            ]
        )
    print(
        f"\n{args.samples:,} samples, {results['tokpack']['tokens']:,} tokens with labels, "
        f"max_len {args.max_len}, input {size / 1e9:.2f} GB Parquet (zstd), "
        f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        f"{', page cache emptied before each run' if args.cold else ''}\n"
    )
    print(
        table(
            [
                "run",
                "time s",
                "vs pyarrow",
                "user / sys s",
                "M tokens/s",
                "peak RSS MB",
                "temp disk B/token",
                "load avg 1 min",
                "rows",
                "efficiency",
            ],
            rows,
        )
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
