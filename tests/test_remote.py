"""Packed directories on object storage (issue 23): the readers, verify and inspect against a
real S3 API (moto's server), through the local range cache."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest
import torch
from torch.utils.data import DataLoader

import tokpack
from tokpack._io.fetch import Source
from tokpack.packed.reader import PackedDir
from tokpack.remote import RemotePackedDir, cache_counters, cache_usage, counters, open_packed
from tokpack.torch import PackedCollator, PackedDataset, PackedIterableDataset, PackedMixture

from .conftest import gcs_uri
from .packed_corpus import (
    batch_bytes as _bytes,
)
from .packed_corpus import (
    random_samples,
    small_packed_dir,
    write_packed_dir,
)

PREFIX = "tokpack-test/remote-packed"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Several shards of many row groups of 8 rows."""
    return small_packed_dir(tmp_path_factory, "remote", 400, seed=5, rows_per_shard=60)


def upload(local: Path, fs, prefix: str = PREFIX, skip=()) -> None:
    for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
        name = path.relative_to(local).as_posix()
        if name not in skip:
            with fs.open_output_stream(f"{prefix}/{name}") as f:
                f.write(path.read_bytes())


def uri(server, prefix: str = PREFIX) -> str:
    """The URI of ``prefix`` on ``server`` (``remote_store``'s, or ``s3_server``)."""
    fs, endpoint = server
    if fs.type_name == "gcs":
        return gcs_uri(endpoint, prefix)
    return f"s3://{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"


def scheme(server) -> str:
    return "gs" if server[0].type_name == "gcs" else "s3"


@pytest.fixture(params=["s3", "gcs"])
def remote_store(request):
    """``(file system, "host:port")`` of a local S3 endpoint, then of a local GCS one."""
    if request.param == "s3":
        return request.getfixturevalue("s3_server")
    return request.getfixturevalue("gcs"), request.getfixturevalue("gcs_endpoint")


@pytest.fixture(autouse=True)
def _credentials(monkeypatch):
    """The local endpoint's credentials, as a reader's environment gives them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "tokpack")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "tokpack")


def _iterable(path, **kw):
    kw.setdefault("collate_fn", PackedCollator())
    return PackedIterableDataset(path, batch_rows=3, seed=11, rank=0, world_size=1, **kw)


def _ranges(packed: PackedDir, groups) -> int:
    """Bytes of row groups ``groups`` and of their shards' footers."""
    shards = {int(packed.group_shard[g]) for g in groups}
    return sum(packed.group_bytes[g][1] for g in groups) + sum(
        packed.shard_footers[k][1] for k in shards
    )


def _cached_groups(packed: RemotePackedDir):
    """(shard, row group) of every row group present in the cache."""
    have = packed.cache.meta / "have"
    return sorted(
        (int(s), int(t)) for s, t, *_ in (n.split(".") for n in os.listdir(have)) if t != "f"
    )


def test_remote_rows_are_the_local_rows(corpus, store, tmp_path):
    upload(corpus, store)
    local = PackedDataset(corpus)
    before = dict(counters())
    remote = PackedDataset(PREFIX, filesystem=store, cache_dir=tmp_path)
    assert remote.packed.remote and len(remote) == len(local)
    # Opening reads the manifest only: one request, whatever the number of shards.
    assert counters()["requests"] - before["requests"] == 1
    for i in range(len(local)):
        a, b = local[i], remote[i]
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    # Every byte fetched was a footer or a row group, each once (the cache holds them all).
    packed = remote.packed
    fetched = counters()["bytes_fetched"] - before["bytes_fetched"]
    manifest_bytes = len((packed.root / "__tokpack__/_manifest.json").read_bytes())
    assert fetched == manifest_bytes + _ranges(packed, range(packed.num_groups))
    # A second reader on the machine finds everything cached: no range is fetched again.
    again = PackedDataset(PREFIX, filesystem=store, cache_dir=tmp_path)
    misses = counters()["misses"]
    assert all(torch.equal(again[i]["input_ids"], local[i]["input_ids"]) for i in range(len(local)))
    assert counters()["misses"] == misses


def test_streaming_and_resume_from_a_store_fetch_only_what_is_left(corpus, remote_store, tmp_path):
    fs, _ = remote_store
    upload(corpus, fs)
    full = _bytes(_iterable(corpus))
    ds = _iterable(uri(remote_store), cache_dir=tmp_path / "first")
    head = []
    for batch in DataLoader(ds, batch_size=None, num_workers=0):
        head.append(batch)
        if len(head) == 40:
            break
    position = head[-1]["position"]
    # Another machine resumes (an empty cache), with another worker count.
    resumed = _iterable(uri(remote_store), cache_dir=tmp_path / "second")
    resumed.load_state_dict(position)
    tail = list(DataLoader(resumed, batch_size=None, num_workers=2))
    assert _bytes(head + tail) == full
    # It fetched exactly the row groups of the rows left, none of those consumed before.
    packed = resumed.packed
    _, groups, _ = resumed._locate(position["rows_consumed"], packed.num_rows)
    left = sorted({(int(packed.group_shard[g]), int(packed.group_index[g])) for g in groups})
    assert _cached_groups(packed) == left
    assert len(left) < packed.num_groups


def test_mixture_of_remote_and_local_sources(corpus, s3, tmp_path):
    upload(corpus, s3)
    kw = dict(batch_rows=4, seed=2, rank=0, world_size=1, collate_fn=PackedCollator())
    local = PackedMixture({"a": corpus, "b": corpus}, {"a": 1, "b": 2}, **kw)
    mixed = PackedMixture(
        {"a": PREFIX, "b": PREFIX}, {"a": 1, "b": 2}, filesystem=s3, cache_dir=tmp_path, **kw
    )
    assert _bytes(mixed) == _bytes(local)


@pytest.fixture(scope="module")
def big_groups(tmp_path_factory):
    """Row groups of tens of KB (several file-system blocks each), about 36 of them."""
    out = tmp_path_factory.mktemp("big-groups") / "packed"
    samples, labels = random_samples(800, 1000, seed=8, min_len=300)
    write_packed_dir(
        out,
        samples,
        labels,
        max_len=2048,
        rows_per_shard=32,
        row_group_rows=8,
        compression="none",
    )
    return out


def test_the_cache_never_exceeds_its_limit(big_groups, s3, tmp_path):
    upload(big_groups, s3)
    packed = open_packed(PREFIX, filesystem=s3, cache_dir=tmp_path)
    biggest = max(r[1] for r in packed.group_bytes) + max(f[1] for f in packed.shard_footers)
    limit = 5 * (biggest + 8192)
    assert limit < sum(packed.shard_sizes) / 2  # the corpus does not fit
    ds = _iterable(PREFIX, filesystem=s3, cache_dir=tmp_path, cache_limit=limit)
    root = ds.packed.root
    seen = []
    for batch in DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"):
        seen.append(batch)
        assert cache_usage(root) <= limit
    assert _bytes(seen) == _bytes(_iterable(big_groups))
    assert len(_cached_groups(ds.packed)) < ds.packed.num_groups  # some were evicted
    with pytest.raises(tokpack.ConfigError, match="cache_limit"):
        open_packed(PREFIX, filesystem=s3, cache_dir=tmp_path, cache_limit=biggest // 2)


def test_space_the_file_system_allocates_beyond_a_range_is_evicted_at_once(
    big_groups, s3, tmp_path, monkeypatch
):
    """Room is made for a range's blocks; a file system may allocate more (extent blocks of a
    sparse file): simulated by under-counting each range by two blocks. The excess is evicted
    before the cache's lock is released, so the limit holds between writes all the same."""
    from tokpack._io import rangecache as _cache

    upload(big_groups, s3)
    span = _cache.RangeCache._span
    monkeypatch.setattr(
        _cache.RangeCache, "_span", lambda self, o, n: max(0, span(self, o, n) - 2 * self.block)
    )
    packed = open_packed(PREFIX, filesystem=s3, cache_dir=tmp_path)
    biggest = max(r[1] for r in packed.group_bytes) + max(f[1] for f in packed.shard_footers)
    limit = 4 * (biggest + 8192)
    ds = _iterable(PREFIX, filesystem=s3, cache_dir=tmp_path, cache_limit=limit)
    peak = 0
    for _ in DataLoader(ds, batch_size=None, num_workers=0):
        peak = max(peak, cache_usage(ds.packed.root))
    assert 0 < peak <= limit


def _log_fetches(monkeypatch, log: Path) -> None:
    read_range = Source.read_range

    def logged(self, name, offset, length):
        with open(log, "a") as f:
            f.write(f"{name}:{offset}\n")
        return read_range(self, name, offset, length)

    monkeypatch.setattr(Source, "read_range", logged)


def _fetch_all(packed, order):
    for g in order:
        packed.fetch_group(int(g))


def test_two_processes_on_a_node_fetch_a_row_group_once(corpus, s3, tmp_path, monkeypatch):
    upload(corpus, s3)
    log = tmp_path / "fetches"
    _log_fetches(monkeypatch, log)
    packed = open_packed(PREFIX, filesystem=s3, cache_dir=tmp_path / "cache")
    groups = np.arange(packed.num_groups)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_fetch_all, args=(packed, order)) for order in (groups, groups)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    fetched = log.read_text().split()
    assert len(fetched) == len(set(fetched)) == packed.num_groups + len(packed.shard_paths)
    # What the processes counted into the cache says the same.
    every = _ranges(packed, range(packed.num_groups))
    assert cache_counters(packed.root)["bytes_fetched"] == every
    assert cache_counters(packed.root)["misses"] == len(fetched)
    # And through a DataLoader's workers: one fetch per range between them.
    log.unlink()
    ds = _iterable(PREFIX, filesystem=s3, cache_dir=tmp_path / "loader")
    list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    fetched = log.read_text().split()
    assert len(fetched) == len(set(fetched)) == packed.num_groups + len(packed.shard_paths)
    assert cache_counters(ds.packed.root)["bytes_fetched"] == every


def test_a_corrupted_object_raises_naming_it(corpus, remote_store, tmp_path):
    fs, _ = remote_store
    upload(corpus, fs)
    packed = PackedDir(corpus)
    shard = packed.manifest["shards"][1]
    data = bytearray((corpus / shard["file"]).read_bytes())
    group = shard["row_group_bytes"][2]
    data[group["offset"] + group["length"] // 2] ^= 0x01
    with fs.open_output_stream(f"{PREFIX}/{shard['file']}") as f:
        f.write(bytes(data))
    target = f"{scheme(remote_store)}://{PREFIX}/{shard['file']}: row group 2"
    with pytest.raises(tokpack.CorruptOutputError, match=target):
        tokpack.verify(uri(remote_store), cache_dir=tmp_path)
    assert tokpack.verify(uri(remote_store), full=False, cache_dir=tmp_path)["ok"]
    remote = PackedDataset(uri(remote_store), cache_dir=tmp_path)
    first = int(packed.group_start[int(np.flatnonzero(packed.group_shard == 1)[2])])
    with pytest.raises(tokpack.CorruptOutputError, match=target):
        remote[first]
    # The damaged range was not cached; the others read fine.
    assert (1, 2) not in _cached_groups(remote.packed)
    assert torch.equal(remote[0]["input_ids"], PackedDataset(corpus)[0]["input_ids"])


def test_verify_and_inspect_on_a_store(corpus, remote_store, tmp_path, capsys, monkeypatch):
    fs, _ = remote_store
    upload(corpus, fs)
    report = tokpack.verify(uri(remote_store), cache_dir=tmp_path)
    local = tokpack.verify(corpus)
    assert report["path"] == f"{scheme(remote_store)}://{PREFIX}"
    assert {k: report[k] for k in ("shards", "row_groups", "rows", "bytes")} == {
        k: local[k] for k in ("shards", "row_groups", "rows", "bytes")
    }
    monkeypatch.setenv("TOKPACK_CACHE_DIR", str(tmp_path))
    from tokpack import cli

    assert cli.main(["inspect", uri(remote_store), "--rows", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{uri(remote_store)}: ") and "part-00000.parquet" in out
    assert cli.main(["verify", uri(remote_store)]) == 0
    assert "intact" in capsys.readouterr().out


def test_a_prefix_without_a_manifest_is_refused(corpus, remote_store, tmp_path):
    fs, _ = remote_store
    prefix = "tokpack-test/no-manifest"  # (the stores keep their objects for the whole session)
    upload(corpus, fs, prefix, skip={"__tokpack__/_manifest.json"})
    with pytest.raises(tokpack.InputNotFoundError, match="not a packed directory"):
        PackedIterableDataset(uri(remote_store, prefix), batch_rows=2, cache_dir=tmp_path)
    # What an interrupted `tokpack.ray.pack` leaves: its claim, no manifest.
    with fs.open_output_stream(f"{prefix}/__tokpack__/_writing") as f:
        f.write(b"1\n")
    with pytest.raises(tokpack.InputNotFoundError, match="has not finished"):
        PackedDataset(uri(remote_store, prefix), cache_dir=tmp_path)
    with pytest.raises(tokpack.InputNotFoundError, match="not a packed directory"):
        tokpack.verify(uri(remote_store, "tokpack-test/elsewhere"), cache_dir=tmp_path)


def test_a_missing_bucket_is_named(s3_server, tmp_path):
    with pytest.raises(tokpack.InputNotFoundError, match="s3://no-such-bucket/packed"):
        PackedDataset(uri(s3_server, "no-such-bucket/packed"), cache_dir=tmp_path)


def test_credentials_in_a_uri_stay_out_of_messages_and_reports(corpus, s3_server, tmp_path):
    """pyarrow takes an S3 key and secret from ``s3://KEY:SECRET@bucket/...``: messages and
    reports name the URI without them (as they drop its query)."""
    fs, endpoint = s3_server
    upload(corpus, fs)
    secret = "tokpack:tokpack@"
    query = f"?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    given = f"s3://{secret}{PREFIX}{query}"
    report = tokpack.verify(given, cache_dir=tmp_path)
    assert report["ok"] and report["path"] == f"s3://{PREFIX}"
    with pytest.raises(tokpack.InputNotFoundError) as err:
        PackedDataset(f"s3://{secret}tokpack-test/nothing{query}", cache_dir=tmp_path)
    assert "s3://tokpack-test/nothing" in str(err.value) and secret not in str(err.value)
    out = f"s3://{secret}tokpack-test/written{query}"
    with pytest.raises(tokpack.OverlongError) as err:
        tokpack.pack_files(tokpack.synthetic.write_token_shards(tmp_path / "t", 20), out, 8)
    assert secret not in str(err.value)


def test_azure_and_hf_uris_resolve_and_are_named_with_their_container():
    """``abfs://`` resolves to pyarrow's Azure file system and ``hf://`` to fsspec's Hugging
    Face one (no request is made). An Azure URI's user part names its container or account
    (``abfs://container@account.dfs.core.windows.net/...``): messages keep it and drop only a
    password (``account:KEY@...``), where an S3 URI's user part is its access key, dropped."""
    from tokpack._io.uri import shown_uri, store_of

    if hasattr(pafs, "AzureFileSystem"):  # (pyarrow built with Azure)
        fs, prefix, shown = store_of("abfs://data@acct.dfs.core.windows.net/packed")
        assert fs.type_name == "abfs" and prefix == "data/packed"
        assert shown == "abfs://data@acct.dfs.core.windows.net/packed"
    assert shown_uri("abfss://acct:S3CRET@data/packed?x=1") == "abfss://acct@data/packed"
    assert shown_uri("s3://KEY:S3CRET@bucket/packed") == "s3://bucket/packed"
    assert shown_uri("gs://anonymous@bucket/p?scheme=http") == "gs://bucket/p"
    with pytest.raises(tokpack.ConfigError) as err:
        store_of("nosuch://user:S3CRET@bucket/packed?token=T0KEN")
    assert "nosuch://bucket/packed" in str(err.value)
    assert "S3CRET" not in str(err.value) and "T0KEN" not in str(err.value)
    pytest.importorskip("huggingface_hub")
    fs, prefix, shown = store_of("hf://datasets/org/name/packed")
    assert fs.type_name == "py::fsspec+hf" and prefix == "datasets/org/name/packed"
    assert shown == "hf://datasets/org/name/packed"


class _Flaky:
    """A file system whose first ``fail`` reads fail as a network error would."""

    def __init__(self, fs, fail: int) -> None:
        self.fs, self.fail = fs, fail

    def open_input_stream(self, key):
        if self.fail > 0:
            self.fail -= 1
            raise OSError("curlCode: 7, Couldn't connect to server")
        return self.fs.open_input_stream(key)


def test_transient_errors_are_retried_then_reported(tmp_path):
    (tmp_path / "obj").write_bytes(b"abc")
    local = pafs.LocalFileSystem()
    source = Source(local, str(tmp_path), "s3://b/p", retries=3, backoff=0.001)
    source._fs = _Flaky(local, 2)
    retries = counters()["retries"]
    assert source.read("obj") == b"abc"
    assert counters()["retries"] - retries == 2
    source._fs = _Flaky(local, 9)
    with pytest.raises(tokpack.StorageError, match="s3://b/p/obj: cannot read after 4 attempts"):
        source.read("obj")
    with pytest.raises(tokpack.InputNotFoundError, match="s3://b/p/missing"):
        Source(local, str(tmp_path), "s3://b/p").read("missing")


def test_fsspec_file_systems_and_uris(corpus, tmp_path):
    """An fsspec file system as ``filesystem=``, and a URI only fsspec knows (``memory://``)."""
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for path in sorted(p for p in corpus.rglob("*") if p.is_file()):
        memory.pipe(f"/fsspec-corpus/{path.relative_to(corpus).as_posix()}", path.read_bytes())
    local = _bytes(_iterable(corpus))
    given = _iterable("/fsspec-corpus", filesystem=memory, cache_dir=tmp_path)
    assert given.packed.remote and _bytes(given) == local
    assert _bytes(_iterable("memory://fsspec-corpus", cache_dir=tmp_path)) == local
    assert tokpack.verify("memory://fsspec-corpus", cache_dir=tmp_path)["ok"]


def test_a_shards_other_ranges_stay_readable_while_one_is_fetched(corpus, s3, tmp_path):
    upload(corpus, s3)
    packed = open_packed(PREFIX, filesystem=s3, cache_dir=tmp_path)
    first, second = (int(g) for g in np.flatnonzero(packed.group_shard == 0)[:2])
    packed.fetch_group(first)
    on_the_wire, release = threading.Event(), threading.Event()
    read_range = packed.source.read_range

    def slow(name, offset, length):
        if offset == packed.group_bytes[second][0]:
            on_the_wire.set()
            assert release.wait(60)
        return read_range(name, offset, length)

    packed.source.read_range = slow
    fetcher = threading.Thread(target=packed.fetch_group, args=(second,))
    fetcher.start()
    try:
        assert on_the_wire.wait(60)
        # The shard's first row group decodes while its second is still being fetched (the
        # fetch holds the range's lock only; before, it held the shard's, and this waited).
        reader = threading.Thread(target=packed.decode, args=(first,))
        reader.start()
        reader.join(30)
        assert not reader.is_alive()
    finally:
        release.set()
        fetcher.join(60)
    assert _cached_groups(packed) == [(0, 0), (0, 1)]


def test_fetch_ahead_leaves_the_training_thread_no_fetch_after_the_first_batch(
    corpus, s3, tmp_path, monkeypatch
):
    from tokpack.packed.remote import settle

    upload(corpus, s3)
    training = threading.get_ident()
    fetched_here = []
    read_range = Source.read_range

    def logged(self, name, offset, length):
        if threading.get_ident() == training:
            fetched_here.append((name, offset))
        return read_range(self, name, offset, length)

    monkeypatch.setattr(Source, "read_range", logged)
    ds = _iterable(PREFIX, filesystem=s3, cache_dir=tmp_path)
    batches = iter(DataLoader(ds, batch_size=None, num_workers=0))
    seen = [next(batches)]
    fetched_here.clear()
    while True:
        # Fetch-ahead keeps up (given the time: this waits for it between batches): every row
        # group is fetched before the loop needs it, the first window's too.
        assert settle(60)
        batch = next(batches, None)
        if batch is None:
            break
        seen.append(batch)
    assert fetched_here == []
    assert _bytes(seen) == _bytes(_iterable(corpus))
    assert len(_cached_groups(ds.packed)) == ds.packed.num_groups


def test_a_stopped_iteration_drops_the_fetches_it_queued(corpus, s3, tmp_path):
    import gc

    from tokpack.packed import remote as _packed

    upload(corpus, s3)
    ds = _iterable(PREFIX, filesystem=s3, cache_dir=tmp_path)
    _packed._before_fork()  # holds every fetch-ahead thread back (as a fork does)
    try:
        batches = iter(DataLoader(ds, batch_size=None, num_workers=0))
        next(batches)  # the loop fetched what it needed itself; the window ahead is queued
        needed = _cached_groups(ds.packed)
        del batches  # the training loop stops
        gc.collect()
    finally:
        _packed._after_fork_in_parent()
    assert _packed.settle(60)
    # Nothing of what was queued was fetched once the reader had stopped.
    assert _cached_groups(ds.packed) == needed
    assert len(needed) < ds.packed.num_groups


def test_the_decode_thread_decodes_what_fetch_ahead_brought_and_never_fetches(
    corpus, s3, tmp_path, monkeypatch
):
    """Without workers, row groups already in the cache are decoded ahead on the background
    thread; a group not yet fetched is left to the fetch-ahead threads and the loop."""
    from tokpack.packed.remote import settle

    upload(corpus, s3)
    fetchers, decoders = [], []
    read_range = Source.read_range
    decode = PackedDir.decode

    def logged_fetch(self, name, offset, length):
        fetchers.append(threading.current_thread().name)
        return read_range(self, name, offset, length)

    def logged_decode(self, group, columns=None):
        decoders.append((threading.current_thread().name, group))
        return decode(self, group, columns)

    monkeypatch.setattr(Source, "read_range", logged_fetch)
    monkeypatch.setattr(PackedDir, "decode", logged_decode)
    ds = _iterable(PREFIX, filesystem=s3, cache_dir=tmp_path)
    seen = []
    for batch in DataLoader(ds, batch_size=None, num_workers=0):
        seen.append(batch)
        assert settle(60)  # fetch-ahead keeps up: the decode thread finds groups cached
    decoded = decoders[:]
    assert _bytes(seen) == _bytes(_iterable(corpus))
    assert not any(name.startswith("tokpack-decode") for name in fetchers)
    # A group fetched after the look-ahead saw it is handed to the decoder at the next batch:
    # the loop decodes only the first batch's groups itself (nothing was fetched before it).
    first = set(ds._locate(0, 3)[1].tolist())
    assert {g for name, g in decoded if not name.startswith("tokpack-decode")} <= first
    assert len(decoded) == ds.packed.num_groups
