"""Inputs on object storage: ``s3://bucket/tokens/`` (any URI ``pyarrow.fs`` knows but
``file://``) given where a command takes input files.

The Rust readers read local files, so each object is mirrored into a local cache first:
``objects/<scheme>/<bucket>/<key>`` of tokpack's cache (``$TOKPACK_CACHE_DIR``, default
``~/.cache/tokpack``), downloaded to a temporary name and renamed when complete. Beside the
copy, a record holds the object's *content identity* (what the store gives: its ETag, version
id, generation or checksums, :func:`store_identity`) and the checksum of the copy's bytes. A
copy is used only when the store still gives the recorded identity and the copy still has the
recorded checksum; otherwise it is downloaded again (an object replaced within the second its
modification time resolves, or a copy damaged on this disk, is never packed). A store that gives
no identity has its objects downloaded on every run. Everything the user sees names the object,
not the copy: messages and dropped lists (:func:`uri_of` through :func:`shown_path`) and the
manifest's inputs, whose fingerprint of an object is a digest of its URI, size, identity and
the checksum of its bytes (so a rerun whose objects did not change is a cache hit, and one
whose object changed is not).

A URI names one object, a prefix (its objects with the command's suffixes, recursively, sorted,
``_`` / ``.`` names skipped as for a local directory) or a glob of keys (``s3://b/t/*.parquet``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import pyarrow.fs as pafs

from .. import _tokpack
from ..errors import InputNotFoundError, TokpackError
from .pids import remove_dead_temporaries
from .uri import cache_home, store_of

__all__ = [
    "mirror_objects",
    "uri_of",
    "object_fingerprint",
    "shown_message",
    "shown_path",
    "store_identity",
]

_SOURCE_SUFFIX = ".tokpack-source.json"


def cache_root() -> Path:
    """The local cache of object copies: ``objects/`` of tokpack's cache."""
    return cache_home() / "objects"


def uri_of(path: Union[str, os.PathLike]) -> Optional[str]:
    """The URI a local copy mirrors, or None for any other path."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(cache_root().absolute())
    except ValueError:
        return None
    parts = rel.parts
    return f"{parts[0]}://{'/'.join(parts[1:])}" if len(parts) > 1 else None


def shown_path(path: Union[str, os.PathLike]) -> str:
    """A file name as messages and side files show it: valid UTF-8 whatever the file system
    gave (undecodable bytes become ``\\xNN``, which JSON, Arrow strings and terminals accept)."""
    uri = uri_of(path)
    if uri is not None:  # a local copy of an object: named by the object
        return uri
    return os.fsdecode(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def shown_message(text: str) -> str:
    """``text`` (a message from the Rust readers, which name the files they read) with every
    local copy's path replaced by its object's URI."""
    root = f"{cache_root().absolute()}{os.sep}"
    while root in text:
        start = text.index(root)
        scheme, _, _ = text[start + len(root) :].partition(os.sep)
        text = text[:start] + f"{scheme}://" + text[start + len(root) + len(scheme) + 1 :]
    return text


def object_fingerprint(path: os.PathLike) -> Optional[Tuple[str, int, str]]:
    """``(uri, size, fingerprint)`` of a local copy, from the record of the object it was
    downloaded from (a digest of its URI, size, content identity and the copy's checksum),
    or None for any other path."""
    uri = uri_of(path)
    if uri is None:
        return None
    try:
        source = json.loads(_source_file(Path(path)).read_text(encoding="utf-8"))
        parts = [uri, str(source["size"]), str(source["identity"]), str(source["checksum"])]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    blob = "\0".join(parts).encode()
    return uri, int(source["size"]), hashlib.blake2b(blob, digest_size=16).hexdigest()


# What identifies an object's content in the metadata stores give (lower case): S3's ETag and
# version id (and its additional checksums), GCS's generation, MD5 and CRC32C, Azure's ETag,
# the Hub's blob id and sha256. The modification time is not among them: S3 gives it to the
# second.
_IDENTITY_FIELDS = (
    "etag",
    "versionid",
    "version_id",
    "generation",
    "md5hash",
    "crc32c",
    "blob_id",  # (the Hugging Face Hub's, with its LFS sha256)
    "sha256",
)


def store_identity(metadata: Dict[str, Any]) -> Optional[str]:
    """The content identity in an object's metadata (``pyarrow.fs``'s stream metadata, or
    fsspec's ``info()``): its identifying fields as ``name=value`` lines, or None when the
    store gives none (then only the bytes themselves tell)."""
    found = {}
    for name, value in metadata.items():
        key = str(name).lower().replace("-", "_")
        if key in _IDENTITY_FIELDS or key.startswith(("checksum", "x_amz_checksum")):
            if value not in (None, "", b""):
                found[key] = value.decode() if isinstance(value, bytes) else str(value)
    return "\n".join(f"{k}={found[k]}" for k in sorted(found)) or None


def _identity_of(fs: pafs.FileSystem, path: str) -> Optional[str]:
    """The content identity the store gives now for the object at ``path`` (one request)."""
    handler = getattr(fs, "handler", None)  # a pafs.PyFileSystem over an fsspec file system
    if handler is not None and hasattr(getattr(handler, "fs", None), "info"):
        return store_identity(handler.fs.info(path))
    with fs.open_input_file(path) as f:
        return store_identity(f.metadata())


def _source_file(copy: Path) -> Path:
    return copy.with_name(f".{copy.name}{_SOURCE_SUFFIX}")


def _objects(uri: str, suffixes: Tuple[str, ...]) -> Tuple[pafs.FileSystem, List[pafs.FileInfo]]:
    """The objects a URI names (see the module docstring), sorted by key."""
    try:
        fs, path, _ = store_of(uri)  # type: ignore[misc]  # (not None: an object URI)
    except OSError as exc:  # credentials, endpoint
        raise InputNotFoundError(f"{uri}: cannot reach the store ({exc})") from None
    scheme = uri.split("://", 1)[0]
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return fs, [info]
        if info.type == pafs.FileType.Directory:
            base, none = path.rstrip("/"), f"no {' / '.join(suffixes)} objects inside"

            def wanted(i: pafs.FileInfo) -> bool:
                hidden = any(p.startswith(("_", ".")) for p in i.path[len(base) + 1 :].split("/"))
                return i.path.lower().endswith(suffixes) and not hidden

        elif glob.has_magic(path):
            base = path[: min(path.index(c) for c in "*?[" if c in path)].rsplit("/", 1)[0]
            none = "no object matches"

            def wanted(i: pafs.FileInfo) -> bool:
                return fnmatch.fnmatchcase(i.path, path)

        if info.type == pafs.FileType.Directory or glob.has_magic(path):
            selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
            found = [
                i for i in fs.get_file_info(selector) if i.type == pafs.FileType.File and wanted(i)
            ]
            if not found:
                raise InputNotFoundError(f"{uri}: {none}")
            return fs, sorted(found, key=lambda i: i.path)
    except OSError as exc:
        raise InputNotFoundError(f"{uri}: cannot list ({exc})") from None
    raise InputNotFoundError(f"{scheme}://{path}: no such object or prefix")


def mirror_objects(uri: str, suffixes: Tuple[str, ...]) -> List[Path]:
    """Local copies of the objects ``uri`` names, downloaded when missing or changed."""
    fs, infos = _objects(uri, suffixes)
    scheme = uri.split("://", 1)[0].lower()
    return [_mirror(fs, scheme, info) for info in infos]


def _mirror(fs: pafs.FileSystem, scheme: str, info: pafs.FileInfo) -> Path:
    """The local copy of one object: the one on disk when its record matches the object's
    content identity now and its bytes their recorded checksum, else downloaded again."""
    copy = cache_root() / scheme / info.path
    shown = f"{scheme}://{info.path}"
    try:
        identity = _identity_of(fs, info.path)
    except OSError as exc:
        raise InputNotFoundError(f"{shown}: cannot read its metadata ({exc})") from None
    if identity is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, TokpackError):
            recorded = json.loads(_source_file(copy).read_text(encoding="utf-8"))
            if (
                recorded["identity"] == identity
                and recorded["size"] == info.size == copy.stat().st_size
                # (the whole copy read again: a copy damaged on this disk is not packed)
                and _tokpack.file_checksum(str(copy))[1] == recorded["checksum"]
            ):
                return copy
    copy.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_downloads(copy)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp = copy.with_name(f".{copy.name}.tmp-{tag}")
    try:
        with fs.open_input_stream(info.path) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
            # The identity of the bytes read (a store that gives one with the GET), else the
            # one read before: an object replaced meanwhile is then downloaded again next run.
            identity = store_identity(src.metadata()) or identity
        size, checksum = _tokpack.file_checksum(str(tmp))
        if size != info.size:
            raise InputNotFoundError(
                f"{shown}: downloaded {size} bytes, the store lists {info.size}"
                " (changed while read?)"
            )
        source: Dict[str, Any] = {"size": size, "identity": identity, "checksum": checksum}
        record = copy.with_name(f"{_source_file(copy).name}.tmp-{tag}")
        try:
            # The old record goes first: a copy renamed without its new record is not trusted.
            _source_file(copy).unlink(missing_ok=True)
            os.replace(tmp, copy)
            record.write_text(json.dumps(source), encoding="utf-8")
            os.replace(record, _source_file(copy))
        finally:
            record.unlink(missing_ok=True)
    except OSError as exc:
        raise InputNotFoundError(f"{shown}: cannot download ({exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return copy


def _remove_dead_downloads(copy: Path) -> None:
    """Removes the temporaries of downloads of ``copy`` (and of its record) left by runs that
    died (``.NAME.tmp-PID-TAG``: their pid is gone), as ``outdir`` does for OUT_DIR's."""
    names = rf"\.{re.escape(copy.name)}(?:{re.escape(_SOURCE_SUFFIX)})?\.tmp-(\d+)-[0-9a-f]{{8}}"
    remove_dead_temporaries(copy.parent, re.compile(names))
