"""The sample kinds' room: the core's table, this side's extras, detection and the one
refusal."""

import pyarrow as pa
import pytest

from tokpack import ConfigError
from tokpack.kinds import (
    ENTRY_POINTS,
    EXTRAS,
    KINDS,
    SAMPLE_KINDS,
    kind,
    kind_of_columns,
    kind_of_packed,
    kind_of_records,
    kind_of_schema,
    refuse_kind,
)
from tokpack.multimodal.tokenize import token_schema as multimodal_schema
from tokpack.packed.format import KTO_LABEL, MEDIA_COLUMNS, manifest_schema
from tokpack.tokenize.schema import token_schema


def test_every_kind_has_its_extras_and_the_manifest_lists_it():
    assert set(EXTRAS) == set(SAMPLE_KINDS) == set(KINDS)
    enum = manifest_schema()["properties"]["sample_kind"]["enum"]
    assert sorted(enum) == sorted(SAMPLE_KINDS)
    assert KINDS["multimodal"].carried == MEDIA_COLUMNS
    assert KINDS["kto"].carried == (KTO_LABEL,)
    assert KINDS["preference"].cut == "never" and KINDS["multimodal"].cut == "safe-blocks"


@pytest.mark.parametrize("name", ["sft", "preference", "kto"])
def test_token_schemas_are_told_apart(name):
    schema = token_schema(name)
    assert set(KINDS[name].inputs) <= set(schema.names)
    found = kind_of_schema(schema)
    assert (found[0] if found else "sft") == name
    # Without the metadata (a dataset's block): the pairs by their columns, KTO as SFT.
    bare = schema.remove_metadata()
    assert kind_of_columns(bare.names) == ("preference" if name == "preference" else "sft")


def test_multimodal_shards_by_metadata_and_tables_by_columns():
    schema = multimodal_schema()
    assert set(KINDS["multimodal"].inputs) <= set(schema.names)
    assert kind_of_schema(schema)[0] == "multimodal"
    assert kind_of_columns(["input_ids", "media"]) == "multimodal"
    assert kind_of_schema(pa.schema([("input_ids", pa.list_(pa.int32()))])) is None


def test_records_give_their_kind():
    assert kind_of_records("preference") == "preference"
    assert kind_of_records("kto") == "kto"
    assert {kind_of_records(f) for f in ("auto", "messages", "text", "alpaca")} == {"sft"}
    assert kind("preference").prompted and not kind("sft").prompted
    with pytest.raises(ConfigError, match='unknown sample kind "trie"'):
        kind("trie")


def test_packed_directories_without_the_field():
    assert kind_of_packed({"config": {"pair_layout": "separate"}}, []) == "preference"
    assert kind_of_packed({"config": {}}, ["label", "w"]) == "kto"
    assert kind_of_packed({"config": {}}, list(MEDIA_COLUMNS)) == "multimodal"
    # Multimodal packs before the kind said "sft".
    assert kind_of_packed({"sample_kind": "sft", "config": {}}, list(MEDIA_COLUMNS)) == "multimodal"
    assert kind_of_packed({"sample_kind": "kto", "config": {}}, ["label"]) == "kto"
    assert kind_of_packed({"config": {}}, []) == "sft"


@pytest.mark.parametrize("name", SAMPLE_KINDS)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_one_refusal_for_every_entry_a_kind_does_not_take(name, entry):
    if entry in KINDS[name].entries:
        refuse_kind(entry, name, "x")
        return
    with pytest.raises(ConfigError) as err:
        refuse_kind(entry, name, "data.parquet")
    message = str(err.value)
    assert message.startswith(f"data.parquet holds {EXTRAS[name]['what']}, which ")
    assert f"use {EXTRAS[name]['instead']}" in message
