"""``TokenizeOptions``: the one list of tokenizing options, used by ``tokenize_files``,
``tokenize_to_batches`` / ``TokenStream``, ``pack_files(tokenize=...)``, the CLI's flags and
the manifests (whose recorded config is part of the cache key)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from ..errors import ConfigError
from ..kinds import prompted
from ..pack.config import PackConfig
from ..pack.plan import MAX_ROWS, check_int
from .formats import FORMATS, first_format, resolve_columns
from .template import RENDERERS, TRAIN_ON
from .tokenizer import ENCODERS

__all__ = ["TokenizeOptions"]


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

    def __post_init__(self) -> None:
        for name, allowed in (
            ("format", FORMATS),
            ("train_on", TRAIN_ON),
            ("encoder", ENCODERS),
            ("renderer", RENDERERS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"unknown {name} {value!r}; choose among {', '.join(allowed)}")
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
        if self.format != "auto" or detected is None or not prompted(detected):
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
