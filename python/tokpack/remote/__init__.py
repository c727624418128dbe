"""Packed directories on object storage (``s3://``, ``gs://``, ``abfs://``, ``hf://``, or a
path on a ``pyarrow.fs`` / fsspec ``filesystem=``), read through a bounded local cache.

:func:`open_packed` opens a directory wherever it is; the torch readers, ``tokpack.verify`` and
``tokpack inspect`` take URIs through it. :func:`counters` tells what this process fetched.
"""

from __future__ import annotations

from .._io.uri import is_remote, local_path, store_of
from ._cache import cache_counters
from ._cache import usage as cache_usage
from ._fetch import counters
from ._packed import DEFAULT_CACHE_LIMIT, RemotePackedDir, default_cache_dir, open_packed

__all__ = [
    "DEFAULT_CACHE_LIMIT",
    "RemotePackedDir",
    "cache_counters",
    "cache_usage",
    "counters",
    "default_cache_dir",
    "is_remote",
    "local_path",
    "open_packed",
    "store_of",
]
