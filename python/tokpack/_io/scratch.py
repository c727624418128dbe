"""Scratch directories tokpack makes outside an output's own temporary: the spill of ``pack
--spill-dir`` (``.tokpack-spill-*``), the local staging of a run writing to object storage
(``tokpack-staged-*``, in ``--spill-dir`` or the system's temporary directory), and the other
local copies a run to or from object storage keeps while it works.

Each is ``PARENT/PREFIX<pid>-<tag>`` with a lock file ``PARENT/PREFIX<pid>-<tag>.lock`` beside
it, ``flock``-ed by the run for its whole life (the kernel releases it when the process dies,
kill -9 included), made before the directory and removed after it. The next run that makes a
scratch directory in PARENT (any command) removes those whose lock nobody holds: a dead run's.
A live run's lock is held, so its directory is never touched; nothing but names of this shape
with their lock file is ever removed (never a user's file).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Union

from ..errors import ConfigError, OutputError

__all__ = ["scratch_dir", "remove_dead", "check_work_dir", "SPILL_PREFIX", "STAGED_PREFIX"]

SPILL_PREFIX = ".tokpack-spill-"
STAGED_PREFIX = "tokpack-staged-"
# Every prefix a scratch directory has (``scratch_dir``'s callers use only these).
PREFIXES = (
    SPILL_PREFIX,
    STAGED_PREFIX,
    "tokpack-export-",
    "tokpack-check-",
    "tokpack-ray-claim-",
    "tokpack-ray-shard-",
)
_LOCK = ".lock"
_NAMES = re.compile(
    rf"(?:{'|'.join(re.escape(p) for p in PREFIXES)})\d+-[0-9a-f]{{12}}{re.escape(_LOCK)}"
)


def remove_dead(parent: Union[str, os.PathLike]) -> None:
    """Removes the scratch directories in ``parent`` whose run died (see the module
    docstring), and their lock files."""
    pattern, parent = _NAMES, str(parent)
    try:
        with os.scandir(parent) as entries:
            names = [e.name for e in entries if pattern.fullmatch(e.name)]
    except OSError:
        return
    for name in names:
        remove_unheld(Path(parent, name), Path(parent, name[: -len(_LOCK)]))


def remove_unheld(lock: Path, folder: Optional[Path] = None) -> None:
    """Removes the lock file ``lock`` when nobody holds its flock (its run died, kill -9), and
    first ``folder`` (that run's directory); nothing when it is held, or was replaced meanwhile
    (not the file this lock is)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            if folder is not None and folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder, ignore_errors=True)
            os.unlink(lock)
    except OSError:
        pass  # held by a live run (or already removed by another run)
    finally:
        os.close(fd)


@contextlib.contextmanager
def scratch_dir(prefix: str, parent: Optional[Union[str, os.PathLike]] = None) -> Iterator[Path]:
    """A new scratch directory ``PREFIX<pid>-<tag>`` in ``parent`` (default: the system's
    temporary directory), owned by this run through its lock (see the module docstring) and
    removed when the block ends, whatever happens; dead runs' ones there are removed first."""
    assert prefix in PREFIXES
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    remove_dead(parent)
    while True:
        name = f"{prefix}{os.getpid()}-{secrets.token_hex(6)}"
        lock = parent / f"{name}{_LOCK}"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        except OSError as exc:
            raise OutputError(
                f"{parent}: cannot create a scratch directory ({exc.strerror})"
            ) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            held = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:  # taken for a dead run's by another run before the flock
            held = False
        if held:
            break
        os.close(fd)
    folder = parent / name
    try:
        try:
            os.mkdir(folder, 0o700)
        except OSError as exc:
            raise OutputError(f"{folder}: cannot create ({exc.strerror})") from None
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def check_work_dir(path: Union[str, os.PathLike], name: str) -> Path:
    """The real path of a directory a run will work in (``spill_dir``, named ``name`` in
    messages), checked before any work: an existing directory (no symlink loop, no file in the
    way) where files can be created."""
    text = os.fspath(path)
    if not text:
        raise ConfigError(f"{name} must be an existing directory, not an empty path")
    real = Path(os.path.realpath(text))
    try:
        mode = os.stat(real).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"{name} must be an existing directory: {text} is a symlink loop"
            ) from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ConfigError(
                f"{name} must be an existing directory: {text} does not exist"
            ) from None
        raise OutputError(f"{name} {text}: cannot use it ({exc.strerror})") from None
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"{name} must be an existing directory: {text} is a file")
    if not os.access(real, os.W_OK | os.X_OK):
        raise OutputError(
            f"{name} {text}: cannot create files in it (read-only or permission denied); "
            "choose a directory this user can write"
        )
    return real
