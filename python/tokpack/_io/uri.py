"""Where a directory is: this machine's file system, or object storage.

The one resolver of tokpack's paths and URIs (``tokpack.ray``'s outputs and the readers of
``tokpack.remote`` use it): a plain path or ``file://`` URI is local; any other URI
(``s3://bucket/packed``, ``gs://...``, ``abfs://...``, ``hf://...``) is a file system
``pyarrow.fs`` knows, or else one fsspec knows (when fsspec and that protocol's package are
installed); ``filesystem=`` (a ``pyarrow.fs.FileSystem`` or an fsspec one) takes a path on it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Tuple, Union

import pyarrow as pa
import pyarrow.fs as pafs

from .._tokpack import SIDE_DIR  # the format's name (packed.format re-exports it)
from ..errors import ConfigError

__all__ = ["RUN_MARKER", "cache_home", "is_remote", "local_path", "store_of"]

# Written first by a run writing to object storage, removed after its manifest: a prefix
# holding it is a run's that did not finish (its objects are tokpack's to remove).
RUN_MARKER = f"{SIDE_DIR}/_writing"


def cache_home() -> Path:
    """Where tokpack caches what it fetches from object storage: ``$TOKPACK_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/tokpack`` (``~/.cache/tokpack``); the readers' row groups go under
    ``remote/``, copies of input objects under ``objects/``."""
    env = os.environ.get("TOKPACK_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "tokpack")


def fs_protocols(filesystem: Any) -> Tuple[str, ...]:
    """The protocols an fsspec file system names itself by (``("s3", "s3a")``), or ()."""
    protocol = getattr(filesystem, "protocol", None)
    return (protocol,) if isinstance(protocol, str) else tuple(protocol or ())


def _with_endpoint(uri: str) -> str:
    """An ``s3://`` URI with the endpoint of ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``
    (the AWS tools' variables, for MinIO, R2 and the like), unless it names one itself."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not uri.startswith("s3://") or not endpoint or "endpoint_override=" in uri:
        return uri
    scheme, _, host = endpoint.partition("://")
    if not host:
        scheme, host = "https", endpoint
    return f"{uri}{'&' if '?' in uri else '?'}endpoint_override={host.rstrip('/')}&scheme={scheme}"


def _from_uri(uri: str) -> Tuple[pafs.FileSystem, str]:
    """``pyarrow.fs``'s file system of ``uri`` and the path on it, else fsspec's (wrapped)."""
    given = _with_endpoint(uri)
    try:
        return pafs.FileSystem.from_uri(given)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        # (pyarrow's message repeats the URI, credentials included)
        shown = shown_uri(uri)
        arrow_error = str(exc).replace(given, shown).replace(uri, shown)
    try:
        import fsspec.core
    except ImportError:
        raise ConfigError(
            f"{shown}: no file system for this URI ({arrow_error}); pyarrow.fs knows"
            " s3://, gs://, abfs:// and hdfs://, fsspec (pip install fsspec and the protocol's"
            " package) knows more; or pass filesystem="
        ) from None
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"{shown}: no file system for this URI (pyarrow: {arrow_error};"
            f" fsspec: {str(exc).replace(uri, shown)}); install the package of its protocol"
            " or pass filesystem="
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), str(path)


def local_path(output_dir: Union[str, os.PathLike], filesystem: Any = None) -> Optional[str]:
    """The local path of a directory on this machine's file system (a path, a ``file://`` URI,
    or a path on a local ``filesystem=``), else None (object storage)."""
    text = str(os.fspath(output_dir))
    if filesystem is None:
        if "://" not in text:
            return text
        if text.startswith(("file://", "local://")):
            fs, path = pafs.FileSystem.from_uri(text)
            return path if isinstance(fs, pafs.LocalFileSystem) else None
        return None
    if isinstance(filesystem, pafs.FileSystem):
        return text if isinstance(filesystem, pafs.LocalFileSystem) else None
    return text if "file" in fs_protocols(filesystem) else None


def is_remote(path: Union[str, os.PathLike], filesystem: Any = None) -> bool:
    """Whether ``path`` (with ``filesystem``) is on object storage rather than a local path."""
    return local_path(path, filesystem) is None


def shown_uri(uri: str) -> str:
    """How messages and reports name ``uri``: without its query and its user information
    (``s3://KEY:SECRET@bucket/...`` and ``?secret_key=...`` carry credentials). An Azure URI's
    user part names its container or account (``abfs://container@account.dfs.core.windows.net``):
    only its password goes."""
    scheme, sep, rest = uri.split("?", 1)[0].partition("://")
    if not sep:
        return scheme
    authority, slash, path = rest.partition("/")
    user, at, host = authority.rpartition("@")
    if at and scheme in ("abfs", "abfss"):
        host = f"{user.partition(':')[0]}@{host}"
    return f"{scheme}://{host}{slash}{path}"


def store_of(
    output_dir: Union[str, os.PathLike], filesystem: Any = None
) -> Optional[Tuple[pafs.FileSystem, str, str]]:
    """``(fs, prefix, shown)`` when ``output_dir`` is on object storage (a URI such as
    ``s3://bucket/packed``, or a path on ``filesystem``: a ``pyarrow.fs.FileSystem`` or an
    fsspec one); None for a local path (or ``file://``, or a local ``filesystem``). ``shown``
    is how messages name it (the URI as given)."""
    text = os.fspath(output_dir)
    if local_path(text, filesystem) is not None:
        return None
    if filesystem is None:
        fs, prefix = _from_uri(str(text))
        return fs, prefix, shown_uri(str(text))
    if not isinstance(filesystem, pafs.FileSystem):
        filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
    return filesystem, str(text), str(text)
