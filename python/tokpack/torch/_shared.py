"""Row groups decoded once for all the DataLoader workers of a reader.

Worker ``w`` of ``n`` builds batches ``w, w + n, ...`` and a row group holds rows of many batches,
so each worker alone would decode every row group it touches: ``n`` workers decoded the corpus
``n`` times per pass (on 2 cores, 4 workers spent most of their time decoding Parquet). Here the
first worker that needs a row group decodes it, as before (checked against the manifest the
reader opened), and publishes its columns as one file in a directory in shared memory
(``/dev/shm``); the other workers map that file instead of decoding the group again.

Decoding a group happens under an exclusive lock (one of a few lock files, by group number), held
only while decoding: a worker never waits on anything but a decode in progress, so workers cannot
deadlock whatever order the DataLoader asks them in, and a worker that dies releases its lock.
Files are written under a temporary name and renamed, so a reader maps complete groups only.

The directory's name is fixed when the reader is created (so forked and spawned workers find the
same one); the first worker that publishes creates it, and it is removed when the reader that
named it is garbage-collected in the process that created it (or that process exits); the
directories of creators that died without that (kill -9) are removed by the next reader created
on the machine. It is private to the user (mode 0700). It holds
at most ``capacity`` groups: the oldest are unlinked first (a worker that mapped one keeps its
mapping; one that needs it again decodes it again). A group with non-numeric columns (carried
strings), or one that does not fit (no space left in ``/dev/shm``), is not published: it is used
only where it was decoded.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import queue
import shutil
import tempfile
import threading
import uuid
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .._io.pids import pid_alive
from ..packed.reader import Column

__all__ = ["SharedGroups", "readahead"]

# Lock files per directory: decodes of groups with the same number modulo this wait on each other.
_LOCKS = 16
# Byte offsets of arrays in a group's file: a multiple of every element size.
_ALIGN = 64
_SUFFIX = ".group"
_PREFIX = "tokpack-groups-"


def _remove_orphans(root: str) -> None:
    """Removes this user's group directories whose creator is gone (killed: no finalizer ran)."""
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for e in entries:
            pid = e.name[len(_PREFIX) :].split("-", 1)[0]
            if e.name.startswith(_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    if e.stat(follow_symlinks=False).st_uid == os.getuid():
                        shutil.rmtree(e.path, ignore_errors=True)


def _remove(path: str, owner: int) -> None:
    # A forked worker inherits the reader and this finalizer: only the creator removes.
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _encode(cols: Dict[str, Column]) -> Optional[Tuple[bytes, List[np.ndarray]]]:
    """(header, arrays) of a group's file, None when a column is not numeric."""
    entries = []
    arrays: List[np.ndarray] = []
    offset = 0
    for name, col in cols.items():
        parts = col if isinstance(col, tuple) else (col,)
        if any(p.dtype == object for p in parts):
            return None
        specs = []
        for p in parts:
            specs.append((p.dtype.str, offset, len(p)))
            arrays.append(np.ascontiguousarray(p))
            offset += _aligned(p.nbytes)
        entries.append((name, isinstance(col, tuple), specs))
    header = json.dumps(entries).encode()
    return len(header).to_bytes(8, "little") + header, arrays


def _load(path: str) -> Optional[Dict[str, Column]]:
    """A published group's columns as read-only views of the mapped file, None if absent."""
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        return None  # not published yet, or already evicted
    size = int.from_bytes(buf[:8], "little")
    base = _aligned(8 + size)
    cols: Dict[str, Column] = {}
    for name, is_list, specs in json.loads(buf[8 : 8 + size]):
        parts = tuple(
            np.frombuffer(buf, dtype=np.dtype(dtype), count=count, offset=base + offset)
            for dtype, offset, count in specs
        )
        cols[name] = parts if is_list else parts[0]  # type: ignore[assignment]
    return cols


class SharedGroups:
    """Decoded row groups shared by the worker processes of one reader (see the module doc)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, int(capacity))
        root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        _remove_orphans(root)
        self.path = os.path.join(root, f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")
        # A pickled copy (a spawned worker's) uses the directory; the creator alone removes it
        # (unpickling runs no __init__, so a copy has no finalizer).
        weakref.finalize(self, _remove, self.path, os.getpid())

    def get(self, group: int, decode: Callable[[], Dict[str, Column]]) -> Dict[str, Column]:
        """Group ``group``'s columns: mapped when another worker published them, else
        ``decode()`` (then published)."""
        data = os.path.join(self.path, f"{group}{_SUFFIX}")
        cols = _load(data) or self._decode_locked(group, data, decode, wait=True)
        assert cols is not None
        return cols

    def prefetch(self, group: int, decode: Callable[[], Dict[str, Column]]) -> None:
        """Decode and publish group ``group`` unless it is published or being decoded."""
        data = os.path.join(self.path, f"{group}{_SUFFIX}")
        if not os.path.exists(data):
            self._decode_locked(group, data, decode, wait=False)

    def _decode_locked(
        self, group: int, data: str, decode: Callable[[], Dict[str, Column]], wait: bool
    ) -> Optional[Dict[str, Column]]:
        """Under the group's lock: the published columns, else ``decode()`` published. Without
        ``wait``, None when another decode holds the lock."""
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        with open(os.path.join(self.path, f"lock-{group % _LOCKS}"), "a") as lock:
            try:
                # Released when the file is closed.
                fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            cols = _load(data)
            if cols is None:
                cols = decode()
                if self._publish(data, cols):
                    self._evict()
        return cols

    def _publish(self, data: str, cols: Dict[str, Column]) -> bool:
        encoded = _encode(cols)
        if encoded is None:
            return False
        header, arrays = encoded
        tmp = f"{data}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(bytes(_aligned(len(header)) - len(header)))
                for a in arrays:
                    f.write(memoryview(a).cast("B"))  # type: ignore[arg-type]
                    f.write(bytes(_aligned(a.nbytes) - a.nbytes))
            os.replace(tmp, data)
        except OSError:
            # No space in shared memory (or the directory went away): keep the group local.
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        return True

    def _evict(self) -> None:
        """Unlink the oldest published groups beyond ``capacity``."""
        published = []
        with os.scandir(self.path) as entries:
            for e in entries:
                if e.name.endswith(_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):  # another worker evicted it
                        published.append((e.stat().st_mtime_ns, e.name, e.path))
        published.sort()
        for _, _, path in published[: max(0, len(published) - self.capacity)]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


# -- readahead -------------------------------------------------------------------------------------

_queue: "Optional[queue.SimpleQueue]" = None
_queue_pid = -1


def _readahead_loop(requests: "queue.SimpleQueue") -> None:
    while True:
        shared, group, decode = requests.get()
        # A damaged or rebuilt directory: the reader raises it when it reaches the group.
        with contextlib.suppress(Exception):
            shared.prefetch(group, decode)


def readahead(shared: SharedGroups, group: int, decode: Callable[[], Dict[str, Column]]) -> None:
    """Have this process's readahead thread decode and publish ``group`` while the caller goes
    on (decoding runs in Rust without the GIL)."""
    global _queue, _queue_pid
    if _queue_pid != os.getpid():
        # One daemon thread per process, started in the worker itself (threads do not survive
        # a fork): it dies with the worker.
        _queue, _queue_pid = queue.SimpleQueue(), os.getpid()
        threading.Thread(target=_readahead_loop, args=(_queue,), daemon=True).start()
    assert _queue is not None
    _queue.put((shared, group, decode))
