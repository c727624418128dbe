"""Packed directories on object storage (``s3://``, ``gs://``, ``abfs://``, ``hf://``, or a
path on a ``pyarrow.fs`` / fsspec ``filesystem=``), read through a bounded local cache.

:func:`open_packed` opens a directory wherever it is; the torch readers, ``tokpack.verify`` and
``tokpack inspect`` take URIs through it. :func:`counters` tells what this process fetched.

This is the public face: the packed directory on object storage is ``packed.remote``'s
(``RemotePackedDir``, a ``PackedDir`` whose shards are fetched by range), the bytes beneath it
``_io``'s (``fetch``: ranged GETs, retries, counters; ``rangecache``: the node-shared cache).
"""

from __future__ import annotations

from .._io.fetch import counters
from .._io.rangecache import cache_counters
from .._io.rangecache import usage as cache_usage
from .._io.uri import is_remote, local_path, store_of  # noqa: F401 (the URI helpers, unlisted)
from ..packed.remote import DEFAULT_CACHE_LIMIT, RemotePackedDir, default_cache_dir, open_packed

__all__ = [
    "DEFAULT_CACHE_LIMIT",
    "RemotePackedDir",
    "cache_counters",
    "cache_usage",
    "counters",
    "default_cache_dir",
    "open_packed",
]
