"""Where a run's files go: a local (or shared) directory, or object storage.

``tokpack pack`` / ``tokenize`` (:func:`destination`, :func:`cached_run`) build their output
in a local directory and commit it: on a file system by renaming it into place; on object
storage by uploading each file whole, the manifest last.

Ray's shard tasks write each file into a scratch directory of their own, then *publish* it
into the output: on a file system by renaming it into the run's temporary directory (renamed
into place when the run is complete); on object storage (any ``pyarrow.fs`` file system, or an
fsspec one, that is not the local one: ``s3://``, ``gs://``, ...) by uploading it under its
final key, one whole object at a time.

Object stores have no rename of a directory, so there the manifest is the commit marker: a run
first removes the previous output's manifest (from then on readers refuse the prefix), writes
every shard and side file, and writes the manifest last. Readers refuse a prefix without one.

Every destination follows ``tokpack pack``'s output rule (``outdir``): a prefix is replaced
only when it is empty or tokpack's (a manifest listing its shards, or the claim ``RUN_MARKER``
a run writes before it deletes or writes anything, so the objects of a run that died are
recognised as tokpack's); anything else there (``part-0.parquet`` of
``pyarrow.dataset.write_dataset``, say) is refused, never deleted. An output holding one of the
run's input files is refused too. A ``file://`` URI, or a local ``filesystem=``, is a local
directory written atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from functools import partial
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

from .. import _tokpack
from ..errors import ConfigError, CorruptOutputError, OutputError, OutputExistsError
from . import manifest as _manifest  # (its write_manifest looked up at each call)
from .manifest import cache_problem, listed_files
from .outdir import (
    MANIFEST_NAME,
    SIDE_DIR,
    add_fingerprints,
    atomic_output_dir,
    cache_key,
    check_replace,
    describe_inputs,
    foreign_names,
    is_tokpack_manifest,
    output_target,
    read_manifest,
    writing,
)
from .overlap import Place, check_apart, local_place, store_place
from .scratch import STAGED_PREFIX, scratch_dir
from .uri import RUN_MARKER, local_path, store_of

ATTEMPT_PREFIX = ".attempt-"
# The object names a tokpack run writes under its prefix (side files, shards, local mode's
# group staging): only those are ever deleted, and only from a prefix that is tokpack's.
_OURS = re.compile(rf"(part-\d{{5}}\.parquet|{SIDE_DIR}/.+|\.group-\d+/.+)")
_STAGED = re.compile(rf"({SIDE_DIR}/.+|\.group-\d+/.+)")


class LocalOut:
    """The output of a Ray run as tasks and the driver see it (an :class:`Out`, picklable: sent
    to tasks): the run's temporary directory ``tmp`` on a file system every node sees, or a
    prefix of object storage (:class:`StoreOut`). ``scratch()`` gives a fresh local directory
    (with the side folder) for one task's files; ``publish(scratch, names, dest)`` puts
    ``scratch/name`` at ``dest/name`` of the output, each whole or not at all; ``move(src,
    dst)`` renames a published file (local mode numbers its shards once all groups are done);
    ``remove(folder)`` removes a folder of published files."""

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


class LocalDir:
    """An output directory of ``pack`` / ``tokenize`` (:func:`destination`) on this machine, as
    :class:`StoreOut` is one on object storage. Both have ``shown`` (as the user wrote it),
    ``local`` (the real path, as ``outdir.output_target`` gives it; None on object storage),
    ``place`` (where it is for the overlap rule: ``resolve_inputs(output_dir=...)``),
    ``manifest()`` (the one there, parsed, or None: missing or unreadable), ``problem()`` (why
    the output a matching manifest describes cannot be trusted, or None) and ``building()``
    (a local directory to build the output in, committed when the block ends)."""

    def __init__(self, local: Path, shown: str) -> None:
        self.local, self.shown = local, shown

    @property
    def place(self) -> Place:
        return local_place(self.local, self.shown)

    def manifest(self) -> Any:
        with contextlib.suppress(CorruptOutputError):
            return read_manifest(self.local)
        return None

    def problem(self, manifest: Dict[str, Any], full: bool = False) -> Optional[str]:
        return cache_problem(self.local, manifest, full=full)

    def building(self, staging: Any) -> ContextManager[Path]:
        return atomic_output_dir(self.local)


class StoreOut:
    """A prefix of an object store (``fs``: a ``pyarrow.fs.FileSystem``): a :class:`Destination`
    and the :class:`Out` of a Ray run."""

    local = None

    def __init__(self, fs: pafs.FileSystem, prefix: str, shown: str) -> None:
        self.fs, self.prefix, self.shown = fs, prefix.rstrip("/"), shown

    @property
    def place(self) -> Place:
        return store_place(self.fs, self.prefix, self.shown)

    def building(self, staging: Any) -> ContextManager[Path]:
        return _committed(self, staging, build_first=True)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        with scratch_dir("tokpack-ray-shard-") as d:
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

    def manifest(self) -> Any:
        with contextlib.suppress(CorruptOutputError):
            return read_manifest(self.prefix, self.fs)
        return None

    def claim(self) -> bool:
        """Checks that the prefix may be replaced (``_outdir.foreign_names``: empty, or
        tokpack's holding only what tokpack writes, a dead run's staged objects included: see
        the module docstring), then marks it as being written by this run. Returns whether
        it was marked already (by a run that died)."""
        names = self.names()
        if names:
            manifest = self.manifest()
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
        with scratch_dir("tokpack-ray-claim-") as d:
            marker = Path(d, "writing")
            marker.write_text(f"{os.getpid()}\n")
            self.upload(marker, RUN_MARKER)
        return RUN_MARKER in names

    def clear(self, keep_claim: bool = True) -> None:
        """Removes this run's objects and those of the output it replaces (manifest first:
        readers refuse the prefix from then on), all tokpack's (see :meth:`claim`)."""
        names = [n for n in self.names() if n != RUN_MARKER or not keep_claim]
        for name in sorted(names, key=lambda n: (n != MANIFEST_NAME, n == RUN_MARKER)):
            if _OURS.fullmatch(name):
                self.fs.delete_file(self.key(name))
        left = self.names()  # (only empty folders are removed: the files stay as they are)
        for folder in sorted(self.names(pafs.FileType.Directory), reverse=True):
            if _OURS.fullmatch(f"{folder}/x") and not any(n.startswith(f"{folder}/") for n in left):
                self.fs.delete_dir(self.key(folder))

    def problem(self, manifest: Dict[str, Any], full: bool = False) -> Optional[str]:
        """``manifest.cache_problem`` on the store: why the output a matching manifest
        describes cannot be trusted (an object missing or of another size; with ``full``, one
        whose bytes do not match its checksum), or None."""
        try:
            listed = listed_files(manifest)
        except (KeyError, TypeError) as exc:
            return f"the manifest is malformed (field {exc})"
        infos = self.fs.get_file_info([self.key(str(name)) for name, _, _ in listed])
        for (name, size, checksum), info in zip(listed, infos):
            if info.type != pafs.FileType.File:
                return f"{self.shown}/{name} is missing"
            if size is not None and info.size != size:
                return f"{self.shown}/{name} has {info.size} bytes, the manifest says {size}"
            if full and checksum is not None:
                with scratch_dir("tokpack-check-") as d:
                    copy = Path(d, "object")
                    with self.fs.open_input_stream(self.key(name)) as src, open(copy, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 22)
                    if _tokpack.file_checksum(str(copy))[1] != checksum:
                        return f"{self.shown}/{name} does not match its checksum"
        return None


def check_no_overlap(dest: Destination, inputs: Sequence[str]) -> None:
    """``overlap.check_apart`` for a Ray run: refuses an output that is one of the dataset's
    inputs (files or folders), holds one (replacing it would delete the run's own inputs) or
    lies inside one (each rerun would read the previous output). Local paths are compared by
    real path, object keys as the file system names them (a ``scheme://`` dropped: the
    dataset names its inputs on the output's file system)."""

    def place(path: str, name: str) -> Place:
        if dest.local is not None:
            return local_place(local_path(path) or path, name)
        return Place("store", tuple(p for p in path.split("://", 1)[-1].split("/") if p), name)

    target = dest.prefix if isinstance(dest, StoreOut) else str(dest.local)
    check_apart(place(target, dest.shown), [(place(str(n), str(n)), True) for n in inputs])


Destination = Union[LocalDir, StoreOut]
Out = Union[LocalOut, StoreOut]


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
    dest = destination(output_dir, filesystem)
    check_no_overlap(dest, inputs)
    if isinstance(dest, StoreOut):
        with _committed(dest) as local:
            yield dest, local
        return
    with atomic_output_dir(dest.local) as tmp:
        (tmp / SIDE_DIR).mkdir(exist_ok=True)
        yield LocalOut(tmp), tmp


@contextlib.contextmanager
def _committed(out: "StoreOut", staging: Any = None, build_first: bool = False) -> Iterator[Path]:
    """Claims ``out`` (refused unless tokpack's) and yields a local directory (under
    ``staging``); on success uploads its files with the manifest last (the commit), then
    removes the claim. The previous output is cleared before the body runs (Ray's tasks upload
    into the prefix) or, with ``build_first``, only once the body has succeeded: a run that
    fails then leaves the previous output as it was. On failure this run's objects go."""
    dead_run = out.claim()
    cleared = False
    with scratch_dir(STAGED_PREFIX, staging) as local:
        try:
            if not build_first:
                out.clear()
                cleared = True
            (Path(local) / SIDE_DIR).mkdir(exist_ok=True)
            yield Path(local)
            if not cleared:
                out.clear()
                cleared = True
            files = sorted(str(p.relative_to(local)) for p in Path(local).rglob("*") if p.is_file())
            for name in sorted(files, key=lambda n: n == MANIFEST_NAME):
                out.upload(Path(local, name), name)
            out.fs.delete_file(out.key(RUN_MARKER))
        except BaseException:
            with contextlib.suppress(Exception):
                if cleared:
                    out.clear(keep_claim=False)
                elif not dead_run:  # else the marker keeps the dead run's objects tokpack's
                    out.fs.delete_file(out.key(RUN_MARKER))
            raise


def destination(output_dir: Union[str, os.PathLike], filesystem: Any = None) -> Destination:
    """Where ``output_dir`` is: a local path, a ``file://`` URI or a path on a local
    ``filesystem=`` is local; a URI of another scheme (``s3://``, ``gs://``, ``abfs://``,
    ``hf://``) or a path on another ``filesystem=`` (pyarrow or fsspec) is object storage."""
    shown = str(os.fspath(output_dir))
    try:
        local_dir = local_path(output_dir, filesystem)
        if local_dir is not None:
            return LocalDir(output_target(local_dir), shown)
        return StoreOut(*store_of(output_dir, filesystem))  # type: ignore[misc]
    except ValueError as exc:  # ArrowInvalid: an unknown scheme, a malformed URI
        raise ConfigError(f"{shown}: not a usable output location ({exc})") from None


def cached_run(
    dest: Destination,
    kind: str,
    inputs: Sequence[os.PathLike],
    config: Dict[str, Any],
    build: Callable[[Path, List[Dict[str, Any]]], Dict[str, Any]],
    *,
    threads: Optional[int] = None,
    force: bool = False,
    verify: bool = False,
    staging: Optional[Union[str, os.PathLike]] = None,
    fingerprinted: bool = False,
) -> Tuple[Dict[str, Any], bool, Optional[str]]:
    """The run of every command that writes a directory: describe the inputs -> cache key ->
    the existing output if built with that key and intact (``verify``: checksums too) -> else
    ``build(tmp, described)`` fills a local directory and returns the manifest, written last
    with the key. Returns (manifest, cache hit?, why a current output was rebuilt).
    ``fingerprinted``: ``build`` fills in the inputs' fingerprints from its own reading
    (:func:`outdir.add_fingerprints`) when the output cannot be current without them.

    Local: ``tmp`` is an :func:`atomic_output_dir`. On object storage a cache hit is a
    manifest with the key whose listed objects are all there with their recorded sizes; the
    output is built in a local directory (under ``staging``, default the system's temporary
    directory), then the prefix is claimed (refused unless tokpack's, before any work),
    cleared and the files uploaded, the manifest last; a run that fails leaves the previous
    output as it was."""
    existing = None if force else dest.manifest()
    existing = existing if is_tokpack_manifest(existing) else None
    # The inputs' content is hashed before the work only when the output may be current: its
    # manifest has this config and lists these inputs with these sizes. Otherwise ``build``
    # (``fingerprinted``) takes the fingerprints while it reads the inputs, which are then read
    # from disk once.
    described = describe_inputs(inputs, threads, contents=False)
    if not fingerprinted or _may_be_current(existing, described, config):
        add_fingerprints(described, inputs, threads=threads)
    rebuilt_because = None
    if existing is not None and all("fingerprint" in d for d in described):
        if existing.get("cache_key") == cache_key(kind, described, config):
            rebuilt_because = dest.problem(existing, full=verify)
            if rebuilt_because is None:
                return existing, True, None
    with dest.building(staging) as tmp:
        manifest = {"tokpack_version": _tokpack.__version__, "cache_key": ""}
        manifest.update(build(tmp, described))
        # Those a build that reads the inputs left out.
        add_fingerprints(described, inputs, threads=threads)
        manifest["cache_key"] = cache_key(kind, described, config)
        with writing(tmp / MANIFEST_NAME):
            _manifest.write_manifest(tmp, manifest)
    return manifest, False, rebuilt_because


def _may_be_current(manifest: Any, described: List[Dict[str, Any]], config: Any) -> bool:
    """Whether ``manifest`` (a packed directory's) records ``config`` and lists the inputs
    ``described`` (paths and sizes, in order)."""
    listed = None if manifest is None else manifest.get("inputs")
    if not isinstance(listed, list) or len(listed) != len(described):
        return False
    if manifest.get("config") != json.loads(json.dumps(config)):
        return False
    return all(
        isinstance(m, dict) and m.get("path") == d["path"] and m.get("size") == d["size"]
        for m, d in zip(listed, described)
    )


def read_manifest_at(output_dir: Union[str, os.PathLike], filesystem: Any = None):
    """``(manifest or None, fs or None, root)`` of a packed output, local or on a store."""
    local_dir = local_path(output_dir, filesystem)
    if local_dir is not None:
        return read_manifest(local_dir), None, local_dir
    out = StoreOut(*store_of(output_dir, filesystem))  # type: ignore[misc]
    return read_manifest(out.prefix, out.fs), out.fs, out.prefix


@contextlib.contextmanager
def object_output_files(
    shown: Sequence[str], *, force: bool, owned: Callable[[str, pafs.FileSystem], bool]
) -> Iterator[List[Path]]:
    """``outdir.atomic_output_files`` for files on object storage (URIs of one store): yields a
    local temporary path for each; on normal exit uploads each whole, in order. An existing
    object is replaced only with ``force`` and only when ``owned(key, fs)`` says tokpack wrote
    it (checked before the work and again before the uploads)."""
    stores = []
    for name in shown:
        store = store_of(name)
        if store is None:
            raise ConfigError(f"{name}: a local file among object-storage outputs {list(shown)}")
        stores.append(store)
    fs = stores[0][0]

    def check() -> None:
        for (_, key, name), info in zip(stores, fs.get_file_info([k for _, k, _ in stores])):
            if info.type != pafs.FileType.NotFound:
                is_dir = info.type != pafs.FileType.File
                check_replace(name, force, is_dir, partial(owned, key, fs), "an object")

    check()
    with scratch_dir("tokpack-export-") as d:
        tmps = [Path(d, f"{i}-{key.rsplit('/', 1)[-1]}") for i, (_, key, _) in enumerate(stores)]
        yield tmps
        check()  # objects written meanwhile by another program are not lost
        for tmp, (_, key, name) in zip(tmps, stores):
            try:
                with open(tmp, "rb") as src, fs.open_output_stream(key) as sink:
                    shutil.copyfileobj(src, sink, 1 << 22)
            except OSError as exc:
                raise OutputError(f"{name}: cannot upload ({exc})") from None
