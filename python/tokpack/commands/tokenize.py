"""``tokpack tokenize``: chat / instruction / text files to Parquet token shards with loss
masks (calls :func:`tokpack.tokenize_files`)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any, Dict, List

from ..errors import ConfigError
from ..tokenize import options
from ..tokenize.writer import DEFAULT_SHARD_ROWS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_inputs_and_output(parser, "JSONL, .jsonl.gz or Parquet", "TOKENS_DIR")
    add_tokenizer_arguments(parser, required=True)
    options.add_arguments(parser, shared=False)
    parser.add_argument("--shard-rows", type=int, default=DEFAULT_SHARD_ROWS, metavar="N")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="worker processes (default: TOKPACK_NUM_THREADS or all cores); 1: one process. "
        "The output is the same for every N",
    )
    add_ray_argument(parser, "render and encode on a Ray cluster (the same output)")
    parser.add_argument(
        "--vision",
        metavar="MODEL_DIR",
        help="image chats of Qwen2-VL, Qwen2.5-VL or Qwen3-VL: image parts become the vision "
        "tokens MODEL_DIR/preprocessor_config.json gives (tokpack.multimodal.tokenize_files)",
    )
    parser.add_argument(
        "--family",
        default="auto",
        choices=["auto", "qwen2-vl", "qwen2.5-vl", "qwen3-vl"],
        help="with --vision: the model family (default: the processor_class of "
        "MODEL_DIR/preprocessor_config.json, else qwen2-vl)",
    )
    parser.add_argument(
        "--video-fps",
        type=float,
        default=None,
        metavar="FPS",
        help="with --vision: the frame rate of the videos' frame lists (Qwen2.5-VL's time step, "
        "Qwen3-VL's timestamps; default 24, as transformers assumes for frames without metadata)",
    )
    parser.add_argument(
        "--image-root",
        metavar="DIR",
        help="with --vision: relative image paths are relative to DIR (default: the input "
        "file's directory)",
    )


def add_ray_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--ray [ADDRESS]`` of ``tokenize`` and ``pack``."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help=f"{what}: no ADDRESS starts a new local cluster; 'auto' joins the running one "
        "(ray start, RAY_ADDRESS), HOST:PORT or ray://HOST:PORT that one",
    )


def add_inputs_and_output(parser: argparse.ArgumentParser, inputs: str, output: str) -> None:
    """The inputs, ``-o``, ``--force`` and ``--quiet`` of the commands that write a directory."""
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help=inputs)
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar=output,
        help="new, empty, or a previous tokpack output (replaced as a whole); not inside an input",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or summary")


def add_tokenizer_arguments(parser: Any, required: bool) -> None:
    """The tokenizing options, shared by ``tokenize`` and one-step ``pack --tokenizer``."""
    parser.add_argument(
        "--tokenizer",
        required=required,
        metavar="PATH",
        help="tokenizer.json, or a directory with tokenizer.json and tokenizer_config.json"
        + ("" if required else "; the inputs are then raw JSONL / Parquet chat or text data"),
    )
    options.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.vision is not None:
        return _run_multimodal(args)
    from ..tokenize import tokenize_files

    cluster: Any = contextlib.nullcontext()
    runner = None
    if args.ray is not None:
        from ..ray._runner import RayRunner
        from ._ray import on_cluster

        cluster, runner = on_cluster(args.ray, args.quiet), RayRunner()
    with cluster:
        manifest = tokenize_files(
            args.inputs,
            args.output,
            args.tokenizer,
            options=options.from_args(args, own=True),
            threads=args.threads,
            force=args.force,
            shard_rows=args.shard_rows,
            progress=not args.quiet,
            runner=runner,
        )
    c = manifest["counts"]
    notes = [
        (c["rejected"], f"rejected (see {manifest['rejected_file']})"),
        *((c[key], f"over-long {key}") for key in ("truncated", "dropped", "split")),
        (c["untrained_samples"], "samples without trained tokens"),
    ]
    extra = [f"{n:,} {what}" for n, what in notes if n]
    made = f"{c['samples_out']:,} samples"
    if manifest.get("sample_kind") == "tree":  # (rows: sequences, grouped by record)
        made = f"{c['samples_out']:,} sequences of {c['samples_in']:,} records (tree kind)"
    body = (
        f"{made} in {len(manifest['shards'])} shard(s), "
        f"{c['tokens']:,} tokens, {c['trained_share']:.1%} trained; template "
        f"{manifest['template']['source']}"
    )
    return _summary(args, manifest, c["samples_out"], body, extra)


def _summary(
    args: argparse.Namespace, manifest: Dict[str, Any], samples: int, body: str, extra: List[str]
) -> int:
    """The run's summary (none with --quiet): up to date, or what it wrote and its notes."""
    if args.quiet:
        return 0
    if manifest.get("cache_hit"):
        print(f"{args.output}: up to date ({samples:,} samples); --force to rebuild")
        return 0
    print(f"{args.output}: {body}")
    if extra:
        print("  " + "; ".join(extra))
    return 0


def _run_multimodal(args: argparse.Namespace) -> int:
    from ..multimodal import tokenize_files

    refused = [
        flag
        for flag, given in (
            ("--format", args.format not in ("auto", "messages")),
            ("--carry", bool(args.carry)),
            ("--ray", args.ray is not None),
            ("--encoder", args.encoder != "auto"),
            ("--add-eos/--no-add-eos", args.add_eos is not None),
            ("--threads", args.threads is not None),
        )
        if given
    ]
    if refused:
        raise ConfigError(f"--vision does not take {', '.join(refused)}")
    columns = options.column_pairs(args.column) or {}
    unknown = sorted(set(columns) - {"messages", "images", "videos"})
    if unknown:
        raise ConfigError(f"--vision reads the fields messages, images and videos; not {unknown}")
    # The flags tokpack.multimodal.tokenize_files takes as they are, and the --column ones.
    names = (
        "vision chat_template train_on max_len overlong video_fps image_root family skip_invalid"
        " shard_rows force"
    )
    given = {name: getattr(args, name) for name in names.split()}
    given.update({f"{field}_column": name for field, name in columns.items()})
    manifest = tokenize_files(args.inputs, args.output, args.tokenizer, **given)
    c = manifest["counts"]
    extra = [f"{c[k]:,} {k.replace('_', ' ')}" for k in ("rejected", "truncated", "split") if c[k]]
    if c["dropped_overlong"]:
        extra.append(f"{c['dropped_overlong']:,} over-long dropped")
    body = (
        f"{c['samples']:,} samples with {c['images']:,} images"
        + (f" and {c['videos']:,} videos" if c["videos"] else "")
        + " in"
        f" {len(manifest['shards'])} shard(s), {c['tokens']:,} tokens of which"
        f" {c['vision_tokens']:,} vision tokens"
    )
    return _summary(args, manifest, c["samples"], body, extra)
