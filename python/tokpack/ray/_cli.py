"""``tokpack pack ... --ray [ADDRESS]``: the command's inputs read by Ray Data and packed with
:func:`tokpack.ray.pack` on the cluster at ADDRESS (``auto``: the running one; none: a new local
one), into a directory or an object-store URI (``-o s3://bucket/packed``)."""

from __future__ import annotations

import argparse
import logging
from typing import Any, Dict

import ray
import ray.data

from .._inputs import TOKEN_SUFFIXES, is_parquet, resolve_inputs
from .._outdir import output_target
from ..commands.pack import packing_options
from ..errors import ConfigError
from ._pack import pack
from ._store import local_path


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
    # An object-store OUT (s3://...) cannot overlap local inputs; a local one (a path or a
    # file:// URI) is checked.
    local = local_path(args.output)
    out = None if local is None else output_target(local)
    paths = resolve_inputs(args.inputs, TOKEN_SUFFIXES, output_dir=out)
    others = [str(p) for p in paths if not is_parquet(p)]
    if others:
        raise ConfigError(f"--ray reads Parquet token shards only, not {others[0]}")
    connect(args.ray, args.quiet)
    ds = ray.data.read_parquet([str(p) for p in paths], include_paths=True)
    manifest = pack(
        ds,
        args.output,
        args.max_len,
        mode=args.ray_mode,
        **packing_options(args),
    )
    return {**manifest, "cache_hit": False, "rebuilt_because": None}
