"""Packing multimodal token shards: vision tokens count against max_len, media carried per
segment, over-long samples cut (truncate / split) at safe boundaries only, never inside an
image, with each piece's own media."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("PIL")
pytest.importorskip("transformers")

import tokpack  # noqa: E402
from tests._vl_factory import (  # noqa: E402
    build_vl_tokenizer,
    image_chats,
    vl_token_shards,
    write_jsonl,
)
from tokpack.multimodal import pack_files, tokenize_files  # noqa: E402


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    return vl_token_shards(tmp_path_factory.mktemp("vl-pack"), 60, seed=5)[0]


def _samples(tokens):
    return pq.read_table(sorted(tokens.glob("part-*.parquet"))).to_pylist()


def test_media_is_carried_per_segment(tokens, tmp_path):
    samples = _samples(tokens)
    max_len = max(s["length"] for s in samples)
    manifest = pack_files(tokens, tmp_path / "packed", max_len)
    assert manifest["figures"]["samples_packed"] == len(samples)
    assert manifest["config"]["carry"] == ["media", "vision_tokens", "vision_patches"]
    rows = pq.read_table(sorted((tmp_path / "packed").glob("part-*.parquet"))).to_pylist()
    seen = []
    for row in rows:
        assert row["num_tokens"] <= max_len
        offset = 0
        for sid, n, media, vt, vp in zip(
            row["sample_ids"],
            row["seq_lengths"],
            row["media"],
            row["vision_tokens"],
            row["vision_patches"],
        ):
            sample = samples[sid]
            assert row["input_ids"][offset : offset + n] == sample["input_ids"]
            assert (media, vt, vp) == (
                sample["media"],
                sample["vision_tokens"],
                sample["vision_patches"],
            )
            offset += n
            seen.append(sid)
    assert sorted(seen) == list(range(len(samples)))
    assert sum(s["vision_tokens"] for s in samples) > 0
    tokpack.verify(tmp_path / "packed")


@pytest.mark.parametrize(
    "options",
    [
        {"max_segments_per_row": 2},
        {"max_segments_per_row": 3, "strategy": "ffd"},
        {"align_segments": 16},
    ],
)
def test_media_with_static_shape_options(tokens, tmp_path, options):
    """The join of the multimodal kind and the static-shape plan options (the cap repair moves
    segments between rows): every sample once with its own media, no row over the cap."""
    samples = _samples(tokens)
    max_len = 16 * (max(s["length"] for s in samples) // 8 + 1)  # (a multiple of the alignment)
    manifest = pack_files(tokens, tmp_path / "packed", max_len, **options)
    assert manifest["sample_kind"] == "multimodal"
    assert manifest["figures"]["samples_packed"] == len(samples)
    cap = options.get("max_segments_per_row", max_len)
    seen = []
    for row in _rows(tmp_path / "packed"):
        assert len(row["sample_ids"]) <= cap and row["num_tokens"] <= max_len
        offset = 0
        for sid, n, media in zip(row["sample_ids"], row["seq_lengths"], row["media"]):
            assert row["input_ids"][offset : offset + n] == samples[sid]["input_ids"]
            assert media == samples[sid]["media"]
            offset += n
            seen.append(sid)
    assert sorted(seen) == list(range(len(samples)))
    tokpack.verify(tmp_path / "packed")


def _rows(out):
    return pq.read_table(sorted(out.glob("part-*.parquet"))).to_pylist()


def _blocks(media):
    return [(m["span"][0] - 1, m["span"][0] + m["span"][1] + 1) for m in media]


def _segments(rows):
    """Per sample id: its segments as (tokens, labels, media, vision_tokens, vision_patches)."""
    out = {}
    for row in rows:
        offset = 0
        for j, (sid, n) in enumerate(zip(row["sample_ids"], row["seq_lengths"])):
            seg = (
                row["input_ids"][offset : offset + n],
                row["labels"][offset : offset + n],
                json.loads(row["media"][j]),
                row["vision_tokens"][j],
                row["vision_patches"][j],
            )
            out.setdefault(sid, []).append(seg)
            offset += n
    return out


def _own_media(media, start, end):
    """The images whole inside tokens start:end (with their markers), spans rebased."""
    return [
        {**m, "span": [m["span"][0] - start, m["span"][1]]}
        for m in media
        if start < m["span"][0] and m["span"][0] + m["span"][1] < end
    ]


def _tiling(ids, media, pieces, at=0):
    """``pieces`` in the order they continue sample ``ids`` from token ``at`` on, each holding
    the sample's tokens there and exactly the images whole inside it, or None. Split pieces
    are in any rows, and two may hold the same tokens (a prefix of another, or one image's
    each): a search with backtracking."""
    if not pieces:
        return []
    for i, p in enumerate(pieces):
        end = at + len(p[0])
        if p[0] == ids[at:end] and p[2] == _own_media(media, at, end):
            rest = _tiling(ids, media, pieces[:i] + pieces[i + 1 :], end)
            if rest is not None:
                return [p, *rest]
    return None


def _check_pack_cuts(samples, out, manifest, max_len, overlong):
    """The theorems of pack-time cuts: every sample accounted for once; a segment is a slice of
    its sample (whole, from 0 when truncated, tiling it when split) that never starts or ends
    inside an image block, carrying exactly its own images, spans rebased."""
    figures = manifest["figures"]
    rows = _rows(out)
    segments = _segments(rows)
    dropped = pa_ipc_table(out / "__tokpack__" / "_dropped.arrow")
    reasons = dict(zip(dropped["sample_id"], dropped["reason"]))
    truncated = split = 0
    for sid, sample in enumerate(samples):
        media = json.loads(sample["media"])
        blocks = _blocks(media)
        if sid in reasons:
            assert sid not in segments and sample["length"] > max_len
            assert reasons[sid] == ("no_safe_cut" if media else "overlong")
            continue
        pieces = segments.pop(sid)
        if sample["length"] <= max_len:
            assert len(pieces) == 1 and pieces[0][0] == sample["input_ids"]
            assert pieces[0][2] == media
            continue
        order = _tiling(sample["input_ids"], media, pieces)
        assert order is not None, (sid, "its segments do not tile it with their images")
        at = 0
        for ids, labels, seg_media, vt, vp in order:
            want = _own_media(media, at, at + len(ids))
            assert seg_media == want  # (the tiling chose it so: its images, rebased)
            end = at + len(ids)
            assert 0 < len(ids) <= max_len
            assert labels == sample["labels"][at:end]
            for a, b in blocks:
                assert not a < at < b and not a < end < b, (sid, at, end, a, b)
            assert vt == sum(m["span"][1] for m in want)
            assert vp == sum(g[0] * g[1] * g[2] for g in (m["grid"] for m in want))
            at = end
        if overlong == "truncate":
            assert len(pieces) == 1 and at < sample["length"]
            truncated += 1
        else:
            assert at == sample["length"] and len(pieces) >= 2
            split += 1
    assert not segments  # no segment of a sample that does not exist
    assert figures["samples_truncated"] == truncated and figures["samples_split"] == split
    assert figures["samples_dropped"] == len(reasons)
    assert (
        figures["samples_packed"] + truncated + split + len(reasons)
        == len(samples)
        == figures["samples_in"]
    )
    assert all(r["num_tokens"] <= max_len for r in rows)


def pa_ipc_table(path):
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all().to_pydict()


def test_pack_cuts_over_long_samples_at_safe_boundaries(tokens, tmp_path):
    """Failed before: pack refused a truncation inside an image and any split of a sample with
    images (ConfigError). Now it cuts before the image, like tokenize-time max_len."""
    samples = _samples(tokens)
    # A sample whose first image has text after it, and a max_len inside that image.
    sample = next(s for s in samples if s["media"] != "[]" and s["vision_tokens"] > 8)
    start, n = json.loads(sample["media"])[0]["span"]
    inside = start + n // 2
    for overlong in ("truncate", "split"):
        out = tmp_path / overlong
        manifest = pack_files(tokens, out, inside, overlong=overlong)
        _check_pack_cuts(samples, out, manifest, inside, overlong)
        figure = "samples_truncated" if overlong == "truncate" else "samples_split"
        assert manifest["figures"][figure] > 0
        tokpack.verify(out)
    # drop: every over-long sample dropped and listed.
    manifest = pack_files(tokens, tmp_path / "c", inside, overlong="drop")
    figures = manifest["figures"]
    assert figures["samples_dropped"] == sum(s["length"] > inside for s in samples) > 0
    assert figures["samples_packed"] + figures["samples_dropped"] == len(samples)


def test_a_sample_with_no_safe_cut_is_dropped_and_listed(tokens, tmp_path):
    samples = _samples(tokens)
    # One token short of the largest image with its markers: a split piece that starts at that
    # image cannot hold it, so its sample has no safe cut. Truncation keeps the text before
    # the sample's first image (tokenize's rule), so it drops only a sample starting with one.
    max_len = max(b - a for s in samples for a, b in _blocks(json.loads(s["media"]))) - 1
    out = tmp_path / "split"
    manifest = pack_files(tokens, out, max_len, overlong="split")
    _check_pack_cuts(samples, out, manifest, max_len, "split")
    reasons = pa_ipc_table(out / "__tokpack__" / "_dropped.arrow")["reason"]
    assert reasons.count("no_safe_cut") == manifest["figures"]["samples_dropped"] > 0
    out = tmp_path / "truncate"
    manifest = pack_files(tokens, out, max_len, overlong="truncate")
    _check_pack_cuts(samples, out, manifest, max_len, "truncate")


def test_pack_cuts_equal_tokenize_cuts(tmp_path):
    """The one rule: packing whole samples with overlong truncate / split gives the pieces
    tokenize-time max_len gives."""
    tok = build_vl_tokenizer(tmp_path / "tok")
    records = write_jsonl(tmp_path / "chats.jsonl", image_chats(30, tmp_path / "imgs", seed=9))
    tokenize_files(records, tmp_path / "whole", tok, vision=tok)
    max_len = 60
    for overlong in ("truncate", "split"):
        cut = tmp_path / f"cut-{overlong}"
        counts = tokenize_files(records, cut, tok, vision=tok, max_len=max_len, overlong=overlong)[
            "counts"
        ]
        out = tmp_path / f"packed-{overlong}"
        figures = pack_files(tmp_path / "whole", out, max_len, overlong=overlong)["figures"]
        assert figures["samples_dropped"] == counts["dropped_overlong"]
        assert figures[f"samples_{'truncated' if overlong == 'truncate' else 'split'}"] == (
            counts["truncated"] if overlong == "truncate" else counts["split"]
        )
        want = sorted(
            (s["input_ids"], s["media"], s["vision_tokens"], s["vision_patches"])
            for s in _samples(cut)
        )
        got = sorted(
            (ids, json.dumps(media, separators=(",", ":")), vt, vp)
            for segs in _segments(_rows(out)).values()
            for ids, _, media, vt, vp in segs
        )
        assert got == want


@settings(max_examples=25)
@given(
    data=st.data(),
    overlong=st.sampled_from(["truncate", "split"]),
    strategy=st.sampled_from(["bfd", "ffd", "next_fit", "padding"]),
)
def test_property_no_segment_cuts_inside_an_image(
    tokens, tmp_path_factory, data, overlong, strategy
):
    samples = _samples(tokens)
    longest = max(s["length"] for s in samples)
    max_len = data.draw(st.integers(4, longest), label="max_len")
    out = tmp_path_factory.mktemp("prop") / "p"
    manifest = pack_files(tokens, out, max_len, overlong=overlong, strategy=strategy)
    _check_pack_cuts(samples, out, manifest, max_len, overlong)


def _check_random(samples, out, manifest, max_len, overlong, expect_cut=True):
    """The theorems of ``random`` with images: every kept sample's tokens once, in order, across
    its segments (all of it, or a prefix when truncated), no row over ``max_len``, no cut inside
    an image block, each segment carrying exactly its own images (spans rebased) and their
    vision figures; a row ends early only where the next token would be inside an image."""
    rows = _rows(out)
    segments = _segments(rows)
    dropped = pa_ipc_table(out / "__tokpack__" / "_dropped.arrow")
    reasons = dict(zip(dropped["sample_id"], dropped["reason"]))
    cut = 0
    for sid, sample in enumerate(samples):
        media = json.loads(sample["media"])
        if sid in reasons:
            assert sid not in segments and sample["length"] > max_len
            continue
        pieces = segments.pop(sid)
        order = _tiling(sample["input_ids"], media, pieces)
        assert order is not None, (sid, "its segments do not tile it with their images")
        at = 0
        for ids, labels, seg_media, vt, vp in order:
            end = at + len(ids)
            assert labels == sample["labels"][at:end]
            for a, b in _blocks(media):
                assert not a < at < b and not a < end < b, (sid, at, end, a, b)
            assert vt == sum(m["span"][1] for m in seg_media)
            assert vp == sum(g[0] * g[1] * g[2] for g in (m["grid"] for m in seg_media))
            at = end
        if sample["length"] <= max_len or overlong == "split":
            assert at == sample["length"]
        cut += len(pieces) > 1
    assert not segments
    assert cut > 0 or not expect_cut  # (the corpus and max_len make random cut samples)
    for row in rows:
        assert 0 < row["num_tokens"] <= max_len
    figures = manifest["figures"]
    assert figures["samples_dropped"] == len(reasons)


@pytest.mark.parametrize("overlong", ["drop", "truncate", "split"])
def test_random_strategy_cuts_only_at_safe_boundaries(tokens, tmp_path, overlong):
    """Failed before: the random strategy was refused for multimodal shards (ConfigError)."""
    samples = _samples(tokens)
    max_len = sorted(s["length"] for s in samples)[len(samples) * 3 // 4]
    out = tmp_path / "r"
    manifest = pack_files(tokens, out, max_len, strategy="random", overlong=overlong, seed=3)
    _check_random(samples, out, manifest, max_len, overlong)
    figures = manifest["figures"]
    assert figures["samples_split"] > 0
    # Rows end early only before an image that would not fit: some rows are shorter.
    assert figures["efficiency"] < 1.0
    tokpack.verify(out)


@settings(max_examples=15)
@given(data=st.data(), overlong=st.sampled_from(["drop", "truncate", "split"]))
def test_property_random_never_cuts_inside_an_image(tokens, tmp_path_factory, data, overlong):
    samples = _samples(tokens)
    longest = max(s["length"] for s in samples)
    shortest_fit = max(b - a for s in samples for a, b in _blocks(json.loads(s["media"])))
    max_len = data.draw(st.integers(shortest_fit, longest), label="max_len")
    seed = data.draw(st.integers(0, 2**32), label="seed")
    out = tmp_path_factory.mktemp("rand") / "p"
    manifest = pack_files(tokens, out, max_len, strategy="random", overlong=overlong, seed=seed)
    _check_random(samples, out, manifest, max_len, overlong, expect_cut=False)


def test_random_with_an_over_long_sample_names_it(tokens, tmp_path):
    samples = _samples(tokens)
    max_len = sorted(s["length"] for s in samples)[len(samples) // 2]
    with pytest.raises(tokpack.OverlongError, match=r"part-.*\.parquet"):
        pack_files(tokens, tmp_path / "r", max_len, strategy="random")


def test_random_plans_once_in_the_core(tokens, tmp_path, monkeypatch):
    """Failed before: Python planned the ``random`` pieces (``_tokpack.plan``) to give each its
    images, then the core planned again and checked the two matched."""
    from tokpack import _tokpack

    def no_plan(**_: object) -> None:
        raise AssertionError("pack_files planned from Python")

    monkeypatch.setattr(_tokpack, "plan", no_plan)
    samples = _samples(tokens)
    max_len = sorted(s["length"] for s in samples)[len(samples) * 3 // 4]
    out = tmp_path / "r"
    manifest = pack_files(tokens, out, max_len, strategy="random", overlong="split", seed=3)
    assert manifest["sample_kind"] == "multimodal"
    _check_random(samples, out, manifest, max_len, "split", expect_cut=True)


def test_truncation_before_an_image_is_allowed(tokens, tmp_path):
    samples = _samples(tokens)
    # The longest sample's last image ends well before its end: cut right after it.
    cuts = []
    for s in samples:
        media = json.loads(s["media"])
        if media:
            end = media[-1]["span"][0] + media[-1]["span"][1] + 1
            if end < s["length"]:
                cuts.append(end)
    max_len = max(cuts)
    safe = all(
        not (m["span"][0] - 1 < max_len <= m["span"][0] + m["span"][1])
        for s in samples
        for m in json.loads(s["media"])
    )
    if not safe:
        pytest.skip("no cut clear of every image in this corpus")
    manifest = pack_files(tokens, tmp_path / "t", max_len, overlong="truncate")
    assert manifest["figures"]["samples_truncated"] == sum(s["length"] > max_len for s in samples)


def test_stats_count_vision_tokens(tokens, capsys):
    from tokpack.cli import main

    samples = _samples(tokens)
    assert main(["stats", str(tokens), "--json", "--quiet", "--max-len", "4096"]) == 0
    vision = json.loads(capsys.readouterr().out)["vision"]
    media = [json.loads(s["media"]) for s in samples]
    assert vision["images"] == sum(map(len, media)) > 0
    assert vision["vision_tokens"] == sum(m["span"][1] for ms in media for m in ms)
    assert vision["tokens"] == sum(s["length"] for s in samples)
    assert vision["samples_with_images"] == sum(bool(ms) for ms in media)
    assert main(["stats", str(tokens), "--quiet", "--max-len", "4096"]) == 0
    assert "Vision tokens (counted in the lengths above)" in capsys.readouterr().out


def test_plain_pack_carries_the_media_of_multimodal_shards(tokens, tmp_path, capsys):
    """Failed before: `tokpack pack` (and `tokpack.pack_files`) packed multimodal shards without
    their media columns unless told `--carry media vision_tokens vision_patches`: rows with image
    tokens and no images, silently; nor did they refuse a cut inside an image."""
    from tokpack.cli import main

    max_len = max(s["length"] for s in _samples(tokens))
    out = tmp_path / "cli"
    assert main(["pack", str(tokens), "-o", str(out), "--max-len", str(max_len), "--quiet"]) == 0
    manifest = json.loads((out / "__tokpack__" / "_manifest.json").read_text())
    assert manifest["config"]["carry"] == ["media", "vision_tokens", "vision_patches"]
    got = tokpack.pack_files(tokens, tmp_path / "api", max_len, carry=["vision_tokens"])
    assert got["config"]["carry"] == ["media", "vision_tokens", "vision_patches"]
    # and cuts an over-long sample before an image, never inside it.
    with_images = [s for s in _samples(tokens) if json.loads(s["media"])]
    inside = json.loads(with_images[0]["media"])[0]["span"][0] + 1
    out = tmp_path / "cut"
    manifest = tokpack.pack_files(tokens, out, inside, overlong="truncate")
    _check_pack_cuts(_samples(tokens), out, manifest, inside, "truncate")


def test_text_and_multimodal_shards_are_not_packed_together(tokens, tmp_path):
    from tokpack.synthetic import write_token_shards

    (text,) = write_token_shards(tmp_path / "t", 10, n_files=1)
    with pytest.raises(tokpack.ConfigError, match="mix kinds of samples.*multimodal samples"):
        tokpack.pack_files([*sorted(tokens.glob("*.parquet")), text], tmp_path / "o", 4096)


@pytest.mark.parametrize("strategy, quantile, rows_per_shard", [("bfd", 3, 7), ("random", 2, 5)])
def test_pack_cut_outputs_are_byte_identical_for_any_thread_count(
    tokens, tmp_path, strategy, quantile, rows_per_shard
):
    samples = _samples(tokens)
    max_len = sorted(s["length"] for s in samples)[len(samples) // quantile]
    outs = []
    for threads in (1, 2):
        out = tmp_path / f"t{threads}"
        pack_files(
            tokens,
            out,
            max_len,
            strategy=strategy,
            overlong="split",
            threads=threads,
            rows_per_shard=rows_per_shard,
        )
        outs.append(out)
    files = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    assert len([f for f in files if f.name.startswith("part-")]) > 1
    for f in files:
        if f.name != "_manifest.json":  # it holds the wall time
            assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
