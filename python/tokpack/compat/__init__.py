"""Drop-in replacements for the functions of the token-packing guide users already call:
``pack_sequences`` and ``concatenate_and_pack`` (``packing``), ``streaming_dataset_reader``
(``streaming``), with the same names, arguments and outputs."""

from .packing import concatenate_and_pack, pack_sequences
from .streaming import streaming_dataset_reader

__all__ = ["concatenate_and_pack", "pack_sequences", "streaming_dataset_reader"]
