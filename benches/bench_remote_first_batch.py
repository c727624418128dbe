"""Reading packed rows from object storage (issue 23): time to the first batch on a small and a
large corpus, and bytes fetched per epoch against the bytes of the data read.

A local S3 endpoint (moto's server) holds packed corpora of --sizes shards each (the same
shard size). For each, a fresh reader with an empty cache opens the URI and takes its first
batch (``PackedIterableDataset``, ``num_workers=0``, best of --repeats); the requests it made
are counted too (those of the fetch-ahead thread included). The first batch reads the shuffle
window's row groups (4), each from its own shard once the corpus has a few shards, so beyond
that the work to the first batch does not grow with the corpus. Goal: the largest corpus's
time to the first batch within 1.5x the middle one's (16x fewer shards to 4x fewer).

Then one epoch of the large corpus through ``DataLoader(num_workers=2)`` with a cache that
holds it: bytes fetched (``tokpack.remote.cache_counters``: every worker's fetches) against
the bytes of the shards' row groups and footers. Goal: fetched bytes
<= 1.1x the data read.

    python benches/bench_remote_first_batch.py --sizes 2,32,128
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _upload(local: Path, fs, prefix: str) -> None:
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        with fs.open_output_stream(f"{prefix}/{path.relative_to(local).as_posix()}") as f:
            f.write(path.read_bytes())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,32,128", help="shards of each corpus")
    parser.add_argument("--rows-per-shard", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer
    from torch.utils.data import DataLoader

    from tests.packed_corpus import random_samples, write_packed_dir
    from tokpack.remote import cache_counters, counters
    from tokpack.torch import PackedCollator, PackedIterableDataset

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    query = f"?endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    os.environ.update(AWS_ACCESS_KEY_ID="b", AWS_SECRET_ACCESS_KEY="b")
    fs = pafs.S3FileSystem(
        endpoint_override=f"{host}:{port}",
        scheme="http",
        access_key="b",
        secret_key="b",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    fs.create_dir("bench")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        uris = {}
        sizes = [int(x) for x in args.sizes.split(",")]
        for shards in sizes:
            name = f"{shards}-shards"
            # Samples of 300..1000 tokens at max_len 2048: about 2.6 samples a row.
            n = shards * args.rows_per_shard * 3
            samples, labels = random_samples(n, 1000, seed=1, min_len=300)
            out = tmp / name
            manifest = write_packed_dir(
                out,
                samples,
                labels,
                max_len=2048,
                rows_per_shard=args.rows_per_shard,
                row_group_rows=16,
            )
            _upload(out, fs, f"bench/{name}")
            uris[name] = (f"s3://bench/{name}{query}", manifest)
            print(
                f"{name}: {len(manifest['shards'])} shards, {manifest['figures']['rows']} rows,"
                f" {sum(s['size'] for s in manifest['shards']) / 1e6:.1f} MB"
            )

        first = {}
        for name, (uri, _) in uris.items():
            times, requests = [], []
            for r in range(args.repeats):
                before = counters()["requests"]
                t0 = time.perf_counter()
                ds = PackedIterableDataset(
                    uri,
                    batch_rows=8,
                    seed=r,
                    collate_fn=PackedCollator(),
                    cache_dir=tmp / f"cache-{name}-{r}",
                )
                next(iter(DataLoader(ds, batch_size=None, num_workers=0)))
                times.append(time.perf_counter() - t0)
                requests.append(counters()["requests"] - before)
            first[name] = min(times)
            print(
                f"time to first batch, {name}: best {min(times) * 1e3:.1f} ms, median"
                f" {statistics.median(times) * 1e3:.1f} ms, requests {min(requests)}"
                f"..{max(requests)}"
            )
        names = list(first)
        ratio = first[names[-1]] / first[names[-2]]
        print(f"{names[-1]} / {names[-2]} time to first batch: {ratio:.2f}x (goal <= 1.5x)")
        whole = first[names[-1]] / first[names[0]]
        print(f"{names[-1]} / {names[0]} time to first batch: {whole:.2f}x")

        uri, manifest = uris[names[-1]]
        cache = tmp / "cache-epoch"
        ds = PackedIterableDataset(
            uri, batch_rows=8, seed=0, collate_fn=PackedCollator(), cache_dir=cache
        )
        t0 = time.perf_counter()
        batches = sum(1 for _ in DataLoader(ds, batch_size=None, num_workers=2))
        took = time.perf_counter() - t0
        packed = ds.packed
        data = sum(r[1] for r in packed.group_bytes) + sum(f[1] for f in packed.shard_footers)
        # What every worker process fetched for its reads (the manifest, read at open, aside).
        fetched = cache_counters(packed.root)["bytes_fetched"]
        print(
            f"one epoch of {names[-1]}, 2 workers: {batches} batches in {took:.2f} s; fetched"
            f" {fetched / 1e6:.2f} MB for {data / 1e6:.2f} MB of row groups and footers read:"
            f" {fetched / data:.3f}x (goal <= 1.1x)"
        )
    server.stop()
    return 0 if ratio <= 1.5 and fetched <= 1.1 * data else 1


if __name__ == "__main__":
    sys.exit(main())
