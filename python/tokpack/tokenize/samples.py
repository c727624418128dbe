"""The shapes a tokenize run passes around: the accounting of a run (:class:`TokenizeStats`),
the texts one record becomes (:class:`Prepared`, :class:`Chat`), and a chunk's
token sequences as flat arrays (:class:`Tokens`), which become the token ``RecordBatch``es of
:mod:`tokpack.tokenize.schema`."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np
import pyarrow as pa

from ..errors import ConfigError
from .formats import Record
from .masks import IGNORE_INDEX
from .schema import PAIR_ROLES, token_schema

PathLike = Union[str, os.PathLike]
# Where a rejected record goes: a dict with its file, line or row, error and raw text.
RejectSink = Callable[[Dict[str, Any]], None]


@dataclass
class TokenizeStats:
    """Accounting of a run: every record read is a sample, split into pieces, truncated, dropped
    as over-long, or rejected (``records == samples_in + rejected``). A sample of the tree kind
    (a GRPO record, a chat with ``each_turn``) is ``sequences`` sequences, to which the
    over-long counts then refer (``samples_out == sequences - dropped``); ``sequences`` is 0 for
    the other kinds."""

    records: int = 0
    rejected: int = 0
    samples_in: int = 0
    samples_out: int = 0
    sequences: int = 0
    formats: Dict[str, int] = field(default_factory=dict)
    overlong: int = 0
    truncated: int = 0
    dropped: int = 0
    split: int = 0
    split_pieces: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    untrained_samples: int = 0

    def merge(self, other: "TokenizeStats") -> None:
        """Adds the counts of ``other`` (a chunk's part of the run)."""
        for name, value in asdict(other).items():
            if name == "formats":
                for fmt, n in value.items():
                    self.formats[fmt] = self.formats.get(fmt, 0) + n
            else:
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["trained_share"] = self.trained_tokens / self.tokens if self.tokens else 0.0
        return data


@dataclass
class Prepared:
    """One text to encode: an SFT record's, or one of a preference / KTO record's texts (its
    prompt, then the prompt with each completion; ``label``: the KTO label, on the prompt)."""

    record: Record
    text: str
    spans: Optional[List[Tuple[int, int]]]  # None: plain text, every token trained
    eos_trained: bool
    label: Optional[bool] = None


@dataclass
class Chat:
    """An SFT record's conversation, rendered with the rest of its chunk."""

    record: Record
    messages: List[Dict[str, Any]]


@dataclass
class Tokens:
    """Sequences as flat arrays, the one shape of a chunk's encoding and of its finished batch:
    sequence ``i`` is ``ids[offsets[i]:offsets[i + 1]]`` (``labels`` alike). Once finished, a
    sample of ``kind`` (:mod:`tokpack.tokenize.schema`) is :attr:`roles` consecutive sequences
    (a preference pair: chosen then rejected) and sample ``j`` comes from input file
    ``files[j]``, JSONL line (from 1) or Parquet row (from 0) ``lines[j]``, with, for preference
    and KTO samples, its ``prompt_lengths[j]`` (and KTO ``kto_labels[j]``), for tree samples
    its ``groups[j]``. Plain arrays travel
    from worker processes cheaply (an Arrow batch would import pandas on both sides to be
    pickled)."""

    offsets: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    files: Optional[np.ndarray] = None
    lines: Optional[np.ndarray] = None
    kind: str = "sft"
    prompt_lengths: Optional[np.ndarray] = None
    kto_labels: Optional[np.ndarray] = None
    groups: Optional[np.ndarray] = None
    # Per carried column (TokenizeOptions.carry, a GRPO run's per-completion values), each
    # sample's value (a GRPO value: None for a record without it).
    carried: Optional[Dict[str, List[Any]]] = None

    def __post_init__(self) -> None:
        if self.offsets[-1] >= 2**31:  # Arrow list offsets are int32
            raise ConfigError("batch_size too large: a batch holds more than 2**31 tokens")

    @classmethod
    def from_pairs(cls, pairs: Sequence[Tuple[np.ndarray, np.ndarray]]) -> "Tokens":
        lengths = np.fromiter((len(ids) for ids, _ in pairs), dtype=np.int64, count=len(pairs))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        none = [np.zeros(0, dtype=np.int32)]
        ids = np.concatenate([ids for ids, _ in pairs] or none)
        return cls(offsets, ids, np.concatenate([labels for _, labels in pairs] or none))

    @property
    def roles(self) -> int:
        """Sequences per row (a preference pair's two, by its schema's columns)."""
        paired = f"{PAIR_ROLES[0]}_input_ids" in token_schema(self.kind).names
        return len(PAIR_ROLES) if paired else 1

    def count(self, stats: TokenizeStats) -> "Tokens":
        """Adds these finished samples to ``stats`` (a sample is untrained when one of its
        sequences has no trained token)."""
        # Trained tokens before each offset, from the trained positions (a running count over
        # every token costs a fresh int64 array of the batch's size, ten times the time).
        before = np.searchsorted(np.flatnonzero(self.labels != IGNORE_INDEX), self.offsets)
        untrained = (np.diff(before) == 0).reshape(-1, self.roles).any(axis=1)
        stats.samples_out += len(untrained)
        stats.tokens += int(self.offsets[-1])
        stats.trained_tokens += int(before[-1])
        stats.untrained_samples += int(np.count_nonzero(untrained))
        return self

    def pairs(self) -> List[Tuple[np.ndarray, np.ndarray]]:
        bounds = self.offsets.tolist()
        return [(self.ids[a:b], self.labels[a:b]) for a, b in zip(bounds, bounds[1:])]

    def to_batch(
        self, sources: bool, carried: Sequence[Tuple[str, pa.DataType]] = ()
    ) -> pa.RecordBatch:
        """The token batch of :func:`~tokpack.tokenize.schema.token_schema` ``(kind,
        sources, carried)``."""
        off = int32_array(self.offsets)
        ids = pa.ListArray.from_arrays(off, int32_array(self.ids))
        labels = pa.ListArray.from_arrays(off, int32_array(self.labels))
        lengths = np.diff(self.offsets).reshape(-1, self.roles).sum(axis=1)
        columns = {"length": int32_array(lengths)}
        if self.roles > 1:
            for i, role in enumerate(PAIR_ROLES):  # each role's sequences, out of the interleaved
                pick = from_numpy(np.arange(i, len(lengths) * self.roles, self.roles), np.int64)
                columns[f"{role}_input_ids"] = ids.take(pick)
                columns[f"{role}_labels"] = labels.take(pick)
        else:
            columns["input_ids"], columns["labels"] = ids, labels
        if self.prompt_lengths is not None:
            columns["prompt_length"] = int32_array(self.prompt_lengths)
        if self.kto_labels is not None:
            columns["label"] = pa.array(self.kto_labels.tolist(), pa.bool_())
        if self.groups is not None:
            columns["group"] = from_numpy(self.groups, np.int64)
        if sources:
            assert self.files is not None and self.lines is not None
            columns["source_file"] = int32_array(self.files)
            columns["source_line"] = from_numpy(self.lines, np.int64)
        for name, type_ in carried:
            columns[name] = pa.array((self.carried or {})[name], type_)
        schema = token_schema(self.kind, sources, carried)
        return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


# What a chunk gives back: its samples (None: none left), counts and rejected records.
ChunkResult = Tuple[Optional[Tokens], TokenizeStats, List[Dict[str, Any]]]

# JSONL records encoded in Rust: one sequence per record, the records left to Python
# (without tokens) and whether each record's last message is an assistant's.
JsonlTokens = Tuple[Tokens, np.ndarray, np.ndarray]


def from_numpy(values: np.ndarray, dtype: type) -> pa.Array:
    # From the buffer, not pa.array(ndarray): that one imports pandas on first use (seconds,
    # during which pyarrow swallows Ctrl-C).
    data: np.ndarray = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(dtype), len(data), [None, pa.py_buffer(data)])


def int32_array(values: np.ndarray) -> pa.Array:
    return from_numpy(values, np.int32)
