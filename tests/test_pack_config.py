"""PackConfig (the one owner of the pack options), PackReport (the one owner of the outcome) and
the format room (names defined once, reserved names refused)."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import tokpack
from tokpack import ConfigError, PackConfig
from tokpack.cli import main
from tokpack.pack.config import refuse_unsupported
from tokpack.packed.format import INDEX_COLUMNS, SHARD_COLUMNS, manifest_schema

from .test_pack_pairs import gen_pairs, sft_table, write_pairs


def test_config_is_a_frozen_picklable_value():
    c = PackConfig(2048, strategy="ffd", carry=["source", "source"], compression="zstd:9")
    assert c.carry == ("source",) and c.max_len == 2048
    assert pickle.loads(pickle.dumps(c)) == c and hash(pickle.loads(pickle.dumps(c))) == hash(c)
    assert PackConfig.from_dict(c.to_dict()) == c
    assert c.replace(seed=3) == PackConfig(
        2048, strategy="ffd", carry=["source"], seed=3, compression="zstd:9"
    )
    assert c.replace(seed=3) != c
    assert repr(c).startswith("PackConfig(max_len=2048, strategy='ffd', overlong='error'")
    with pytest.raises(AttributeError):
        c.max_len = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match='unexpected keyword argument "stratgy"'):
        PackConfig(8, stratgy="bfd")


def test_the_row_group_layout_is_checked_when_made():
    """A row group's row_group_rows * max_len tokens must fit int32 offsets: the constructor
    (and replace) refuses the config, not the pack that would use it."""
    most = (2**31 - 1) // 4096
    assert PackConfig(4096, row_group_rows=most).row_group_rows == most == 524287
    with pytest.raises(ConfigError, match="^row_group_rows must be at most 524287 with max_len"):
        PackConfig(4096, row_group_rows=10**6)
    with pytest.raises(ConfigError, match="^row_group_rows must be at most"):
        PackConfig(4096).replace(row_group_rows=10**6)
    small = PackConfig(1024, row_group_rows=10**6)
    with pytest.raises(ConfigError, match="^row_group_rows must be at most 524287"):
        small.replace(max_len=4096)


def test_pair_options_are_checked_for_preference_inputs():
    """What pairs refuse depends on the inputs' kind: for_kind checks it, before any work."""
    config = PackConfig(64, overlong="split")
    assert config.for_kind("sft", "x.parquet").overlong == "split"
    with pytest.raises(ConfigError, match="split.*preference pair"):
        config.for_kind("preference", "x.parquet")
    with pytest.raises(ConfigError, match="^align_segments applies to SFT samples"):
        PackConfig(64, align_segments=8).for_kind("preference", "x.parquet")


def test_to_dict_is_the_manifest_config(tmp_path):
    pq.write_table(sft_table(30, random.Random(1), w=pa.array([1.0] * 30)), tmp_path / "s.parquet")
    config = PackConfig(64, strategy="next_fit", carry=["w"], rows_per_shard=7)
    m = tokpack.pack_files(tmp_path / "s.parquet", tmp_path / "out", config=config)
    assert m["config"] == config.to_dict()
    assert PackConfig.from_dict(m["config"]) == config
    # Keyword fields build the same config: same cache key, so a cache hit.
    again = tokpack.pack_files(
        tmp_path / "s.parquet",
        tmp_path / "out",
        64,
        strategy="next_fit",
        carry=["w"],
        rows_per_shard=7,
    )
    assert again["cache_hit"] and again["cache_key"] == m["cache_key"]


@pytest.mark.parametrize(
    "call",
    [
        lambda c: tokpack.plan([1, 2], 8, config=c),
        lambda c: tokpack.plan([1, 2], strategy="ffd", config=c),
        lambda c: tokpack.pack_tokens([[1, 2]], 8, config=c),
        lambda c: tokpack.pack_files("x.parquet", "out", seed=1, config=c),
    ],
)
def test_config_or_fields_not_both(call):
    with pytest.raises(ConfigError, match="pass config= or its fields"):
        call(PackConfig(8))


def test_one_check_one_message():
    """Each rule is checked by the config, with policy.rs's wording, wherever it is reached."""
    for call in (
        lambda: PackConfig(8, strategy="best"),
        lambda: tokpack.plan([1], 8, strategy="best"),
        lambda: tokpack.pack_tokens([[1]], 8, strategy="best"),
    ):
        with pytest.raises(ConfigError, match=r'^unknown strategy "best"; expected one of "bfd"'):
            call()
    with pytest.raises(ConfigError, match=r'^unknown overlong policy "cut"'):
        tokpack.TokenizeOptions(overlong="cut")
    with pytest.raises(ConfigError, match="^max_len must be at least 1 and at most 2147483647"):
        tokpack.TokenizeOptions(max_len=0)


def test_refuse_unsupported_names_the_field():
    c = PackConfig(8, carry=["source"])
    refuse_unsupported(c, "X", {"strategy": "why"})
    refuse_unsupported(PackConfig(8), "X", {"carry": "why"})  # defaults are always supported
    with pytest.raises(ConfigError, match=r"^carry \(--carry\) is not supported with X: why$"):
        refuse_unsupported(c, "X", {"carry": "why"})
    with pytest.raises(ConfigError, match=r"^threads \(--threads\) is not supported with X: t$"):
        refuse_unsupported(c, "X", {"threads": "t"}, threads=2)
    refuse_unsupported(c, "X", {"threads": "t"}, threads=None)


def test_ray_pack_refuses_pair_layout_and_spill_dir_by_name():
    """Was silently ignored (pair_layout, spill_dir)."""
    pytest.importorskip("ray")
    from tokpack.ray import pack

    for name, value in (("pair_layout", "shared-prompt"), ("spill_dir", "/tmp")):
        with pytest.raises(ConfigError, match=f"^{name} .* is not supported with Ray"):
            pack(None, "never-written", 64, **{name: value})
    assert not Path("never-written").exists()


def test_one_step_pack_refuses_columns_before_any_work(tmp_path, capsys):
    """Was: the columns given were silently replaced by the tokenizer's."""
    from ._tokenizer_factory import build_tokenizer, write_jsonl

    tok = build_tokenizer(tmp_path / "tok")
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a b c"}] * 3)
    out = tmp_path / "out"
    refused = r"^tokens_column \(--tokens-column\) is not supported with a one-step pack"
    with pytest.raises(ConfigError, match=refused):
        tokpack.pack_files(path, out, 64, tokenizer=tok, tokens_column="ids")
    argv = ["pack", str(path), "-o", str(out), "--tokenizer", str(tok), "--tokens-column", "ids"]
    assert main(argv + ["--quiet"]) == 2
    assert "the tokenizer writes the columns" in capsys.readouterr().err
    assert not out.exists()


def test_cli_flags_come_from_the_config_fields():
    from tokpack.cli import build_parser

    parser = build_parser()
    pack = parser._subparsers._group_actions[0].choices["pack"]  # type: ignore[union-attr]
    flags = {a.dest: a for a in pack._actions}
    for name, default, choices, help_text in PackConfig.FIELDS:
        assert name in flags and help_text in flags[name].help
        assert tuple(flags[name].choices or ()) == tuple(choices)
        if name not in ("max_len", "carry"):
            assert flags[name].default == default
    args = parser.parse_args(["pack", "in", "-o", "out", "--strategy", "ffd", "--carry", "a"])
    from tokpack.pack.config import from_args

    assert from_args(args) == PackConfig(4096, strategy="ffd", carry=["a"])


def test_shard_and_index_columns_are_the_format_rooms(tmp_path):
    pairs = gen_pairs(random.Random(4), 20)
    write_pairs(tmp_path / "p.parquet", pairs, source=["s"] * 20)
    m = tokpack.pack_files(tmp_path / "p.parquet", tmp_path / "out", 200, carry=["source"])
    shard = pq.read_schema(tmp_path / "out" / m["shards"][0]["file"])
    assert shard.names == [*SHARD_COLUMNS, "source"]
    with ipc.open_file(tmp_path / "out" / m["shards"][0]["index"]) as index:
        assert tuple(index.schema.names) == INDEX_COLUMNS
    table = tokpack.pack_tokens([[1, 2, 3], [4]], 8, labels=[[1, 2, 3], [4]])
    assert table.column_names == list(SHARD_COLUMNS[:4])


def test_schema_is_versioned_with_the_format():
    schema = manifest_schema()
    assert schema["properties"]["format_version"]["const"] == tokpack.packed.format.FORMAT_VERSION
    assert schema["properties"]["format"]["const"] == tokpack.packed.format.FORMAT
    fields = schema["$defs"]["config"]["properties"]
    assert {f[0] for f in PackConfig.FIELDS} <= set(fields)


def test_report_merge_derives_the_figures_once():
    """Ray's local mode merges reports; lower_bound and efficiency come from the totals."""
    pytest.importorskip("ray")
    from tokpack.ray._shards import accounting

    parts = [tokpack.plan([5, 3, 7], 8, strategy="padding"), tokpack.plan([6, 6], 8)]
    reports = [
        accounting(p, tokpack.PackConfig(8), [], [p.n_samples], True, base)
        for p, base in zip(parts, (0, 3))
    ]
    merged = tokpack.PackReport.merge(reports, [], [5])
    whole = tokpack.plan([5, 3, 7, 6, 6], 8, strategy="padding")
    figures = merged.figures()
    assert figures["tokens"] == whole.total_tokens and figures["rows"] == 5
    assert figures["lower_bound"] == whole.lower_bound == 4
    assert figures["efficiency"] == whole.efficiency
    assert pickle.loads(pickle.dumps(merged)).figures() == merged.figures()
    assert json.dumps(merged.figures())
    assert np.array_equal(merged.dropped, np.zeros(0, np.int64))


def test_report_crosses_as_plain_data_in_field_order():
    """PackReport's fields, shards and figures reach Python as dicts in field order, ints and
    floats as they are in Rust; numpy arrays and scalars are taken; a wrong field is refused."""
    shard = {
        "file": "part-00000.parquet",
        "index": "_index-part-00000.arrow",
        "rows": 1,
        "row_groups": 1,
        "tokens": 6,
        "loss_tokens": 6,
        "size": 10,
        "checksum": "xxh3_128:0",
        "row_group_bytes": [{"offset": 4, "length": 2, "checksum": "xxh3_128:1"}],
        "footer_bytes": {"offset": 6, "length": 4, "checksum": "xxh3_128:2"},
        "index_size": 3,
        "index_checksum": "xxh3_128:3",
    }
    fields = dict(input_rows=[np.int64(2)], has_labels=True, max_len=8, n_samples=2, rows=1)
    fields.update(segments=2, tokens=6, input_tokens=6, empty=[], truncated=[], split=[])
    report = tokpack.PackReport(**fields, dropped=np.zeros(0, np.int64), shards=[shard])
    assert report.shards == [shard] and list(report.shards[0]) == list(shard)
    figures = report.figures()
    assert list(figures)[:3] == ["samples_in", "samples_packed", "samples_truncated"]
    assert type(figures["rows"]) is int and type(figures["efficiency"]) is float
    assert figures["efficiency"] == 0.75 and figures["padding_tokens"] == 2
    assert pickle.loads(pickle.dumps(report)).shards == [shard]
    with pytest.raises(ConfigError, match="^PackReport: unknown field `bogus`"):
        tokpack.PackReport(**fields, dropped=[], shards=[], bogus=1)
    with pytest.raises(ConfigError, match="^PackReport: "):
        tokpack.PackReport(**{**fields, "rows": 1.5}, dropped=[], shards=[])


def test_the_schema_check_of_the_suite_sees_packs_manifests(tmp_path, monkeypatch):
    """conftest validates every manifest as written through _io.manifest.write_manifest; a
    writer that bound the function at import would bypass it (the object-storage work did)."""
    from tokpack._io import manifest as _manifest
    from tokpack.packed import format as packed_format
    from tokpack.synthetic import write_token_shards

    seen = []
    write = _manifest.write_manifest
    monkeypatch.setattr(
        _manifest, "write_manifest", lambda d, m: (seen.append(m["format"]), write(d, m))
    )
    files = write_token_shards(tmp_path / "c", 20, n_files=1, max_length=100)
    tokpack.pack_files(files, tmp_path / "out", 128)
    assert seen == [packed_format.FORMAT]
