"""``tokpack pack``: pack token shards on disk into packed Parquet shards (``pack_files``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict

from .._contract import OVERLONG_POLICIES, STRATEGIES
from ..files import PACKING_OPTIONS, PAIR_LAYOUTS, pack_files
from ..report import table
from .tokenize import (
    add_inputs_and_output,
    add_ray_argument,
    add_tokenizer_arguments,
    tokenize_options,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inputs_and_output(parser, "files, directories or globs", "OUT_DIR")
    parser.add_argument("--max-len", type=int, default=4096, help="row capacity (default 4096)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="bfd")
    parser.add_argument("--tokens-column", default="input_ids")
    parser.add_argument(
        "--labels-column", default="labels", help="used when present (-100 = not trained on)"
    )
    parser.add_argument("--loss-mask-column", default=None, help="0/1 column instead of labels")
    parser.add_argument("--overlong", choices=OVERLONG_POLICIES, default="error")
    parser.add_argument(
        "--pair-layout",
        choices=PAIR_LAYOUTS,
        default="separate",
        help="preference pairs: chosen then rejected, each whole (separate, the default), or "
        "the prompt once then both completions (shared-prompt)",
    )
    parser.add_argument(
        "--carry",
        nargs="+",
        default=None,
        metavar="COLUMN",
        help="scalar per-sample columns kept as per-segment lists (KTO's label always is)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rows-per-shard", type=int, default=16384)
    parser.add_argument("--row-group-rows", type=int, default=1024)
    parser.add_argument("--compression", default="zstd", help="zstd[:LEVEL], snappy, lz4, none")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument(
        "--verify-cache",
        action="store_true",
        help="before a cache hit, check the shards' checksums (sizes are always checked)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    parser.add_argument(
        "--spill-dir",
        default=None,
        help="existing directory (another disk) for the spill files, ~2.1 bytes per token "
        "(default: next to OUTPUT); tokpack works in a subdirectory it creates and removes",
    )
    add_ray_argument(parser, "pack on a Ray cluster (tokpack.ray.pack; Parquet inputs)")
    parser.add_argument(
        "--ray-mode",
        choices=("global", "local"),
        default="global",
        help="with --ray: global (byte-identical to tokpack pack) or local (per block group)",
    )
    raw = parser.add_argument_group(
        "one step from raw data (with --tokenizer: tokenize JSONL / Parquet chat or text data "
        "and pack it in the same run, see `tokpack tokenize`)"
    )
    add_tokenizer_arguments(raw, required=False)


def summary(manifest: Dict[str, Any]) -> str:
    """The end-of-run table: samples, rows, efficiency, padding saved, time."""
    f = manifest["figures"]
    saved = f["padding_tokens_unpacked"] - f["padding_tokens"]
    unpacked = f["padding_tokens_unpacked"] + f["tokens"]
    rows = [
        ["samples in", f"{f['samples_in']:,}"],
        [
            "packed / truncated / split / dropped",
            f"{f['samples_packed']:,} / {f['samples_truncated']:,} / "
            f"{f['samples_split']:,} / {f['samples_dropped']:,}",
        ],
        ["rows (lower bound)", f"{f['rows']:,} ({f['lower_bound']:,})"],
        ["tokens", f"{f['tokens']:,}"],
        ["efficiency", f"{f['efficiency']:.4f}"],
        [
            "padding saved vs one sample per row",
            f"{saved:,} tokens ({saved / max(unpacked, 1):.1%})",
        ],
        ["shards", f"{len(manifest['shards'])}"],
        ["wall time", f"{f['wall_time_s']:.1f} s"],
    ]
    return table(["figure", "value"], rows)


def run(args: argparse.Namespace) -> int:
    if args.ray is not None:
        from ..ray._cli import pack_command

        manifest = pack_command(args)
    else:
        manifest = _pack_here(args)
    if manifest["rebuilt_because"]:
        print(
            f"{args.output} was up to date but damaged ({manifest['rebuilt_because']}): rebuilt",
            file=sys.stderr,
        )
    if manifest["cache_hit"]:
        print(
            f"{args.output} is up to date (cache hit: same inputs and config); nothing to do. "
            "Pass --force to rebuild.",
            file=sys.stderr,
        )
    if not args.quiet:
        print(summary(manifest))
    return 0


def packing_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The packing keywords of ``pack`` (here and ``--ray``) from its flags."""
    return {name: getattr(args, name) for name in PACKING_OPTIONS}


def _pack_here(args: argparse.Namespace) -> Dict[str, Any]:
    return pack_files(
        args.inputs,
        args.output,
        args.max_len,
        **packing_options(args),
        threads=args.threads,
        force=args.force,
        progress=not args.quiet,
        tokenizer=args.tokenizer,
        tokenize=tokenize_options(args) if args.tokenizer else None,
        verify_cache=args.verify_cache,
        pair_layout=args.pair_layout,
        carry=args.carry,
        spill_dir=args.spill_dir,
    )
