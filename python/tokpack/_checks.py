"""The checkers of arguments every area uses, on the ground floor (below every user): the
numeric ranges (``MAX_*``), ``check_int``, ``checked_threads`` and ``check_choice``, each with
one wording (the core's, for the choices)."""

from __future__ import annotations

import json
from typing import Any, Collection, Optional, TypeVar

from . import _tokpack
from .errors import ConfigError

# Ranges of the numeric arguments. max_len: the core's row capacity (int32 token offsets);
# row counts: a row group of row_group_rows * max_len tokens must fit in int32 anyway.
MAX_LEN = _tokpack.MAX_LEN
MAX_ROWS = _tokpack.MAX_ROWS
MAX_SEED = 2**64 - 1
MAX_THREADS = _tokpack.MAX_THREADS

# ``value`` as an int in ``lo..=hi``, else a ConfigError naming the argument and its range
# (never an OverflowError later, in numpy or Rust): the one checker of numeric arguments.
check_int = _tokpack.check_int

T = TypeVar("T")


def checked_threads(threads: Any) -> Optional[int]:
    """``None`` (``TOKPACK_NUM_THREADS``, else all cores) or 1..MAX_THREADS."""
    return None if threads is None else check_int(threads, "threads", 1, MAX_THREADS)


def _shown(value: Any) -> str:
    # As the core shows a name (Rust's `{:?}` of a str): in double quotes.
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


def check_choice(name: str, value: T, choices: Collection[Any]) -> T:
    """``value`` when it is one of ``choices``, else a ConfigError in the core's wording:
    ``unknown NAME "VALUE"; expected one of "A", "B"`` (the one message of an unknown choice).

    >>> check_choice("tail", "drop", ("drop", "pad"))
    'drop'
    >>> check_choice("tail", "keep", ("drop", "pad"))
    Traceback (most recent call last):
    ...
    tokpack.errors.ConfigError: unknown tail "keep"; expected one of "drop", "pad"
    """
    try:
        known = value in choices
    except TypeError:  # an unhashable value is no name
        known = False
    if not known:
        listed = ", ".join(_shown(choice) for choice in choices)
        raise ConfigError(f"unknown {name} {_shown(value)}; expected one of {listed}")
    return value
