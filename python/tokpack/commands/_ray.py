"""``tokpack pack ... --ray [ADDRESS]``: the command's inputs packed with :func:`tokpack.ray.pack`
on a Ray cluster, into a directory or an object-store URI (``-o s3://bucket/packed``).

ADDRESS: none starts a new local cluster for the run (never joins another: not
``RAY_ADDRESS``, not the latest ``ray start``); ``auto`` joins the running one (``ray start``,
or ``RAY_ADDRESS``); ``HOST:PORT`` or ``ray://HOST:PORT`` joins that one. A failure on Ray's
side (cannot connect, the cluster or a node went away) is one ``tokpack`` error line."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading
from typing import Any, Dict, Iterator

import ray
import ray.data

from ..errors import ClusterError, TokpackError
from ..pack import config as pack_config
from ..ray._pack import pack


@contextlib.contextmanager
def on_cluster(address: str, quiet: bool) -> Iterator[None]:
    """Connected to the cluster of ``--ray ADDRESS`` for the block; Ray's errors become a
    ClusterError naming what failed."""
    try:
        if not ray.is_initialized():
            _init(address or "local")
        ray.data.DataContext.get_current().enable_progress_bars = not quiet
        yield
    except TokpackError:
        raise  # (a task's TokpackError comes back as a RayTaskError that is one too)
    except (ray.exceptions.RayError, ConnectionError) as exc:
        where = "a new local cluster" if not address else f"the cluster at {address!r}"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterError(f"Ray failed on {where}: {first}") from None


def _init(address: str) -> None:
    # Ray's driver installs its own SIGTERM handler (a stack dump, then abort: exit 134);
    # tokpack's (cleanup, "terminated", exit 143) is put back.
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def pack_command(args: argparse.Namespace) -> Dict[str, Any]:
    with on_cluster(args.ray, args.quiet):
        manifest = pack(
            args.inputs,
            args.output,
            mode=args.ray_mode,
            config=pack_config.from_args(args),
            threads=args.threads,
            tokenizer=args.tokenizer,
            spill_dir=args.spill_dir,
        )
    return {**manifest, "cache_hit": False, "rebuilt_because": None}
