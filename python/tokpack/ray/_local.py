"""``mode="local"``: runs of consecutive blocks holding at least ``min_block_samples`` samples are
packed on their own, each by one task that plans its samples and writes its shards; the driver
holds one number per block, never a number per sample, so corpora of any size fit it.

Each group's last row may be partly empty where a global plan would have filled it, so local
mode costs rows against the global plan; README gives the measured cost by group size.
Shards are numbered in group order once every group is done (a group's shard count is known only
after it planned): a task publishes ``.group-<g>/part-<k>.parquet`` and the driver renames them
(on object storage, a server-side copy).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import ray

from .. import _tokpack
from .._contract import OVERLONG_HINT
from .._io.store import Out
from ..errors import DataError, OverlongError, TokpackError
from ..pack.config import PackConfig, PackReport
from ..pack.plan import plan as make_plan
from ._blocks import (
    Columns,
    Unit,
    block_error,
    cancelling,
    dataset_source,
    read_block,
    sample_arrays,
)
from ._shards import Rows, accounting, shard_ranges, write_shard

GROUP_PREFIX = ".group-"


@ray.remote
def _rows(table: pa.Table) -> int:
    return table.num_rows


@ray.remote
def _pack_group(
    out: Out,
    group: int,
    base: int,
    columns: Columns,
    config: PackConfig,
    *tables: pa.Table,
) -> Any:
    """Plans and writes one group's shards under ``.group-<group>/`` of ``out``; returns the
    group's report (ids global), or the TokpackError its data raised. ``tables`` are blocks of
    a dataset or units of files."""
    table = pa.concat_tables([read_block(t, columns) for t in tables])
    try:
        tokens, offsets, labels, carried = sample_arrays(table, columns)
        lengths = np.diff(offsets)
        too_long: Any = (
            np.flatnonzero(lengths > config.max_len) if config.overlong == "error" else []
        )
        if len(too_long):
            k = int(too_long[0])
            # The planner would name the sample by its index in the group, not in the dataset.
            raise OverlongError(
                f"sample {base + k} has {int(lengths[k])} tokens, more than "
                f"max_len={config.max_len}; {OVERLONG_HINT}"
            )
        plan = make_plan(lengths, config=config)
    except TokpackError as exc:
        return exc
    # Each file is published whole: a retried or duplicated group puts the same bytes in place.
    ids = np.arange(len(offsets) - 1, dtype=np.int64) + base
    held = (ids, offsets, tokens, labels, carried)
    dest = f"{GROUP_PREFIX}{group}"
    shards = [
        write_shard(out, k, Rows.of(plan, a, b, base), held, config, labels is not None, dest)
        for k, (a, b) in enumerate(shard_ranges(plan.n_bins, config.rows_per_shard))
    ]
    return accounting(plan, config, shards, [len(lengths)], labels is not None, base)


def groups_of(sizes: List[int], min_block_samples: int) -> List[Tuple[int, int]]:
    """Runs of consecutive blocks holding at least ``min_block_samples`` samples each (the last
    run joins the one before when it is smaller)."""
    groups: List[Tuple[int, int]] = []
    start, held = 0, 0
    for j, n in enumerate(sizes):
        held += n
        if held >= min_block_samples:
            groups.append((start, j + 1))
            start, held = j + 1, 0
    if start < len(sizes):
        if groups and held < min_block_samples:
            groups[-1] = (groups[-1][0], len(sizes))
        else:
            groups.append((start, len(sizes)))
    return groups


def pack_local(
    refs: List[Any],
    columns: Columns,
    config: PackConfig,
    out: Out,
    min_block_samples: int,
    sources: Optional[Tuple[List[str], List[int]]] = None,
) -> Tuple[PackReport, List[str]]:
    """Packs group by group into ``out``; returns the merged report with the shards renamed
    ``part-NNNNN`` in group order, and the inputs' paths: ``sources`` (files and their rows),
    else the dataset as one input."""
    units = bool(refs) and isinstance(refs[0], Unit)
    sizes = [u.rows for u in refs] if units else ray.get([_rows.remote(ref) for ref in refs])
    if sum(sizes) == 0:
        raise DataError("the inputs hold no samples")
    groups = groups_of(sizes, min_block_samples)
    bases = np.cumsum([0, *sizes], dtype=np.int64)
    with cancelling([]) as tasks:
        tasks += [
            _pack_group.remote(out, g, int(bases[a]), columns, config, *refs[a:b])
            for g, (a, b) in enumerate(groups)
        ]
        results = ray.get(tasks)
    for (a, _), result in zip(groups, results):
        if isinstance(result, TokpackError):
            # (A group's rows count from its first block's.)
            raise block_error(result, refs[a], a, int(bases[a]))
    paths, rows = sources or dataset_source(int(bases[-1]))
    return _merge(results, out, rows), paths


def _merge(results: List[PackReport], out: Out, input_rows: List[int]) -> PackReport:
    """Renames the groups' shards ``part-NNNNN`` in order. A group whose samples were all
    dropped wrote one empty shard: it is kept only when every group is empty (as ``pack_files``
    writes one empty shard then, to carry the schema)."""
    written = [(g, info) for g, r in enumerate(results) for info in r.shards]
    kept = [(g, info) for g, info in written if info["rows"] > 0] or written[:1]
    shards: List[Dict[str, Any]] = []
    for s, (g, info) in enumerate(kept):
        named = {**info, "file": _tokpack.shard_name(s), "index": _tokpack.index_name(s)}
        for key in ("file", "index"):
            out.move(f"{GROUP_PREFIX}{g}/{info[key]}", named[key])
        shards.append(named)
    for g in range(len(results)):
        out.remove(f"{GROUP_PREFIX}{g}")
    return PackReport.merge(results, shards, input_rows)
