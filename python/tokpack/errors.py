"""The exception hierarchy: everything tokpack raises on purpose is a ``TokpackError``."""

from __future__ import annotations

from functools import partial

__all__ = [
    "TokpackError",
    "ConfigError",
    "OverlongError",
    "DataError",
    "InputNotFoundError",
    "InputPermissionError",
    "InputReadError",
    "CorruptOutputError",
    "CorruptInputError",
    "SchemaError",
    "OutputError",
    "OutputExistsError",
    "DiskSpaceError",
    "InvalidRecordError",
    "ClusterError",
    "StorageError",
    "PackingError",
]


class TokpackError(Exception):
    """Base class of every error tokpack raises on purpose."""


class ConfigError(TokpackError, ValueError):
    """An argument or option is invalid (``max_len < 1``, unknown strategy, ...)."""


class DataError(TokpackError, ValueError):
    """The input data is invalid (negative lengths, nulls, labels of the wrong length, ...).

    Messages name the file, row and column where one applies.
    """


class OverlongError(DataError):
    """A sample is longer than ``max_len`` and the overlong policy is ``"error"``. Raised by
    the packer, it also holds the sample's ``index`` (across the inputs), ``length`` and the
    ``max_len``."""

    index: int
    length: int
    max_len: int


class InputNotFoundError(TokpackError, FileNotFoundError):
    """An input file is missing (also a broken symlink or a symlink loop)."""


class InputPermissionError(TokpackError, PermissionError):
    """An input file or directory exists but tokpack may not read it."""


class InputReadError(TokpackError, OSError):
    """An input exists but cannot be read as a file: a directory or a special file (a FIFO, a
    device) where a file is expected, or reading it failed (an I/O error)."""


class CorruptOutputError(DataError):
    """An output directory's manifest or files are damaged."""


class CorruptInputError(DataError):
    """An input file is not valid Parquet / Arrow IPC, or a row group does not decode."""


class SchemaError(DataError):
    """An input file lacks a needed column, or has it with an unsupported type."""


class OutputError(TokpackError, OSError):
    """Writing the output directory (or its temporary files) failed: disk full, permissions,
    another tokpack run writing the same directory; or a DataLoader worker found no shared
    memory (``/dev/shm``) for its batch."""


class OutputExistsError(OutputError, FileExistsError):
    """The output directory exists and is not tokpack's to replace: it is not empty and either
    has no tokpack manifest or holds files its manifest does not list. Nothing was touched."""


class DiskSpaceError(OutputError):
    """The disk cannot hold what a run needs (its spill files and output), by an estimate made
    before any work: the message names the need and the free space. Nothing was written."""


class ClusterError(TokpackError, RuntimeError):
    """The Ray cluster of a ``--ray`` run failed: it could not be reached or started, or it or
    a node went away mid-run."""


class StorageError(TokpackError, OSError):
    """Object storage could not be read: a request still failed after its retries (network,
    throttling), the credentials were refused, or the local cache of a remote directory
    cannot hold what a reader needs. The message names the object (its URI)."""


class PackingError(TokpackError, RuntimeError):
    """A model would train on mixed samples with the packed batch it is given: its layers read
    boundaries the batch does not carry, or the installed transformers has no exact path for
    them on this machine. The message names the model family, the layer kind that mixes, and
    what would make it exact (a kernel package to install, another collator format)."""


class InvalidRecordError(DataError):
    """One input record (a JSONL line or a Parquet row) cannot be turned into a sample: invalid
    JSON, a missing field, an unknown role, an empty conversation, a template that fails on it.

    The message starts with ``FILE:LINE`` (JSONL lines count from 1), ``FILE:row N`` for Parquet
    (rows count from 0, as in ``pack``'s messages) or ``FILE`` alone when the whole file is
    unreadable (``line`` 0, ``row`` False); ``path`` and ``line`` hold the same.
    ``tokpack tokenize --skip-invalid`` writes these records to ``_rejected.jsonl`` instead of
    failing.
    """

    def __init__(self, path: str, line: int, reason: str, *, row: bool = False) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        self.row = row
        where = f"{path}:row {line}" if row else f"{path}:{line}" if line else path
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        # Pickled when raised in a worker process (the default would call __init__(message)).
        return (partial(InvalidRecordError, row=self.row), (self.path, self.line, self.reason))
