"""``tokpack check-model``: whether an architecture trains exactly on packed batches here.

Builds a tiny random model of the ``config.json``'s architecture (``tokpack.torch.tiny``: no
weights, shrunk dimensions) and prints, per collator format, the verdict on this machine:
exact (measured by ``check_packing``), or refused with the fix.
"""

from __future__ import annotations

import argparse
import json
import os

from ..errors import ConfigError, DataError, InputNotFoundError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", metavar="CONFIG_OR_DIR", help="a model's config.json, or its directory"
    )
    parser.add_argument(
        "--attn-implementation",
        default=None,
        help="the attention implementation to build with (default: the config's, else"
        " transformers' default)",
    )


def _read_config(path: str):
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise InputNotFoundError(f"{file}: no such config file")
    try:
        with open(file, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError) as exc:
        raise DataError(f"{file}: not a JSON config ({exc})") from None
    if not isinstance(values, dict) or not isinstance(values.get("model_type"), str):
        raise DataError(f"{file}: a model config needs a model_type string")
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ConfigError("check-model needs transformers: pip install transformers") from None
    model_type = values.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **values)
    except ValueError as exc:
        raise ConfigError(
            f"{file}: model_type {model_type!r} is unknown to transformers ({exc})"
        ) from None


def run(args: argparse.Namespace) -> int:
    import warnings

    from ..errors import PackingError
    from ..torch import PackedCollator, check_packing, packing_support
    from ..torch.models import MODEL_FORMATS
    from ..torch.tiny import tiny_model

    config = _read_config(args.config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny_model(config, attn_implementation=args.attn_implementation)
    default = packing_support(model)
    print(
        f"{config.model_type} ({type(model).__name__}), attention"
        f" {default.attn_implementation}, layers {', '.join(default.layer_kinds)};"
        f" tiny random model, float64, CPU"
        + ("" if default.verified else "; family not verified by tokpack")
    )
    for fmt in MODEL_FORMATS:
        support = packing_support(model, fmt)
        name = f"{fmt} (default)" if fmt == default.format else fmt
        if not support.exact:
            print(f"  {name:<20} refused: {support.fix}")
            continue
        if fmt == "per_sample":
            print(f"  {name:<20} exact: each sample alone in its row")
            continue
        collator = PackedCollator.for_model(model, fmt, check=False)
        try:
            report = check_packing(model, collator, fix=support.check_fix())
        except PackingError as exc:
            print(f"  {name:<20} MIXES SAMPLES: {exc}")
            continue
        worst = max(report.errors.values(), default=0.0)
        fields = ", ".join(support.fields)
        print(f"  {name:<20} exact (max error {worst:.1e}; reads {fields})")
    return 0
