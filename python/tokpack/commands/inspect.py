"""``tokpack inspect``: the manifest figures of a packed directory and a few rows with their
sample boundaries."""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow.parquet as pq

from .._contract import FORMAT
from .._outdir import MANIFEST_NAME, read_manifest
from ..errors import CorruptOutputError, InputNotFoundError
from ..integrity import cache_problem
from ..report import table

# ``seq_roles`` of preference outputs.
_ROLE_NAMES = {1: "chosen", 2: "rejected", 3: "prompt"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", metavar="OUT_DIR")
    parser.add_argument("--rows", type=int, default=3, help="rows to show (default 3)")


def run(args: argparse.Namespace) -> int:
    out = Path(args.output)
    manifest = read_manifest(out)
    if manifest is None:
        raise InputNotFoundError(f"{out}: no {MANIFEST_NAME} (not a tokpack output directory)")
    if manifest.get("format") != FORMAT:
        raise CorruptOutputError(f"{out}: not a packed directory (format {manifest.get('format')})")
    problem = cache_problem(out, manifest)
    if problem is not None:
        raise CorruptOutputError(f"{problem} (run `tokpack verify {out}` for a full check)")
    c, f = manifest["config"], manifest["figures"]
    print(
        f"{out}: {len(manifest['shards'])} shards, max_len {c['max_len']}, strategy "
        f"{c['strategy']}, overlong {c['overlong']}, labels {manifest['has_labels']}, "
        f"tokpack {manifest['tokpack_version']}\n"
    )
    print(
        table(
            ["figure", "value"], [[k, f"{v:,}" if isinstance(v, int) else v] for k, v in f.items()]
        )
    )
    shown = []
    for shard in manifest["shards"]:
        if len(shown) >= args.rows:
            break
        pf = pq.ParquetFile(out / shard["file"])
        cols = ["input_ids", "seq_lengths", "sample_ids", "num_tokens", "num_loss_tokens"]
        cols += ["seq_roles"] if "seq_roles" in pf.schema_arrow.names else []
        for g in range(pf.num_row_groups):
            for row in pf.read_row_group(g, columns=cols).to_pylist():
                shown.append((shard["file"], row))
                if len(shown) >= args.rows:
                    break
            if len(shown) >= args.rows:
                break
    for file, row in shown:
        ids = row["input_ids"]
        roles = row.get("seq_roles") or [0] * len(row["seq_lengths"])
        print(
            f"\n{file}: {row['num_tokens']} tokens ({row['num_loss_tokens']} trained on), "
            f"{len(row['seq_lengths'])} {'segments' if row.get('seq_roles') else 'samples'}"
        )
        pos = 0
        for n, s, role in zip(row["seq_lengths"], row["sample_ids"], roles):
            head = " ".join(map(str, ids[pos : pos + min(n, 8)]))
            what = f"pair {s} {_ROLE_NAMES[role]}" if role else f"sample {s}"
            print(f"  [{pos:>6}:{pos + n:<6}] {what}: {head}{' ...' if n > 8 else ''}")
            pos += n
    return 0
