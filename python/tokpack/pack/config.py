"""``tokpack.PackConfig``: the pack options (plan, columns, pair layout, carried columns, shard
layout), one frozen value checked once, in Rust, when made. Every entry point builds one from
``config=`` or from the config's fields given as keywords (exactly one of the two), and the CLI's
pack flags are made from its ``FIELDS`` (choices, defaults and help in one place).

>>> c = PackConfig(2048, strategy="ffd")
>>> c.strategy, c.replace(seed=3).seed, PackConfig.from_dict(c.to_dict()) == c
('ffd', 3, True)
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, Mapping, Optional

from .._tokpack import PackConfig, PackReport
from ..errors import ConfigError

__all__ = [
    "PackConfig",
    "PackReport",
    "pack_config",
    "refuse_unsupported",
    "add_arguments",
    "from_args",
]


def pack_config(
    max_len: Any = None, config: Optional[PackConfig] = None, fields: Mapping[str, Any] = {}
) -> PackConfig:
    """``config``, or a PackConfig of ``max_len`` and ``fields``; never both."""
    fields = {k: v for k, v in fields.items() if v is not None or k.endswith("_column")}
    if config is None:
        return PackConfig(max_len, **fields)
    if max_len is not None or fields:
        given = ", ".join(([] if max_len is None else ["max_len"]) + sorted(fields))
        raise ConfigError(f"pass config= or its fields ({given}), not both")
    if not isinstance(config, PackConfig):
        raise ConfigError(f"config must be a tokpack.PackConfig, got {type(config).__name__}")
    return config


def refuse_unsupported(
    config: PackConfig, path: str, why: Mapping[str, str], **run_args: Any
) -> None:
    """The one check of what ``path`` does not support: a ConfigError naming the first of
    ``run_args`` given (not None), else the first field of ``config`` in ``why`` set to other
    than its default; ``why[name]`` says why."""
    given, default = config.to_dict(), PackConfig(config.max_len).to_dict()
    names = [name for name, value in run_args.items() if value is not None]
    names += [name for name in why if given.get(name) != default.get(name)]
    if names:
        name = names[0]
        raise ConfigError(f"{name} ({_flag(name)}) is not supported with {path}: {why[name]}")


# Integer fields whose default is None (unset), so their type is not read off the default.
_OPTIONAL_INTS = ("max_segments_per_row", "tree_max_path")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, max_len_default: int = 4096) -> None:
    """The CLI flags of every PackConfig field: ``--max-len``, ``--strategy``, ..."""
    for name, default, choices, help_text in PackConfig.FIELDS:
        kw: Dict[str, Any] = {"help": help_text}
        if name == "max_len":
            default = max_len_default
        if name == "carry":
            kw.update(nargs="+", metavar="COLUMN")
        elif choices:
            kw["choices"] = choices
        elif isinstance(default, int) or name in _OPTIONAL_INTS:
            kw["type"] = int
        if default is not None and default != ():
            kw["help"] += f" (default {default})"
        parser.add_argument(_flag(name), default=None if name == "carry" else default, **kw)


def from_args(args: argparse.Namespace) -> PackConfig:
    """The PackConfig of the flags :func:`add_arguments` made."""
    names = [f[0] for f in PackConfig.FIELDS if f[0] != "max_len"]
    return PackConfig(args.max_len, **{name: getattr(args, name) for name in names})
