"""Media references: where an image of a sample comes from, read back by the collator.

An image of a record's ``images`` column is a path (absolute, or relative to ``image_root``,
by default the directory of the input file; ``file://`` URLs are paths), raw bytes, or a
Hugging Face ``datasets`` ``Image`` value (``{"bytes": ..., "path": ...}``). A sample stores a
reference per image: ``{"path": ABSOLUTE}`` for a file, ``{"file": INPUT, "row": R, "index": I}``
for bytes held by a Parquet input (row ``R`` of the file, ``I``-th image of its ``images``
column), and the BLAKE2b-128 hash of the image bytes, checked when the image is loaded again.
A video of a ``videos`` column is a list of frames, each such a value; a frame held as bytes is
referenced with the ``frame`` index added (``{"file", "row", "column", "index", "frame"}``).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..errors import DataError, InputNotFoundError

__all__ = ["media_hash", "resolve_image", "MediaReader", "describe_ref"]

_REMOTE = ("http://", "https://", "s3://", "gs://", "hf://")


def media_hash(data: bytes) -> str:
    return "blake2b128:" + hashlib.blake2b(data, digest_size=16).hexdigest()


def describe_ref(ref: Dict[str, Any]) -> str:
    """A reference as a file name for messages."""
    if "path" in ref:
        return str(ref["path"])
    where = f"{ref['file']}:row {ref['row']}, column {ref.get('column', 'images')!r}"
    if "frame" in ref:
        return f"{where}, video {ref['index']}, frame {ref['frame']}"
    return f"{where}, image {ref['index']}"


def resolve_image(value: Any, root: Path, where: Dict[str, Any]) -> Tuple[Dict[str, Any], bytes]:
    """The reference and the bytes of one value of an ``images`` column. ``where`` is the
    reference a value holding bytes gets (its input file, row, column and index)."""
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path")
        value = data if data is not None else path
    if isinstance(value, (bytes, bytearray, memoryview)):
        if "row" not in where:
            raise DataError("image bytes need a Parquet input (a JSONL line cannot hold bytes)")
        return dict(where), bytes(value)
    if not isinstance(value, str) or not value:
        raise DataError(f"an image must be a path, bytes or {{'bytes', 'path'}}, got {value!r}")
    if value.startswith("file://"):
        value = value[len("file://") :]
    elif value.startswith(_REMOTE):
        raise DataError(f"{value}: remote images are not fetched; download them and give paths")
    path = Path(value)
    if not path.is_absolute():
        path = root / path
    path = Path(os.path.abspath(path))
    return {"path": str(path)}, _read(path)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputNotFoundError(f"{path}: no such image file") from None
    except OSError as exc:
        raise InputNotFoundError(f"{path}: cannot read the image ({exc})") from None


class MediaReader:
    """Reads referenced images back (in DataLoader workers): a file's bytes, or the bytes of a
    Parquet input's row (its row groups cached, a few at a time), each checked against the
    hash stored at tokenize time. Picklable: the cache is per process."""

    def __init__(self, cached_groups: int = 2) -> None:
        self.cached_groups = cached_groups
        self._groups: "OrderedDict[Tuple[str, str, int], list]" = OrderedDict()
        self._files: Dict[str, Any] = {}

    def __getstate__(self) -> Dict[str, Any]:
        return {"cached_groups": self.cached_groups}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["cached_groups"])  # type: ignore[misc]

    def read(self, ref: Dict[str, Any], expected_hash: Optional[str]) -> bytes:
        data = _read(Path(ref["path"])) if "path" in ref else self._row_bytes(ref)
        if expected_hash is not None and media_hash(data) != expected_hash:
            raise DataError(
                f"{describe_ref(ref)}: the image changed since it was tokenized (its hash is"
                f" {media_hash(data)}, the sample records {expected_hash}); tokenize again"
            )
        return data

    def image(self, ref: Dict[str, Any], expected_hash: Optional[str]) -> Any:
        """The image as transformers' ``load_image`` gives it: decoded, EXIF orientation
        applied, RGB."""
        from PIL import Image, ImageOps

        data = self.read(ref, expected_hash)
        try:
            with Image.open(io.BytesIO(data)) as im:
                im = ImageOps.exif_transpose(im)
                return im.convert("RGB")
        except Exception as exc:  # PIL raises many types for damaged data
            raise DataError(f"{describe_ref(ref)}: cannot decode the image ({exc})") from None

    def _row_bytes(self, ref: Dict[str, Any]) -> bytes:
        import pyarrow.parquet as pq

        file, row, column = str(ref["file"]), int(ref["row"]), str(ref.get("column", "images"))
        pf = self._files.get(file)
        if pf is None:
            try:
                pf = pq.ParquetFile(file)
            except FileNotFoundError:
                raise InputNotFoundError(
                    f"{file}: no such input file (images of row {row})"
                ) from None
            except Exception as exc:
                raise DataError(f"{file}: cannot read the Parquet input ({exc})") from None
            self._files[file] = pf
        start, group = 0, 0
        meta = pf.metadata
        while group < meta.num_row_groups and start + meta.row_group(group).num_rows <= row:
            start += meta.row_group(group).num_rows
            group += 1
        if group == meta.num_row_groups:
            raise DataError(f"{describe_ref(ref)}: the file has only {start} rows")
        key = (file, column, group)
        values = self._groups.get(key)
        if values is None:
            try:
                values = pf.read_row_group(group, columns=[column]).column(0).to_pylist()
            except Exception as exc:
                raise DataError(f"{file}: cannot read row group {group} ({exc})") from None
            self._groups[key] = values
            while len(self._groups) > self.cached_groups:
                self._groups.popitem(last=False)
        else:
            self._groups.move_to_end(key)
        images = values[row - start]
        index = int(ref["index"])
        if not isinstance(images, list) or index >= len(images):
            raise DataError(f"{describe_ref(ref)}: the row has no such image")
        value = images[index]
        if "frame" in ref:  # a frame of a video: a list of frames
            frame = int(ref["frame"])
            if not isinstance(value, list) or frame >= len(value):
                raise DataError(f"{describe_ref(ref)}: the row has no such frame")
            value = value[frame]
        if isinstance(value, dict):
            value = value.get("bytes")
        if not isinstance(value, bytes):
            raise DataError(f"{describe_ref(ref)}: the row holds no image bytes there")
        return value
