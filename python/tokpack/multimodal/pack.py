"""Pack multimodal token shards: :func:`tokpack.pack_files` carrying the media columns.

Vision tokens are tokens: a sample's ``length`` counts them, so they count against
``max_len``. ``media``, ``vision_tokens`` and ``vision_patches`` are carried per segment (the
packed format's carried columns). No sample is cut inside an image: before any work, every
sample longer than ``max_len`` is checked against the policy. ``truncate`` keeps the images
that end before the cut (the collator drops the others with their tokens' positions intact)
and refuses a cut inside an image; ``split`` is refused for a sample with images (its pieces
would lose their images' spans). Both refusals name the file and row: tokenize with
``max_len`` (:func:`tokpack.multimodal.tokenize_files`), which moves such cuts to a safe
boundary or drops the sample, counted.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import ConfigError, SchemaError
from .tokenize import MEDIA_COLUMNS, MULTIMODAL_KEY

__all__ = ["check_cuts", "media_config"]


def check_cuts(files: Sequence[os.PathLike], max_len: int, overlong: str) -> None:
    """Refuse (``ConfigError`` naming file and row) an over-long sample the policy would cut
    inside an image."""
    if overlong not in ("truncate", "split"):
        return
    for path in files:
        try:
            table = pq.read_table(path, columns=["length", "media"])
        except Exception as exc:
            raise SchemaError(
                f"{path}: not a multimodal token shard with 'length' and 'media' ({exc})"
            ) from None
        long_rows = pc.indices_nonzero(pc.greater(table.column("length"), max_len)).to_pylist()
        media = table.column("media")
        for row in long_rows:
            items = json.loads(media[row].as_py())
            if not items:
                continue
            if overlong == "split":
                raise ConfigError(
                    f"{path}: row {row}: a sample with images is longer than max_len {max_len};"
                    " overlong 'split' would cut its images off their spans: tokenize with"
                    f" max_len={max_len}, overlong='split' (pieces end before an image)"
                )
            for m in items:
                start, n = m["span"]
                if start - 1 < max_len <= start + n:
                    raise ConfigError(
                        f"{path}: row {row}: truncating at max_len {max_len} would cut inside"
                        f" image {items.index(m)} (tokens {start - 1}-{start + n}): tokenize"
                        f" with max_len={max_len}, overlong='truncate' (cuts before the image)"
                    )


def media_config(files: Sequence[os.PathLike], config: Any) -> Any:
    """``config`` for packing ``files``: unchanged for text token shards; for multimodal ones
    (:func:`tokenize_files`' schema metadata), the media columns carried per segment, after
    :func:`check_cuts`. Without them a packed row would hold image tokens and no images."""
    multimodal = [_is_multimodal(f) for f in files]
    if not any(multimodal):
        return config
    if not all(multimodal):
        plain = files[multimodal.index(False)]
        raise SchemaError(f"{plain}: a text token shard among multimodal ones (no media columns)")
    check_cuts(files, config.max_len, config.overlong)
    carry = [*MEDIA_COLUMNS, *(c for c in config.carry if c not in MEDIA_COLUMNS)]
    return config.replace(carry=carry)


def _is_multimodal(path: os.PathLike) -> bool:
    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet, or unreadable: the packer names the problem
        return False
    return MULTIMODAL_KEY in metadata
