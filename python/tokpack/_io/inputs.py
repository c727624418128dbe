"""The one input resolver of every command (``pack``, ``stats``, ``tokenize``, ``pack
--tokenizer``, ``streaming_dataset_reader``): files, directories and globs to a list of files.

- A file is taken as given (whatever its suffix).
- A directory gives its files with one of the command's suffixes, recursively, sorted by path.
  Names starting with ``_`` or ``.`` are side files (tokpack's ``__tokpack__/``, temporaries,
  HF datasets' state) and skipped with everything below them; symlinked files are followed,
  symlinked subdirectories are not (no loops, no file read twice).
- A glob (``*``, ``?``, ``[``, ``**``) gives the files it matches, sorted.
- A URI of object storage (``s3://bucket/tokens/``, a key, or a glob of keys) gives its objects,
  as local copies in tokpack's cache (``objects``), named by their URIs in every message.
- A file given twice (named twice, or found by two items) is listed, and read, twice: every
  command and ``--ray`` take its samples once per listing, as the order given says.

With an output directory (local or on object storage), inputs and output must not overlap
(``overlap``, the one rule of every destination): an output inside an input directory or
prefix would be read back as input by the next run, and replacing an output that holds the
inputs would delete them.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

from ..errors import (
    ConfigError,
    InputNotFoundError,
    InputPermissionError,
    InputReadError,
    TokpackError,
)
from .objects import mirror_objects, shown_path, uri_of  # noqa: F401 (shown_path re-exported)
from .overlap import Place, check_apart, local_place, uri_place
from .uri import is_remote

PARQUET_SUFFIXES = (".parquet", ".pq")
# Token shards: Parquet and Arrow IPC (the Rust reader recognises the format by its magic bytes).
TOKEN_SUFFIXES = PARQUET_SUFFIXES + (".arrow", ".feather", ".ipc")
# Raw data that `tokenize` and `pack --tokenizer` read (".gz" covers ".jsonl.gz").
RAW_SUFFIXES = (".jsonl", ".gz") + PARQUET_SUFFIXES

PathsLike = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


def is_parquet(path: Union[str, os.PathLike]) -> bool:
    """A Parquet file by its suffix (else JSONL for raw data, Arrow IPC for token shards)."""
    return os.fspath(path).lower().endswith(PARQUET_SUFFIXES)


def input_error(path: Union[str, os.PathLike], exc: OSError) -> TokpackError:
    """The tokpack error for an OSError met while looking at or reading an input."""
    shown = shown_path(path)
    if isinstance(exc, PermissionError):
        return InputPermissionError(f"{shown}: permission denied")
    if exc.errno == errno.ELOOP:
        return InputNotFoundError(f"{shown}: symlink loop (too many levels of symbolic links)")
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return InputNotFoundError(f"{shown}: broken symbolic link (to {os.readlink(path)})")  # type: ignore[type-var]
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return InputNotFoundError(f"{shown}: no such file or directory")
    return InputReadError(f"{shown}: cannot read ({exc.strerror or exc})")


def require_file(path: Union[str, os.PathLike]) -> os.stat_result:
    """The stat of a readable regular file (symlinks followed), or the fitting tokpack error."""
    shown = shown_path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise input_error(path, exc) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputReadError(f"{shown}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputReadError(f"{shown}: not a regular file")
    if not os.access(path, os.R_OK):
        raise InputPermissionError(f"{shown}: permission denied")
    return st


def resolve_inputs(
    inputs: PathsLike,
    suffixes: Tuple[str, ...],
    *,
    output_dir: Optional[Union[Path, Place]] = None,
    folders: Optional[List[str]] = None,
) -> List[Path]:
    """The input files, in the order given (each directory's and glob's files sorted).

    ``suffixes`` (lower case) select the files of directories; ``output_dir`` (the place of
    the output directory, or its real path as ``_outdir.output_target`` returns) is checked
    not to overlap any input (``overlap.check_apart``). ``folders``, when given, gets the
    folders the inputs list (directories, a glob's folder before its first wildcard, object
    prefixes; real paths or URIs, each once): a packed directory records them, since an
    export into one would be read by the next run of the same pack."""
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    out = local_place(output_dir) if isinstance(output_dir, Path) else output_dir
    found: List[Path] = []
    listed: List[Place] = []
    for item in items:
        text = os.fspath(item)
        if not text:
            raise ConfigError("an input path is empty")
        if is_remote(text):
            copies = mirror_objects(str(text), suffixes)
            places = _object_places(str(text), copies)
            if out is not None:
                check_apart(out, places)
            listed.extend(place for place, folder in places if folder)
            found.extend(copies)
            continue
        files = _local_files(Path(text), suffixes, out)
        if os.path.isdir(text):
            listed.append(local_place(text))
        elif glob.has_magic(text) and not os.path.exists(text):
            base = text[: min(text.index(c) for c in "*?[" if c in text)]
            listed.append(local_place(os.path.dirname(base) or "."))
        if out is not None:
            # The file itself and the link to it (if it is one) both must lie outside.
            check_apart(
                out,
                [(p, False) for f in files for p in (local_place(f), local_place(f, link=True))],
            )
        found.extend(files)
    if not found:
        raise InputNotFoundError("no input files given")
    if folders is not None:
        folders.extend(dict.fromkeys(p.name for p in listed if p.name not in folders))
    return found


def _local_files(path: Path, suffixes: Tuple[str, ...], out: Optional[Place]) -> List[Path]:
    """The files one local item names (a file, a directory, a glob)."""
    text = os.fspath(path)
    try:
        mode: Optional[int] = os.stat(path).st_mode
    except OSError as exc:
        if not (isinstance(exc, FileNotFoundError) and glob.has_magic(text)):
            raise input_error(path, exc) from None
        mode = None
    if mode is None:
        found = sorted(Path(p) for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        if not found:
            raise InputNotFoundError(f"{text}: no file matches")
        for f in found:
            require_file(f)
        return found
    if stat.S_ISDIR(mode):
        if out is not None:  # (before the walk: an output inside it is refused first)
            check_apart(out, [(local_place(path, str(path)), True)])
        found = sorted(_walk(path, suffixes))
        if not found:
            raise InputNotFoundError(f"{path}: no {' / '.join(suffixes)} files inside")
        return found
    require_file(path)
    return [path]


def _object_places(uri: str, copies: List[Path]) -> List[Tuple[Place, bool]]:
    """What an object-storage input reads: its objects, and the prefix it lists (a prefix, or
    a glob's folder before its first wildcard) unless it names one object."""
    objects = [uri_place(str(uri_of(c))) for c in copies]
    given = uri_place(uri)
    if glob.has_magic(uri):  # (its folder: the components before the first with a wildcard)
        first = next(i for i, p in enumerate(given.parts) if glob.has_magic(p))
        given = Place(given.store, given.parts[:first], given.shown)
    elif len(objects) == 1 and objects[0].parts == given.parts:
        return [(objects[0], False)]
    return [(given, True)] + [(o, False) for o in objects]


def _walk(root: Path, suffixes: Tuple[str, ...]) -> List[Path]:
    """Files under ``root`` with one of ``suffixes``, side files and their folders skipped."""
    found: List[Path] = []
    try:
        with os.scandir(root) as it:
            entries = list(it)
    except OSError as exc:
        raise input_error(root, exc) from None
    for entry in entries:
        if entry.name.startswith(("_", ".")):
            continue
        path = root / entry.name
        if entry.is_dir(follow_symlinks=False):
            found.extend(_walk(path, suffixes))
        elif entry.name.lower().endswith(suffixes) and not path.is_dir():
            # (path.is_dir(): a symlinked directory, not followed; a broken link or a loop is
            # not a directory and require_file names it.)
            require_file(path)
            found.append(path)
    return found
