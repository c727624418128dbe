"""``TokenizeOptions``: the one list of tokenizing options, used by ``tokenize_files``,
``tokenize_to_batches`` / ``TokenStream``, ``pack_files(tokenize=...)``, the CLI's flags and
the manifests (whose recorded config is part of the cache key)."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .._checks import MAX_ROWS, check_choice, check_int
from .._contract import OVERLONG_POLICIES
from .._tokpack import PackConfig
from ..errors import ConfigError
from ..kinds import RECORD_KINDS, kind, kind_of_records
from .formats import (
    DEFAULT_COLUMNS,
    FORMATS,
    PER_COMPLETION,
    TREE,
    first_format,
    resolve_columns,
)
from .template import RENDERERS, TRAIN_ON
from .tokenizer import ENCODERS

__all__ = ["TokenizeOptions", "add_arguments", "from_args"]

# The named choices of the options, checked when made (overlong by its owner, PackConfig).
CHOICES = {"format": FORMATS, "train_on": TRAIN_ON, "encoder": ENCODERS, "renderer": RENDERERS}


@dataclass(frozen=True)
class TokenizeOptions:
    """How raw records become token samples (besides the tokenizer); checked when made.

    Attributes:
        chat_template: a Jinja file overriding the tokenizer config's template.
        format: ``"auto"`` (per record), ``"messages"``, ``"sharegpt"``, ``"alpaca"``,
            ``"text"``, ``"preference"``, ``"kto"`` or ``"grpo"`` (a prompt and its
            ``completions``, with optional ``rewards`` / ``advantages``: one tree-kind sample
            per completion, grouped by record) (a run is of one kind, see :meth:`for_inputs`).
        train_on: ``"assistant"`` (default), ``"last"`` or ``"all"``.
        each_turn: a chat with k trained assistant turns becomes k samples of the tree kind
            (sample j: the chat up to assistant turn j, rendered on those messages, trained
            on turn j only), grouped by chat; needs ``train_on="assistant"``.
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

    chat_template: Optional[Union[str, os.PathLike]] = None
    format: str = "auto"
    train_on: str = "assistant"
    max_len: Optional[int] = None
    overlong: str = "error"
    add_eos: Optional[bool] = None
    columns: Optional[Mapping[str, str]] = None
    skip_invalid: bool = False
    batch_size: int = 2048
    encoder: str = "auto"
    renderer: str = "auto"
    carry: Sequence[str] = ()
    each_turn: bool = False

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
        if not isinstance(self.each_turn, bool):
            raise ConfigError(f"each_turn must be True or False, got {self.each_turn!r}")

    @property
    def kind(self) -> str:
        """The kind of samples these options give (``tree`` for GRPO records and with
        ``each_turn``)."""
        return TREE if self.each_turn else kind_of_records(self.format)

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
        """These options for a run over ``inputs``: with ``format="auto"``, the preference, KTO
        or GRPO format when the first record is one (a run writes one kind of token shard, so SFT
        records then are invalid, and the other way round); otherwise unchanged."""
        if self.format != "auto":
            return self
        return self.for_first_format(first_format(inputs, self.columns or {}))

    def for_first_format(self, detected: Optional[str]) -> "TokenizeOptions":
        """:meth:`for_inputs` given the format of the run's first record (None: unknown)."""
        if self.format != "auto" or detected not in RECORD_KINDS:
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
        if not self.each_turn:
            del data["each_turn"]
        if not kind(self.kind).trees:  # (the same: the GRPO fields only in the runs that read them)
            for name in ("completions", *PER_COMPLETION):
                if data["columns"][name] == DEFAULT_COLUMNS[name]:
                    del data["columns"][name]
        return data


# The fields that are command-line flags, in the order shown: their help and argparse keywords
# (the default is the field's, the choices CHOICES'). Shared by ``tokenize`` and one-step
# ``pack --tokenizer``, but OWN: ``tokenize``'s own (pack's come from PackConfig's fields).
FLAGS: Dict[str, Tuple[Optional[str], Dict[str, Any]]] = {
    "chat_template": ("Jinja chat template (default: the tokenizer's)", {"metavar": "FILE"}),
    "format": (
        "record format (default auto: per record; preference (chosen/rejected), kto "
        "(prompt/completion/label) or grpo (prompt/completions) when the first record is one)",
        {},
    ),
    "train_on": ("tokens with labels: assistant turns (default), the last one, or all", {}),
    "add_eos": ("append EOS to every sample (default: to plain-text samples only)", {}),
    "columns": (
        f"read FIELD from column NAME (fields: {', '.join(DEFAULT_COLUMNS)})",
        {"flag": "--column", "action": "append", "metavar": "FIELD=NAME"},
    ),
    "encoder": (
        "auto (default): tokpack's Rust BPE encoder when it reproduces the tokenizer "
        "(byte-level BPE of the GPT-2, Llama 3 and Qwen2 kinds), else tokenizers; "
        "tokenizers: always tokenizers",
        {},
    ),
    "skip_invalid": (
        "write bad records to OUT_DIR/__tokpack__/_rejected.jsonl instead of failing",
        {},
    ),
    "max_len": (None, {"type": int, "metavar": "N"}),
    "overlong": ("samples longer than --max-len (default: error)", {}),
    "carry": (
        "record fields kept as columns of the token shards (for pack --carry): one bool, "
        "number or string a record",
        {"nargs": "+", "metavar": "FIELD"},
    ),
    "each_turn": (
        "one sample per assistant turn of each chat (the chat up to that turn, trained on it "
        "alone), written as tree-kind token shards grouped by chat (the history shared)",
        {},
    ),
}
OWN = ("max_len", "overlong", "carry", "each_turn")


def _flagged(shared: bool) -> List[str]:
    return [name for name in FLAGS if (name not in OWN) == shared]


def _dest(name: str) -> str:
    return FLAGS[name][1].get("flag", f"--{name}").lstrip("-").replace("-", "_")


def add_arguments(parser: Any, shared: bool = True) -> None:
    """The CLI flags of the option fields, from their defaults, FLAGS' help and CHOICES: the ones
    ``tokenize`` and one-step ``pack --tokenizer`` share (``--chat-template``, ``--format``,
    ...), or (``shared=False``) ``tokenize``'s own (``--max-len``, ``--overlong``, ``--carry``)."""
    defaults = {f.name: f.default for f in fields(TokenizeOptions)}
    choices = {**CHOICES, "overlong": OVERLONG_POLICIES}
    for name in _flagged(shared):
        help_text, kw = FLAGS[name][0], dict(FLAGS[name][1])
        flag = kw.pop("flag", "--" + name.replace("_", "-"))
        kw.update(help=help_text, default=[] if kw.get("action") == "append" else defaults[name])
        if name in choices:
            kw["choices"] = choices[name]
        if defaults[name] is False:
            kw["action"] = "store_true"
        if name == "add_eos":  # --add-eos / --no-add-eos, unset: None
            pair = parser.add_mutually_exclusive_group()
            pair.add_argument(flag, dest=name, action="store_true", **kw)
            pair.add_argument("--no-add-eos", dest=name, action="store_false")
            continue
        parser.add_argument(flag, **kw)


def from_args(args: argparse.Namespace, own: bool = False, **values: Any) -> TokenizeOptions:
    """The TokenizeOptions of the flags :func:`add_arguments` made: the shared ones, with
    ``own`` ``tokenize``'s own too, and ``values``."""
    names = _flagged(True) + (_flagged(False) if own else [])
    given = {name: getattr(args, _dest(name)) for name in names}
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
