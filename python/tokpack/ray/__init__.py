"""``tokpack.ray``: tokenize and pack on a Ray cluster (Ray Data), writing the packed-directory
format that ``PackedDataset``, ``inspect`` and ``verify`` read.

- :func:`pack` (``mode="global"``): the driver plans the whole corpus from its lengths with the
  Rust planner; Ray tasks write the shards with tokpack's Rust writer, so for the same inputs and
  config the shards are byte-identical to ``tokpack pack``'s, whatever the cluster or blocks.
- :func:`pack` (``mode="local"``): runs of blocks of at least ``min_block_samples`` samples are
  packed on their own (for corpora whose lengths do not fit the driver), at a small row cost.
- :func:`tokenize`: a ``map_batches`` stage with ``tokpack tokenize``'s ids and labels.
- :class:`RayRunner`: ``tokpack tokenize``'s own run (``tokenize_files(..., runner=...)``,
  ``tokpack tokenize --ray``) with its chunks encoded by Ray tasks: the same output.
- :func:`read_packed`: a packed directory as a ``ray.data.Dataset`` (one row per packed row);
  :func:`rows_collate` adapts ``PackedCollator`` to ``iter_torch_batches``.

OUT is committed atomically as by ``tokpack pack``: written into a temporary directory next to
it and renamed into place when complete, so every node must see it at the same path (a local
file system for a one-machine cluster, else a shared one such as NFS). On object storage
(``s3://...``, or ``filesystem=``) the manifest, written last, is the commit marker.
"""

from __future__ import annotations

try:
    import ray  # noqa: F401
    import ray.data  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without ray installed
    raise ImportError("tokpack.ray needs Ray Data: pip install 'tokpack[ray]'") from exc

from ._pack import pack, read_packed, rows_collate
from ._runner import RayRunner
from ._tokenize import tokenize

__all__ = ["pack", "read_packed", "rows_collate", "tokenize", "RayRunner"]
