"""The rows a packed tree directory holds (the tree kind's contract, ``docs/format.md``), cut
out of an in-memory ``tokpack.tree.pack_trees`` batch: each row's row-local arrays, its
sequences ascending by sample id (``ids[i]`` names sequence ``i`` of the batch)."""

import numpy as np


def _np(t):
    return t.numpy() if hasattr(t, "numpy") else np.asarray(t)


def rows_of(batch, ids=None, carried=None, dtype=np.int32):
    """The contract rows of ``batch`` (dicts of 1-D numpy arrays, ``dtype`` for the list<int32>
    columns, int64 sample ids). ``ids``: sample id of each original sequence (default its
    index; ascending, so that the rows' order is the batch's). ``carried``: name -> one value
    per original sequence."""
    b = {k: _np(v) for k, v in batch.items() if k != "tree_stats"}
    n_rows = b["input_ids"].shape[0]
    seq_index = b["tree_seq_index"]
    ids = np.arange(int(seq_index.max(initial=-1)) + 1) if ids is None else np.asarray(ids)
    pred_off = np.concatenate([[0], np.cumsum(np.bincount(b["tree_pred_row"], minlength=n_rows))])
    rows = []
    for r in range(n_rows):
        n = int((b["tree_node"][r] >= 0).sum())
        lo, hi = int(b["tree_node_offsets"][r]), int(b["tree_node_offsets"][r + 1])
        seqs = np.flatnonzero(b["tree_seq_row"] == r)
        end = b["tree_seq_end_node"][seqs]
        depth, length = b["tree_node_depth"][lo:hi], b["tree_node_len"][lo:hi]
        targets = [
            b["tree_target_pred"][b["tree_target_offsets"][i] : b["tree_target_offsets"][i + 1]]
            - pred_off[r]
            for i in seqs
        ]
        loss = b["tree_completion_lengths"][seqs]
        row = {
            "input_ids": b["input_ids"][r, :n].astype(dtype),
            "seq_lengths": (depth[end] + length[end]).astype(dtype),
            "sample_ids": ids[seq_index[seqs]].astype(np.int64),
            "num_tokens": n,
            "num_seqs": seqs.size,
            "num_loss_tokens": int(loss.sum()),
            "seq_loss_tokens": loss.astype(dtype),
            "tree_node": b["tree_node"][r, :n].astype(dtype),
            "tree_seq_end_node": end.astype(dtype),
            "tree_target_pred": np.concatenate(targets or [np.zeros(0, np.int64)]).astype(dtype),
        }
        for name in ("parent", "depth", "tin", "tout", "len"):
            row[f"tree_node_{name}"] = b[f"tree_node_{name}"][lo:hi].astype(dtype)
        preds = slice(int(pred_off[r]), int(pred_off[r + 1]))
        for name in ("pos", "token", "weight"):
            row[f"tree_pred_{name}"] = b[f"tree_pred_{name}"][preds].astype(dtype)
        for name, values in (carried or {}).items():
            values = np.asarray(values)
            row[name] = values[seq_index[seqs]]
        rows.append(row)
    return rows
