"""Packed preference and KTO rows in the layout ``tokpack pack`` writes for preference and KTO
token shards (segments, roles and layouts: README, "Preference training"), built in pure Python
for the torch tests.

A pair is (prompt, chosen completion, rejected completion) token lists; rows are filled in order
with whole pairs (a pair is never split), as tensors like the readers deliver.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

IGNORE = -100
CHOSEN, REJECTED, PROMPT = 1, 2, 3

Pair = Tuple[List[int], List[int], List[int]]


def random_pairs(
    n: int, *, seed: int, vocab: int, prompt: Tuple[int, int], completion: Tuple[int, int]
) -> List[Pair]:
    """``n`` pairs with prompt and completion lengths drawn in the inclusive ranges given."""
    rng = np.random.default_rng(seed)

    def tokens(bounds):
        return rng.integers(1, vocab, size=int(rng.integers(bounds[0], bounds[1] + 1))).tolist()

    return [(tokens(prompt), tokens(completion), tokens(completion)) for _ in range(n)]


def pair_segments(pair: Pair, layout: str) -> List[Tuple[int, List[int], List[int]]]:
    """(role, tokens, labels) of the pair's segments in ``layout``."""
    p, c, r = pair
    masked = [IGNORE] * len(p)
    if layout == "separate":
        return [(CHOSEN, p + c, masked + c), (REJECTED, p + r, masked + r)]
    if layout == "shared-prompt":
        return [(PROMPT, p, masked), (CHOSEN, c, c), (REJECTED, r, r)]
    raise ValueError(layout)


def _rows(units: Sequence[List[tuple]], max_len: int) -> List[List[tuple]]:
    """Fill rows of at most ``max_len`` tokens with whole units (lists of segments), in order."""
    rows: List[List[tuple]] = [[]]
    used = 0
    for unit in units:
        size = sum(len(seg[1]) for seg in unit)
        assert size <= max_len, "a unit longer than a row"
        if used + size > max_len:
            rows.append([])
            used = 0
        rows[-1].extend(unit)
        used += size
    return rows


def _row_dict(segments: List[tuple], columns: Dict[str, torch.dtype]) -> Dict[str, torch.Tensor]:
    row = {
        "input_ids": torch.tensor([t for s in segments for t in s[1]], dtype=torch.int32),
        "labels": torch.tensor([t for s in segments for t in s[2]], dtype=torch.int32),
        "seq_lengths": torch.tensor([len(s[1]) for s in segments], dtype=torch.int32),
    }
    for i, (name, dtype) in enumerate(columns.items()):
        row[name] = torch.tensor([s[3 + i] for s in segments], dtype=dtype)
    return row


def preference_rows(pairs: Sequence[Pair], layout: str, max_len: int) -> List[Dict]:
    """Packed rows of ``pairs``: ``input_ids``, ``labels``, ``seq_lengths``, ``sample_ids`` (the
    pair's index, per segment) and ``seq_roles``."""
    units = [
        [(role, ids, lab, sid, role) for role, ids, lab in pair_segments(pair, layout)]
        for sid, pair in enumerate(pairs)
    ]
    columns = {"sample_ids": torch.int64, "seq_roles": torch.int8}
    return [_row_dict(row, columns) for row in _rows(units, max_len)]


def kto_rows(records: Sequence[Tuple[List[int], List[int], bool]], max_len: int) -> List[Dict]:
    """Packed KTO rows of (prompt, completion, label) records: one segment per record, the
    ``label`` carried per segment, no ``seq_roles``."""
    units = [
        [(0, p + c, [IGNORE] * len(p) + c, sid, label)] for sid, (p, c, label) in enumerate(records)
    ]
    columns = {"sample_ids": torch.int64, "label": torch.bool}
    return [_row_dict(row, columns) for row in _rows(units, max_len)]
