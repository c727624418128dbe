"""Atomic output directories with a manifest cache, shared by every command that writes a
directory (``pack``, ``tokenize``).

A run writes into a temporary directory next to OUT_DIR and renames it into place only when
everything is written, so OUT_DIR is either absent or complete, whatever happens to the process
(Ctrl-C, kill -9). Leftover temporaries of dead runs are removed by the next run. The manifest
records a cache key (input fingerprints + full config); the same key means the output is current
and the run does no work.

tokpack replaces only what it wrote: OUT_DIR must be absent, empty, or a tokpack output holding
nothing but the shards its manifest lists and the side folder; anything else is refused before
any work, and again just before the swap. A symlinked OUT_DIR is written through (its target is
replaced, the link stays). Runs writing one OUT_DIR are serialised by ``.NAME.lock`` next to it
(``flock``): a second run refuses at once with a message instead of racing the first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Union

import pyarrow as pa

from .. import _tokpack
from .._tokpack import SIDE_DIR
from ..errors import (
    ConfigError,
    CorruptOutputError,
    OutputError,
    OutputExistsError,
    TokpackError,
)
from .inputs import input_error, shown_path
from .manifest import MANIFEST_NAME, read_manifest, write_json_atomic  # noqa: F401 (re-exported)
from .objects import object_fingerprint
from .pids import remove_dead_temporaries
from .scratch import remove_unheld

# Side files (manifest, indexes, accounting) live in SIDE_DIR, a subdirectory Parquet readers
# skip: pyarrow.dataset ignores names starting with "_", Hugging Face datasets ignores directories
# starting with "__". So `pyarrow.dataset.dataset(OUT_DIR)` and
# `datasets.load_dataset("parquet", data_dir=OUT_DIR)` both see only the data files.
_TMP_TAG = ".tmp-"
_OLD_TAG = ".old-"
_LOCK_SUFFIX = ".lock"


def fingerprint_file(path: os.PathLike) -> str:
    """Content fingerprint of a file: xxh3-128 over its parts (a Parquet file's row groups and
    the gaps between them), as ``pack`` takes it while reading an input
    (``tokpack_core::io::fingerprint``; the GIL is released)."""
    return _tokpack.file_fingerprint(os.fspath(path))[1]


def _describe(path: Path, contents: bool = True) -> Dict[str, Any]:
    remote = object_fingerprint(path)
    if remote is not None:  # a copy of an object: described by the object, not re-hashed
        uri, size, fingerprint = remote
        return {"path": uri, "size": size, "fingerprint": fingerprint}
    try:
        size = path.stat().st_size
        described = {"path": str(path.resolve()), "size": size}
        if contents:
            described["fingerprint"] = fingerprint_file(path)
    except OSError as exc:
        raise input_error(path, exc) from None
    return described


def describe_inputs(
    paths: Sequence[os.PathLike], threads: Optional[int] = None, contents: bool = True
) -> List[Dict[str, Any]]:
    """Path, size and content fingerprint of every input file, in order (files hashed on
    ``threads`` threads, default all cores: the hashing releases the GIL). Without
    ``contents`` local files get no fingerprint yet: the run that reads them takes it
    (:func:`add_fingerprints`)."""
    return _pooled(lambda p: _describe(Path(p), contents), paths, threads)


def add_fingerprints(
    described: List[Dict[str, Any]],
    paths: Sequence[os.PathLike],
    taken: Sequence[str] = (),
    threads: Optional[int] = None,
) -> None:
    """Gives every input described without a fingerprint the one its run ``taken`` while
    reading it (in input order), or hashes it now (on ``threads`` threads, default all cores:
    the hashing releases the GIL)."""
    missing = [i for i, d in enumerate(described) if "fingerprint" not in d]
    for i in [i for i in missing if i < len(taken)]:
        described[i]["fingerprint"] = taken[i]
    missing = [i for i in missing if i >= len(taken)]
    for i, fp in zip(missing, _pooled(lambda i: fingerprint_file(paths[i]), missing, threads)):
        described[i]["fingerprint"] = fp


def _pooled(work: Callable[[Any], Any], items: Sequence[Any], threads: Optional[int]) -> List[Any]:
    """``work`` of each item, in order, on ``threads`` threads (default all cores: the hashing
    releases the GIL)."""
    workers = max(1, min(len(items), threads or _tokpack.default_threads()))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(work, items))


def cache_key(kind: str, inputs: List[Dict[str, Any]], config: Dict[str, Any]) -> str:
    """A digest of everything that determines the output bytes."""
    blob = json.dumps({"kind": kind, "inputs": inputs, "config": config}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def _clean_stale(out_dir: Path) -> None:
    """Removes temporaries and the lock file left by runs that died (their pid is gone), so the
    next run leaves none behind, a cache hit included."""
    parent, prefix = out_dir.parent, f".{out_dir.name}"
    # ``.NAME.tmp-PID-TAG`` / ``.NAME.old-PID-TAG``: a run's temporaries, by its pid.
    tags = "|".join(re.escape(tag) for tag in (_TMP_TAG, _OLD_TAG))
    remove_dead_temporaries(
        parent, re.compile(rf"{re.escape(prefix)}(?:{tags})(\d+)(?:-.*)?", re.DOTALL)
    )
    # The lock file of a run that died (kill -9): nobody holds its flock. A run that opened it
    # meanwhile sees it unlinked and takes a new one (see :func:`_output_lock`).
    remove_unheld(parent / f"{prefix}{_LOCK_SUFFIX}")


def output_target(out_dir: Union[str, os.PathLike]) -> Path:
    """The real path of the directory a run will replace, checked before any work: not an empty
    path, not the current directory or one containing it, no symlink loop, no file in the way,
    and replaceable (see :func:`check_replaceable`). Symlinks are resolved, so a symlinked
    OUT_DIR is written through."""
    text = os.fspath(out_dir)
    if not text:
        raise ConfigError("the output directory is an empty path")
    real = Path(os.path.realpath(text))
    try:
        mode: Optional[int] = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{text}: symlink loop (too many levels of symbolic links)") from None
        if exc.errno == errno.ENOTDIR:
            blocker = next((p for p in real.parents if p.exists() and not p.is_dir()), real)
            raise ConfigError(f"{text}: {blocker} is a file, not a directory") from None
        raise OutputError(f"{text}: cannot use as output directory ({exc.strerror})") from None
    if mode is not None and not stat.S_ISDIR(mode):
        raise ConfigError(f"{text} exists and is not a directory")
    cwd = Path(os.path.realpath(os.getcwd()))
    if real == cwd or real in cwd.parents:
        raise ConfigError(
            f"{text}: the output directory is the current directory or contains it; tokpack "
            "replaces the output directory as a whole: name a new subdirectory"
        )
    check_replaceable(real, text)
    with contextlib.suppress(OSError):  # a read-only parent still allows a cache hit
        _clean_stale(real)
    return real


def check_replaceable(out_dir: Path, shown: object = None) -> None:
    """Raises OutputExistsError unless ``out_dir`` is absent, empty, or a tokpack output that
    holds only its manifest's shards and the side folder (so replacing it loses nothing)."""
    shown = out_dir if shown is None else shown
    try:
        entries = sorted(os.listdir(out_dir))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"{shown}: cannot list the output directory ({exc.strerror})") from None
    if not entries:
        return
    try:
        manifest = read_manifest(out_dir)
    except CorruptOutputError:
        raise OutputExistsError(
            f"{shown}: refusing to replace it: its {MANIFEST_NAME} is unreadable, so tokpack "
            "cannot tell what it wrote; remove the directory yourself or choose another"
        ) from None
    if not is_tokpack_manifest(manifest):
        raise OutputExistsError(
            f"{shown}: refusing to replace a non-empty directory that tokpack did not write "
            f"(no {MANIFEST_NAME}); choose a new or empty directory"
        )
    foreign = set(foreign_names(entries, manifest))
    # A listed name that is not a file (a folder in its place) is not what tokpack wrote either.
    unknown = [
        n for n in entries if n in foreign or (n != SIDE_DIR and not (out_dir / n).is_file())
    ]
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise OutputExistsError(
            f"{shown}: refusing to replace it: it holds files tokpack did not write "
            f"({', '.join(unknown[:5])}{more}); move them away or choose another directory"
        )


def is_tokpack_manifest(manifest: Any) -> bool:
    """Whether a parsed manifest is one tokpack wrote (the claim on an output it may replace)."""
    return isinstance(manifest, dict) and "tokpack_version" in manifest


def foreign_names(
    names: Sequence[str], manifest: Any, ours: Optional[Callable[[str], bool]] = None
) -> List[str]:
    """The output rule, for every destination: the names under an output (top-level entries of
    a directory, or every key under an object-store prefix) that tokpack did not write, given
    its manifest (None when there is none): the shards the manifest lists and the side folder
    are tokpack's; ``ours`` adds what a destination's own runs leave (an object store's staging
    names, see ``ray._store``). An output is replaced only when this is empty."""
    listed: Set[str] = set()
    if is_tokpack_manifest(manifest):
        shards = [s for s in manifest.get("shards") or [] if isinstance(s, dict)]
        listed = {SIDE_DIR} | {s["file"] for s in shards if isinstance(s.get("file"), str)}
    return [
        n
        for n in names
        if not (
            n in listed
            or (bool(listed) and n.startswith(f"{SIDE_DIR}/"))
            or (ours is not None and ours(n))
        )
    ]


@contextlib.contextmanager
def _output_lock(out_dir: Path) -> Iterator[None]:
    """Holds ``.NAME.lock`` next to ``out_dir`` (flock) for the run; raises OutputError at once
    when another run holds it. The holder unlinks the file when done, so a run that opened it
    just before checks that it locked the file still at that path (else it retries)."""
    path = out_dir.parent / f".{out_dir.name}{_LOCK_SUFFIX}"
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(
                f"{out_dir}: cannot create the output directory here ({exc.strerror})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            locked = False
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current and locked:
            break
        if current:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputError(
                f"{out_dir}: another tokpack run (pid {holder}) is writing this output "
                f"directory; wait for it to finish (lock file {path})"
            )
        os.close(fd)  # the file a finished run just removed: open the current one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


@contextlib.contextmanager
def atomic_output_dir(out_dir: Union[str, os.PathLike]) -> Iterator[Path]:
    """Yields a fresh temporary directory next to ``out_dir``; on normal exit it replaces
    ``out_dir`` (an existing one is moved aside first, then deleted); on any exception the
    temporary is removed and ``out_dir`` is left as it was. ``out_dir`` is checked by
    :func:`output_target` first, and must still be replaceable at the swap."""
    out_dir = output_target(out_dir)
    make_parent(out_dir)
    with _output_lock(out_dir):
        _clean_stale(out_dir)
        tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        tmp = out_dir.parent / f".{out_dir.name}{_TMP_TAG}{tag}"
        try:  # one try from the mkdir on: an interrupt right after it leaves no temporary
            try:
                tmp.mkdir()
            except OSError as exc:
                raise OutputError(f"{tmp}: cannot create ({exc.strerror})") from None
            yield tmp
            keep_permissions(out_dir, tmp)
            _fsync_dir(tmp)
            check_replaceable(out_dir)  # files added to OUT_DIR during the run are not lost
            old = out_dir.parent / f".{out_dir.name}{_OLD_TAG}{tag}"
            with _signals_deferred():  # Ctrl-C / SIGTERM land after the swap and the old's removal
                _swap(tmp, out_dir, old)
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def output_file(path: Union[str, os.PathLike]) -> Path:
    """The real path of a file a run will write (``export``'s files), checked before any work:
    a file name, not a directory (that it lies outside what the export reads is
    ``overlap.check_apart``'s). Symlinks are resolved, so a symlinked file is written through,
    as a symlinked OUT_DIR."""
    text = os.fspath(path)
    if not text or not os.path.basename(text):
        raise ConfigError(f"{shown_path(text)}: the output needs a file name")
    real = Path(os.path.realpath(text))
    if real.is_dir():
        raise OutputExistsError(f"{shown_path(text)}: is a directory")
    return real


@contextlib.contextmanager
def atomic_output_files(
    shown: Sequence[str], *, force: bool, owned: Callable[[str], bool]
) -> Iterator[List[Path]]:
    """Yields a temporary path next to each of the files ``shown`` (their real paths, from
    :func:`output_file`); on normal exit renames each into place, in order, else removes them.
    An existing one is replaced only with ``force`` and only when ``owned(real path)`` says
    tokpack wrote it (checked before the work and again just before the renames); a replaced
    file's mode and group are kept. Runs writing the same first file are serialised by its lock
    (see :func:`_output_lock`). Several files are committed by several renames: a writer whose
    files must match (``export megatron``'s pair) names them all, with checksums, in the first
    one, so a pair torn by a kill between renames is detected."""

    finals = [output_file(name) for name in shown]

    def check() -> None:
        for final, name in zip(finals, shown):
            if os.path.lexists(final):
                check_replace(name, force, final.is_dir(), partial(owned, str(final)), "a file")

    check()
    for final in finals:
        make_parent(final)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmps = [final.with_name(f".{final.name}{_TMP_TAG}{tag}") for final in finals]
    with _output_lock(finals[0]):
        for final in finals:
            with contextlib.suppress(OSError):
                _clean_stale(final)
        try:
            yield tmps
            check()  # files created meanwhile by another program are not lost
            for final, tmp in zip(finals, tmps):
                keep_permissions(final, tmp)
            with _signals_deferred():  # Ctrl-C / SIGTERM land after the renames, not between
                for final, tmp in zip(finals, tmps):
                    os.replace(tmp, final)
            _fsync_dir(finals[0].parent)
        finally:
            for tmp in tmps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)


def check_replace(
    name: str, force: bool, is_dir: bool, owned: Callable[[], bool], what: str
) -> None:
    """Refuses to replace the existing output file (or object: ``what``) ``name`` unless
    ``force`` and it is a file that tokpack wrote (``owned()``)."""
    if not force:
        raise OutputExistsError(f"{name}: exists (pass force=True / --force to replace it)")
    if is_dir:
        raise OutputExistsError(f"{name}: is a directory")
    if not owned():
        raise OutputExistsError(
            f"{name}: refusing to replace {what} tokpack did not write; remove it yourself or "
            "choose another name"
        )


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Holds back SIGINT and SIGTERM (raised again when it ends), so a commit of several renames
    is not cut in the middle by them (only SIGKILL or a crash can). Their Python handlers are
    swapped for a recorder, not their delivery blocked: a signal sent to the process may be
    delivered to any thread that does not block it (the progress thread, Rust's pools), and
    Python then runs the handler in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: List[int] = []
    wanted = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _: pending.append(signum)) for s in wanted}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


def numpy_api_ready() -> None:
    """Makes the Rust extension fetch NumPy's C API now, with SIGINT and SIGTERM deferred. The
    fetch runs Python code (numpy's version check); a Ctrl-C or SIGTERM raised there by the
    CLI's handlers made the numpy crate panic (exit 1 with a Rust backtrace) instead of the
    command stopping with 130 / 143, whenever it landed on a command's first array."""
    import numpy as np

    with _signals_deferred():
        _tokpack.plan(lengths=np.zeros(0, np.int64), config=_tokpack.PackConfig(1), threads=1)


def keep_permissions(existing: Path, new: Path) -> None:
    """Gives ``new`` (a file, or a directory tree) the mode and group of ``existing`` when it
    exists (through a symlink: its target's), so a rebuilt output is exactly as private as the
    one it replaces: in a 0700 directory the files become 0600, in a 0750 one 0640 (a file
    keeps only the read/write bits the directory grants each class). A new output keeps the
    umask's modes. Groups the user is not a member of are left as they are."""
    try:
        st = os.stat(existing)
    except OSError:
        return
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        _chmod_chgrp(new, mode, st.st_gid)
        return
    file_bits = mode & 0o666
    for root, _, files in os.walk(new):
        _chmod_chgrp(Path(root), mode, st.st_gid)
        for name in files:
            path = Path(root, name)
            with contextlib.suppress(OSError):
                _chmod_chgrp(path, stat.S_IMODE(path.lstat().st_mode) & file_bits, st.st_gid)


def _chmod_chgrp(path: Path, mode: int, gid: int) -> None:
    with contextlib.suppress(OSError):
        os.chown(path, -1, gid)
    try:
        os.chmod(path, mode)
    except OSError as exc:
        raise OutputError(f"{shown_path(path)}: cannot set its mode ({exc.strerror})") from None


def make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{shown_path(path.parent)}: cannot create ({exc.strerror})") from None


def _swap(tmp: Path, out_dir: Path, old: Path) -> None:
    """Renames ``tmp`` to ``out_dir``, moving an existing ``out_dir`` to ``old`` first (and back
    if the second rename fails)."""
    try:
        moved = out_dir.exists()
        if moved:
            os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if moved:
                os.rename(old, out_dir)
            raise
    except OSError as exc:
        raise OutputError(f"{out_dir}: cannot move the output into place ({exc})") from None
    _fsync_dir(out_dir.parent)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def writing(path: Union[str, os.PathLike]) -> Iterator[None]:
    """Turns an OSError while writing ``path`` (disk full, permissions; pyarrow raises OSError
    too) into an :class:`OutputError` naming it, so the CLI reports one line, not a traceback."""
    try:
        yield
    except TokpackError:
        raise
    except OSError as exc:
        raise OutputError(f"{shown_path(path)}: cannot write ({exc.strerror or exc})") from None


def open_for_writing(path: Path) -> pa.NativeFile:
    """A new file for pyarrow to write, opened by its bytes: pyarrow cannot open a name that is
    not valid UTF-8 itself."""
    return pa.OSFile(os.fsencode(path), "wb")
