"""The one overlap rule of every destination: ``pack``, ``tokenize``, ``export`` and
``tokpack.ray.pack``, to a local directory or to object storage.

An output may not be one of the run's inputs, hold one (replacing it would delete them) or lie
inside a folder the run reads (the next run would read its output back as input). Places are
compared by path components on one store, never by string prefix: ``s3://B/tok/`` and
``s3://B/tokens-packed/`` are apart, ``s3://B/tokens/`` and ``s3://B/tokens/packed`` are not.
Local paths are compared by real path (symlinks resolved), keys of object storage as the store
names them (``bucket/key``), on the store their scheme or file system names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Tuple

from ..errors import ConfigError
from .objects import shown_path
from .uri import fs_protocols, shown_uri

__all__ = ["Place", "local_place", "store_place", "uri_place", "check_apart"]

# One name per store, whichever spelling names it (a URI's scheme, fsspec's protocol, pyarrow's
# file system type): ``gs://`` and pyarrow's ``GcsFileSystem`` are the same store.
_STORES = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "s3a": "s3", "abfss": "abfs", "az": "abfs"}


@dataclass(frozen=True)
class Place:
    """A file or folder: ``store`` ("" for this machine's file system, else the store's name:
    ``s3``, ``gcs``, ...), its path ``parts`` and how messages name it (``shown``)."""

    store: str
    parts: Tuple[str, ...]
    shown: str

    @property
    def name(self) -> str:
        """The place as a path (local) or a URI (``s3://bucket/key``)."""
        if not self.store:
            return os.sep + os.sep.join(self.parts)
        return f"{'gs' if self.store == 'gcs' else self.store}://{'/'.join(self.parts)}"

    def within(self, other: "Place") -> bool:
        """Whether this place is ``other`` or lies inside it."""
        n = len(other.parts)
        return self.store == other.store and self.parts[:n] == other.parts


def local_place(path: Any, shown: Optional[str] = None, link: bool = False) -> Place:
    """A local path, by its real path (with ``link``, a symlink's own place: its folder's
    real path and its name)."""
    text = os.path.abspath(os.fspath(path))
    if link:
        real = os.path.join(os.path.realpath(os.path.dirname(text)), os.path.basename(text))
    else:
        real = os.path.realpath(text)
    return Place("", tuple(p for p in real.split(os.sep) if p), shown or shown_path(path))


def _store_name(scheme: str) -> str:
    scheme = scheme.lower()
    return _STORES.get(scheme, scheme)


def _key_parts(key: str) -> Tuple[str, ...]:
    return tuple(p for p in key.split("?", 1)[0].split("/") if p)


def store_place(fs: Any, key: str, shown: str) -> Place:
    """A key on a ``pyarrow.fs`` file system (an fsspec one wrapped in ``PyFileSystem``)."""
    protocols = fs_protocols(getattr(getattr(fs, "handler", None), "fs", None))
    name = protocols[0] if protocols else getattr(fs, "type_name", "store")
    if "://" in key:  # (a URI given as a key names its own store)
        return uri_place(key, shown)
    return Place(_store_name(str(name)), _key_parts(key), shown)


def uri_place(uri: str, shown: Optional[str] = None) -> Place:
    """An object-storage URI (``s3://bucket/key``), without its user information and query."""
    clean = shown_uri(uri)
    scheme, _, rest = clean.partition("://")
    return Place(_store_name(scheme), _key_parts(rest), shown or clean)


def check_apart(output: Place, inputs: Iterable[Tuple[Place, bool]], writes: str = "dir") -> None:
    """Refuses ``output`` when it overlaps one of ``inputs`` (``(place, is_folder)``: a folder
    the run reads, or one input file). ``writes`` is what the output is: ``"dir"``, a directory
    the run replaces as a whole, or ``"file"``, one file (``export``'s) that only must not lie
    inside what the run reads."""
    for place, folder in inputs:
        if output.store == place.store and output.parts == place.parts:
            what = "input directory" if folder else "input"
            raise ConfigError(
                f"the output {output.shown} is the {what} {place.shown}: writing it would "
                "delete the inputs; choose another output"
            )
        if folder and output.within(place):
            raise ConfigError(
                f"the output {output.shown} is inside the input directory {place.shown}: the "
                "next run would read its own output back as input; choose an output outside "
                "the inputs"
            )
        if not folder and writes == "file" and output.within(place):
            raise ConfigError(
                f"the output {output.shown} is inside the input {place.shown}; tokpack never "
                "writes into what it reads: choose an output outside it"
            )
        if writes == "dir" and place.within(output):
            kind = "input directory" if folder else "input"
            raise ConfigError(
                f"the {kind} {place.shown} is inside the output directory {output.shown}, which "
                "a run replaces as a whole; choose another output directory"
            )
