"""Input files and record formats: JSONL (also ``.jsonl.gz``) and Parquet, holding OpenAI-style
``messages``, ShareGPT ``conversations``, Alpaca ``instruction``/``input``/``output`` or plain
``text`` records (SFT), TRL's preference (``prompt``/``chosen``/``rejected``) and unpaired
preference (KTO: ``prompt``/``completion``/``label``) records, or GRPO-style records (a
``prompt`` and its ``completions``, with optional per-completion ``rewards`` / ``advantages``:
samples of the tree kind, one sequence per completion).

Reading and parsing are separate so a bad record is reported with its file and line and, with
``skip_invalid``, set aside without stopping the run: every record read ends up either as one
sample or as one rejection.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from .._checks import check_choice
from .._io.inputs import input_error, is_parquet, require_file, shown_path
from ..errors import ConfigError, InvalidRecordError
from ..kinds import kind_of_records

__all__ = [
    "FORMATS",
    "DEFAULT_COLUMNS",
    "Record",
    "Sample",
    "read_records",
    "detect_format",
    "first_format",
    "parse_record",
    "resolve_columns",
    "shown_path",
]

FORMATS = ("auto", "messages", "sharegpt", "alpaca", "text", "preference", "kto", "grpo")

# The kind of samples tree-kind token shards hold (prefix trees: sequences of a group share
# prefixes): GRPO records, and chats tokenized with TokenizeOptions.each_turn.
TREE = "tree"
# A GRPO record's per-completion fields -> the per-sequence column each becomes (float64).
PER_COMPLETION = {"rewards": "reward", "advantages": "advantage"}

# Logical field -> column (JSON key) it is read from; users override any of them.
DEFAULT_COLUMNS: Dict[str, str] = {
    "messages": "messages",
    "conversations": "conversations",
    "system": "system",
    "instruction": "instruction",
    "input": "input",
    "output": "output",
    "text": "text",
    "prompt": "prompt",
    "chosen": "chosen",
    "rejected": "rejected",
    "completion": "completion",
    "label": "label",
    "completions": "completions",
    "rewards": "rewards",
    "advantages": "advantages",
}

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})

SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "tool": "tool",
    "observation": "tool",
}

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass
class Record:
    """One raw input record. ``value`` is the decoded object, or None when ``error`` says why it
    could not be decoded. ``raw`` is the line's text (JSONL) for the rejected-records file.
    A JSONL record read with ``decode=False`` holds only ``raw`` (``decoded`` is False) until
    :meth:`decode` runs, so decoding can happen in a worker process."""

    path: str
    line: int  # JSONL: line number, from 1; Parquet: row number, from 0 (as pack's messages)
    is_row: bool
    raw: Optional[str]
    value: Optional[Any]
    error: Optional[str] = None
    decoded: bool = True
    file_index: int = 0  # position of ``path`` among the run's inputs
    carried: Tuple[Any, ...] = ()  # its values of TokenizeOptions.carry, once parsed
    index: int = 0  # position among the run's records (from 0): a tree sample's group
    # A GRPO record's per-completion values, by column (PER_COMPLETION), once parsed.
    values: Optional[Dict[str, List[float]]] = None

    def decode(self) -> None:
        if self.decoded:
            return
        self.decoded = True
        try:
            self.value = json.loads(self.raw)  # type: ignore[arg-type]
        except ValueError as exc:
            self.error = f"invalid JSON ({exc})"
            return
        # JSON may escape half of a surrogate pair alone ("\ud800"): not text any encoder takes.
        if _SURROGATE_ESCAPE.search(self.raw):  # type: ignore[arg-type]
            try:
                json.dumps(self.value, ensure_ascii=False).encode()
            except UnicodeEncodeError:
                self.error = "invalid JSON (a lone surrogate escape, \\ud800-\\udfff: not text)"

    def fail(self, reason: str) -> InvalidRecordError:
        return InvalidRecordError(self.path, self.line, reason, row=self.is_row)

    def to_rejection(self, reason: str) -> Dict[str, Any]:
        data: Dict[str, Any] = {"file": self.path, "error": reason}
        data["row" if self.is_row else "line"] = self.line
        if self.raw is not None:
            data["raw"] = self.raw
        else:
            data["record"] = _jsonable(self.value)
        return data


@dataclass
class Sample:
    """A parsed record: a chat (``messages``, role/content dicts) or a plain ``text``; or, for
    the preference, KTO and GRPO formats, a ``prompt`` and its ``completions`` (chosen then
    rejected, the one KTO completion, or a GRPO record's completions, its per-completion values
    on the record), all strings (TRL's standard shape) or all message lists (conversational),
    with the KTO ``label``."""

    record: Record
    messages: Optional[List[Dict[str, Any]]] = None
    text: Optional[str] = None
    prompt: Union[None, str, List[Dict[str, Any]]] = None
    completions: Optional[List[Union[str, List[Dict[str, Any]]]]] = None
    label: Optional[bool] = None


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def resolve_columns(columns: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """The default column names updated with the user's overrides (unknown fields are an error)."""
    resolved = dict(DEFAULT_COLUMNS)
    for key, name in (columns or {}).items():
        check_choice("column field", key, DEFAULT_COLUMNS)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"column name for {key!r} must be a non-empty string")
        resolved[key] = name
    return resolved


# --- reading ---------------------------------------------------------------------------------


def read_records(
    path: Union[str, os.PathLike],
    on_bytes: Optional[Callable[[int], None]] = None,
    decode: bool = True,
) -> Iterator[Record]:
    """Records of one input file, in file order. ``on_bytes`` is told how many bytes of the file
    (compressed size for ``.gz``) each step consumed, for progress bars."""
    path = Path(path)
    require_file(path)
    if is_parquet(path):  # records are rows, counted from 0; JSONL: lines, from 1
        yield from _parquet_records(path, on_bytes)
    else:
        gzip_ = path.name.lower().endswith(".gz")
        yield from _jsonl_records(path, gzip_=gzip_, on_bytes=on_bytes, decode=decode)


_PROGRESS_LINES = 64
_BOM = b"\xef\xbb\xbf"


def _jsonl_records(
    path: Path, gzip_: bool, on_bytes: Optional[Callable[[int], None]], decode: bool
) -> Iterator[Record]:
    shown = shown_path(path)
    try:
        raw_file = open(path, "rb")
    except OSError as exc:
        raise input_error(path, exc) from None
    with raw_file:
        stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw_file) if gzip_ else raw_file
        last_pos = 0
        line_no = 0
        try:
            for line_no, line in enumerate(stream, start=1):
                # Progress every _PROGRESS_LINES lines: per line it costs as much as reading.
                if on_bytes is not None and line_no % _PROGRESS_LINES == 0:
                    pos = raw_file.tell()
                    on_bytes(pos - last_pos)
                    last_pos = pos
                if line_no == 1 and line.startswith(_BOM):
                    line = line[len(_BOM) :]  # files from Windows tools may start with one
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    yield Record(shown, line_no, False, None, None, f"not UTF-8 ({exc.reason})")
                    continue
                stripped = text.strip()
                if not stripped:
                    continue
                record = Record(shown, line_no, False, stripped, None, decoded=False)
                if decode:
                    record.decode()
                yield record
        except (OSError, EOFError, zlib.error) as exc:
            raise InvalidRecordError(shown, line_no + 1, f"cannot read file ({exc})") from None
        if on_bytes is not None:
            on_bytes(raw_file.tell() - last_pos)


def _parquet_records(path: Path, on_bytes: Optional[Callable[[int], None]]) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    shown = shown_path(path)
    try:
        # Opened by its bytes: pyarrow cannot open a name that is not valid UTF-8.
        source = pa.OSFile(os.fsencode(path))
    except OSError as exc:
        raise input_error(path, exc) from None
    with source:
        try:
            pf = pq.ParquetFile(source)
        except Exception as exc:  # pyarrow raises several unrelated types for a damaged file
            raise InvalidRecordError(shown, 0, f"not a readable Parquet file ({exc})") from None
        size = path.stat().st_size
        total_rows = max(pf.metadata.num_rows, 1)
        row = 0
        for group in range(pf.num_row_groups):
            try:
                rows = pf.read_row_group(group).to_pylist()
            except Exception as exc:
                raise InvalidRecordError(
                    shown, row, f"cannot read row group {group} ({exc})", row=True
                ) from None
            for value in rows:
                yield Record(shown, row, True, None, value)
                row += 1
            if on_bytes is not None:
                on_bytes(size * len(rows) // total_rows)


# --- parsing ---------------------------------------------------------------------------------


# The formats of "auto" by the fields a record has, first match first (GRPO's completions: a
# list).
_DETECT = (
    ("preference", ("chosen", "rejected")),
    ("grpo", ("prompt", "completions")),
    ("kto", ("prompt", "completion", "label")),
    ("messages", ("messages",)),
    ("sharegpt", ("conversations",)),
    ("alpaca", ("instruction", "output")),
    ("text", ("text",)),
)


def detect_format(value: Any, columns: Mapping[str, str]) -> Optional[str]:
    """The format a decoded record looks like, or None."""
    if not isinstance(value, dict):
        return None
    for fmt, needed in _DETECT:
        if all(columns[k] in value for k in needed):
            if fmt != "grpo" or isinstance(value[columns["completions"]], list):
                return fmt
    return None


def first_format(
    paths: Sequence[Union[str, os.PathLike]], columns: Mapping[str, str]
) -> Optional[str]:
    """The format of the first record of ``paths`` that decodes (None: none does, or it has no
    format)."""
    for path in paths:
        with contextlib.closing(read_records(path)) as records:  # type: ignore[type-var]
            for record in records:
                if record.error is None:
                    return detect_format(record.value, columns)
    return None


def parse_record(record: Record, fmt: str, columns: Mapping[str, str]) -> Sample:
    """Turns a record into a Sample; raises InvalidRecordError naming file and line."""
    record.decode()
    if record.error is not None:
        raise record.fail(record.error)
    value = record.value
    if not isinstance(value, dict):
        raise record.fail(f"expected a JSON object, got {type(value).__name__}")
    if fmt == "auto":
        detected = detect_format(value, columns)
        if detected is None:
            raise record.fail(
                "cannot detect the format: no "
                + ", ".join(
                    repr(columns[k])
                    for k in ("messages", "conversations", "instruction", "text", "chosen")
                )
                + f" field (fields: {', '.join(map(repr, list(value)[:8])) or 'none'})"
            )
        if kind_of_records(detected) != "sft":
            # One run writes one kind of token shard; its kind comes from its first record.
            raise record.fail(
                f"a {detected} record among SFT records (the format was detected from the "
                f"first record); tokenize {detected} data on its own or pass --format {detected}"
            )
        fmt = detected
    chat = {"messages": _messages, "sharegpt": _sharegpt, "alpaca": _alpaca}.get(fmt)
    if chat is not None:
        return Sample(record, messages=chat(record, value, columns))
    if fmt == "text":
        text = _field(record, value, columns["text"])
        if not isinstance(text, str):
            raise record.fail(f"{columns['text']!r} must be a string")
        if not text:
            raise record.fail(f"{columns['text']!r} is empty")
        return Sample(record, text=text)
    check_choice("format", fmt, FORMATS)
    return {"preference": _preference, "kto": _kto, "grpo": _grpo}[fmt](record, value, columns)


def _field(record: Record, value: Dict[str, Any], name: str) -> Any:
    if name not in value:
        raise record.fail(f"missing field {name!r}")
    return value[name]


def _system(record: Record, value: Dict[str, Any], columns: Mapping[str, str]) -> List[Dict]:
    system = value.get(columns["system"])
    if system is None or system == "":
        return []
    if not isinstance(system, str):
        raise record.fail(f"{columns['system']!r} must be a string")
    return [{"role": "system", "content": system}]


def _turn_list(record: Record, name: str, turns: Any) -> List[Dict]:
    """``turns`` (field ``name``), which must be a non-empty list of objects."""
    if not isinstance(turns, list):
        raise record.fail(f"{name!r} must be a list of messages")
    if not turns:
        raise record.fail(f"empty conversation ({name!r} has no messages)")
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise record.fail(f"{name}[{i}] is not an object")
    return turns


def _one_of(
    record: Record,
    turn: Dict[str, Any],
    where: str,
    key: str,
    allowed: Collection[str],
    what: Optional[str] = None,
) -> str:
    """``turn[key]``, which must be one of the ``allowed`` names (the turn's ``what``)."""
    value = turn.get(key)
    if value is None:
        raise record.fail(f"{where} has no {key!r}")
    if not isinstance(value, str) or value not in allowed:  # (a list is no name, nor hashable)
        expected = ", ".join(sorted(allowed))
        raise record.fail(f"{where} has unknown {what or key} {value!r} (expected {expected})")
    return value


def _messages(record: Record, value: Dict[str, Any], columns: Mapping[str, str]) -> List[Dict]:
    name = columns["messages"]
    out = _system(record, value, columns)
    return out + _chat_messages(record, name, _turn_list(record, name, _field(record, value, name)))


def _chat_messages(record: Record, name: str, turns: List[Dict]) -> List[Dict]:
    """The OpenAI-style messages ``turns`` of field ``name``, checked."""
    out = []
    for i, msg in enumerate(turns):
        role = msg.get("role")
        if not (role.__class__ is str and role in CHAT_ROLES):  # the usual case costs no f-string
            role = _one_of(record, msg, f"{name}[{i}]", "role", CHAT_ROLES)
        if msg.get("content").__class__ is not str:
            tool_call = role == "assistant" and bool(msg.get("tool_calls"))
            _text(record, msg, "content", f"{name}[{i}] ({role})", optional=tool_call)
        # As transformers does: keys whose value is None are dropped before rendering.
        out.append({k: v for k, v in msg.items() if v is not None})
    return out


def _sharegpt(record: Record, value: Dict[str, Any], columns: Mapping[str, str]) -> List[Dict]:
    name = columns["conversations"]
    out = _system(record, value, columns)
    for i, turn in enumerate(_turn_list(record, name, _field(record, value, name))):
        speaker = _one_of(record, turn, f"{name}[{i}]", "from", SHAREGPT_ROLES, "speaker")
        content = _text(record, turn, "value", f"{name}[{i}] ({speaker})")
        out.append({"role": SHAREGPT_ROLES[speaker], "content": content})
    return out


def _text(
    record: Record, turn: Dict[str, Any], key: str, where: str, optional: bool = False
) -> Any:
    """``turn[key]`` (of the turn ``where`` names): a string, or (``optional``) None."""
    content = turn.get(key)
    if content is None and not optional:
        what = f"{key!r} is null" if key in turn else f"has no {key!r}"
        raise record.fail(f"{where} {what}")
    if content is not None and not isinstance(content, str):
        raise record.fail(f"{where} {key!r} must be a string")
    return content


def _alpaca(record: Record, value: Dict[str, Any], columns: Mapping[str, str]) -> List[Dict]:
    parts = {}
    for key in ("instruction", "input", "output"):
        col = columns[key]
        item = value.get(col)
        if item is None and key != "input":
            raise record.fail(f"missing field {col!r}")
        item = "" if item is None else item
        if not isinstance(item, str):
            raise record.fail(f"{col!r} must be a string")
        parts[key] = item
    if not parts["instruction"] and not parts["input"]:
        raise record.fail(f"empty conversation ({columns['instruction']!r} is empty)")
    prompt = "\n\n".join(p for p in (parts["instruction"], parts["input"]) if p)
    return _system(record, value, columns) + [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": parts["output"]},
    ]


# --- preference and KTO (TRL's dataset shapes) ----------------------------------------------


def _part(record: Record, value: Dict[str, Any], name: str, empty_ok: bool = False) -> Any:
    """Field ``name`` of a preference / KTO record: a string or a list of messages."""
    return _piece(record, name, _field(record, value, name), empty_ok)


def _piece(record: Record, name: str, part: Any, empty_ok: bool = False) -> Any:
    """``part`` (field or item ``name``): a string or a list of messages."""
    if isinstance(part, list):
        return _chat_messages(record, name, _turn_list(record, name, part))
    if not isinstance(part, str):
        raise record.fail(f"{name!r} must be a string or a list of messages")
    if not part and not empty_ok:
        raise record.fail(f"{name!r} is empty")
    return part


def _same_shape(record: Record, parts: Mapping[str, Any], *more: Any) -> None:
    if len({isinstance(part, str) for part in (*parts.values(), *more)}) > 1:
        raise record.fail(
            f"{', '.join(map(repr, parts))} must all be strings or all lists of messages"
        )


def _preference(record: Record, value: Dict[str, Any], columns: Mapping[str, str]) -> Sample:
    chosen = _part(record, value, columns["chosen"])
    rejected = _part(record, value, columns["rejected"])
    _same_shape(record, {columns["chosen"]: chosen, columns["rejected"]: rejected})
    name = columns["prompt"]
    prompt = value.get(name)
    if prompt is not None and not isinstance(prompt, (str, list)):
        raise record.fail(f"{name!r} must be a string or a list of messages")
    # As TRL's maybe_extract_prompt: a prompt of the other shape than the completions (a string
    # prompt with whole conversations, as in UltraFeedback) is left aside and the prompt is
    # taken from the conversations.
    if prompt is None or isinstance(prompt, str) != isinstance(chosen, str):
        return _extract_prompt(record, chosen, rejected, columns)
    prompt = _part(record, value, name, empty_ok=True)
    return Sample(record, prompt=prompt, completions=[chosen, rejected])


def _extract_prompt(
    record: Record, chosen: Any, rejected: Any, columns: Mapping[str, str]
) -> Sample:
    """TRL's ``extract_prompt``: the prompt is the longest common prefix of the chosen and
    rejected conversations or strings (a space ending a string prefix goes to the completions);
    when one is a prefix of the other, its last element starts the completions."""
    n = min(len(chosen), len(rejected))
    cut = next((i for i in range(n) if chosen[i] != rejected[i]), None)
    if cut is None:
        cut = n - 1
    elif cut > 0 and chosen[cut - 1] == " ":
        cut -= 1
    if cut <= 0:
        raise record.fail(
            f"{columns['chosen']!r} and {columns['rejected']!r} share no prompt (no common "
            f"start before their completions) and there is no {columns['prompt']!r} field"
        )
    return Sample(record, prompt=chosen[:cut], completions=[chosen[cut:], rejected[cut:]])


def _kto(record: Record, value: Dict[str, Any], columns: Mapping[str, str]) -> Sample:
    prompt = _part(record, value, columns["prompt"], empty_ok=True)
    completion = _part(record, value, columns["completion"])
    _same_shape(record, {columns["prompt"]: prompt, columns["completion"]: completion})
    label = _field(record, value, columns["label"])
    if not isinstance(label, bool):
        raise record.fail(f"{columns['label']!r} must be true or false, not {label!r}")
    return Sample(record, prompt=prompt, completions=[completion], label=label)


def _grpo(record: Record, value: Dict[str, Any], columns: Mapping[str, str]) -> Sample:
    """A GRPO-style record: a prompt and its completions (a group), all strings or all lists
    of messages; its ``rewards`` / ``advantages``, when given, one number per completion."""
    name = columns["completions"]
    given = _field(record, value, name)
    if not isinstance(given, list) or not given:
        raise record.fail(f"{name!r} must be a non-empty list of completions")
    completions = [_piece(record, f"{name}[{i}]", c, empty_ok=True) for i, c in enumerate(given)]
    prompt = _part(record, value, columns["prompt"], empty_ok=True)
    _same_shape(record, {columns["prompt"]: prompt, name: completions[0]}, *completions)
    record.values = {}
    for field, column in PER_COMPLETION.items():
        numbers = value.get(columns[field])
        if numbers is None:
            continue
        if not isinstance(numbers, list) or len(numbers) != len(completions):
            got = f"{len(numbers)} values" if isinstance(numbers, list) else type(numbers).__name__
            raise record.fail(
                f"{columns[field]!r} must be a list of one number per completion "
                f"({len(completions)} in {name!r}), got {got}"
            )
        bad = next((i for i, x in enumerate(numbers) if not _finite(x)), None)
        if bad is not None:
            raise record.fail(f"{columns[field]}[{bad}] is not a finite number: {numbers[bad]!r}")
        record.values[column] = [float(x) for x in numbers]
    return Sample(record, prompt=prompt, completions=completions)


def _finite(x: Any) -> bool:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer beyond floats
        return False
