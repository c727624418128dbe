"""``tokpack export``: a packed directory to Megatron-LM's indexed dataset (``megatron``) or
to Megatron-Bridge / NeMo packed-sequence Parquet (``nemo``)."""

from __future__ import annotations

import argparse

from ..packed.export import DOCUMENT_MODES, MEGATRON_DTYPES, export_megatron, export_nemo_packed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="format", metavar="FORMAT", required=True)
    mega = sub.add_parser(
        "megatron",
        help="PREFIX.bin + PREFIX.idx, Megatron-LM's indexed dataset (one sequence per sample)",
    )
    mega.add_argument("packed", metavar="OUT_DIR", help="a directory written by tokpack pack")
    mega.add_argument("prefix", metavar="PREFIX", help="writes PREFIX.bin and PREFIX.idx")
    mega.add_argument(
        "--document",
        choices=DOCUMENT_MODES,
        default="sample",
        help="one Megatron document per sample (default) or per packed row",
    )
    mega.add_argument(
        "--dtype",
        choices=list(MEGATRON_DTYPES),
        default=None,
        help="token dtype (default: uint16 when every id < 65,499, as Megatron, else int32)",
    )
    mega.add_argument("--force", action="store_true", help="replace existing PREFIX.bin/.idx")
    nemo = sub.add_parser(
        "nemo", help="one packed-sequence Parquet file (input_ids, loss_mask, seq_start_id)"
    )
    nemo.add_argument("packed", metavar="OUT_DIR", help="a directory written by tokpack pack")
    nemo.add_argument("dest", metavar="DEST", help="the Parquet file to write (NAME.idx.parquet)")
    nemo.add_argument("--force", action="store_true", help="replace an existing DEST")


def run(args: argparse.Namespace) -> int:
    if args.format == "megatron":
        f = export_megatron(
            args.packed, args.prefix, document=args.document, dtype=args.dtype, force=args.force
        )
        print(
            f"{f['bin']}, {f['idx']}: {f['sequences']:,} sequences, {f['documents']:,} "
            f"documents, {f['tokens']:,} tokens ({f['dtype']})"
        )
    else:
        f = export_nemo_packed(args.packed, args.dest, force=args.force)
        print(
            f"{f['file']}: {f['rows']:,} rows, {f['sequences']:,} sequences, {f['tokens']:,} "
            f"tokens ({f['loss_tokens']:,} trained on)"
        )
    return 0
