"""The columns of token shards, one schema per kind of sample (the one place they are defined):

- ``sft`` (formats ``messages``, ``sharegpt``, ``alpaca``, ``text``): one sequence per row,
  ``input_ids`` list<int32>, ``labels`` list<int32> (-100: not trained on), ``length`` int32.
- ``preference`` (format ``preference``: TRL's paired preference data): one row per pair, so
  nothing downstream can separate its two sequences. ``chosen_input_ids`` / ``chosen_labels``
  and ``rejected_input_ids`` / ``rejected_labels`` (list<int32>) are the whole sequences, prompt
  then completion, labelled on the completion tokens only; ``prompt_length`` (int32) is the
  number of leading tokens the two share as the prompt (TRL's ``prompt_ids``); ``length`` (int32)
  is the pair's token count, chosen plus rejected.
- ``kto`` (format ``kto``: TRL's unpaired preference data): the ``sft`` columns (prompt then
  completion, labelled on the completion), plus ``prompt_length`` (int32) and ``label`` (bool:
  the completion is desirable).
- ``tree`` (format ``grpo``, or chats with ``each_turn``: prefix trees): the ``sft`` columns,
  one sequence per row, plus ``group`` (int64): sequences of one group may share prefixes (a
  GRPO prompt's completions, the turns of one chat), those of different groups never do. A
  GRPO run whose records give ``rewards`` / ``advantages`` adds ``reward`` / ``advantage``
  (float64, one per sequence), after the source columns.

The ``preference``, ``kto`` and ``tree`` schemas name their kind in the metadata key
``tokpack.kind`` (``sft`` shards carry no metadata), which
:func:`tokpack.kinds.kind_of_shards` reads.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

import pyarrow as pa

from ..kinds import KIND_KEY

__all__ = [
    "PAIR_ROLES",
    "TOKEN_SCHEMA",
    "PREFERENCE_SCHEMA",
    "KTO_SCHEMA",
    "TREE_SCHEMA",
    "SOURCE_SCHEMA",
    "token_schema",
    "describe",
]

# The sequences of one preference row, in order.
PAIR_ROLES = ("chosen", "rejected")

_IDS = pa.list_(pa.int32())


def _schema(kind: str, fields: list) -> pa.Schema:
    return pa.schema(fields, metadata={KIND_KEY: kind.encode()})


TOKEN_SCHEMA = pa.schema([("input_ids", _IDS), ("labels", _IDS), ("length", pa.int32())])
PREFERENCE_SCHEMA = _schema(
    "preference",
    [
        field
        for role in PAIR_ROLES
        for field in ((f"{role}_input_ids", _IDS), (f"{role}_labels", _IDS))
    ]
    + [("prompt_length", pa.int32()), ("length", pa.int32())],
)
KTO_SCHEMA = _schema(
    "kto", list(TOKEN_SCHEMA) + [("prompt_length", pa.int32()), ("label", pa.bool_())]
)
TREE_SCHEMA = _schema("tree", list(TOKEN_SCHEMA) + [("group", pa.int64())])
_SCHEMAS = {
    "sft": TOKEN_SCHEMA,
    "preference": PREFERENCE_SCHEMA,
    "kto": KTO_SCHEMA,
    "tree": TREE_SCHEMA,
}

# Where each sample comes from (``sources=True``): the index of its input file and its JSONL line
# (from 1) or Parquet row (from 0). One-step pack stages these columns, which the packer does not
# read, to name the raw record of a dropped sample.
_SOURCE_FIELDS = [pa.field("source_file", pa.int32()), pa.field("source_line", pa.int64())]


def token_schema(
    kind: str, sources: bool = False, carried: Sequence[Tuple[str, pa.DataType]] = ()
) -> pa.Schema:
    """The token-shard schema of ``kind``; with ``sources``, the source columns too; then the
    ``carried`` record fields (``TokenizeOptions.carry``), by name and type."""
    schema = _SCHEMAS[kind]
    if not sources and not carried:
        return schema
    fields = list(schema) + (_SOURCE_FIELDS if sources else [])
    return pa.schema(fields + [pa.field(n, t) for n, t in carried], metadata=schema.metadata)


SOURCE_SCHEMA = token_schema("sft", sources=True)


def describe(schema: pa.Schema) -> Dict[str, str]:
    """Column -> type, as manifests list them (``list<int32>``, ``int32``, ``bool``)."""
    return {
        f.name: f"list<{f.type.value_type}>" if pa.types.is_list(f.type) else str(f.type)
        for f in schema
    }
