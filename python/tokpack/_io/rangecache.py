"""The local cache of a packed directory on object storage: byte ranges of its shards on disk.

Each remote shard has a local *sparse* file of the shard's size, into which the ranges a reader
needs (the footer, row groups) are written at their own offsets once fetched and checked
against the manifest's checksums. The Rust reader then decodes the local file exactly as it
decodes a local shard (it reads only the footer's and the row group's bytes, and checks them
again), so nothing in the decoder knows about object storage.

Which ranges are present is told by empty marker files ``.tokpack-cache/have/SHARD.TAG.OFFSET.
LENGTH`` (TAG ``f`` for the footer, else the row group), created after the bytes are written.
Their modification time is the last use. The cache is shared by every process on the machine
that reads the same remote directory (the DataLoader workers of a node, several ranks on one
node): a range is fetched once between them.

Locks (``flock``, released when a process dies):

- per shard: shared while a process checks its ranges and decodes, exclusive while a range is
  written into it and while an evictor punches holes into it (evictors never wait for a shard in
  use: they skip it); not held while a range is fetched, so the shard's other ranges stay
  readable meanwhile;
- per range: exclusive while it is fetched (a second fetcher of the same range, a thread or a
  process, waits and finds it present once it gets the lock: fetched once);
- the cache's: held while bytes are written and while making room, so that the space used, as
  the file system allocates it (``st_blocks``), never exceeds ``limit`` outside it. Room is made
  for a range's blocks before it is written; what the file system allocates beyond them (extent
  blocks of a sparse file, a partial block left by a punched neighbour) is evicted after the
  write, before the lock is released. :func:`usage` reads the figure under this lock.

A range whose cached bytes fail their check when read (a damaged or truncated file under the
cache) is dropped and fetched again once by its reader (:meth:`RangeCache.drop`); the bytes
fetched are checked before they are cached, so only the store's own bytes can fail twice.

Eviction frees the least recently used row groups first (punching holes into the sparse file,
so the space is returned without rewriting it); a shard's footer goes with its last row group.
Where the file system cannot punch holes, the whole shard file is removed instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

from ..errors import ConfigError, StorageError
from .fetch import collecting, count

__all__ = ["RangeCache", "Want", "cache_counters", "usage"]

META = ".tokpack-cache"
# How long a writer waits for other readers to release shards it must evict to make room.
_ROOM_TIMEOUT = 120.0
_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2

_TOTALS_LOCK = threading.Lock()

# (tag, offset, length, checksum): a range of a shard ("f" the footer, else the row group).
Want = Tuple[str, int, int, str]


def _libc_fallocate() -> Optional[Callable[..., int]]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_FALLOCATE = _libc_fallocate()


def _punch(fd: int, offset: int, length: int) -> bool:
    """Frees the blocks of ``[offset, offset + length)`` (zeroing its bytes), keeping the size."""
    if _FALLOCATE is None or length <= 0:
        return False
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    return _FALLOCATE(fd, mode, offset, length) == 0


def usage(root: os.PathLike) -> int:
    """Bytes the file system allocates for the cached data under ``root`` (its shards and side
    files; the markers and locks are empty files), between two writes (under the cache's lock:
    the figure ``cache_limit`` bounds)."""
    lock_path = Path(root) / META / "lock"
    if not lock_path.exists():
        return _usage(root)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        return _usage(root)


def _usage(root: Union[str, os.PathLike]) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):  # type: ignore[type-var]
        if META in dirnames:
            dirnames.remove(META)
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


class RangeCache:
    """Ranges of the shards of one remote directory, cached under ``root`` up to ``limit`` bytes
    (see the module docstring)."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root = Path(root)
        self.limit = int(limit)
        self.meta = self.root / META
        (self.meta / "have").mkdir(parents=True, exist_ok=True)
        (self.meta / "locks").mkdir(exist_ok=True)
        # The local file of each shard, set by the reader (markers name shards by number).
        self.shard_files: List[Path] = []
        # What this process fetched into the cache (see `_record`).
        self._totals: Dict[str, int] = {}
        self._totals_pid = os.getpid()
        try:
            self.block = os.statvfs(self.root).f_bsize
        except OSError:
            self.block = 4096

    def _marker(self, shard: int, want: Want) -> Path:
        tag, offset, length, _ = want
        return self.meta / "have" / f"{shard}.{tag}.{offset}.{length}"

    def drop(self, shard: int, wants: Sequence[Want]) -> None:
        """Forgets ranges of shard ``shard`` whose cached bytes failed their check, so that the
        next read fetches them again (under the shard's lock: no reader is decoding it)."""
        with open(self.meta / "locks" / str(shard), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for want in wants:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._marker(shard, want))

    def has(self, shard: int, want: Want) -> bool:
        """Whether range ``want`` of shard ``shard`` is cached now (it may be evicted later)."""
        return self._marker(shard, want).exists()

    def _span(self, offset: int, length: int) -> int:
        """Bytes of the blocks ``[offset, offset + length)`` touches."""
        if length <= 0:
            return 0
        b = self.block
        return ((offset + length - 1) // b - offset // b + 1) * b

    def check_fits(self, need: int, what: str) -> None:
        if self._span(0, need) + 2 * self.block > self.limit:
            raise ConfigError(
                f"cache_limit={self.limit} bytes cannot hold {what} ({need} bytes): raise it"
            )

    @contextlib.contextmanager
    def ranges(
        self,
        shard: int,
        path: Path,
        size: int,
        wants: Sequence[Want],
        fetch: Callable[[Want], bytes],
    ) -> Iterator[Path]:
        """The local file of shard ``shard`` (``path``, of ``size`` bytes) holding ``wants``,
        fetched (``fetch(want)``: its bytes, checked by the caller) when missing. The ranges stay
        until the block exits (the shard's lock is held shared)."""
        with open(self.meta / "locks" / str(shard), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
            missing = [w for w in wants if not self._marker(shard, w).exists()]
            count("hits", len(wants) - len(missing))
            while missing:
                # Nothing of the shard is held while fetching: its other ranges stay readable
                # (by this process's other threads too) while a range is on the wire.
                fcntl.flock(lock, fcntl.LOCK_UN)
                with collecting() as fetched:
                    try:
                        for want in missing:
                            self._fill(shard, path, size, want, wants, fetch, lock)
                    finally:
                        self._record(fetched)
                # An evictor may have taken a range back meanwhile: the loop looks again.
                fcntl.flock(lock, fcntl.LOCK_SH)
                missing = [w for w in wants if not self._marker(shard, w).exists()]
            now = time.time()
            for want in wants:
                with contextlib.suppress(FileNotFoundError):
                    os.utime(self._marker(shard, want), (now, now))
            yield path

    def _fill(
        self,
        shard: int,
        path: Path,
        size: int,
        want: Want,
        keep: Sequence[Want],
        fetch: Callable[[Want], bytes],
        lock,
    ) -> None:
        """Fetches ``want`` into the cache unless present. The range's own lock makes its
        fetchers on the node wait for the first (who finds it present after it gets the lock:
        fetched once); the shard's lock (``lock``) is exclusive only while writing."""
        tag = want[0]
        with open(self.meta / "locks" / f"{shard}.{tag}", "a") as mine:
            fcntl.flock(mine, fcntl.LOCK_EX)
            if self._marker(shard, want).exists():
                return
            data = fetch(want)
            count("misses")
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._store(shard, path, size, want, data, keep)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _record(self, fetched: Dict[str, int]) -> None:
        """Adds what this thread just fetched to this process's totals for the cache, and
        writes them to its counters file there (read by :func:`cache_counters`)."""
        if not fetched:
            return
        with _TOTALS_LOCK:
            if self._totals_pid != os.getpid():
                self._totals, self._totals_pid = {}, os.getpid()
            for key, value in fetched.items():
                self._totals[key] = self._totals.get(key, 0) + value
            folder = self.meta / "counters"
            folder.mkdir(exist_ok=True)
            tmp = folder / f".{os.getpid()}.tmp"
            tmp.write_text(json.dumps(self._totals))
            os.replace(tmp, folder / str(os.getpid()))

    def put(self, path: Path, data: bytes) -> None:
        """A whole side file (an index, the dropped list), written atomically under ``root``."""
        with self._room(len(data)):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)

    def _store(
        self, shard: int, path: Path, size: int, want: Want, data: bytes, keep: Sequence[Want]
    ) -> None:
        _, offset, length, _ = want
        with self._room(self._span(offset, length), shard, keep):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size != size:
                    os.ftruncate(fd, size)
                view = memoryview(data)
                while view:
                    view = view[os.pwrite(fd, view, offset + len(data) - len(view)) :]
            finally:
                os.close(fd)
            self._marker(shard, want).touch()

    @contextlib.contextmanager
    def _room(
        self, need: int, shard: Optional[int] = None, keep: Sequence[Want] = ()
    ) -> Iterator[None]:
        """Holds the cache's lock with ``need`` bytes free under the limit, evicting the least
        recently used ranges first (never ``keep`` of ``shard``, whose lock the caller holds
        exclusively, nor a shard another process is using)."""
        deadline = time.monotonic() + _ROOM_TIMEOUT
        with open(self.meta / "lock", "a") as lock:
            while True:
                fcntl.flock(lock, fcntl.LOCK_EX)
                while _usage(self.root) + need > self.limit:
                    if not self._evict_one(shard, keep):
                        break
                else:
                    yield
                    while _usage(self.root) > self.limit and self._evict_one(shard, keep):
                        pass
                    return
                fcntl.flock(lock, fcntl.LOCK_UN)
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"{self.root}: the cache (cache_limit={self.limit} bytes) stays full of"
                        " ranges other readers are using; raise cache_limit"
                    )
                time.sleep(0.05)

    def _markers(self) -> List[Tuple[float, int, str, int, int, str]]:
        found = []
        with os.scandir(self.meta / "have") as entries:
            for e in entries:
                # (a name of another shape, or a marker evicted meanwhile, is passed over)
                with contextlib.suppress(FileNotFoundError, ValueError):
                    shard, tag, offset, length = e.name.split(".")
                    found.append(
                        (e.stat().st_mtime, int(shard), tag, int(offset), int(length), e.path)
                    )
        return sorted(found)

    def _evict_one(self, mine: Optional[int], keep: Sequence[Want]) -> bool:
        """Evicts the least recently used range that may go; False when none may."""
        markers = self._markers()
        groups: Set[int] = {m[1] for m in markers if m[2] != "f"}
        kept = {(w[0], w[1]) for w in keep}
        for _, shard, tag, offset, length, marker in markers:
            if shard == mine and (tag, offset) in kept:
                continue
            if tag == "f" and shard in groups:
                continue  # a footer goes with its shard's last row group
            if shard == mine:
                self._evict(shard, tag, offset, length, marker, markers)
                return True
            with open(self.meta / "locks" / str(shard), "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # in use: never waited for
                if os.path.exists(marker):
                    self._evict(shard, tag, offset, length, marker, markers)
                    return True
        return False

    def _evict(self, shard: int, tag: str, offset: int, length: int, marker: str, markers) -> None:
        os.unlink(marker)
        count("evictions")
        if not 0 <= shard < len(self.shard_files):
            return
        path = self.shard_files[shard]
        if tag == "f":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            punched = _punch(fd, offset, length)
        finally:
            os.close(fd)
        if not punched:
            # No holes on this file system: the whole shard goes (its other markers first).
            for m in markers:
                if m[1] == shard:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(m[5])
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def cache_counters(root: os.PathLike) -> Dict[str, int]:
    """What every process that read through the cache at ``root`` (a reader's
    ``packed.root``) fetched into it: ``requests``, ``bytes_fetched``, ``retries``, ``misses``
    (ranges fetched) and ``evictions`` made while fetching, summed over the processes."""
    total: Dict[str, int] = {}
    folder = Path(root) / META / "counters"
    for path in folder.glob("[0-9]*") if folder.is_dir() else ():
        with contextlib.suppress(FileNotFoundError, ValueError):
            for key, value in json.loads(path.read_text()).items():
                total[key] = total.get(key, 0) + int(value)
    return total
