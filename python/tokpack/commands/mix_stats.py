"""``tokpack mix-stats``: what one epoch of a weighted mixture of packed directories delivers
(``tokpack.mixture_stats``; no torch needed)."""

from __future__ import annotations

import argparse
import json
from typing import Dict, Union

from ..errors import ConfigError
from ..packed.mixture import STOPS, WEIGHT_UNITS, mixture_stats


def _pairs(text: str, what: str) -> Dict[str, str]:
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    bad = [p[0] for p in pairs if len(p) != 2 or not p[0]]
    if bad or not pairs:
        raise ConfigError(f"{what} must be NAME=VALUE[,NAME=VALUE...], got {text!r}")
    out: Dict[str, str] = {}
    for name, value in pairs:
        if name in out:
            raise ConfigError(f"{what} gives {name!r} twice ({name}={out[name]}, {name}={value})")
        out[name] = value
    return out


def _numbers(text: str, what: str) -> Dict[str, float]:
    out = {}
    for name, value in _pairs(text, what).items():
        try:
            out[name] = float(value)
        except ValueError:
            raise ConfigError(f"{what}: {name}={value!r} is not a number") from None
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources", metavar="NAME=DIR", nargs="+", help="the packed directories, by name"
    )
    parser.add_argument(
        "--weights", required=True, help="NAME=WEIGHT,... (one per source, any positive scale)"
    )
    parser.add_argument(
        "--weight-unit", choices=WEIGHT_UNITS, default="rows", help="weights of rows or tokens"
    )
    parser.add_argument(
        "--epochs-per-source",
        default="1",
        help="each source's budget per mixture epoch, in its epochs: N, or NAME=N,... (default 1)",
    )
    parser.add_argument("--stop", choices=STOPS, default="first", help="when an epoch ends")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch", type=int, default=0, help="which epoch (default 0)")
    parser.add_argument(
        "--rows", type=int, default=None, help="the first N rows instead of one epoch"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    sources = _pairs(",".join(args.sources), "NAME=DIR")
    epochs: Union[float, Dict[str, float]]
    try:
        epochs = float(args.epochs_per_source)
    except ValueError:
        epochs = _numbers(args.epochs_per_source, "--epochs-per-source")
    stats = mixture_stats(
        sources,
        _numbers(args.weights, "--weights"),
        weight_unit=args.weight_unit,
        epochs_per_source=epochs,
        stop=args.stop,
        seed=args.seed,
        epoch=args.epoch,
        rows=args.rows,
    )
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    span = f"first {args.rows:,} rows" if args.rows is not None else f"epoch {args.epoch}"
    print(
        f"{span} (stop={args.stop}): {stats['rows']:,} rows, {stats['tokens']:,} tokens,"
        f" {stats['loss_terms']:,} loss tokens, {stats['samples']:,} samples"
        f" (schedule period {stats['period']:,} rows)"
    )
    print("  ".join(f"{h:>12}" for h in ("source", *(c[0] for c in _COLUMNS))))
    for name, s in stats["sources"].items():
        cells = [name] + [format(s[key], spec) for _, key, spec in _COLUMNS]
        print("  ".join(f"{c:>12}" for c in cells))
    return 0


# The table's columns after the source name: (header, figure, format).
_COLUMNS = (
    ("weight", "weight", ".4f"),
    ("rows", "rows", ","),
    ("row share", "row_share", ".4f"),
    ("tokens", "tokens", ","),
    ("token share", "token_share", ".4f"),
    ("loss tokens", "loss_terms", ","),
    ("epochs", "epochs", ".3f"),
)
