"""Reading objects of a prefix on object storage: whole, or a byte range, with retries.

A :class:`Source` is picklable and safe to use after a fork (a DataLoader worker): each process
rebuilds its own file system from the pickled one the first time it reads, so no client (nor its
connection pool or threads) created in the parent is used in a child.

Transient errors (a refused or reset connection, a time-out, throttling, a 5xx) are retried with
exponential backoff and jitter; a missing object, a missing bucket or refused credentials are not
(they are reported at once, naming the object's URI).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, TypeVar

import pyarrow.fs as pafs

from ..errors import CorruptOutputError, InputNotFoundError, InputPermissionError, StorageError

__all__ = ["Source", "counters"]

T = TypeVar("T")

# Open files kept per process (each is a connection-free handle knowing its object's size).
_OPEN_FILES = 256

# What this process fetched (``counters()``; the cache adds its hits and evictions).
_COUNTERS: Dict[str, int] = {}
_COUNTERS_PID = -1

# Words of the messages of errors that retrying does not cure.
_DENIED = (
    "ACCESS_DENIED",
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "credentials",
    "Unauthorized",
    "401",
)
_MISSING = ("NoSuchBucket", "NoSuchKey", "404", "NOT_FOUND", "Not Found", "does not exist")


def counters() -> Dict[str, int]:
    """This process's counters: ``requests`` and ``bytes_fetched`` (successful reads),
    ``retries``, and the cache's ``hits``, ``misses`` (ranges fetched) and ``evictions``."""
    global _COUNTERS, _COUNTERS_PID
    if _COUNTERS_PID != os.getpid():
        _COUNTERS_PID = os.getpid()
        _COUNTERS = dict.fromkeys(
            ("requests", "bytes_fetched", "retries", "hits", "misses", "evictions"), 0
        )
    return _COUNTERS


# What the calling thread fetched while a cache collects it (``collecting``).
_LOCAL = threading.local()


def count(name: str, n: int = 1) -> None:
    counters()[name] += n
    mine = getattr(_LOCAL, "collected", None)
    if mine is not None:
        mine[name] = mine.get(name, 0) + n


@contextlib.contextmanager
def collecting() -> Iterator[Dict[str, int]]:
    """What this thread counts inside the block (besides the process's counters)."""
    collected: Dict[str, int] = {}
    _LOCAL.collected = collected
    try:
        yield collected
    finally:
        _LOCAL.collected = None


class Source:
    """A prefix of a file system (``fs``: a ``pyarrow.fs.FileSystem``), named ``shown`` in
    messages (``s3://bucket/packed``)."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        prefix: str,
        shown: str,
        *,
        retries: int = 5,
        backoff: float = 0.2,
    ) -> None:
        self.prefix = prefix.rstrip("/")
        self.shown = shown.rstrip("/")
        self.retries = int(retries)
        self.backoff = float(backoff)
        self._pickled = pickle.dumps(fs)
        self._fs: Optional[pafs.FileSystem] = fs
        self._pid = os.getpid()
        self._files: Dict[str, Any] = {}

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"], state["_pid"] = None, -1
        state["_files"] = {}
        return state

    @property
    def fs(self) -> pafs.FileSystem:
        if self._fs is None or self._pid != os.getpid():
            # A forked or spawned worker: a client (and open files) of its own.
            self._fs, self._pid, self._files = pickle.loads(self._pickled), os.getpid(), {}
        return self._fs

    def uri(self, name: str) -> str:
        return f"{self.shown}/{name}"

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _call(self, name: str, what: str, read: Callable[[], T]) -> T:
        """``read()`` with retries of transient errors (counted, with the bytes it returns);
        errors name ``name``'s URI."""
        for attempt in range(self.retries + 1):
            try:
                result = read()
                count("requests")
                if isinstance(result, bytes):
                    count("bytes_fetched", len(result))
                return result
            except FileNotFoundError:
                raise InputNotFoundError(f"{self.uri(name)}: no such object") from None
            except PermissionError as exc:
                raise InputPermissionError(f"{self.uri(name)}: access denied ({exc})") from None
            except OSError as exc:
                text = str(exc)
                if any(w in text for w in _DENIED):
                    raise InputPermissionError(
                        f"{self.uri(name)}: access denied ({text.strip()}); check the "
                        "credentials (for S3: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a "
                        "profile, or filesystem=)"
                    ) from None
                if any(w in text for w in _MISSING):
                    raise InputNotFoundError(
                        f"{self.uri(name)}: no such object or bucket ({text.strip()})"
                    ) from None
                if attempt == self.retries:
                    raise StorageError(
                        f"{self.uri(name)}: cannot {what} after {self.retries + 1} attempts "
                        f"({text.strip()})"
                    ) from None
                count("retries")
                delay = min(self.backoff * 2**attempt, 10.0)
                time.sleep(delay * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def read(self, name: str) -> bytes:
        """The whole object ``name`` (under the prefix)."""

        def read() -> bytes:
            with self.fs.open_input_stream(self.key(name)) as f:
                return f.read()

        return self._call(name, "read", read)

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes of object ``name`` from ``offset`` (one ranged GET)."""

        def read() -> bytes:
            data = self._file(name).read_at(length, offset)
            if len(data) != length:
                raise CorruptOutputError(
                    f"{self.uri(name)}: bytes {offset}..{offset + length}: got {len(data)} bytes"
                    " (the object is shorter than the manifest says: truncated or replaced)"
                )
            return data

        return self._call(name, f"read bytes {offset}..{offset + length}", read)

    def _file(self, name: str) -> Any:
        """An open random-access file of object ``name``, kept per process (opening one asks
        the object's size: a request saved for every later range of it)."""
        fs = self.fs  # (first: a forked worker starts without its parent's files)
        files = self._files
        f = files.get(name)
        if f is None:
            f = files[name] = fs.open_input_file(self.key(name))
            count("requests")  # (the size asked)
            while len(files) > _OPEN_FILES:
                files.pop(next(iter(files))).close()
        return f

    def size(self, name: str) -> Optional[int]:
        """The size of object ``name``, None when it does not exist."""
        info = self._call(name, "stat", lambda: self.fs.get_file_info(self.key(name)))
        return info.size if info.type == pafs.FileType.File else None
