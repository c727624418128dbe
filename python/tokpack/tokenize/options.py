"""``TokenizeOptions``: the one list of tokenizing options, used by ``tokenize_files``,
``tokenize_to_batches`` / ``TokenStream``, ``pack_files(tokenize=...)``, the CLI's flags and
the manifests (whose recorded config is part of the cache key)."""

from __future__ import annotations

import argparse
import os
from dataclasses import Field, asdict, dataclass, field, fields, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from .._checks import MAX_ROWS, check_choice, check_int
from .._contract import OVERLONG_POLICIES
from .._tokpack import PackConfig
from ..errors import ConfigError
from .formats import DEFAULT_COLUMNS, FORMATS, first_format, resolve_columns
from .schema import kind_of_format
from .template import RENDERERS, TRAIN_ON
from .tokenizer import ENCODERS

__all__ = ["TokenizeOptions", "add_arguments", "from_args"]

# The named choices of the options, checked when made (overlong by its owner, PackConfig).
CHOICES = {"format": FORMATS, "train_on": TRAIN_ON, "encoder": ENCODERS, "renderer": RENDERERS}


def _flag(default: Any, help: Optional[str], shared: bool = True, **argparse_kw: Any) -> Any:
    """A field that is also a command-line flag (``--name``, or ``flag``), with its help and
    argparse keywords: ``shared`` by ``tokenize`` and one-step ``pack --tokenizer``, or
    ``tokenize``'s own (pack has its own ``--max-len``, ``--overlong`` and ``--carry``)."""
    return field(default=default, metadata={"help": help, "shared": shared, "cli": argparse_kw})


@dataclass(frozen=True)
class TokenizeOptions:
    """How raw records become token samples (besides the tokenizer); checked when made.

    Attributes:
        chat_template: a Jinja file overriding the tokenizer config's template.
        format: ``"auto"`` (per record), ``"messages"``, ``"sharegpt"``, ``"alpaca"``,
            ``"text"``, ``"preference"`` or ``"kto"`` (a run is of one kind, see
            :meth:`for_inputs`).
        train_on: ``"assistant"`` (default), ``"last"`` or ``"all"``.
        max_len, overlong: over-long samples follow the packer's policies (``"error"``,
            ``"truncate"``, ``"drop"``, ``"split"``).
        add_eos: append the EOS token (None: to plain-text samples only; preference and KTO
            records follow TRL: the EOS text ends each string completion unless this is False,
            conversations end as their template renders them).
        columns: column-name overrides, e.g. ``{"messages": "chat"}`` (held resolved: every
            field with its column).
        skip_invalid: reject bad records (to the stream's ``on_reject``) instead of raising
            :class:`tokpack.InvalidRecordError`.
        batch_size: records per batch (batch boundaries depend on the input only).
        encoder: ``"auto"`` (default): tokpack's Rust byte-level BPE encoder when it reproduces
            the tokenizer exactly (byte-level BPE of the GPT-2, Llama 3 and Qwen2 kinds),
            otherwise ``tokenizers``; ``"tokenizers"``: always ``tokenizers``. Same ids either
            way.
        renderer: ``"auto"`` (default): chat templates render in Rust when that renderer
            passes the parity probe (see :mod:`tokpack.tokenize.template`), otherwise with
            Jinja in Python; ``"python"``: always Jinja. Same texts either way, so the choice is
            not part of the recorded config (the manifest's ``renderer`` says which ran).
        carry: fields of each record kept as columns of its samples (``pack --carry`` then
            carries them into the packed rows): one bool, integer, float or string a record,
            of one type in a run; a record without one is invalid.
    """

    chat_template: Optional[Union[str, os.PathLike]] = _flag(
        None, "Jinja chat template (default: the tokenizer's)", metavar="FILE"
    )
    format: str = _flag(
        "auto",
        "record format (default auto: per record; preference (chosen/rejected) or kto "
        "(prompt/completion/label) when the first record is one)",
    )
    train_on: str = _flag(
        "assistant", "tokens with labels: assistant turns (default), the last one, or all"
    )
    max_len: Optional[int] = _flag(None, None, shared=False, type=int, metavar="N")
    overlong: str = _flag("error", "samples longer than --max-len (default: error)", shared=False)
    add_eos: Optional[bool] = _flag(
        None, "append EOS to every sample (default: to plain-text samples only)"
    )
    columns: Optional[Mapping[str, str]] = _flag(
        None,
        f"read FIELD from column NAME (fields: {', '.join(DEFAULT_COLUMNS)})",
        flag="--column",
        action="append",
        metavar="FIELD=NAME",
    )
    skip_invalid: bool = _flag(
        False, "write bad records to OUT_DIR/__tokpack__/_rejected.jsonl instead of failing"
    )
    batch_size: int = 2048
    encoder: str = _flag(
        "auto",
        "auto (default): tokpack's Rust BPE encoder when it reproduces the tokenizer "
        "(byte-level BPE of the GPT-2, Llama 3 and Qwen2 kinds), else tokenizers; "
        "tokenizers: always tokenizers",
    )
    renderer: str = "auto"
    carry: Sequence[str] = _flag(
        (),
        "record fields kept as columns of the token shards (for pack --carry): one bool, "
        "number or string a record",
        shared=False,
        nargs="+",
        metavar="FIELD",
    )

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            check_choice(name, getattr(self, name), allowed)
        # max_len and overlong are pack options: checked by their owner.
        packing = PackConfig(1 if self.max_len is None else self.max_len, overlong=self.overlong)
        if self.max_len is not None:
            object.__setattr__(self, "max_len", packing.max_len)
        object.__setattr__(
            self, "batch_size", check_int(self.batch_size, "batch_size", 1, MAX_ROWS)
        )
        object.__setattr__(self, "columns", resolve_columns(self.columns))
        if isinstance(self.carry, (str, bytes)) or not all(
            isinstance(c, str) and c for c in self.carry
        ):
            raise ConfigError(f"carry must be a list of field names, got {self.carry!r}")
        object.__setattr__(self, "carry", tuple(dict.fromkeys(self.carry)))

    @classmethod
    def of(
        cls, options: Union[None, "TokenizeOptions", Mapping[str, Any]] = None, **overrides: Any
    ) -> "TokenizeOptions":
        """``options`` (TokenizeOptions, a dict of its fields, or None: the defaults) with
        ``overrides``."""
        if isinstance(options, TokenizeOptions):
            return replace(options, **overrides)
        return cls(**{**(options or {}), **overrides})

    def for_inputs(self, inputs: Sequence[Union[str, os.PathLike]]) -> "TokenizeOptions":
        """These options for a run over ``inputs``: with ``format="auto"``, the preference or
        KTO format when the first record is one (a run writes one kind of token shard, so SFT
        records then are invalid, and the other way round); otherwise unchanged."""
        if self.format != "auto":
            return self
        return self.for_first_format(first_format(inputs, self.columns or {}))

    def for_first_format(self, detected: Optional[str]) -> "TokenizeOptions":
        """:meth:`for_inputs` given the format of the run's first record (None: unknown)."""
        if self.format != "auto" or detected is None or kind_of_format(detected) == "sft":
            return self
        return replace(self, format=detected)

    def config(self) -> Dict[str, Any]:
        """The options as manifests record them (the template by its hash, elsewhere; the
        renderer not at all: it does not change the output)."""
        data = asdict(self)
        del data["chat_template"], data["renderer"]
        if self.carry:
            data["carry"] = list(self.carry)
        else:  # only where it applies: the cache keys of other outputs stay what they were
            del data["carry"]
        return data


def _flag_fields(shared: bool) -> Iterator["Field[Any]"]:
    for f in fields(TokenizeOptions):
        if "cli" in f.metadata and f.metadata["shared"] == shared:
            yield f


def _dest(f: "Field[Any]") -> str:
    return f.metadata["cli"].get("flag", f"--{f.name}").lstrip("-").replace("-", "_")


def add_arguments(parser: Any, shared: bool = True) -> None:
    """The CLI flags of the option fields, from their defaults, help and choices: the ones
    ``tokenize`` and one-step ``pack --tokenizer`` share (``--chat-template``, ``--format``,
    ...), or (``shared=False``) ``tokenize``'s own (``--max-len``, ``--overlong``, ``--carry``)."""
    choices = {**CHOICES, "overlong": OVERLONG_POLICIES}
    for f in _flag_fields(shared):
        kw = dict(f.metadata["cli"])
        flag = kw.pop("flag", "--" + f.name.replace("_", "-"))
        kw.update(help=f.metadata["help"], default=f.default)
        if f.name in choices:
            kw["choices"] = choices[f.name]
        if kw.get("action") == "append":
            kw["default"] = []
        if f.default is False:
            kw["action"] = "store_true"
        if f.type in ("Optional[bool]", Optional[bool]):  # --name / --no-name, unset: None
            pair = parser.add_mutually_exclusive_group()
            pair.add_argument(flag, dest=f.name, action="store_true", **kw)
            pair.add_argument(flag.replace("--", "--no-", 1), dest=f.name, action="store_false")
            continue
        parser.add_argument(flag, **kw)


def from_args(args: argparse.Namespace, own: bool = False, **values: Any) -> TokenizeOptions:
    """The TokenizeOptions of the flags :func:`add_arguments` made: the shared ones, with
    ``own`` ``tokenize``'s own too, and ``values``."""
    chosen = [*_flag_fields(True), *(_flag_fields(False) if own else ())]
    given = {f.name: getattr(args, _dest(f)) for f in chosen}
    given["columns"] = column_pairs(given["columns"])
    return TokenizeOptions(**given, **values)


def column_pairs(items: List[str]) -> Optional[Dict[str, str]]:
    """``--column FIELD=NAME`` items as ``{field: name}`` (None when there are none)."""
    columns = {}
    for item in items:
        key, sep, name = item.partition("=")
        if not sep:
            raise ConfigError(f"--column expects FIELD=NAME, got {item!r}")
        columns[key] = name
    return columns or None
