"""The accounting invariant, checked from the output files alone.

For random corpora (empty, normal and over-long samples, labels or not, several Parquet and
Arrow IPC files, small row groups and shards) and every strategy x overlong policy x thread
count: every input sample appears in the shards (its tokens and labels equal to the source, found
by ``sample_ids``) or in ``_dropped.arrow`` with the right file, row and reason, never both and
never twice; the manifest's figures are the ones the files show; the Megatron and NeMo exports
hold exactly the packed rows' segments, and the side files match their recorded checksums.
"""

from __future__ import annotations

import struct
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokpack
from tokpack import _tokpack
from tokpack._io.outdir import read_manifest
from tokpack.errors import OverlongError
from tokpack.pack.files import DROPPED_NAME

STRATEGIES = ["bfd", "ffd", "next_fit", "padding", "random"]
POLICIES = ["error", "truncate", "drop", "split"]
IGNORE = -100

Sample = Tuple[np.ndarray, Optional[np.ndarray]]


@st.composite
def corpora(draw):
    max_len = draw(st.integers(4, 40))
    length = st.one_of(
        st.just(0),
        st.integers(1, max_len),
        st.integers(1, max_len),
        st.integers(max_len + 1, 3 * max_len + 5),
    )
    files = draw(st.lists(st.lists(length, max_size=25), min_size=1, max_size=3))
    return {
        "max_len": max_len,
        "files": files,
        "labels": draw(st.booleans()),
        "ipc": draw(st.lists(st.booleans(), min_size=len(files), max_size=len(files))),
        "row_group_size": draw(st.integers(1, 8)),
        "rows_per_shard": draw(st.integers(1, 6)),
        "row_group_rows": draw(st.integers(1, 4)),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def write_corpus(root: Path, c: dict) -> Tuple[List[Path], List[Sample], List[Tuple[str, int]]]:
    """Writes the files; returns them, every sample in global order and its (file, row)."""
    rng = np.random.default_rng(c["seed"])
    paths, samples, where = [], [], []
    for k, lengths in enumerate(c["files"]):
        ids = [rng.integers(0, 50_000, n, dtype=np.int32) for n in lengths]
        labs = []
        for t in ids:
            lab = t.copy()
            lab[: int(rng.integers(0, len(t) + 1))] = IGNORE
            labs.append(lab)
        cols = {"input_ids": pa.array(ids, pa.list_(pa.int32()))}
        if c["labels"]:
            cols["labels"] = pa.array(labs, pa.list_(pa.int32()))
        table = pa.table(cols)
        if c["ipc"][k]:
            path = root / f"in-{k}.arrow"
            feather.write_feather(table, path, chunksize=c["row_group_size"])
        else:
            path = root / f"in-{k}.parquet"
            pq.write_table(table, path, row_group_size=c["row_group_size"])
        paths.append(path)
        for r, t in enumerate(ids):
            samples.append((t, labs[r] if c["labels"] else None))
            where.append((str(path), r))
    return paths, samples, where


def read_segments(out: Path, max_len: int, strategy: str) -> Tuple[Dict[int, list], int, int]:
    """Segments by sample id, in row order; also the row and token counts. Checks each row."""
    manifest = read_manifest(out)
    segments: Dict[int, list] = defaultdict(list)
    rows = tokens = 0
    for shard in manifest["shards"]:
        t = pq.read_table(out / shard["file"])
        has_labels = "labels" in t.column_names
        for r in range(t.num_rows):
            ids = np.asarray(t.column("input_ids")[r].values, dtype=np.int32)
            labs = np.asarray(t.column("labels")[r].values) if has_labels else None
            seq = t.column("seq_lengths")[r].as_py()
            sid = t.column("sample_ids")[r].as_py()
            assert len(seq) == len(sid) and all(n > 0 for n in seq)
            assert sum(seq) == len(ids) <= max_len
            if strategy == "padding":
                assert len(seq) == 1
            pos = 0
            for n, s in zip(seq, sid):
                segments[s].append(
                    (ids[pos : pos + n], None if labs is None else labs[pos : pos + n])
                )
                pos += n
            rows += 1
            tokens += len(ids)
    return segments, rows, tokens


def _in_sample_order(pieces: list, tokens: np.ndarray) -> list:
    """``pieces`` in the order whose concatenation is a prefix of ``tokens`` (searched depth
    first); as given when there is none (the caller's check then fails)."""

    def search(pos: int, left: list) -> Optional[list]:
        if not left:
            return []
        for i, (t, lab) in enumerate(left):
            if np.array_equal(tokens[pos : pos + len(t)], t):
                rest = search(pos + len(t), left[:i] + left[i + 1 :])
                if rest is not None:
                    return [(t, lab), *rest]
        return None

    return search(0, list(pieces)) or pieces


def classify(src: Sample, pieces: list, max_len: int, strategy: str) -> str:
    """'packed', 'split' or 'truncated', after checking the pieces against the source."""
    tokens, labels = src
    if strategy != "random" and len(pieces) > 1:
        # Pieces of max_len packed on their own: any row order, cut at multiples of max_len.
        expect = {
            k: (tokens[k : k + max_len], None if labels is None else labels[k : k + max_len])
            for k in range(0, len(tokens), max_len)
        }
        assert len(pieces) == len(expect)
        unused = dict(expect)
        for t, lab in pieces:
            k = next(k for k, (et, _) in unused.items() if np.array_equal(et, t))
            if labels is not None:
                assert np.array_equal(unused[k][1], lab)
            del unused[k]
        return "split"
    # The random strategy cuts a sample anywhere, across consecutive planned rows, which are then
    # written in shuffled order: put the pieces back in the order that rebuilds the sample.
    pieces = _in_sample_order(pieces, tokens)
    got = np.concatenate([t for t, _ in pieces])
    n = len(got)
    assert 0 < n <= len(tokens)
    assert np.array_equal(got, tokens[:n])
    if labels is not None:
        assert np.array_equal(np.concatenate([lab for _, lab in pieces]), labels[:n])
    if n < len(tokens):
        assert n == max_len
        return "truncated"
    return "split" if len(pieces) > 1 else "packed"


@pytest.mark.parametrize("overlong", POLICIES)
@pytest.mark.parametrize("strategy", STRATEGIES)
@given(c=corpora(), threads=st.sampled_from([1, 2, 3]))
def test_every_sample_accounted_for(strategy, overlong, c, threads):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths, samples, where = write_corpus(root, c)
        max_len = c["max_len"]
        out = root / "out"
        args = dict(
            strategy=strategy,
            overlong=overlong,
            seed=c["seed"] % 1000,
            rows_per_shard=c["rows_per_shard"],
            row_group_rows=c["row_group_rows"],
            threads=threads,
        )
        n_long = sum(len(t) > max_len for t, _ in samples)
        if not samples:
            with pytest.raises(tokpack.TokpackError):
                tokpack.pack_files(paths, out, max_len, **args)
            assert not out.exists()
            return
        if overlong == "error" and n_long:
            with pytest.raises(OverlongError):
                tokpack.pack_files(paths, out, max_len, **args)
            assert not out.exists()
            return
        manifest = tokpack.pack_files(paths, out, max_len, **args)
        assert sorted(p.name for p in root.iterdir()) == sorted([p.name for p in paths] + ["out"])

        segments, rows, tokens = read_segments(out, max_len, strategy)
        dropped = pa.ipc.open_file(out / DROPPED_NAME).read_all().to_pylist()
        counts = {"packed": 0, "split": 0, "truncated": 0, "dropped": 0, "empty": 0}
        for d in dropped:
            s = d["sample_id"]
            assert s not in segments, f"sample {s} both packed and dropped"
            assert (d["file"], d["row"]) == where[s]
            length = len(samples[s][0])
            if length == 0:
                assert d["reason"] == "empty"
                counts["empty"] += 1
            else:
                assert d["reason"] == "overlong" and overlong == "drop" and length > max_len
            counts["dropped"] += 1
        assert len({d["sample_id"] for d in dropped}) == len(dropped)
        for s, pieces in segments.items():
            cls = classify(samples[s], pieces, max_len, strategy)
            if cls == "truncated":
                assert overlong == "truncate"
            if cls == "split" and strategy != "random":
                assert overlong == "split" and len(samples[s][0]) > max_len
            counts[cls] += 1
        assert len(segments) + len(dropped) == len(samples), "a sample is missing"

        f = manifest["figures"]
        assert f["samples_in"] == len(samples)
        assert f["samples_packed"] == counts["packed"]
        assert f["samples_split"] == counts["split"]
        assert f["samples_truncated"] == counts["truncated"]
        assert f["samples_dropped"] == counts["dropped"]
        assert f["samples_empty"] == counts["empty"]
        assert f["rows"] == rows and f["tokens"] == tokens
        assert f["input_tokens"] == sum(len(t) for t, _ in samples)
        check_exports(out, root)


def check_exports(out: Path, root: Path) -> None:
    """The exports account for the packed rows: Megatron's sequences are the rows' segments
    in order, token for token; NeMo's rows are the packed rows with their segment starts; the
    side files read back are the ones the manifest checksums."""
    manifest = read_manifest(out)
    table = pa.concat_tables(pq.read_table(out / s["file"]) for s in manifest["shards"])
    tokens = np.asarray(pc.list_flatten(table.column("input_ids")), dtype=np.int64)
    lengths = np.asarray(pc.list_flatten(table.column("seq_lengths")), dtype=np.int64)
    figures = tokpack.export_megatron(out, root / "mg")
    idx = (root / "mg.idx").read_bytes()
    _, code, n_seq, _ = struct.unpack_from("<QBQQ", idx, 9)
    assert n_seq == len(lengths) == figures["sequences"]
    got = np.frombuffer(idx, "<i4", n_seq, 34)
    assert np.array_equal(got, lengths)
    dtype = {8: np.uint16, 4: np.int32}[code]
    assert np.array_equal(np.fromfile(root / "mg.bin", dtype).astype(np.int64), tokens)
    tokpack.packed.export.check_megatron(root / "mg")
    nemo = pq.read_table(tokpack.export_nemo_packed(out, root / "n.parquet")["file"])
    assert nemo.column("input_ids").to_pylist() == table.column("input_ids").to_pylist()
    starts = [
        np.concatenate([[0], np.cumsum(r)[:-1]]).tolist() for r in table["seq_lengths"].to_pylist()
    ]
    assert nemo.column("seq_start_id").to_pylist() == starts
    for shard in manifest["shards"]:
        size, checksum = _tokpack.file_checksum(str(out / shard["index"]))
        assert (size, checksum) == (shard["index_size"], shard["index_checksum"])
    size, checksum = _tokpack.file_checksum(str(out / manifest["dropped_file"]))
    assert (size, checksum) == (manifest["dropped_size"], manifest["dropped_checksum"])
