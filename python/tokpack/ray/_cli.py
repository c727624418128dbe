"""``tokpack pack ... --ray [ADDRESS]``: the command's inputs read by Ray Data and packed with
:func:`tokpack.ray.pack` on the cluster at ADDRESS (``auto``: the running one; none: a new local
one), into a directory or an object-store URI (``-o s3://bucket/packed``)."""

from __future__ import annotations

import argparse
import logging
from typing import Any, Dict

import ray
import ray.data

from .. import pack_config
from .._inputs import TOKEN_SUFFIXES, is_parquet, resolve_inputs
from .._outdir import output_target
from ..errors import ConfigError
from ._pack import SUPPORTED, pack
from ._store import store_of


def connect(address: str, quiet: bool) -> None:
    if not ray.is_initialized():
        ray.init(address=address or None, logging_level=logging.WARNING, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = not quiet


def pack_command(args: argparse.Namespace) -> Dict[str, Any]:
    if args.tokenizer:
        raise ConfigError(
            "--ray packs token shards; tokenize first (tokpack tokenize --ray, or "
            "tokpack.ray.tokenize), then pack them"
        )
    config = pack_config.from_args(args)
    config.refuse_unsupported("pack --ray", SUPPORTED)  # before any work
    # An object-store OUT (s3://...) cannot overlap local inputs; a local one is checked.
    out = None if store_of(args.output) is not None else output_target(args.output)
    paths = resolve_inputs(args.inputs, TOKEN_SUFFIXES, output_dir=out)
    others = [str(p) for p in paths if not is_parquet(p)]
    if others:
        raise ConfigError(f"--ray reads Parquet token shards only, not {others[0]}")
    connect(args.ray, args.quiet)
    ds = ray.data.read_parquet([str(p) for p in paths], include_paths=True)
    manifest = pack(ds, args.output, mode=args.ray_mode, config=config)
    return {**manifest, "cache_hit": False, "rebuilt_because": None}
