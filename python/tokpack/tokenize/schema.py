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

The ``preference`` and ``kto`` schemas name their kind in the metadata key ``tokpack.kind``,
which ``pack`` reads to refuse what it cannot pack yet (``sft`` shards carry no metadata).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from .._io.inputs import shown_path
from ..errors import ConfigError

__all__ = [
    "KINDS",
    "PAIR_ROLES",
    "KIND_KEY",
    "TOKEN_SCHEMA",
    "PREFERENCE_SCHEMA",
    "KTO_SCHEMA",
    "SOURCE_SCHEMA",
    "kind_of_format",
    "token_schema",
    "describe",
    "kind_of_schema",
    "kind_of_files",
]

KINDS = ("sft", "preference", "kto")
# The sequences of one preference row, in order.
PAIR_ROLES = ("chosen", "rejected")
KIND_KEY = b"tokpack.kind"

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
_SCHEMAS = {"sft": TOKEN_SCHEMA, "preference": PREFERENCE_SCHEMA, "kto": KTO_SCHEMA}

# Where each sample comes from (``sources=True``): the index of its input file and its JSONL line
# (from 1) or Parquet row (from 0). One-step pack stages these columns, which the packer does not
# read, to name the raw record of a dropped sample.
_SOURCE_FIELDS = [pa.field("source_file", pa.int32()), pa.field("source_line", pa.int64())]


def kind_of_format(fmt: str) -> str:
    """The kind of samples a record format gives (``auto`` gives SFT records)."""
    return fmt if fmt in _SCHEMAS else "sft"


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


def kind_of_schema(schema: pa.Schema) -> Optional[Tuple[str, str]]:
    """``(kind, why)`` for a token file whose samples are not plain SFT sequences (by its
    ``tokpack.kind`` metadata or its pair columns), else None."""
    kind = (schema.metadata or {}).get(KIND_KEY, b"").decode(errors="replace")
    if kind in ("preference", "kto"):
        return kind, f"its metadata says tokpack.kind={kind!r}"
    names = set(schema.names)
    if {"chosen_input_ids", "rejected_input_ids"} <= names:
        return "preference", "it has chosen_input_ids and rejected_input_ids columns"
    return None


def kind_of_files(paths: List[Path]) -> str:
    """The kind of samples the token shards ``paths`` hold (``sft``, ``preference`` or ``kto``),
    one for all of them."""
    kinds: Dict[str, Path] = {}
    for path in paths:
        try:
            with pa.OSFile(os.fsencode(path)) as source:
                parquet = source.read(4) == b"PAR1"  # by its magic bytes, as the packer
                source.seek(0)
                schema = pq.read_schema(source) if parquet else pa.ipc.open_file(source).schema
        except Exception:  # unreadable or not Arrow: the packer reports it, naming the file
            continue
        found = kind_of_schema(schema)
        kinds.setdefault("sft" if found is None else found[0], path)
    if len(kinds) > 1:
        shown = ", ".join(f"{shown_path(p)} holds {k} samples" for k, p in kinds.items())
        raise ConfigError(f"the inputs mix kinds of samples ({shown}); pack each kind apart")
    return next(iter(kinds), "sft")
