"""Where a Ray run's files go: a local (or shared) directory, or object storage.

Shard tasks write each file into a scratch directory of their own, then *publish* it into the
output: on a file system by renaming it into the run's temporary directory (renamed into place
when the run is complete, as ``tokpack pack`` does); on object storage (any ``pyarrow.fs``
file system, or an fsspec one, that is not the local one: ``s3://``, ``gs://``, ...) by
uploading it under its final key, one whole object at a time. Object stores have no rename of a
directory, so there the manifest is the commit marker: a run first removes the previous
output's manifest (from then on readers refuse the prefix), writes every shard and side file,
and writes the manifest last. Readers (:func:`tokpack.ray.read_packed`) refuse a prefix without
one.

Every destination follows ``tokpack pack``'s output rule (``_outdir``): a prefix is replaced only
when it is empty or tokpack's (a manifest listing its shards, or the claim ``RUN_MARKER`` a run
writes before it deletes or writes anything, so the objects of a run that died are recognised
as tokpack's); anything else there (``part-0.parquet`` of ``pyarrow.dataset.write_dataset``,
say) is refused, never deleted. An output holding one of the dataset's input files is refused
too. A ``file://`` URI, or a local ``filesystem=``, is a local directory written atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import pyarrow.fs as pafs

from .._outdir import (
    MANIFEST_NAME,
    SIDE_DIR,
    atomic_output_dir,
    foreign_names,
    is_tokpack_manifest,
    output_target,
)
from ..errors import ConfigError, CorruptOutputError, OutputError, OutputExistsError
from ..remote._uri import RUN_MARKER, local_path, store_of

ATTEMPT_PREFIX = ".attempt-"
# The object names a tokpack run writes under its prefix (side files, shards, local mode's
# group staging): only those are ever deleted, and only from a prefix that is tokpack's.
_OURS = re.compile(rf"(part-\d{{5}}\.parquet|{SIDE_DIR}/.+|\.group-\d+/.+)")
_STAGED = re.compile(rf"({SIDE_DIR}/.+|\.group-\d+/.+)")


class Out(ABC):
    """The output of a run as tasks and the driver see it (picklable: sent to tasks)."""

    @abstractmethod
    def scratch(self) -> ContextManager[Path]:
        """A fresh local directory (with the side folder) for one task's files."""

    @abstractmethod
    def publish(self, scratch: Path, names: Sequence[str], dest: str = "") -> None:
        """Puts ``scratch/name`` at ``dest/name`` of the output, each whole or not at all."""

    @abstractmethod
    def move(self, src: str, dst: str) -> None:
        """Renames a published file (local mode numbers its shards once all groups are done)."""

    @abstractmethod
    def remove(self, folder: str) -> None:
        """Removes a folder of published files."""


class LocalOut(Out):
    """The run's temporary directory ``tmp`` on a file system every node sees."""

    def __init__(self, tmp: Union[str, Path]) -> None:
        self.tmp = str(tmp)

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        # Inside the run's temporary (which must exist: a task outliving a failed run writes
        # nothing), so renames stay on one file system; what a killed task left is removed by
        # remove_attempts before the commit.
        attempt = Path(self.tmp) / f"{ATTEMPT_PREFIX}{secrets.token_hex(8)}"
        os.mkdir(attempt)
        try:
            (attempt / SIDE_DIR).mkdir()
            yield attempt
        finally:
            shutil.rmtree(attempt, ignore_errors=True)

    def publish(self, scratch: Path, names: Sequence[str], dest: str = "") -> None:
        for name in names:
            target = Path(self.tmp, dest, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(scratch / name, target)  # a retried task replaces it with the same bytes

    def move(self, src: str, dst: str) -> None:
        os.replace(Path(self.tmp, src), Path(self.tmp, dst))

    def remove(self, folder: str) -> None:
        shutil.rmtree(Path(self.tmp, folder))


class StoreOut(Out):
    """A prefix of an object store (``fs``: a ``pyarrow.fs.FileSystem``)."""

    def __init__(self, fs: pafs.FileSystem, prefix: str, shown: str) -> None:
        self.fs, self.prefix, self.shown = fs, prefix.rstrip("/"), shown

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="tokpack-ray-shard-") as d:
            (Path(d) / SIDE_DIR).mkdir()
            yield Path(d)

    def publish(self, scratch: Path, names: Sequence[str], dest: str = "") -> None:
        for name in names:
            self.upload(scratch / name, f"{dest}/{name}" if dest else name)

    def upload(self, path: Path, name: str) -> None:
        """One object, whole (an object store shows a PUT complete or not at all)."""
        try:
            sink = self._into(name, self.fs.open_output_stream)
            with open(path, "rb") as src, sink:
                shutil.copyfileobj(src, sink, 1 << 22)
        except OSError as exc:
            raise OutputError(f"{self.shown}/{name}: cannot upload ({exc})") from None

    def _into(self, name: str, write: Callable[[str], Any]) -> Any:
        """``write(key)`` of ``name``, creating its folder on a file system that has them
        (object stores have none)."""
        key = self.key(name)
        try:
            return write(key)
        except FileNotFoundError:
            self.fs.create_dir(key.rsplit("/", 1)[0], recursive=True)
            return write(key)

    def move(self, src: str, dst: str) -> None:
        self._into(dst, lambda key: self.fs.move(self.key(src), key))

    def remove(self, folder: str) -> None:
        self.fs.delete_dir(self.key(folder))

    def names(self, kind: pafs.FileType = pafs.FileType.File) -> List[str]:
        """The objects (or folders, on a file system that has them) under the prefix."""
        selector = pafs.FileSelector(self.prefix, recursive=True, allow_not_found=True)
        return sorted(
            info.path[len(self.prefix) + 1 :]
            for info in self.fs.get_file_info(selector)
            if info.type == kind
        )

    def _manifest(self) -> Any:
        """The manifest under the prefix, parsed, or None (missing or unreadable)."""
        try:
            with self.fs.open_input_stream(self.key(MANIFEST_NAME)) as f:
                return json.loads(f.read())
        except (OSError, ValueError):
            return None

    def claim(self) -> None:
        """Checks that the prefix may be replaced (``_outdir.foreign_names``: empty, or
        tokpack's holding only what tokpack writes, a dead run's staged objects included: see
        the module docstring), then marks it as being written by this run."""
        names = self.names()
        if names:
            manifest = self._manifest()
            writing = RUN_MARKER in names
            if not is_tokpack_manifest(manifest) and not writing:
                raise OutputExistsError(
                    f"{self.shown}: holds {names[0]!r} and no tokpack manifest: refusing to "
                    "replace what tokpack did not write; choose another output or remove it "
                    "yourself"
                )

            def staged(name: str) -> bool:
                return bool(_STAGED.fullmatch(name) or (writing and _OURS.fullmatch(name)))

            foreign = foreign_names(names, manifest, staged)
            if foreign:
                raise OutputExistsError(
                    f"{self.shown}: holds {foreign[0]!r}, which tokpack did not write; choose "
                    "another output or remove it yourself"
                )
        with tempfile.TemporaryDirectory(prefix="tokpack-ray-claim-") as d:
            marker = Path(d, "writing")
            marker.write_text(f"{os.getpid()}\n")
            self.upload(marker, RUN_MARKER)

    def clear(self, keep_claim: bool = True) -> None:
        """Removes this run's objects and those of the output it replaces (manifest first:
        readers refuse the prefix from then on), all tokpack's (see :meth:`claim`)."""
        names = [n for n in self.names() if n != RUN_MARKER or not keep_claim]
        for name in sorted(names, key=lambda n: (n != MANIFEST_NAME, n == RUN_MARKER)):
            if _OURS.fullmatch(name):
                self.fs.delete_file(self.key(name))
        for folder in sorted(self.names(pafs.FileType.Directory), reverse=True):
            if _OURS.fullmatch(f"{folder}/x") and not self.names_in(folder):
                self.fs.delete_dir(self.key(folder))

    def names_in(self, folder: str) -> List[str]:
        selector = pafs.FileSelector(self.key(folder), recursive=True, allow_not_found=True)
        return [i.path for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]


def dataset_inputs(ds: Any) -> List[str]:
    """The files and folders a dataset reads, from its plan (nothing is executed): its
    ``input_files()``, and the paths its read operators were given (Ray Data's Parquet reader
    lists its files only when it runs); empty when the plan cannot say."""
    found: List[str] = []
    with contextlib.suppress(Exception):
        found.extend(str(p) for p in ds.input_files())
    with contextlib.suppress(Exception):  # Ray's logical plan: its read operators' paths
        pending, seen = [ds._logical_plan.dag], set()
        while pending:
            op = pending.pop()
            if id(op) in seen:
                continue
            seen.add(id(op))
            paths = getattr(op, "source_paths", None) or getattr(op, "paths", None)
            if isinstance(paths, (list, tuple)):
                found.extend(str(p) for p in paths)
            pending.extend(getattr(op, "input_dependencies", None) or ())
    return found


def check_no_overlap(target: str, inputs: Sequence[str], shown: str, local: bool) -> None:
    """Refuses an output that is one of the dataset's inputs, holds one (replacing it would
    delete the run's own inputs) or lies inside an input folder (each rerun would read the
    previous output). Local paths are compared by real path, object keys as the file system
    names them (without a ``scheme://``)."""

    def norm(path: str) -> str:
        if local:
            return os.path.realpath(local_path(path) or path)
        return path.split("://", 1)[-1].rstrip("/")

    base = norm(target)
    for name in inputs:
        path = norm(str(name))
        if path == base or path.startswith(base + "/") or base.startswith(path + "/"):
            raise ConfigError(
                f"{shown}: overlaps the dataset's input {name} (replacing the output would "
                "delete the run's own inputs, or a rerun would read its output): choose an "
                "output outside them"
            )


@contextlib.contextmanager
def committed_output(
    output_dir: Union[str, os.PathLike], filesystem: Any = None, inputs: Sequence[str] = ()
):
    """Yields ``(out, local)``: where tasks put files, and a local directory whose files the
    driver adds (the side files, then the manifest, last). Local: an :func:`atomic_output_dir`.
    Object storage: the prefix claimed (refused unless tokpack's) and cleared; on success the
    driver's files are uploaded with the manifest last (the commit), then the claim removed; on
    failure this run's objects are removed. Either way an output holding one of ``inputs``
    (the dataset's input files) is refused before anything is touched."""
    local_dir = local_path(output_dir, filesystem)
    if local_dir is not None:
        check_no_overlap(str(output_target(local_dir)), inputs, str(output_dir), local=True)
        with atomic_output_dir(local_dir) as tmp:
            (tmp / SIDE_DIR).mkdir(exist_ok=True)
            yield LocalOut(tmp), tmp
        return
    store = store_of(output_dir, filesystem)
    assert store is not None
    out = StoreOut(*store)
    check_no_overlap(out.prefix, inputs, out.shown, local=False)
    out.claim()
    with tempfile.TemporaryDirectory(prefix="tokpack-ray-driver-") as local:
        try:
            out.clear()
            yield out, Path(local)
            driver_files = sorted(
                str(p.relative_to(local)) for p in Path(local).rglob("*") if p.is_file()
            )
            for name in sorted(driver_files, key=lambda n: n == MANIFEST_NAME):
                out.upload(Path(local, name), name)
            out.fs.delete_file(out.key(RUN_MARKER))
        except BaseException:
            with contextlib.suppress(Exception):
                out.clear(keep_claim=False)
            raise


def read_manifest_at(output_dir: Union[str, os.PathLike], filesystem: Any = None):
    """``(manifest or None, fs or None, root)`` of a packed output, local or on a store."""
    from .._outdir import read_manifest

    local_dir = local_path(output_dir, filesystem)
    if local_dir is not None:
        return read_manifest(local_dir), None, local_dir
    store = store_of(output_dir, filesystem)
    assert store is not None
    fs, prefix, _ = store
    try:
        with fs.open_input_stream(f"{prefix.rstrip('/')}/{MANIFEST_NAME}") as f:
            manifest: Dict[str, Any] = json.loads(f.read())
    except FileNotFoundError:
        return None, fs, prefix.rstrip("/")
    except (OSError, ValueError) as exc:
        raise CorruptOutputError(f"{output_dir}: unreadable manifest ({exc})") from None
    return manifest, fs, prefix.rstrip("/")


def read_checked_shards(
    shards: Sequence[Dict[str, Any]], root: str, fs: Any, columns: Optional[Sequence[str]]
) -> Any:
    """A ``ray.data.Dataset`` of the shards, one task per shard, each row group decoded by the
    checked reader (``packed_dir.decode_row_group``: its bytes and the footer against the
    manifest's checksums), so a damaged shard raises :class:`CorruptOutputError` naming it
    instead of yielding other tokens. A shard on object storage is downloaded whole first."""
    import ray.data

    items = [{"shard": json.dumps(s)} for s in shards]
    return ray.data.from_items(items, override_num_blocks=max(len(items), 1)).map_batches(
        _read_shards,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={"root": root, "fs": fs, "columns": list(columns) if columns else None},
    )


def _read_shards(batch: Any, root: str, fs: Any, columns: Optional[List[str]]) -> Any:
    import pyarrow as pa

    tables = [
        _read_shard(json.loads(text), root, fs, columns)
        for text in batch.column("shard").to_pylist()
    ]
    return pa.concat_tables(tables) if len(tables) != 1 else tables[0]


def _read_shard(shard: Dict[str, Any], root: str, fs: Any, columns: Optional[List[str]]) -> Any:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..packed_dir import decode_row_group

    name = shard["file"]
    try:
        size = int(shard["size"])
        footer = _checked_range(shard["footer_bytes"])
        groups = [_checked_range(r) for r in shard["row_group_bytes"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptOutputError(f"{root}/{MANIFEST_NAME}: shard {name}: field {exc}") from None
    with _local_copy(root, name, fs) as path:
        tables = []
        for g, group in enumerate(groups):
            decoded = decode_row_group(path, g, columns or _names(path), (size, footer, group))
            if not tables:  # the footer was checked with the first row group
                schema = pq.read_schema(path)
                names = list(decoded)
            arrays = []
            for col in names:
                field = schema.field(col)
                if isinstance(decoded[col], tuple):
                    values, offsets = decoded[col]
                    inner = pa.array(values, type=field.type.value_type)
                    kind = pa.LargeListArray if pa.types.is_large_list(field.type) else pa.ListArray
                    width = np.int64 if kind is pa.LargeListArray else np.int32
                    arrays.append(kind.from_arrays(pa.array(offsets.astype(width)), inner))
                else:
                    arrays.append(pa.array(decoded[col], type=field.type))
            tables.append(pa.Table.from_arrays(arrays, names=names))
        if not tables:  # an empty shard (every sample dropped): its schema only
            schema = pq.read_schema(path)
            if columns:
                schema = pa.schema([schema.field(c) for c in columns])
            return schema.empty_table()
        return pa.concat_tables(tables)


def _names(path: str) -> List[str]:
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(path).names)
    except Exception as exc:
        raise CorruptOutputError(f"{path}: not a readable shard ({exc})") from None


def _checked_range(value: Any) -> Tuple[int, int, str]:
    return (int(value["offset"]), int(value["length"]), str(value["checksum"]))


@contextlib.contextmanager
def _local_copy(root: str, name: str, fs: Any) -> Iterator[str]:
    """The shard as a local file: itself, or downloaded from the store into a temporary file."""
    if fs is None:
        yield os.path.join(root, name)
        return
    with tempfile.TemporaryDirectory(prefix="tokpack-ray-read-") as d:
        path = os.path.join(d, "shard.parquet")
        try:
            with fs.open_input_stream(f"{root}/{name}") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        except FileNotFoundError:
            raise CorruptOutputError(f"{root}/{name}: listed in the manifest but missing") from None
        yield path
