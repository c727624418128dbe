"""``MultimodalCollator``: packed multimodal rows in, a Qwen2-VL / Qwen2.5-VL / Qwen3-VL
training batch out.

The text fields are :class:`tokpack.torch.PackedCollator`'s ``hf`` format (``input_ids`` and
``labels`` ``[1, T]``, ``cu_seq_lens_q/k``, ``max_length_q/k``, counts). ``position_ids`` become
``[4, 1, T]``: the text positions (restarting per segment, from which transformers builds the
block-diagonal mask) then the three mRoPE rows, computed per segment by
:func:`tokpack.multimodal.positions.packed_positions`. The images of the batch, in row and
token order, are read back from their references (hash checked), decoded and run through the
model's image processor: ``pixel_values`` and ``image_grid_thw`` (checked against the grids
the samples were tokenized for). The videos (frame lists) likewise through the model's video
processor: ``pixel_values_videos`` and ``video_grid_thw``. Runs in DataLoader workers (CPU
only).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np
import torch

from ..errors import ConfigError, DataError
from ..multimodal.media import MediaReader, describe_ref
from ..multimodal.positions import packed_positions
from ..multimodal.vision import VisionRules
from ._transport import ship
from .collate import PackedCollator

__all__ = ["MultimodalCollator"]


class MultimodalCollator:
    """Collate packed rows carrying ``media`` (a packed directory of multimodal token shards).

    Args:
        image_processor: the model's image processor (a transformers ``Qwen2VLImageProcessor``
            or a processor holding one): called as ``image_processor(images=[PIL images],
            return_tensors="pt")``.
        video_processor: the model's video processor (transformers' ``Qwen2VLVideoProcessor``;
            default: the one ``image_processor`` holds, if it is a processor), for samples with
            videos: called as ``video_processor(videos=[[PIL frames], ...],
            do_sample_frames=False, return_tensors="pt")``, giving ``pixel_values_videos`` and
            ``video_grid_thw``.
        mrope_rows: 4 (default) puts the text positions first (transformers then isolates the
            segments with SDPA / eager attention); 3 gives the mRoPE rows only, for backends
            that read ``cu_seq_lens_*`` instead.
        return_loss_weights, return_seq_idx: as :class:`tokpack.torch.PackedCollator`.
    """

    #: As :attr:`tokpack.torch.PackedCollator.reads_rows_only`: rows are only read.
    reads_rows_only = True

    def __init__(
        self,
        image_processor: Any,
        *,
        video_processor: Any = None,
        mrope_rows: int = 4,
        return_loss_weights: bool = False,
        return_seq_idx: bool = False,
    ) -> None:
        if mrope_rows not in (3, 4):
            raise ConfigError(f"mrope_rows must be 3 or 4, got {mrope_rows!r}")
        if video_processor is None:
            video_processor = getattr(image_processor, "video_processor", None)
        self.image_processor = getattr(image_processor, "image_processor", image_processor)
        self.video_processor = video_processor
        self.rules = VisionRules.from_processor(self.image_processor)
        self.mrope_rows = mrope_rows
        self.text = PackedCollator(
            "hf", return_loss_weights=return_loss_weights, return_seq_idx=return_seq_idx
        )
        self.reader = MediaReader()

    def reads_columns(self, columns: Sequence[str]) -> Tuple[str, ...]:
        """As :meth:`tokpack.torch.PackedCollator.reads_columns`."""
        return self.text.reads_columns(columns)

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        return ship(self.collate(rows))

    def collate(self, rows: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        batch = self.text.collate(rows)
        media_per_segment: List[List[Dict[str, Any]]] = []
        lengths: List[int] = []
        for i, row in enumerate(rows):
            media = row.get("media")
            seq = row["seq_lengths"]
            seq = seq.tolist() if hasattr(seq, "tolist") else list(seq)
            if media is None or len(media) != len(seq):
                raise DataError(
                    f"row {i}: no 'media' column with one entry per segment (a packed directory"
                    " of multimodal token shards, packed with tokpack.multimodal.pack_files)"
                )
            lengths.extend(int(n) for n in seq)
            for j, (entry, n) in enumerate(zip(media, seq)):
                try:
                    items = json.loads(entry)
                except (TypeError, ValueError) as exc:
                    raise DataError(f"row {i}, segment {j}: 'media' is not JSON ({exc})") from None
                # A segment's images are its own (pack cuts samples at safe boundaries, each
                # piece carrying its images); an image past its end is dropped, one cut inside
                # is refused (a row tokpack did not pack).
                for k, m in enumerate(items):
                    start, count = m["span"]
                    if start - 1 < int(n) <= start + count:
                        raise DataError(
                            f"row {i}, segment {j}: the sample was cut inside its image {k}"
                            f" ({describe_ref(m.get('ref') or m['frames'][0]['ref'])});"
                            " pack multimodal token shards with tokpack.pack_files, which"
                            " never cuts inside an image or a video"
                        )
                media_per_segment.append([m for m in items if m["span"][0] + m["span"][1] < int(n)])
        positions = packed_positions(lengths, media_per_segment, self.rules.merge_size)
        if self.mrope_rows == 3:
            positions = positions[1:]
        batch["position_ids"] = torch.from_numpy(np.ascontiguousarray(positions))[:, None, :]
        batch.pop("media", None)
        items = [m for segment in media_per_segment for m in segment]
        images = [m for m in items if m.get("type", "image") == "image"]
        videos = [m for m in items if m.get("type") == "video"]
        if images:
            pil = [self.reader.image(m["ref"], m.get("hash")) for m in images]
            out = self.image_processor(images=pil, return_tensors="pt")
            batch["pixel_values"] = out["pixel_values"]
            batch["image_grid_thw"] = _checked_grids(out["image_grid_thw"], images, "image")
        if videos:
            if self.video_processor is None:
                raise ConfigError(
                    f"{describe_ref(videos[0]['frames'][0]['ref'])}: the batch holds videos;"
                    " give MultimodalCollator the model's video_processor"
                )
            clips = [
                [self.reader.image(f["ref"], f.get("hash")) for f in m["frames"]] for m in videos
            ]
            # Every frame of a frame list is used (no sampling), as at tokenize time.
            out = self.video_processor(videos=clips, do_sample_frames=False, return_tensors="pt")
            batch["pixel_values_videos"] = out["pixel_values_videos"]
            batch["video_grid_thw"] = _checked_grids(out["video_grid_thw"], videos, "video")
        return batch


def _checked_grids(grids: Any, items: List[Dict[str, Any]], media_type: str) -> Any:
    """The processor's grids, refused (``DataError`` naming the file) where one differs from
    the grid the sample was tokenized for."""
    expected = torch.tensor([m["grid"] for m in items], dtype=grids.dtype)
    if not torch.equal(grids, expected):
        bad = int((grids != expected).any(dim=1).nonzero()[0])
        ref = items[bad]["ref"] if media_type == "image" else items[bad]["frames"][0]["ref"]
        raise DataError(
            f"{describe_ref(ref)}: the {media_type} processor gives grid {grids[bad].tolist()}, the"
            f" sample was tokenized for {items[bad]['grid']}: tokenize with this processor's"
            " settings"
        )
    return grids
