"""`tokpack.ray.pack` (global and local mode) against `tokpack pack` on the same generated
SFT-like corpus, in one run, on a one-machine Ray cluster (`ray.init(num_cpus=CPUS)`):

- wall time of each and its ratio to `tokpack pack`; the Ray runs' per-stage times from the
  manifest (global: read+measure, the blocks measured as Ray Data streams them in; plan; write:
  scatter + shard tasks. local: blocks, reading into the object store; write: group tasks);
- the driver's peak RSS, and its growth over the RSS after `ray.init` per million samples;
- local mode's row cost against the global plan for several group sizes, computed with the
  planner alone (the rows local mode writes for groups of that many consecutive samples).

Each packer runs in its own child process; its peak RSS is its own ``VmHWM`` (not ru_maxrss,
which Linux carries over from the forking parent across exec).

    python benches/bench_ray.py --samples 1000000 --work /tmp/tokpack-bench-ray
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HWM = """
def hwm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

CHILD = {
    "tokpack": HWM
    + """
import json, sys, time
import tokpack
t = time.perf_counter()
m = tokpack.pack_files(sys.argv[1], sys.argv[2], int(sys.argv[3]), overlong="split", force=True)
print(json.dumps({"time": time.perf_counter() - t, "rows": m["figures"]["rows"],
                  "peak_rss_mb": hwm_mb()}))
""",
    "ray": HWM
    + """
import json, logging, sys, time
from pathlib import Path
import ray, ray.data
import tokpack.ray
t = time.perf_counter()
ray.init(num_cpus=int(sys.argv[5]), logging_level=logging.WARNING, log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False
started = time.perf_counter() - t
base_rss = hwm_mb()
files = sorted(str(p) for p in Path(sys.argv[1]).glob("*.parquet"))
t = time.perf_counter()
m = tokpack.ray.pack(ray.data.read_parquet(files), sys.argv[2], int(sys.argv[3]),
                     overlong="split", mode=sys.argv[4])
print(json.dumps({"time": time.perf_counter() - t, "rows": m["figures"]["rows"],
                  "ray_init": started, "base_rss_mb": base_rss, "stages": m["ray"]["stage_s"],
                  "blocks": m["ray"]["blocks"], "peak_rss_mb": hwm_mb()}))
""",
}


def run_child(name: str, *argv: str) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD[name], *argv],
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert proc.stdout is not None
    text = proc.stdout.read()
    if proc.wait() != 0:
        raise SystemExit(f"{name} {argv} failed")
    return json.loads(text.decode().strip().splitlines()[-1])


def local_cost(lengths, max_len: int, group_sizes) -> list:
    """Rows of per-group plans over groups of consecutive samples, against the global plan."""
    import tokpack

    whole = tokpack.plan(lengths, max_len, overlong="split").n_bins
    out = []
    for g in group_sizes:
        rows = sum(
            tokpack.plan(lengths[a : a + g], max_len, overlong="split").n_bins
            for a in range(0, len(lengths), g)
        )
        out.append((g, rows, (rows - whole) / whole))
    return [whole, out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--work", default="/tmp/tokpack-bench-ray")
    parser.add_argument("--keep", action="store_true", help="keep the corpus and outputs")
    args = parser.parse_args()

    from tokpack._io.tables import table
    from tokpack.synthetic import sft_lengths, write_token_shards

    work = Path(args.work)
    # Keyed by size: a corpus left by a run of another --samples / --files is not reused.
    corpus = work / f"corpus-{args.samples}x{args.files}"
    if not corpus.exists():
        write_token_shards(corpus, args.samples, n_files=args.files, row_group_rows=8192)
    results = {}
    runs = [("tokpack pack", "tokpack", ()), ("ray global", "ray", ("global", str(args.cpus)))]
    runs.append(("ray local", "ray", ("local", str(args.cpus))))
    for label, child, extra in runs:
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        results[label] = run_child(child, str(corpus), str(out), str(args.max_len), *extra)
        print(label, json.dumps(results[label]), flush=True)
    shutil.rmtree(work / "out", ignore_errors=True)
    base = results["tokpack pack"]["time"]
    rows = []
    for label, r in results.items():
        growth = r["peak_rss_mb"] - r.get("base_rss_mb", 0)
        rows.append(
            [
                label,
                f"{r['time']:.1f}",
                f"{r['time'] / base:.2f}x",
                " / ".join(f"{k} {v:.1f}" for k, v in r.get("stages", {}).items()) or "-",
                f"{r['peak_rss_mb']:,.0f}",
                f"{growth / args.samples * 1e6:,.0f}" if "base_rss_mb" in r else "-",
                f"{r['rows']:,}",
            ]
        )
    print(f"\n{args.samples:,} samples, max_len {args.max_len}, {args.cpus} CPUs\n")
    head = ["run", "time (s)", "vs pack", "stages (s)", "peak RSS (MB)", "MB / 1M samples"]
    print(table([*head, "rows"], rows))
    whole, costs = local_cost(
        sft_lengths(args.samples, max_length=8192), args.max_len, (1024, 4096, 16384, 65536)
    )
    print(f"\nlocal mode row cost (global plan: {whole:,} rows)\n")
    print(
        table(
            ["samples per group", "rows", "extra rows"],
            [[f"{g:,}", f"{r:,}", f"{c:.3%}"] for g, r, c in costs],
        )
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"\nbench total {time.perf_counter() - started:.0f} s")
