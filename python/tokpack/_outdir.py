"""Atomic output directories with a manifest cache, shared by every command that writes a
directory (``pack``, ``tokenize``).

A run writes into a temporary directory next to OUT_DIR and renames it into place only when
everything is written, so OUT_DIR is either absent or complete, whatever happens to the process
(Ctrl-C, kill -9). Leftover temporaries of dead runs are removed by the next run. The manifest
records a cache key (input fingerprints + full config); the same key means the output is current
and the run does no work.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ._inputs import input_error
from .errors import ConfigError, CorruptOutputError

__all__ = [
    "MANIFEST_NAME",
    "SIDE_DIR",
    "fingerprint_file",
    "describe_inputs",
    "cache_key",
    "read_manifest",
    "is_cache_hit",
    "atomic_output_dir",
    "write_json_atomic",
]

# Side files (manifest, indexes, accounting) live in a subdirectory that Parquet readers skip:
# pyarrow.dataset ignores names starting with "_", Hugging Face datasets ignores directories
# starting with "__". So `pyarrow.dataset.dataset(OUT_DIR)` and
# `datasets.load_dataset("parquet", data_dir=OUT_DIR)` both see only the data files.
SIDE_DIR = "__tokpack__"
MANIFEST_NAME = f"{SIDE_DIR}/_manifest.json"
_TMP_TAG = ".tmp-"
_OLD_TAG = ".old-"


def fingerprint_file(path: os.PathLike, chunk: int = 1 << 22) -> str:
    """BLAKE2b-128 of the whole file content (hashlib releases the GIL on large buffers)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def describe_inputs(paths: Sequence[os.PathLike]) -> List[Dict[str, Any]]:
    """Path, size and content fingerprint of every input file, in order."""
    out = []
    for p in paths:
        p = Path(p)
        try:
            size = p.stat().st_size
            fp = fingerprint_file(p)
        except OSError as exc:
            raise input_error(p, exc) from None
        out.append({"path": str(p.resolve()), "size": size, "fingerprint": fp})
    return out


def cache_key(kind: str, inputs: List[Dict[str, Any]], config: Dict[str, Any]) -> str:
    """A digest of everything that determines the output bytes."""
    blob = json.dumps({"kind": kind, "inputs": inputs, "config": config}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()


def read_manifest(out_dir: os.PathLike) -> Optional[Dict[str, Any]]:
    """The manifest of a complete output directory, or None when there is none."""
    path = Path(out_dir) / MANIFEST_NAME
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CorruptOutputError(f"{path}: unreadable manifest ({exc})") from None


def is_cache_hit(out_dir: os.PathLike, key: str) -> Optional[Dict[str, Any]]:
    """The existing manifest when OUT_DIR is complete and was built with the same key."""
    try:
        manifest = read_manifest(out_dir)
    except CorruptOutputError:
        return None
    if manifest is not None and manifest.get("cache_key") == key:
        return manifest
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale(out_dir: Path) -> None:
    """Removes temporaries left by runs that died (their pid is gone)."""
    parent = out_dir.parent
    if not parent.is_dir():
        return
    prefix = f".{out_dir.name}"
    for entry in parent.iterdir():
        name = entry.name
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        for tag in (_TMP_TAG, _OLD_TAG):
            if rest.startswith(tag):
                pid_text = rest[len(tag) :].split("-", 1)[0]
                if pid_text.isdigit() and not _pid_alive(int(pid_text)):
                    shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def atomic_output_dir(out_dir: os.PathLike) -> Iterator[Path]:
    """Yields a fresh temporary directory next to ``out_dir``; on normal exit it replaces
    ``out_dir`` (an existing one is moved aside first, then deleted); on any exception the
    temporary is removed and ``out_dir`` is left as it was."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} exists and is not a directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out_dir)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp = out_dir.parent / f".{out_dir.name}{_TMP_TAG}{tag}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_dir(tmp)
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}{_OLD_TAG}{tag}"
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        _fsync_dir(out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json_atomic(path: os.PathLike, data: Dict[str, Any]) -> None:
    """Writes JSON to a temporary name in the same directory, then renames it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
