"""``tokpack verify``'s checks of tree rows (``tokpack.packed.tree_integrity``), on row groups
as the reader decodes them (list columns as values and offsets) made of the tree kind's
contract rows: consistent rows pass; each kind of damage is found, naming its row and column."""

import numpy as np
import pytest

from tokpack.packed.tree_integrity import tree_problem
from tokpack.tree import pack_trees

from .tree_packed_rows import rows_of

SCALARS = ("num_tokens", "num_seqs", "num_loss_tokens")


def group_of(rows):
    """The decoded row group of ``rows``: list columns as (values, offsets), counts as arrays."""
    cols = {}
    for name in rows[0]:
        if name in SCALARS:
            cols[name] = np.array([r[name] for r in rows], dtype=np.int32)
            continue
        parts = [np.asarray(r[name]) for r in rows]
        offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
        cols[name] = (np.concatenate(parts), offsets)
    return cols


def sample_rows():
    rng = np.random.default_rng(7)
    seqs, labels, group = [], [], []
    for g in range(4):
        prompt = rng.integers(0, 5, int(rng.integers(3, 7))).tolist()
        for k in range(4):
            out = rng.integers(0, 5, int(rng.integers(1, 6))).tolist()
            if k % 2:
                out = seqs[-1][len(prompt) :][:2] + out
            seqs.append(prompt + out)
            labels.append([-100] * len(prompt) + out)
            group.append(g)
    batch = pack_trees(seqs, labels, groups=group, max_tokens=14)
    assert batch["tree_stats"].split_trees >= 1
    return rows_of(batch)


def test_consistent_rows_pass():
    rows = sample_rows()
    assert tree_problem(group_of(rows)) is None
    assert tree_problem(group_of(rows[1:])) is None


def damaged(rows, row, name, change):
    out = [dict(r) for r in rows]
    out[row][name] = change(np.array(out[row][name]))
    return out


def bump(k, by=1):
    def change(a):
        a = a.copy()
        a[k] += by
        return a

    return change


DAMAGE = [
    ("tree_node", bump(-1), "tree_node"),
    ("tree_node_len", bump(0), "tree_node_tin"),
    ("tree_node_tin", bump(1), "tree_node_tin"),
    ("tree_node_tout", bump(0, -1), "tree_node_tout"),
    ("tree_node_depth", bump(-1), "tree_node_depth"),
    ("tree_node_parent", lambda a: np.append(a[:-1], a.size), "tree_node_parent"),
    ("tree_seq_end_node", bump(0, 100), "tree_seq_end_node"),
    ("seq_lengths", bump(0), "seq_lengths"),
    ("sample_ids", lambda a: a[::-1].copy(), "sample_ids"),
    ("seq_loss_tokens", bump(0), "tree_target_pred"),
    ("num_loss_tokens", None, "num_loss_tokens"),
    ("tree_target_pred", bump(0, 1000), "tree_target_pred"),
    ("tree_pred_pos", bump(0, 10_000), "tree_pred_pos"),
    ("tree_pred_weight", bump(0), "tree_pred_weight"),
    ("tree_pred_token", bump(0, 1), "tree_pred_token"),
    ("tree_target_pred", lambda a: a[::-1].copy(), None),
    # One entry short: named beside the column it disagrees with.
    ("tree_node_parent", lambda a: a[:-1], "tree_node_depth"),
]


@pytest.mark.parametrize("name,change,column", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damage_is_found_naming_row_and_column(name, change, column):
    rows = sample_rows()
    r = 1
    if name == "num_loss_tokens":
        rows = [dict(x) for x in rows]
        rows[r]["num_loss_tokens"] += 1
    else:
        rows = damaged(rows, r, name, change)
    found = tree_problem(group_of(rows))
    assert found is not None, name
    row, got_column, what = found
    assert row == r
    if column is not None:
        assert got_column == column, what
