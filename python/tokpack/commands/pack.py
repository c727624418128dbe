"""``tokpack pack``: pack token shards on disk into packed Parquet shards (``pack_files``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List

from .._io.tables import table
from ..pack import config as pack_config
from ..pack.files import pack_files
from ..tokenize import options as tokenize_options
from .tokenize import add_inputs_and_output, add_ray_argument, add_tokenizer_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inputs_and_output(parser, "files, directories or globs", "OUT_DIR")
    pack_config.add_arguments(parser)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--verify-cache",
        action="store_true",
        help="before a cache hit, check the shards' checksums (sizes are always checked)",
    )
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
        *_tree_rows(f),
        ["shards", f"{len(manifest['shards'])}"],
        ["wall time", f"{f['wall_time_s']:.1f} s"],
    ]
    return table(["figure", "value"], rows)


def _tree_rows(f: Dict[str, Any]) -> List[List[str]]:
    """Prefix trees' lines of the summary: what sharing saved against packing flat."""
    if "tree_forward_tokens" not in f:
        return []
    return [
        ["sequences / tree nodes / pieces", f"{f['tree_sequences']:,} / {f['tree_nodes']:,} / "
         f"{f['tree_pieces']:,}"],
        [
            "forward tokens vs flat (rows)",
            f"{f['tree_forward_tokens']:,} vs {f['tree_flat_tokens']:,} "
            f"({f['tree_token_ratio']:.3f}; rows {f['rows']:,} vs {f['tree_flat_rows']:,})",
        ],
    ]


def run(args: argparse.Namespace) -> int:
    if args.ray is not None:
        from ._ray import pack_command

        manifest = pack_command(args)
    else:
        manifest = pack_files(
            args.inputs,
            args.output,
            config=pack_config.from_args(args),
            threads=args.threads,
            force=args.force,
            progress=not args.quiet,
            tokenizer=args.tokenizer,
            tokenize=tokenize_options.from_args(args) if args.tokenizer else None,
            verify_cache=args.verify_cache,
            spill_dir=args.spill_dir,
        )
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
