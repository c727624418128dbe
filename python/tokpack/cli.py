"""The ``tokpack`` command line. Every subcommand lives in ``tokpack/commands/<name>.py`` with an
``add_arguments(parser)`` and a ``run(args) -> int``, and calls the same Python API users import."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from . import __version__
from .errors import TokpackError

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS = {
    "demo": ("tokpack.commands.demo", "pack a built-in synthetic SFT corpus and print the figures"),
    "pack": ("tokpack.commands.pack", "pack Parquet / Arrow IPC token shards into packed shards"),
    "stats": ("tokpack.commands.stats", "length distribution and packing efficiency of shards"),
    "inspect": ("tokpack.commands.inspect", "figures and a few rows of a packed directory"),
    "verify": (
        "tokpack.commands.verify",
        "check that a packed directory is intact (exit 2 if not)",
    ),
    "tokenize": ("tokpack.commands.tokenize", "chat / instruction / text files to token shards"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokpack", description="Sequence packing for LLM fine-tuning."
    )
    parser.add_argument("--version", action="version", version=f"tokpack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(cmd)
        cmd.set_defaults(_module=module)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except TokpackError as exc:
        print(f"tokpack {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tokpack {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
