"""A packed directory on object storage, read through the local range cache.

Opening it costs one request (the manifest), whatever the corpus size: the row-group layout
comes from the manifest (every shard's row groups hold ``config.row_group_rows`` rows but the
last, as ``tokpack pack`` writes them), and each shard's footer is fetched and checked against
it when the shard is first read. A row group is fetched by byte range (with the footer, the
first time), checked against the manifest's checksums before it is cached, and decoded by the
same Rust reader as a local shard, from the cache's sparse copy of the shard.

The cache heals: a cached range (or side file) that fails its check when read is dropped and
fetched again once. The bytes fetched are checked against the manifest before they are cached,
so a range whose fetched bytes fail is the store's damage (the message names the object), and
one that fails again after a checked fetch is this machine's (the message names the cache file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import threading
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

import pyarrow as pa
import pyarrow.parquet as pq

from .._checks import check_int
from .._io.fetch import Source
from .._io.manifest import listed_files, member_path
from .._io.rangecache import RangeCache, Want
from .._io.uri import RUN_MARKER, cache_home, local_path, store_of
from .._tokpack import bytes_checksum, file_checksum
from ..errors import ConfigError, CorruptOutputError, InputNotFoundError, TokpackError
from .format import MANIFEST_NAME
from .reader import Column, Identity, PackedDir, byte_range, parse_manifest

__all__ = ["RemotePackedDir", "open_packed", "default_cache_dir", "DEFAULT_CACHE_LIMIT"]

DEFAULT_CACHE_LIMIT = 8 << 30
T = TypeVar("T")
# Fetches of a range whose bytes do not match their checksum before it is reported damaged.
_CHECKSUM_ATTEMPTS = 2


def default_cache_dir() -> Path:
    """``remote/`` of tokpack's cache (``$TOKPACK_CACHE_DIR``, else ``~/.cache/tokpack``)."""
    return cache_home() / "remote"


def open_packed(
    path: Union[str, os.PathLike],
    *,
    filesystem: Any = None,
    cache_dir: Optional[Union[str, os.PathLike]] = None,
    cache_limit: Optional[int] = None,
) -> PackedDir:
    """The packed directory at ``path``: a local one (:class:`PackedDir`), or one on object
    storage (a URI, or a path on ``filesystem``) read through a local cache of at most
    ``cache_limit`` bytes under ``cache_dir`` (:class:`RemotePackedDir`)."""
    local = local_path(path, filesystem)
    if local is not None:
        return PackedDir(local)
    return RemotePackedDir(
        path, filesystem=filesystem, cache_dir=cache_dir, cache_limit=cache_limit
    )


class RemotePackedDir(PackedDir):
    """A packed directory on object storage (see the module docstring). ``root`` is its cache
    directory on this machine; ``shown`` (``s3://bucket/packed``) names it in messages."""

    remote = True

    def __init__(
        self,
        path: Union[str, os.PathLike],
        *,
        filesystem: Any = None,
        cache_dir: Optional[Union[str, os.PathLike]] = None,
        cache_limit: Optional[int] = None,
    ) -> None:
        store = store_of(path, filesystem)
        if store is None:
            raise ConfigError(f"{path}: a local directory (open it with PackedDir)")
        limit = DEFAULT_CACHE_LIMIT if cache_limit is None else cache_limit
        limit = check_int(limit, "cache_limit (bytes)", 1, 2**63 - 1)
        self.source = Source(*store)
        self.shown = self.source.shown
        text = self._read_manifest()
        if text is None:
            writing = self.source.size(RUN_MARKER) is not None
            raise InputNotFoundError(
                f"{self.shown}: not a packed directory (no {MANIFEST_NAME}"
                + ("; a run writing it has not finished" if writing else "; run `tokpack pack`")
                + ")"
            )
        self._manifest_hash = hashlib.sha256(text).hexdigest()
        key = hashlib.sha256(f"{self.shown}\0{self._manifest_hash}".encode()).hexdigest()[:24]
        self.root = Path(cache_dir or default_cache_dir()).resolve() / key
        self.cache = RangeCache(self.root, limit)
        manifest_copy = self.root / MANIFEST_NAME
        if not manifest_copy.exists():
            self.cache.put(manifest_copy, text)
        self._footers_checked: Dict[int, List[int]] = {}
        # Side files whose cached copy matched the manifest (checked once per process).
        self._sides_checked: Set[str] = set()
        with contextlib.suppress(Exception):  # (a malformed manifest is reported just below)
            self.cache.shard_files = [
                member_path(self.root, s["file"]) for s in json.loads(text)["shards"]
            ]
        with self.naming():
            self.manifest = parse_manifest(text, self.root)
            self._validate(self.manifest)
        biggest = max((r[1] for r in self.group_bytes), default=0)
        footer = max((r[1] for r in self.shard_footers), default=0)
        self.cache.check_fits(biggest + footer, "a row group and its shard's footer")

    def _read_manifest(self) -> Optional[bytes]:
        try:
            return self.source.read(MANIFEST_NAME)
        except InputNotFoundError:
            return None

    # -- messages name the objects, not the cache -----------------------------------------

    @contextlib.contextmanager
    def naming(self) -> Iterator[None]:
        """Errors raised inside name the directory's URI instead of its cache."""
        try:
            yield
        except TokpackError as exc:
            local = getattr(exc, "names_the_cache", False)  # the cache's damage, not the store's
            if local or str(self.root) not in str(exc) or len(exc.args) != 1:
                raise
            try:
                renamed = type(exc)(str(exc).replace(str(self.root), self.shown))
            except TypeError:  # an error class taking other arguments
                raise exc from None
            raise renamed from None

    # -- the layout without reading the shards --------------------------------------------

    def _open_shard(
        self, k: int, path: Path, rows: int, groups: int, size: int
    ) -> Tuple[Optional[Identity], List[int]]:
        try:
            per_group = int(self.manifest["config"]["row_group_rows"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptOutputError(
                f"{self.root / MANIFEST_NAME}: missing or invalid field {exc}"
            ) from None
        if per_group >= 1 and groups == -(-rows // per_group):
            layout = [per_group] * groups
            if groups:
                layout[-1] = rows - per_group * (groups - 1)
            return None, layout
        # Not the layout `tokpack pack` writes: fetch the shard's footer now (during open).
        want: Want = ("f", *byte_range(self.manifest["shards"][k]["footer_bytes"]))
        with self.cache.ranges(k, path, size, [want], self._fetcher(k)):
            return None, self._read_footer(k, path, rows, groups)

    def _wants(self, shard: int, group: Optional[int] = None) -> List[Want]:
        wants: List[Want] = [("f", *self.shard_footers[shard])]
        if group is not None:
            wants.append((str(int(self.group_index[group])), *self.group_bytes[group]))
        return wants

    def _fetcher(self, shard: int) -> Callable[[Want], bytes]:
        name = self._shard_fields(shard)[0]

        def fetch(want: Want) -> bytes:
            tag, offset, length, checksum = want
            what = "footer" if tag == "f" else f"row group {tag}"
            for _ in range(_CHECKSUM_ATTEMPTS):
                try:
                    data = self.source.read_range(name, offset, length)
                except InputNotFoundError:
                    raise CorruptOutputError(
                        f"{self.source.uri(name)}: listed in the manifest but missing"
                    ) from None
                got = bytes_checksum(data)
                if got == checksum:
                    return data
            if self.changed(shard):
                raise CorruptOutputError(
                    f"{self.shown}: changed since the dataset was opened ({name} was replaced,"
                    " e.g. by `tokpack pack --force`): open it again"
                )
            raise CorruptOutputError(
                f"{self.source.uri(name)}: {what}: bytes {offset}..{offset + length} fetched from"
                f" object storage do not match their checksum (they hash to {got}, the manifest"
                f" says {checksum}): the object is damaged, or was replaced since the directory"
                " was opened"
            )

        return fetch

    def _read_cached(self, shard: int, group: Optional[int], read: Callable[[Path], T]) -> T:
        """``read(local file)`` of shard ``shard`` holding its footer (and row group
        ``group``), the footer checked against the manifest's layout the first time. A cached
        range that fails its check is dropped and fetched again once (see the module
        docstring)."""
        path = Path(self.shard_paths[shard])
        size = self.shard_sizes[shard]
        wants = self._wants(shard, group)
        failure: Optional[CorruptOutputError] = None
        for _ in range(2):
            # (a failure to fetch is raised from here as is: the store's bytes failed)
            with self.cache.ranges(shard, path, size, wants, self._fetcher(shard)):
                try:
                    self._check_layout(shard, path)
                    return read(path)
                except CorruptOutputError as exc:
                    if self.changed(shard):
                        raise
                    failure = exc
            self.cache.drop(shard, wants)
            self._footers_checked.pop(shard, None)
        # Failed again right after a fetch whose bytes matched their checksums.
        raise self._damaged_cache(shard, group, path, failure) from None

    def _check_layout(self, shard: int, path: Path) -> None:
        if shard in self._footers_checked:
            return
        _, rows, groups, _ = self._shard_fields(shard)
        found = self._read_footer(shard, path, rows, groups)
        layout = self.group_rows[self.group_shard == shard].tolist()
        if found != layout:
            raise CorruptOutputError(
                f"{self.source.uri(self._shard_fields(shard)[0])}: row groups of {found} rows,"
                f" the manifest's layout says {layout}"
            )
        self._footers_checked[shard] = found

    def _damaged_cache(
        self, shard: int, group: Optional[int], path: Path, exc: Optional[Exception]
    ) -> CorruptOutputError:
        """The error of a range that fails its check again right after a checked fetch: the
        local cache is damaged (its disk), not the object."""
        what = "footer" if group is None else f"row group {int(self.group_index[group])}"
        error = CorruptOutputError(
            f"{path}: the local cache of {self.source.uri(self._shard_fields(shard)[0])} ({what})"
            f" fails its check even after fetching it again from object storage, where its bytes"
            f" were intact: this machine's cache (cache_dir {self.root.parent}) is damaged; free"
            f" or check that disk, or pass another cache_dir ({exc})"
        )
        error.names_the_cache = True  # type: ignore[attr-defined]
        return error

    def _read_footer(self, k: int, path: Path, rows: int, groups: int) -> List[int]:
        try:
            meta = pq.ParquetFile(path).metadata
        except (pa.ArrowException, OSError) as exc:
            raise CorruptOutputError(
                f"{self.source.uri(self._shard_fields(k)[0])}: not a readable Parquet footer"
                f" ({exc})"
            ) from None
        with self.naming():
            return self._check_footer(k, path, meta, rows, groups)

    # -- reads ----------------------------------------------------------------------------

    def decode(self, group: int, columns: Optional[Sequence[str]] = None) -> Dict[str, Column]:
        shard = int(self.group_shard[group])
        with self.naming():
            return self._read_cached(
                shard, group, lambda _: super(RemotePackedDir, self).decode(group, columns)
            )

    def prefetch(self, group: int) -> None:
        _prefetch(self, group)

    def cancel_prefetch(self) -> None:
        # Queued requests carry the count they were made under: older ones are skipped.
        self._ahead_gen = getattr(self, "_ahead_gen", 0) + 1

    def cached(self, group: int) -> bool:
        """Whether row group ``group`` and its shard's footer are in the local cache now."""
        shard = int(self.group_shard[group])
        return all(self.cache.has(shard, w) for w in self._wants(shard, group))

    def fetch_group(self, group: int) -> None:
        """Fetch row group ``group`` (and its shard's footer) into the cache, if missing."""
        with self.naming():
            self._read_cached(int(self.group_shard[group]), group, lambda _: None)

    def shard_columns(self, shard: int) -> List[str]:
        with self.naming():
            return self._read_cached(shard, None, lambda path: list(pq.read_schema(path).names))

    def side_path(self, name: Any, what: str = "file") -> Path:
        path = member_path(self.root, name, what)
        recorded = self._side_files().get(str(name))
        if path.exists() and recorded is not None and str(name) not in self._sides_checked:
            if not self._side_intact(path, *recorded):
                path.unlink(missing_ok=True)  # damaged in the cache: fetched again
        if not path.exists():
            try:
                data = self.source.read(str(name))
            except InputNotFoundError:
                raise CorruptOutputError(
                    f"{self.source.uri(str(name))}: {what} listed in the manifest but missing"
                ) from None
            if recorded is not None and recorded[1] is not None:
                if (len(data), bytes_checksum(data)) != recorded:
                    raise CorruptOutputError(
                        f"{self.source.uri(str(name))}: {what}: the bytes fetched from object"
                        f" storage do not match the manifest's size and checksum: the object is"
                        f" damaged, or was replaced since the directory was opened"
                    )
            self.cache.put(path, data)
        self._sides_checked.add(str(name))
        return path

    def _side_files(self) -> Dict[str, Tuple[Any, Any]]:
        """``{name: (size, checksum)}`` of the files the manifest lists (shards, side files)."""
        return {str(name): (size, checksum) for name, size, checksum in listed_files(self.manifest)}

    @staticmethod
    def _side_intact(path: Path, size: Any, checksum: Any) -> bool:
        if size is None or checksum is None:
            return True  # (nothing recorded to check it against)
        try:
            return file_checksum(str(path)) == (size, checksum)
        except (OSError, TokpackError):
            return False

    def changed(self, shard: int) -> bool:
        try:
            text = self._read_manifest()
        except TokpackError:
            return False
        return text is None or hashlib.sha256(text).hexdigest() != self._manifest_hash

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_footers_checked"], state["_sides_checked"] = {}, set()
        return state


# -- fetching ahead of the reader ------------------------------------------------------------

# Fetch-ahead threads per process: ranged GETs in flight at once (a request's latency overlaps
# another's transfer, and the range locks keep two of them from fetching the same range).
AHEAD_THREADS = 2

_queue: "Optional[queue.SimpleQueue]" = None
_queue_pid = -1
# Held by a fetch-ahead thread while it fetches (and holds a range's or a shard's lock): a fork
# waits for all of them, so a child never inherits a lock held by a thread it does not have.
_busy = [threading.Lock() for _ in range(AHEAD_THREADS)]
# Requests queued and not finished (``settle`` waits for none).
_pending = 0
_pending_cond = threading.Condition()


def _before_fork() -> None:
    for lock in _busy:
        lock.acquire()


def _after_fork_in_parent() -> None:
    for lock in reversed(_busy):
        lock.release()


def _after_fork_in_child() -> None:
    global _busy, _pending, _pending_cond
    _busy = [threading.Lock() for _ in range(AHEAD_THREADS)]
    _pending, _pending_cond = 0, threading.Condition()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


def _ahead_loop(requests: "queue.SimpleQueue", slot: int) -> None:
    global _pending
    while True:
        packed, group, gen = requests.get()
        try:
            with _busy[slot]:
                if gen != getattr(packed, "_ahead_gen", 0):
                    continue  # cancelled (the reader that asked for it stopped)
                with contextlib.suppress(Exception):
                    # A damaged object or a network failure: the reader raises it when it gets
                    # there.
                    packed.fetch_group(group)
        finally:
            with _pending_cond:
                _pending -= 1
                _pending_cond.notify_all()


def _prefetch(packed: RemotePackedDir, group: int) -> None:
    global _queue, _queue_pid, _pending
    if _queue_pid != os.getpid():
        # The daemon threads of a process, started on first use in that process.
        _queue, _queue_pid = queue.SimpleQueue(), os.getpid()
        for slot in range(AHEAD_THREADS):
            threading.Thread(target=_ahead_loop, args=(_queue, slot), daemon=True).start()
    assert _queue is not None
    with _pending_cond:
        _pending += 1
    _queue.put((packed, group, getattr(packed, "_ahead_gen", 0)))


def settle(timeout: Optional[float] = None) -> bool:
    """Waits until this process's fetch-ahead threads have nothing queued or in flight; False
    when ``timeout`` seconds pass first. (For tests and benchmarks: readers never need it.)"""
    with _pending_cond:
        return _pending_cond.wait_for(lambda: _pending == 0, timeout)
