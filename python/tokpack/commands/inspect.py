"""``tokpack inspect``: the manifest figures of a packed directory and a few rows with their
sample boundaries."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

from .._contract import SEGMENT_ROLES
from .._io.manifest import cache_problem
from .._io.tables import table
from ..errors import ConfigError, CorruptOutputError
from ..kinds import KINDS
from ..multimodal.stats import (
    PATCHES,
    render_row_patches,
    row_patch_figures,
    row_vision_patches,
)
from ..packed.reader import PackedDir
from ..packed.shuffle_quality import DEFAULT_BATCH_ROWS, DEFAULT_SHUFFLE_WINDOW, shuffle_quality
from ..remote import open_packed
from ..stats.estimate import check_options
from .stats import add_step_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", metavar="OUT_DIR")
    parser.add_argument("--rows", type=int, default=3, help="rows to show (default 3)")
    add_step_arguments(parser)
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=DEFAULT_BATCH_ROWS,
        help="rows per batch of the shuffle-quality figure (default %(default)s)",
    )
    parser.add_argument(
        "--shuffle-window",
        type=int,
        default=DEFAULT_SHUFFLE_WINDOW,
        help="PackedIterableDataset's shuffle_window for the shuffle-quality figure "
        "(default %(default)s, the reader's)",
    )


def run(args: argparse.Namespace) -> int:
    if args.world_size or args.batch_size:
        if args.batch_size is None or args.world_size is None:
            raise ConfigError("give --world-size and --batch-size together")
        check_options("split", args.batch_size, args.world_size)
    out = args.output
    packed = open_packed(out)
    manifest = packed.manifest
    # On object storage, shards are checked as they are read (a listing per shard is not made).
    problem = None if packed.remote else cache_problem(out, manifest)
    if problem is not None:
        raise CorruptOutputError(f"{problem} (run `tokpack verify {out}` for a full check)")
    c, f = manifest["config"], manifest["figures"]
    print(
        f"{out}: {len(manifest['shards'])} shards, max_len {c['max_len']}, strategy "
        f"{c['strategy']}, row order {c.get('row_order', 'plan')}, overlong {c['overlong']}, "
        f"labels {manifest['has_labels']}, "
        f"tokpack {manifest['tokpack_version']}\n"
    )
    print(
        table(
            ["figure", "value"], [[k, f"{v:,}" if isinstance(v, int) else v] for k, v in f.items()]
        )
    )
    quality = shuffle_quality(
        packed, batch_rows=args.batch_rows, shuffle_window=args.shuffle_window
    )
    print("\n" + "\n".join(quality.lines()))
    if PATCHES in packed.carried:
        print("\nvision-encoder patches per row (a second cost to balance rows on):")
        print(render_row_patches(row_patch_figures(row_vision_patches(packed))))
    if args.world_size or args.batch_size:
        print(_step_imbalance(packed, args.batch_size, args.world_size))
    for file, row in itertools.islice(_rows(packed), max(args.rows, 0)):
        ids = row["input_ids"]
        roles = row.get("seq_roles") or [0] * len(row["seq_lengths"])
        print(
            f"\n{file}: {row['num_tokens']} tokens ({row['num_loss_tokens']} trained on), "
            f"{len(row['seq_lengths'])} {'segments' if row.get('seq_roles') else 'samples'}"
        )
        if KINDS[packed.kind].trees:
            _print_tree_row(row)
            continue
        pos = 0
        for n, s, role in zip(row["seq_lengths"], row["sample_ids"], roles):
            head = " ".join(map(str, ids[pos : pos + min(n, 8)]))
            what = f"pair {s} {SEGMENT_ROLES[role]}" if role else f"sample {s}"
            print(f"  [{pos:>6}:{pos + n:<6}] {what}: {head}{' ...' if n > 8 else ''}")
            pos += n
    return 0


TREE_SHOWN = ("tree_node_parent", "tree_node_tin", "tree_node_len", "tree_seq_end_node")


def _print_tree_row(row: Dict[str, Any]) -> None:
    """A prefix-tree row's sequences: each one's path of nodes (a shared node once in the row)
    and its first tokens, followed from its end node to the root."""
    ids, parent = row["input_ids"], row["tree_node_parent"]
    for n, s, end in zip(row["seq_lengths"], row["sample_ids"], row["tree_seq_end_node"]):
        chain = [end]
        while parent[chain[-1]] >= 0:
            chain.append(parent[chain[-1]])
        path = [
            t
            for k in reversed(chain)
            for t in ids[row["tree_node_tin"][k] :][: row["tree_node_len"][k]]
        ]
        head = " ".join(map(str, path[:8]))
        print(f"  sample {s}: {n} tokens, nodes {chain[::-1]}: {head}{' ...' if n > 8 else ''}")


def _rows(packed: PackedDir) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(shard file, row) of every packed row, read one row group at a time through the checked
    reader (a damaged shard is reported, not shown)."""
    cols = ["input_ids", "seq_lengths", "sample_ids", "num_tokens", "num_loss_tokens"]
    cols += ["seq_roles"] if KINDS[packed.kind].paired else []
    cols += list(TREE_SHOWN) if KINDS[packed.kind].trees else []
    for group in range(packed.num_groups):
        file = Path(packed.shard_paths[int(packed.group_shard[group])]).name
        decoded = packed.decode(group, cols)
        for r in range(int(packed.group_rows[group])):
            row = {}
            for name, col in decoded.items():
                if isinstance(col, tuple):
                    values, offsets = col
                    row[name] = values[offsets[r] : offsets[r + 1]].tolist()
                else:
                    row[name] = col[r].item()
            yield file, row


def _step_imbalance(packed: PackedDir, batch_size: int, world_size: int) -> str:
    from ..balance.packed import row_compute, step_imbalance
    from ..stats.estimate import COMPUTE_COST

    figures = step_imbalance(row_compute(packed, COMPUTE_COST), batch_size, world_size)
    if figures is None:
        return f"\nfewer rows than one step of {batch_size:,}: no step imbalance"
    return (
        f"\ncompute imbalance per step (max / mean rank compute, 24576·L + L² per segment, "
        f"mean over steps of {batch_size:,} shuffled rows over {world_size} ranks): "
        f'{figures[0]:.4f} as dealt, {figures[1]:.4f} with balance="compute"'
    )
