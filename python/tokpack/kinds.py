"""The sample kinds' room on the Python side: what kind of samples a file, a table, a record
format or a packed directory holds, the one refusal of an entry point that does not take a
kind, and each kind's extras for the readers and collators.

The kinds, their columns, where they may be cut and the entry points that take them are the
core's table (``tokpack_core::kind``, exported as ``_tokpack.KINDS``); what is only Python's
(how messages name a kind, what to use instead, the collator that reads it) is :data:`EXTRAS`.
Adding a kind: one variant of ``SampleKind`` and one entry of ``SampleKind::spec`` in the core,
one entry of :data:`EXTRAS` here, and its collator.

It stands on the ground floor: it imports only the compiled core, the errors and ``_io``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from . import _tokpack
from ._checks import check_choice
from ._io.inputs import shown_path
from .errors import ConfigError

__all__ = [
    "SAMPLE_KINDS",
    "ENTRY_POINTS",
    "KIND_KEY",
    "MULTIMODAL_KEY",
    "Kind",
    "kind",
    "kind_of_records",
    "prompted",
    "kind_of_schema",
    "kind_of_columns",
    "kind_of_shards",
    "kind_of_packed",
    "packing_kind",
    "refuse_kind",
]

SAMPLE_KINDS: Tuple[str, ...] = tuple(_tokpack.SAMPLE_KINDS)
ENTRY_POINTS: Tuple[str, ...] = tuple(_tokpack.ENTRY_POINTS)
# The schema metadata naming a token shard's kind: ``tokpack.kind`` (preference, KTO) and
# ``tokpack.multimodal`` (the model family of multimodal shards); SFT shards carry none.
KIND_KEY = b"tokpack.kind"
MULTIMODAL_KEY = b"tokpack.multimodal"
# Each segment's trained targets (a shard column the readers decode for prefix trees only).
SEQ_LOSS_TOKENS = "seq_loss_tokens"
assert SEQ_LOSS_TOKENS in _tokpack.SHARD_COLUMNS


@dataclass(frozen=True)
class Kind:
    """One kind of sample: the core's entry (``inputs``, ``outputs``, ``carried``, ``cut``,
    ``entries``) and this side's extras (``what`` names its samples in messages, ``instead``
    is what takes it where an entry point does not, ``collator`` reads its packed rows,
    ``sequences`` is how many sequences one record of it is encoded into)."""

    name: str
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    carried: Tuple[str, ...]
    cut: str
    entries: Tuple[str, ...]
    what: str
    instead: str
    collator: str
    sequences: int

    @property
    def prompted(self) -> bool:
        """Each sample is a prompt and its completions (labelled on the completions only)."""
        return self.sequences > 1

    @property
    def paired(self) -> bool:
        """A sample is a pair of sequences packed whole in one row (never cut)."""
        return self.cut == "never"

    @property
    def trees(self) -> bool:
        """Its packed rows are prefix trees: the sequences of a group share their common
        prefixes, stored once (the ``tree_*`` columns), so a row's tokens are not its
        sequences' tokens end to end. Readers, checks and collators of flat rows refuse them."""
        return "tree_node" in self.outputs

    @property
    def read(self) -> Tuple[str, ...]:
        """The columns of its packed shards a reader needs beyond the common ones: its own
        outputs, and for prefix trees how each sequence's targets split (``seq_loss_tokens``)."""
        return self.outputs + ((SEQ_LOSS_TOKENS,) if self.trees else ())


_PACK = "tokpack.pack_files (tokpack pack)"
# This side's part of each kind (the core's table has the rest).
EXTRAS: Dict[str, Dict[str, Any]] = {
    "sft": dict(what="sft samples", instead=_PACK, collator="PackedCollator", sequences=1),
    "preference": dict(
        what="preference samples (pairs of a chosen and a rejected sequence)",
        instead=f"{_PACK} and tokpack.torch.PackedCollator's pair formats",
        collator="PackedCollator",
        sequences=3,  # the prompt, then prompt + each completion
    ),
    "kto": dict(
        what="kto samples (a desirable / undesirable label each)",
        instead=f"{_PACK} and tokpack.torch.PackedCollator",
        collator="PackedCollator",
        sequences=2,
    ),
    "multimodal": dict(
        what="multimodal data (a 'media' column of images per sample)",
        instead=f"{_PACK} on its token shards, which carries each segment's images and never"
        " cuts inside one, and tokpack.torch.MultimodalCollator",
        collator="MultimodalCollator",
        sequences=1,
    ),
    "tree": dict(
        what="tree samples (sequences of a group sharing prefixes, packed as prefix trees)",
        instead=f"{_PACK}, which packs each group's sequences as prefix trees, and"
        " tokpack.tree.PackedTreeCollator",
        collator="tokpack.tree.PackedTreeCollator",
        sequences=1,
    ),
}
# How the refusal names each entry point.
ENTRY_NAMES = {
    "pack": "tokpack.pack_files",
    "tokenize": "tokpack.tokenize_files",
    "ray": "tokpack.ray.pack (--ray)",
    "export": "export to Megatron / NeMo (token ids only, one document per sequence)",
    "pack_tokens": "tokpack.pack_tokens (in memory, no carried columns)",
}
KINDS: Dict[str, Kind] = {
    name: Kind(
        name=name,
        **spec,
        **EXTRAS[name],
    )
    for name, spec in _tokpack.KINDS.items()
}


def kind(name: str) -> Kind:
    """The kind ``name`` (one of :data:`SAMPLE_KINDS`)."""
    return KINDS[check_choice("sample kind", name, SAMPLE_KINDS)]


# The record formats whose samples are not SFT sequences, and their kind.
RECORD_KINDS = {"preference": "preference", "kto": "kto", "grpo": "tree"}


def kind_of_records(fmt: str) -> str:
    """The kind of samples a record format gives (``preference``, ``kto``; ``tree`` for GRPO
    records; every other format, ``auto`` included, gives SFT records)."""
    return RECORD_KINDS.get(fmt, "sft")


def prompted(fmt: str) -> bool:
    """Records of format ``fmt`` are prompts with completions (preference, KTO): one run
    tokenizes one such format, named or detected from its first record."""
    return KINDS[kind_of_records(fmt)].prompted


def kind_of_schema(schema: pa.Schema) -> Optional[Tuple[str, str]]:
    """``(kind, why)`` for a token file, table or dataset whose samples are not plain SFT
    sequences (by its metadata, else by its columns: a dataset's blocks may have lost the
    metadata), else None."""
    metadata = schema.metadata or {}
    declared = metadata.get(KIND_KEY, b"").decode(errors="replace")
    if declared in KINDS and declared != "sft":
        return declared, f"its metadata says tokpack.kind={declared!r}"
    if MULTIMODAL_KEY in metadata:
        return "multimodal", "its metadata names a multimodal model family"
    by_columns = kind_of_columns(schema.names)
    return None if by_columns == "sft" else (by_columns, "by its columns")


def kind_of_columns(names: Iterable[str]) -> str:
    """The kind of samples of a table by its column names alone (a table in memory, a
    dataset's block): a preference pair's two sequences, or a multimodal sample's media."""
    names = set(names)
    if {"chosen_input_ids", "rejected_input_ids"} <= names:
        return "preference"
    return "multimodal" if KINDS["multimodal"].carried[0] in names else "sft"


def kind_of_shards(paths: Sequence[os.PathLike]) -> str:
    """The kind of samples the token shards ``paths`` hold, one for all of them (ConfigError
    naming a file of each kind when they mix kinds)."""
    kinds: Dict[str, os.PathLike] = {}
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


def kind_of_packed(manifest: Mapping[str, Any], carried: Iterable[str]) -> str:
    """The kind of samples of a packed directory: its manifest's ``sample_kind``, else (written
    before the field, or by Ray) from its pair layout and carried columns."""
    recorded = manifest.get("sample_kind")
    carried = set(carried)
    if recorded in KINDS and not (recorded == "sft" and KINDS["multimodal"].carried[0] in carried):
        return str(recorded)
    if manifest.get("config", {}).get("pair_layout") is not None:
        return "preference"
    return next((k.name for k in KINDS.values() if k.carried and set(k.carried) <= carried), "sft")


def packing_kind(found: str, tree_group: Optional[str]) -> str:
    """The kind token shards holding ``found`` samples are packed as: SFT shards named a group
    column by ``tree_group`` (``--tree-group``) are packed as prefix trees; tree shards are by
    their metadata (``tokpack.kind = "tree"``) whatever the config says."""
    return "tree" if found == "sft" and tree_group is not None else found


def refuse_kind(entry: str, name: str, where: str) -> None:
    """The one refusal of an entry point (one of :data:`ENTRY_POINTS`) given samples of a kind
    it does not take: ConfigError naming ``where`` they are, the kind, and what takes them."""
    got = kind(name)
    if entry not in got.entries:
        raise ConfigError(
            f"{where} holds {got.what}, which {ENTRY_NAMES[entry]} does not support (it would"
            f" lose what makes them {got.name} samples): use {got.instead}"
        )
