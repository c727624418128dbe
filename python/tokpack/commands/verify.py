"""``tokpack verify``: check that a packed directory is intact (``tokpack.verify``)."""

from __future__ import annotations

import argparse
import os

from ..packed.export import MARKER_SUFFIX, check_megatron
from ..packed.integrity import verify


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "output",
        metavar="OUT_DIR",
        help="a packed directory, or the PREFIX of `tokpack export megatron` (PREFIX.bin and "
        "PREFIX.idx checked against PREFIX.tokpack.json)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="check the manifest, shard presence and sizes, side files and figures only "
        "(no checksums, no decoding)",
    )


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.output) and os.path.exists(args.output + MARKER_SUFFIX):
        marker = check_megatron(args.output)
        print(f"{args.output}: intact ({', '.join(sorted(marker['files']))} match their checksums)")
        return 0
    report = verify(args.output, full=not args.quick)
    checked = "checksums, decoding and " if report["full"] else ""
    print(
        f"{args.output}: intact ({report['shards']} shards, {report['row_groups']} row groups, "
        f"{report['rows']:,} rows, {report['bytes']:,} bytes; {checked}side files checked)"
    )
    return 0
