"""``tokpack verify``: check that a packed directory is intact (``tokpack.verify``)."""

from __future__ import annotations

import argparse

from ..integrity import verify


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", metavar="OUT_DIR")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="check the manifest, shard presence and sizes, side files and figures only "
        "(no checksums, no decoding)",
    )


def run(args: argparse.Namespace) -> int:
    report = verify(args.output, full=not args.quick)
    checked = "checksums, decoding and " if report["full"] else ""
    print(
        f"{args.output}: intact ({report['shards']} shards, {report['row_groups']} row groups, "
        f"{report['rows']:,} rows, {report['bytes']:,} bytes; {checked}side files checked)"
    )
    return 0
