"""Loading a Hugging Face tokenizer from local files only: ``tokenizer.json`` (a file, or a
directory holding it) and, next to it, ``tokenizer_config.json`` for the chat template and the
special tokens the template sees. Nothing here ever reaches for a model hub."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from .. import _tokpack
from .._io.inputs import input_error
from .._io.outdir import fingerprint_file
from ..errors import ConfigError, InputNotFoundError

__all__ = ["LoadedTokenizer", "load_tokenizer", "SPECIAL_TOKEN_KEYS", "ENCODERS"]

# "auto": tokpack's encoder when it reproduces the tokenizer; "tokenizers": always theirs.
ENCODERS = ("auto", "tokenizers")

# The tokenizer_config keys transformers passes to chat templates (its special_tokens_map).
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclass
class LoadedTokenizer:
    """A ``tokenizers.Tokenizer`` with what its config says about chat rendering."""

    tokenizer: Any
    path: Path
    config_path: Optional[Path]
    chat_template: Optional[Union[str, Dict[str, str]]]
    special_tokens: Dict[str, str]
    # Strings of the tokenizer's special added tokens, longest first (end-of-turn detection).
    special_token_strings: Tuple[str, ...]
    fingerprint: Dict[str, str] = field(default_factory=dict)
    # tokpack's own byte-level BPE encoder (same ids, several times faster), or None with the
    # reason it does not reproduce this tokenizer (then ``tokenizers`` encodes).
    fast: Any = None
    fast_unsupported: Optional[str] = None

    @property
    def eos_token(self) -> Optional[str]:
        return self.special_tokens.get("eos_token")

    def eos_id(self) -> Optional[int]:
        eos = self.eos_token
        return None if eos is None else self.tokenizer.token_to_id(eos)


def _token_text(value: Any) -> Optional[str]:
    """A special token as written in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def read_json_object(path: Path) -> Dict[str, Any]:
    """The object a JSON file holds (a model's config files)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path}: invalid JSON ({exc})") from None
    except OSError as exc:
        raise input_error(path, exc) from None
    if not isinstance(found, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return found


def _chat_template(config: Dict[str, Any], path: Path) -> Optional[Union[str, Dict[str, str]]]:
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    # Named templates are stored as a list of {"name", "template"} objects.
    if isinstance(template, list):
        if not all(
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("template"), str)
            for item in template
        ):
            raise ConfigError(f"{path}: 'chat_template' list items need 'name' and 'template'")
        return {item["name"]: item["template"] for item in template}
    if isinstance(template, dict) and all(isinstance(v, str) for v in template.values()):
        return dict(template)
    raise ConfigError(f"{path}: 'chat_template' must be a string or a list of named templates")


def load_tokenizer(path: Union[str, os.PathLike]) -> LoadedTokenizer:
    """Loads ``tokenizer.json`` (``path`` is the file or its directory) and the
    ``tokenizer_config.json`` beside it when there is one."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(
            "tokenizing needs the 'tokenizers' package: pip install 'tokpack[tokenize]'"
        ) from None
    path = Path(path)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise InputNotFoundError(f"{path}: directory has no tokenizer.json")
    elif path.is_file():
        file = path
    else:
        raise InputNotFoundError(f"{path}: no such tokenizer file or directory")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ConfigError(f"{file}: not a valid tokenizer.json ({exc})") from None

    try:
        fast, fast_unsupported = _tokpack.BpeEncoder.load(file.read_text(encoding="utf-8"))
    except ConfigError as exc:  # valid for tokenizers (it loaded) but not for us
        fast, fast_unsupported = None, str(exc)
    config_path = file.parent / "tokenizer_config.json"
    config = read_json_object(config_path) if config_path.is_file() else {}
    texts = {key: _token_text(config.get(key)) for key in SPECIAL_TOKEN_KEYS}
    specials = {key: text for key, text in texts.items() if text is not None}
    added = tokenizer.get_added_tokens_decoder().values()
    special_strings = sorted({t.content for t in added if t.special}, key=len, reverse=True)
    fingerprint = {"tokenizer.json": fingerprint_file(file)}
    if config:
        fingerprint["tokenizer_config.json"] = fingerprint_file(config_path)
    return LoadedTokenizer(
        tokenizer=tokenizer,
        path=file,
        config_path=config_path if config else None,
        chat_template=_chat_template(config, config_path),
        special_tokens=specials,
        special_token_strings=tuple(special_strings),
        fingerprint=fingerprint,
        fast=fast,
        fast_unsupported=fast_unsupported,
    )
