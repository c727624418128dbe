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
from typing import Any, Dict, Optional, Sequence, Union

import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._inputs import resolve_inputs
from ..errors import ConfigError, SchemaError
from .tokenize import MEDIA_COLUMNS

__all__ = ["pack_files", "check_cuts"]

_TOKEN_SUFFIXES = (".parquet", ".pq")


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


def pack_files(
    inputs: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
    output_dir: Union[str, os.PathLike],
    max_len: int,
    *,
    overlong: str = "error",
    carry: Optional[Sequence[str]] = None,
    **options: Any,
) -> Dict[str, Any]:
    """:func:`tokpack.pack_files` for multimodal token shards (:func:`tokenize_files`'s
    output): the same options and output, plus the carried ``media``, ``vision_tokens`` and
    ``vision_patches`` columns, after :func:`check_cuts`."""
    from .._outdir import output_target
    from ..files import pack_files as pack_token_files

    files = resolve_inputs(inputs, _TOKEN_SUFFIXES, output_dir=output_target(output_dir))
    check_cuts(files, max_len, overlong)
    return pack_token_files(
        files,
        output_dir,
        max_len,
        overlong=overlong,
        carry=[*MEDIA_COLUMNS, *(carry or ())],
        **options,
    )
