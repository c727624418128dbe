"""What ``tokpack verify`` checks of a packed tree directory's rows (sample kind ``tree``), on a
decoded row group, whole columns at a time: the tree arrays of each row are one consistent
forest in DFS order, and every sequence's targets lie on its path.

Per row: the nodes tile the row's tokens in order (``tree_node_tin`` the running sum of
``tree_node_len``, each token's ``tree_node`` the node holding it), a parent comes before its
children, a root starts at position 0 and a child where its parent ends
(``tree_node_depth``), each node's interval ``[tin, tout)`` is exactly its subtree (so
intervals nest); per sequence, its end node is in the row and ``seq_lengths`` is its path;
``seq_loss_tokens`` split ``tree_target_pred`` and sum to ``num_loss_tokens``; each target is
a prediction of the row scored at a position of the sequence's path and naming the token that
follows there (the next token of the node, or a child's first token at a branch), targets in
path order; each prediction's weight is the number of targets naming it (at least 1).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..kinds import KINDS

__all__ = [
    "TREE_TOKEN_COLUMNS",
    "TREE_NODE_COLUMNS",
    "TREE_SEQ_COLUMNS",
    "TREE_TARGETS",
    "TREE_PRED_COLUMNS",
    "tree_problem",
]

# The tree kind's own shard columns (the core's, in its order; tests/test_contract.py pins the
# groups) by what they hold an entry per: token, node, sequence, target, prediction.
_TREE = KINDS["tree"].outputs
TREE_TOKEN_COLUMNS = _TREE[:1]  # tree_node
TREE_NODE_COLUMNS = _TREE[1:6]  # tree_node_{parent,depth,tin,tout,len}
TREE_SEQ_COLUMNS = _TREE[6:7]  # tree_seq_end_node
TREE_TARGETS = _TREE[7]  # tree_target_pred
TREE_PRED_COLUMNS = _TREE[8:]  # tree_pred_{pos,token,weight}
_PER_SEQ = ("sample_ids", "seq_loss_tokens", *TREE_SEQ_COLUMNS)
_PER_PRED = TREE_PRED_COLUMNS


class _Bad(Exception):
    """A problem found: (row of the group, column, what)."""


def _fail(row_of: np.ndarray, bad: np.ndarray, column: str, what: str) -> None:
    if bad.any():
        raise _Bad(int(row_of[int(np.argmax(bad))]), column, what)


def _list(cols: Dict[str, Any], name: str) -> Tuple[np.ndarray, np.ndarray]:
    values, offsets = cols[name]
    return np.asarray(values, dtype=np.int64), np.asarray(offsets, dtype=np.int64)


def _same_offsets(cols: Dict[str, Any], names, like: str, what: str) -> np.ndarray:
    want = np.asarray(cols[like][1], dtype=np.int64)
    for name in names:
        got = np.asarray(cols[name][1], dtype=np.int64)
        if not np.array_equal(got, want):
            r = int(np.argmax(np.diff(got) != np.diff(want)))
            raise _Bad(r, name, f"does not have one entry per {what} (as {like!r})")
    return want


def tree_problem(cols: Dict[str, Any]) -> Optional[Tuple[int, str, str]]:
    """``(row of the group, column, what is wrong)`` for the first inconsistency of a decoded
    row group of a tree directory, or None."""
    try:
        _check(cols)
    except _Bad as bad:
        return bad.args
    return None


def _level_sums(parent: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per node (global parents, -1 for roots, a parent before its children), the sum of
    ``values`` over its subtree: children's sums added to their parents, deepest level first."""
    level = np.zeros(parent.size, dtype=np.int64)
    has = parent >= 0
    while True:  # levels from the roots down: as many passes as the deepest path has nodes
        nxt = np.where(has, level[np.maximum(parent, 0)] + 1, 0)
        if np.array_equal(nxt, level):
            break
        level = nxt
    sums = values.astype(np.int64).copy()
    for d in range(int(level.max(initial=0)), 0, -1):
        at = np.flatnonzero(level == d)
        np.add.at(sums, parent[at], sums[at])
    return sums


def _check(cols: Dict[str, Any]) -> None:
    ids, tok_off = _list(cols, "input_ids")
    n_rows = tok_off.size - 1
    rows = np.arange(n_rows, dtype=np.int64)
    _same_offsets(cols, ("tree_node",), "input_ids", "token")
    node_off = _same_offsets(cols, TREE_NODE_COLUMNS[1:], TREE_NODE_COLUMNS[0], "node")
    seq_off = _same_offsets(cols, _PER_SEQ, "seq_lengths", "sequence")
    pred_off = _same_offsets(cols, _PER_PRED[1:], _PER_PRED[0], "prediction")
    n_tok, n_node, n_seq = np.diff(tok_off), np.diff(node_off), np.diff(seq_off)
    tok_row, node_row = np.repeat(rows, n_tok), np.repeat(rows, n_node)
    seq_row = np.repeat(rows, n_seq)
    parent, depth, tin, tout, length = (_list(cols, c)[0] for c in TREE_NODE_COLUMNS)
    # Nodes tile the row's tokens in order; each token names the node holding it.
    _fail(node_row, length < 1, "tree_node_len", "holds a node of no tokens")
    local = np.arange(node_row.size, dtype=np.int64) - node_off[:-1][node_row]
    cum = np.concatenate([[0], np.cumsum(length)])
    _fail(
        node_row,
        tin != cum[:-1] - cum[node_off[:-1]][node_row],
        "tree_node_tin",
        "is not where the node's tokens start (nodes in order, tiling the row)",
    )
    ends = cum[node_off[1:]] - cum[node_off[:-1]]
    _fail(rows, ends != n_tok, "tree_node_len", "does not sum to the row's tokens")
    node = _list(cols, "tree_node")[0]
    want_node = np.repeat(local, length) if length.size else np.zeros(0, np.int64)
    _fail(tok_row, node != want_node, "tree_node", "does not name the node holding the token")
    # Parents before children; roots at position 0, children where their parents end.
    _fail(
        node_row,
        (parent < -1) | (parent >= local),
        "tree_node_parent",
        "is not -1 or an earlier node of the row",
    )
    g_parent = np.where(parent >= 0, parent + node_off[:-1][node_row], -1)
    p = np.maximum(g_parent, 0)
    want_depth = np.where(g_parent >= 0, depth[p] + length[p], 0)
    _fail(
        node_row,
        depth != want_depth,
        "tree_node_depth",
        "is not where the node's path starts (0 for a root, its parent's end for a child)",
    )
    # Intervals: each node's is exactly its subtree, in DFS order.
    sub = _level_sums(g_parent, length)
    _fail(
        node_row,
        tout != tin + sub,
        "tree_node_tout",
        "does not end the node's subtree (nodes in DFS order, intervals nesting)",
    )
    # Sequences: an end node of the row, its path's length.
    end = _list(cols, "tree_seq_end_node")[0]
    _fail(
        seq_row,
        (end < 0) | (end >= n_node[seq_row]),
        "tree_seq_end_node",
        "is not a node of the row",
    )
    sample_ids = _list(cols, "sample_ids")[0]
    same_row = seq_row[1:] == seq_row[:-1]
    _fail(
        seq_row[1:],
        same_row & (np.diff(sample_ids) <= 0),
        "sample_ids",
        "is not ascending within the row",
    )
    g_end = end + node_off[:-1][seq_row]
    lengths = _list(cols, "seq_lengths")[0]
    _fail(
        seq_row,
        lengths != depth[g_end] + length[g_end],
        "seq_lengths",
        "is not the length of the sequence's path",
    )
    _check_targets(
        cols,
        rows,
        tok_off,
        node_off,
        seq_off,
        pred_off,
        ids,
        g_end,
        (g_parent, depth, tin, tout, length),
    )


def _check_targets(cols, rows, tok_off, node_off, seq_off, pred_off, ids, g_end, nodes) -> None:
    g_parent, depth, tin, tout, length = nodes
    n_pred = np.diff(pred_off)
    n_seq = np.diff(seq_off)
    loss, _ = _list(cols, "seq_loss_tokens")
    seq_row = np.repeat(rows, n_seq)
    _fail(seq_row, loss < 0, "seq_loss_tokens", "is negative")
    per_row = np.concatenate([[0], np.cumsum(loss)])[seq_off]
    per_row = per_row[1:] - per_row[:-1]
    targets, tgt_off = _list(cols, "tree_target_pred")
    _fail(
        rows,
        np.diff(tgt_off) != per_row,
        "tree_target_pred",
        "does not have as many entries as 'seq_loss_tokens' sum to",
    )
    if "num_loss_tokens" in cols:
        counted = np.asarray(cols["num_loss_tokens"], dtype=np.int64)
        _fail(rows, counted != per_row, "num_loss_tokens", "is not the sum of 'seq_loss_tokens'")
    tgt_row = np.repeat(rows, np.diff(tgt_off))
    tgt_seq = np.repeat(np.arange(loss.size, dtype=np.int64), loss)
    _fail(
        tgt_row,
        (targets < 0) | (targets >= n_pred[tgt_row]),
        "tree_target_pred",
        "is not a prediction of the row",
    )
    g_pred = targets + pred_off[:-1][tgt_row]
    pos, token, weight = (_list(cols, c)[0] for c in _PER_PRED)
    pred_row = np.repeat(rows, n_pred)
    n_tok = np.diff(tok_off)
    _fail(
        pred_row,
        (pos < 0) | (pos >= n_tok[pred_row]),
        "tree_pred_pos",
        "is not a position of the row",
    )
    used = np.bincount(g_pred, minlength=pos.size)
    _fail(
        pred_row,
        (weight != used) | (weight < 1),
        "tree_pred_weight",
        "is not the number of the row's targets naming the prediction (at least 1)",
    )
    # Each target: scored on the sequence's path, naming the token that follows there.
    node_of = np.asarray(cols["tree_node"][0], dtype=np.int64)
    q = pos[g_pred]
    u = node_of[q + tok_off[:-1][tgt_row]] + node_off[:-1][tgt_row]
    e = g_end[tgt_seq]
    on_path = (tin[u] <= tin[e]) & (tin[e] < tout[u])
    _fail(tgt_row, ~on_path, "tree_target_pred", "names a position off the sequence's path")
    interior = q < tin[u] + length[u] - 1
    next_tok = ids[np.minimum(q + 1, n_tok[tgt_row] - 1) + tok_off[:-1][tgt_row]]
    # At a node's last token the path goes on in the child of u holding e's start: the last
    # of u's children (nodes sorted by parent, then tin) starting at or before it.
    n_all = g_parent.size
    key = np.where(g_parent >= 0, g_parent, n_all) * (int(tin.max(initial=0)) + 2) + tin
    order = np.argsort(key, kind="stable")
    at = np.searchsorted(key[order], u * (int(tin.max(initial=0)) + 2) + tin[e], side="right") - 1
    child = order[np.clip(at, 0, max(n_all - 1, 0))] if n_all else at
    ok_child = (at >= 0) & (g_parent[child] == u) & (tin[child] <= tin[e]) & (tin[e] < tout[child])
    branch_tok = ids[tin[child] + tok_off[:-1][tgt_row]] if n_all else next_tok
    good = np.where(interior, token[g_pred] == next_tok, ok_child & (token[g_pred] == branch_tok))
    _fail(
        tgt_row,
        ~good,
        "tree_pred_token",
        "is not the token following its position on the path of a sequence training it",
    )
    # In path order: positions along the path strictly increasing within each sequence.
    path_pos = depth[u] + q - tin[u]
    first = np.ones(tgt_seq.size, dtype=bool)
    first[1:] = tgt_seq[1:] != tgt_seq[:-1]
    _fail(
        tgt_row,
        ~first & (np.diff(path_pos, prepend=-1) <= 0),
        "tree_target_pred",
        "is not in path order",
    )
