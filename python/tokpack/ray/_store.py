"""Where a Ray run's files go: a local (or shared) directory, or object storage.

Shard tasks write each file into a scratch directory of their own, then *publish* it into the
output: on a file system by renaming it into the run's temporary directory (renamed into place
when the run is complete, as ``tokpack pack`` does); on object storage (any ``pyarrow.fs``
file system, or an fsspec one, that is not the local one: ``s3://``, ``gs://``, ...) by
uploading it under its final key, one whole object at a time. Object stores have no rename of a
directory, so there the manifest is the commit marker: a run first removes the previous
output's manifest (from then on readers refuse the prefix), writes every shard and side file,
and writes the manifest last. Readers (:func:`tokpack.ray.read_packed`) refuse a prefix without
one. A prefix holding objects tokpack does not write is refused, never deleted.
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

from .._outdir import MANIFEST_NAME, SIDE_DIR, atomic_output_dir
from ..errors import CorruptOutputError, OutputError, OutputExistsError

ATTEMPT_PREFIX = ".attempt-"
# The object names a tokpack run writes under its prefix (side files, shards, local mode's
# group staging): only those are ever deleted.
_OURS = re.compile(rf"(part-\d+\.parquet|{SIDE_DIR}/.+|\.group-\d+/.+)")


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

    def clear(self) -> None:
        """Removes a previous tokpack output (manifest first: readers refuse it from then on)
        or a failed run's objects; refuses a prefix holding anything else."""
        names = self.names()
        foreign = [n for n in names if not _OURS.fullmatch(n)]
        if foreign:
            raise OutputExistsError(
                f"{self.shown}: holds {foreign[0]!r}, which tokpack did not write; choose "
                "another output or remove it yourself"
            )
        for name in sorted(names, key=lambda n: n != MANIFEST_NAME):
            self.fs.delete_file(self.key(name))
        for folder in sorted(self.names(pafs.FileType.Directory), reverse=True):
            if _OURS.fullmatch(f"{folder}/x"):  # a folder of ours, emptied above
                self.fs.delete_dir(self.key(folder))


def store_of(
    output_dir: Union[str, os.PathLike], filesystem: Any = None
) -> Optional[Tuple[pafs.FileSystem, str, str]]:
    """``(fs, prefix, shown)`` when ``output_dir`` is on object storage (a URI such as
    ``s3://bucket/packed``, or a path on ``filesystem``: a ``pyarrow.fs.FileSystem`` or an
    fsspec one); None for a local path (or ``file://``)."""
    text = os.fspath(output_dir)
    if filesystem is None:
        if "://" not in str(text):
            return None
        fs, prefix = pafs.FileSystem.from_uri(str(text))
        if isinstance(fs, pafs.LocalFileSystem):
            return None
        return fs, prefix, str(text)
    if not isinstance(filesystem, pafs.FileSystem):
        filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
    return filesystem, str(text), str(text)


@contextlib.contextmanager
def committed_output(output_dir: Union[str, os.PathLike], filesystem: Any = None):
    """Yields ``(out, local)``: where tasks put files, and a local directory whose files the
    driver adds (the side files, then the manifest, last). Local: an :func:`atomic_output_dir`.
    Object storage: the prefix cleared first; on success the driver's files are uploaded with
    the manifest last (the commit); on failure this run's objects are removed."""
    store = store_of(output_dir, filesystem)
    if store is None:
        with atomic_output_dir(output_dir) as tmp:
            (tmp / SIDE_DIR).mkdir(exist_ok=True)
            yield LocalOut(tmp), tmp
        return
    out = StoreOut(*store)
    out.clear()
    with tempfile.TemporaryDirectory(prefix="tokpack-ray-driver-") as local:
        try:
            yield out, Path(local)
            driver_files = sorted(
                str(p.relative_to(local)) for p in Path(local).rglob("*") if p.is_file()
            )
            for name in sorted(driver_files, key=lambda n: n == MANIFEST_NAME):
                out.upload(Path(local, name), name)
        except BaseException:
            with contextlib.suppress(Exception):
                out.clear()
            raise


def read_manifest_at(output_dir: Union[str, os.PathLike], filesystem: Any = None):
    """``(manifest or None, fs or None, root)`` of a packed output, local or on a store."""
    from .._outdir import read_manifest

    store = store_of(output_dir, filesystem)
    if store is None:
        return read_manifest(output_dir), None, str(output_dir)
    fs, prefix, _ = store
    try:
        with fs.open_input_stream(f"{prefix.rstrip('/')}/{MANIFEST_NAME}") as f:
            manifest: Dict[str, Any] = json.loads(f.read())
    except FileNotFoundError:
        return None, fs, prefix.rstrip("/")
    except (OSError, ValueError) as exc:
        raise CorruptOutputError(f"{output_dir}: unreadable manifest ({exc})") from None
    return manifest, fs, prefix.rstrip("/")
