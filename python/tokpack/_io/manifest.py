"""The manifest of a tokpack output directory (``pack`` and ``tokenize`` alike): its one reader
and writer (JSON, written atomically, last: it makes a directory complete), the one check of the
file names it lists (:func:`member_path`), and the check a rerun makes before it trusts an
existing output as a cache hit (:func:`cache_problem`). What only a packed directory has (its
format name, the dropped list's layout) is ``packed.format``'s."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Optional, Tuple, Union

import pyarrow as pa
import pyarrow.parquet as pq

from .._tokpack import MANIFEST_NAME, file_checksum
from ..errors import CorruptOutputError


def read_json(path: Union[str, os.PathLike], fs: Any = None) -> Any:
    """The JSON in the file ``path``, or in the object ``path`` of the ``pyarrow.fs`` file system
    ``fs`` (FileNotFoundError when it is missing; OSError or ValueError when unreadable)."""
    if fs is None:
        return json.loads(Path(path).read_bytes())
    with fs.open_input_stream(str(path)) as f:
        return json.loads(f.read())


def read_manifest(out_dir: Union[str, os.PathLike], fs: Any = None) -> Optional[Dict[str, Any]]:
    """The manifest of a complete output directory (or prefix of the ``pyarrow.fs`` file system
    ``fs``), or None when there is none."""
    path = Path(out_dir) / MANIFEST_NAME if fs is None else f"{out_dir}/{MANIFEST_NAME}"
    try:
        return read_json(path, fs)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CorruptOutputError(f"{path}: unreadable manifest ({exc})") from None


def write_json_atomic(path: Union[str, os.PathLike], data: Dict[str, Any]) -> None:
    """Writes JSON to a temporary name in the same directory, then renames it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_json(tmp, data)
    os.replace(tmp, path)


def write_json(path: Union[str, os.PathLike], data: Dict[str, Any]) -> None:
    """``data`` as JSON (indented, keys sorted) in the file ``path``, on disk when it returns."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def write_manifest(out_dir: Union[str, os.PathLike], manifest: Dict[str, Any]) -> None:
    """Writes ``out_dir``'s manifest (last: it makes the directory complete). Every writer looks
    it up at the call (``_manifest.write_manifest``), so the suite's schema check sees them all."""
    write_json_atomic(Path(out_dir) / MANIFEST_NAME, manifest)


def member_path(root: Union[str, os.PathLike], name: Any, what: str = "file") -> Path:
    """``root / name`` for a file a manifest lists (a shard, an index or the dropped list),
    refused unless ``name`` is a relative path inside ``root``: no absolute path and no ``..``
    component, so a downloaded directory cannot make tokpack read (or report intact) a file
    outside it. Every reader of a manifest's file names goes through here."""
    root = Path(root)
    if not isinstance(name, str) or not name:
        raise CorruptOutputError(f"{root / MANIFEST_NAME}: {what} name {name!r} is not a file name")
    parts = PurePosixPath(name).parts
    if os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts or "\x00" in name:
        raise CorruptOutputError(
            f"{root / MANIFEST_NAME}: {what} {name!r} is outside the directory (an absolute path"
            " or a '..' component); refusing to read it"
        )
    return root / name


def listed_files(manifest: Dict[str, Any]) -> List[Tuple[Any, Any, Any]]:
    """``(name, size, checksum)`` of every file ``manifest`` lists, as it records them: each
    shard and its index, the dropped list, the rejected records (no size or checksum); KeyError
    or TypeError when it is malformed."""
    m, found = manifest, []
    for shard in m["shards"]:
        found.append((shard["file"], shard.get("size"), shard.get("checksum")))
        if "index" in shard:
            found.append((shard["index"], shard.get("index_size"), shard.get("index_checksum")))
    if m.get("dropped_file"):
        found.append((m["dropped_file"], m.get("dropped_size"), m.get("dropped_checksum")))
    if m.get("rejected_file"):
        found.append((m["rejected_file"], None, None))
    return found


def side_file_problem(
    path: Path, size: Any, checksum: Any, full: bool = True, what: str = "side file"
) -> Optional[str]:
    """What is wrong with a side file (a shard's index, the dropped list) against the size and
    checksum its manifest records, or None. Outputs written before these were recorded
    (``size`` None) are only checked for presence."""
    try:
        got_size = path.stat().st_size
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as exc:
        return f"{path}: cannot read ({exc.strerror})"
    if size is None:
        return None
    if got_size != size:
        return f"{path} has {got_size} bytes, the manifest says {size} ({what} damaged)"
    if full:
        _, got = file_checksum(str(path))
        if got != checksum:
            return f"{path} does not match its checksum ({what} damaged; it hashes to {got})"
    return None


def _file_problem(out: Path, shard: Dict[str, Any], full: bool) -> Optional[str]:
    path = member_path(out, shard["file"], "shard")
    checksum = shard.get("checksum")
    problem = side_file_problem(
        path, shard.get("size"), checksum, full and checksum is not None, "shard"
    )
    if problem is None and "size" not in shard:
        # Written without a recorded size (token shards of an older `tokenize`): the footer must
        # say the recorded number of rows.
        try:
            rows = pq.read_metadata(path).num_rows
        except (pa.ArrowException, OSError) as exc:
            return f"{path} is not a readable Parquet file ({exc})"
        if rows != shard["rows"]:
            return f"{path} has {rows} rows, the manifest says {shard['rows']}"
    if problem is None and "index" in shard:
        index = member_path(out, shard["index"], "index")
        size, checksum = shard.get("index_size"), shard.get("index_checksum")
        problem = side_file_problem(index, size, checksum, full, "index")
        if problem is None and full and checksum is None and "checksum" in shard:
            return f"{index} has no recorded checksum (written by an older tokpack)"
    return problem


def cache_problem(
    out_dir: Union[str, os.PathLike], manifest: Dict[str, Any], *, full: bool = False
) -> Optional[str]:
    """Why the output a matching manifest describes cannot be trusted, or None when it is intact:
    a listed file missing or of another size (another row count for shards without a recorded
    size) and, with ``full``, a shard whose bytes do not match its checksum."""
    out = Path(out_dir)
    try:
        for shard in manifest["shards"]:
            problem = _file_problem(out, shard, full)
            if problem is not None:
                return problem
        for key in ("dropped_file", "rejected_file"):
            name = manifest.get(key)
            if name:
                path = member_path(out, name, key)
                size = manifest.get("dropped_size") if key == "dropped_file" else None
                checksum = manifest.get("dropped_checksum")
                problem = side_file_problem(path, size, checksum, full, "dropped list")
                if problem is not None:
                    return problem
    except (KeyError, TypeError) as exc:
        return f"the manifest is malformed (field {exc})"
    except CorruptOutputError as exc:
        return str(exc)
    return None
