"""Raw records to token batches: read -> parse -> render (main thread, compiled template) ->
encode + labels (in Rust with the GIL released, overlapping the render of the next chunk) ->
over-long policy -> ``pyarrow.RecordBatch``.

Encoding uses tokpack's byte-level BPE encoder (``tokpack-core``'s ``bpe``: exact ids of the
tokenizer, labels from the character spans) when it reproduces the tokenizer, otherwise
``tokenizers``' encoder with labels from its offsets.

Preference and KTO records become the texts TRL tokenizes (the prompt, then the prompt with each
completion), encoded the same way; :meth:`RecordEncoder.finish` makes one sample of each record's
texts (see :mod:`tokpack.tokenize.schema`).

Chunks have a fixed number of records and results are put back in input order, so the batches
are identical for any number of threads. A :class:`RecordEncoder` turns one chunk into
:class:`_Tokens`, in this process or in worker processes; :class:`TokenStream` reads, hands out
the chunks and puts the results together.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import (
    Any,
    Callable,
    ContextManager,
    Deque,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Union,
)

import numpy as np
import pyarrow as pa

from .. import _tokpack
from .._contract import OVERLONG_HINT
from .._inputs import RAW_SUFFIXES, is_parquet, resolve_inputs, shown_path
from .._progress import Progress
from ..errors import ConfigError, InvalidRecordError, OverlongError
from ..planning import checked_threads
from .formats import Record, parse_record, read_records
from .masks import IGNORE_INDEX, labels_from_spans
from .options import TokenizeOptions
from .schema import PAIR_ROLES, SOURCE_SCHEMA, TOKEN_SCHEMA, kind_of_format, token_schema
from .template import ChatTemplate, resolve_template
from .tokenizer import ENCODERS, LoadedTokenizer, load_tokenizer

__all__ = [
    "TokenizeStats",
    "TokenStream",
    "RecordEncoder",
    "tokenize_to_batches",
    "TOKEN_SCHEMA",
    "SOURCE_SCHEMA",
    "ENCODERS",
]

PathLike = Union[str, os.PathLike]
# Where a rejected record goes: a dict with its file, line or row, error and raw text.
RejectSink = Callable[[Dict[str, Any]], None]


@dataclass
class TokenizeStats:
    """Accounting of a run: every record read is a sample, split into pieces, truncated, dropped
    as over-long, or rejected (``records == samples_in + rejected``)."""

    records: int = 0
    rejected: int = 0
    samples_in: int = 0
    samples_out: int = 0
    formats: Dict[str, int] = field(default_factory=dict)
    overlong: int = 0
    truncated: int = 0
    dropped: int = 0
    split: int = 0
    split_pieces: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    untrained_samples: int = 0

    def merge(self, other: "TokenizeStats") -> None:
        """Adds the counts of ``other`` (a chunk's part of the run)."""
        for name, value in asdict(other).items():
            if name == "formats":
                for fmt, n in value.items():
                    self.formats[fmt] = self.formats.get(fmt, 0) + n
            else:
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["trained_share"] = self.trained_tokens / self.tokens if self.tokens else 0.0
        return data


@dataclass
class _Prepared:
    """One text to encode: an SFT record's, or one of a preference / KTO record's texts (its
    prompt, then the prompt with each completion; ``label``: the KTO label, on the prompt)."""

    record: Record
    text: str
    spans: Optional[List[Tuple[int, int]]]  # None: plain text, every token trained
    eos_trained: bool
    label: Optional[bool] = None


@dataclass
class _Chat:
    """An SFT record's conversation, rendered with the rest of its chunk."""

    record: Record
    messages: List[Dict[str, Any]]


@dataclass
class _PairChat:
    """A conversational preference / KTO record, rendered with the rest of its chunk."""

    record: Record
    prompt: List[Dict[str, Any]]
    completions: List[List[Dict[str, Any]]]
    label: Optional[bool]


@dataclass
class _Tokens:
    """Sequences as flat arrays, the one shape of a chunk's encoding and of its finished batch:
    sequence ``i`` is ``ids[offsets[i]:offsets[i + 1]]`` (``labels`` alike). Once finished, a
    sample of ``kind`` (:mod:`tokpack.tokenize.schema`) is :attr:`roles` consecutive sequences
    (a preference pair: chosen then rejected) and sample ``j`` comes from input file
    ``files[j]``, JSONL line (from 1) or Parquet row (from 0) ``lines[j]``, with, for preference
    and KTO samples, its ``prompt_lengths[j]`` (and KTO ``kto_labels[j]``). Plain arrays travel
    from worker processes cheaply (an Arrow batch would import pandas on both sides to be
    pickled)."""

    offsets: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    files: Optional[np.ndarray] = None
    lines: Optional[np.ndarray] = None
    kind: str = "sft"
    prompt_lengths: Optional[np.ndarray] = None
    kto_labels: Optional[np.ndarray] = None
    # Per carried record field (TokenizeOptions.carry), each sample's value.
    carried: Optional[List[List[Any]]] = None

    def __post_init__(self) -> None:
        if self.offsets[-1] >= 2**31:  # Arrow list offsets are int32
            raise ConfigError("batch_size too large: a batch holds more than 2**31 tokens")

    @classmethod
    def from_pairs(cls, pairs: Sequence[Tuple[np.ndarray, np.ndarray]]) -> "_Tokens":
        lengths = np.fromiter((len(ids) for ids, _ in pairs), dtype=np.int64, count=len(pairs))
        offsets = np.zeros(len(pairs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        none = [np.zeros(0, dtype=np.int32)]
        ids = np.concatenate([ids for ids, _ in pairs] or none)
        return cls(offsets, ids, np.concatenate([labels for _, labels in pairs] or none))

    @property
    def roles(self) -> int:
        """Sequences per sample."""
        return len(PAIR_ROLES) if self.kind == "preference" else 1

    def count(self, stats: TokenizeStats) -> "_Tokens":
        """Adds these finished samples to ``stats`` (a sample is untrained when one of its
        sequences has no trained token)."""
        # Trained tokens before each offset, from the trained positions (a running count over
        # every token costs a fresh int64 array of the batch's size, ten times the time).
        before = np.searchsorted(np.flatnonzero(self.labels != IGNORE_INDEX), self.offsets)
        untrained = (np.diff(before) == 0).reshape(-1, self.roles).any(axis=1)
        stats.samples_out += len(untrained)
        stats.tokens += int(self.offsets[-1])
        stats.trained_tokens += int(before[-1])
        stats.untrained_samples += int(np.count_nonzero(untrained))
        return self

    def pairs(self) -> List[Tuple[np.ndarray, np.ndarray]]:
        bounds = self.offsets.tolist()
        return [(self.ids[a:b], self.labels[a:b]) for a, b in zip(bounds, bounds[1:])]

    def to_batch(
        self, sources: bool, carried: Sequence[Tuple[str, pa.DataType]] = ()
    ) -> pa.RecordBatch:
        """The token batch of :func:`~tokpack.tokenize.schema.token_schema` ``(kind,
        sources, carried)``."""
        off = _int32(self.offsets)
        ids = pa.ListArray.from_arrays(off, _int32(self.ids))
        labels = pa.ListArray.from_arrays(off, _int32(self.labels))
        lengths = np.diff(self.offsets).reshape(-1, self.roles).sum(axis=1)
        columns = {"length": _int32(lengths)}
        if self.kind == "preference":
            for i, role in enumerate(PAIR_ROLES):  # each role's sequences, out of the interleaved
                pick = _from_numpy(np.arange(i, len(lengths) * self.roles, self.roles), np.int64)
                columns[f"{role}_input_ids"] = ids.take(pick)
                columns[f"{role}_labels"] = labels.take(pick)
        else:
            columns["input_ids"], columns["labels"] = ids, labels
        if self.prompt_lengths is not None:
            columns["prompt_length"] = _int32(self.prompt_lengths)
        if self.kto_labels is not None:
            columns["label"] = pa.array(self.kto_labels.tolist(), pa.bool_())
        if sources:
            assert self.files is not None and self.lines is not None
            columns["source_file"] = _int32(self.files)
            columns["source_line"] = _from_numpy(self.lines, np.int64)
        for (name, type_), values in zip(carried, self.carried or ()):
            columns[name] = pa.array(values, type_)
        schema = token_schema(self.kind, sources, carried)
        return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


# What a chunk gives back: its samples (None: none left), counts and rejected records.
_ChunkResult = Tuple[Optional[_Tokens], TokenizeStats, List[Dict[str, Any]]]

# JSONL records encoded in Rust: one sequence per record, the records left to Python
# (without tokens) and whether each record's last message is an assistant's.
_JsonlTokens = Tuple[_Tokens, np.ndarray, np.ndarray]

# The columns whose presence makes a record of format "auto" other than a chat (detect_format).
_DETECTED = ("chosen", "rejected", "prompt", "completion", "label")


@contextlib.contextmanager
def _sequential_tokenizers() -> Iterator[None]:
    # Each worker encodes its chunk sequentially; tokpack's own workers are the only
    # parallelism, so --threads is exact. tokenizers reads this variable at every call.
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


class RecordEncoder:
    """A loaded tokenizer and chat template with :class:`TokenizeOptions`: turns chunks of
    records into token samples. Holds no per-run state (counts and rejections go to the
    caller), so worker processes share one and the cache key can be known before a run."""

    def __init__(
        self, tokenizer: Union[PathLike, LoadedTokenizer], options: TokenizeOptions
    ) -> None:
        self.options = options
        self.kind = kind_of_format(options.format)
        if self.kind != "sft" and options.overlong == "split":
            raise ConfigError(
                f"overlong 'split' cannot apply to {self.kind} samples (a prompt and its "
                "completions stay together); choose 'error', 'truncate' or 'drop'"
            )
        clash = [c for c in options.carry if c in token_schema(self.kind, sources=True).names]
        if clash:
            raise ConfigError(
                f"carry: {', '.join(map(repr, clash))} would replace a column of the {self.kind}"
                " token shards; a carried record field needs another name"
            )
        if self.kind != "sft" and options.train_on != "assistant":
            raise ConfigError(
                f"train_on {options.train_on!r} does not apply to {self.kind} samples: they are "
                "trained on their completions, as TRL trains them"
            )
        self.tokenizer = (
            tokenizer if isinstance(tokenizer, LoadedTokenizer) else load_tokenizer(tokenizer)
        )
        source, info = resolve_template(self.tokenizer.chat_template, options.chat_template)
        self.template = ChatTemplate(
            source,
            self.tokenizer.special_tokens,
            self.tokenizer.special_token_strings,
            renderer=options.renderer,
            train_on=options.train_on,
        )
        self.template_info = {
            **info,
            "hash": self.template.hash,
            "generation_markers": self.template.has_generation,
        }
        # Which renderer runs (not in the cache key: both render the same texts).
        self.renderer_info = self.template.renderer_info
        self._eos_id = self.tokenizer.eos_id()
        self._fast = self.tokenizer.fast if options.encoder == "auto" else None
        if self._fast is not None:
            self.encoder_info: Dict[str, Any] = {"name": "tokpack-bpe"}
        elif options.encoder == "tokenizers":
            self.encoder_info = {"name": "tokenizers", "reason": "requested"}
        else:
            self.encoder_info = {"name": "tokenizers", "reason": self.tokenizer.fast_unsupported}
        eos = self.tokenizer.eos_token
        if eos is not None and self._eos_id is None and options.add_eos is not False:
            # Otherwise samples meant to end with EOS would silently go without it.
            raise ConfigError(
                f"eos_token {eos!r} of {self.tokenizer.config_path} is not in the vocabulary of "
                f"{self.tokenizer.path}; fix the tokenizer config, or turn add_eos off "
                "(--no-add-eos) to append no EOS"
            )
        if options.add_eos and self._eos_id is None:
            raise ConfigError(
                "add_eos needs an EOS token: the tokenizer config names none (or it is not in "
                "the vocabulary)"
            )

    def schema(
        self, sources: bool = False, carried: Optional[Mapping[str, pa.DataType]] = None
    ) -> pa.Schema:
        """The schema of the batches (:mod:`tokpack.tokenize.schema`); a carried field is of
        type ``carried[name]``, null while no sample has shown it."""
        types = carried or {}
        fields = [(c, types.get(c, pa.null())) for c in self.options.carry]
        return token_schema(self.kind, sources, fields)

    def config(self) -> Dict[str, Any]:
        """Everything besides the input bytes that determines the output (for the cache key)."""
        import tokenizers

        return {
            **self.options.config(),
            "tokenizer": self.tokenizer.fingerprint,
            "tokenizers_version": tokenizers.__version__,
            "template": self.template_info,
        }

    def run(self, records: List[Record]) -> _ChunkResult:
        """One chunk from start to end (what a worker process does)."""
        stats, rejected = TokenizeStats(), []
        prepared = self.prepare(records, stats, rejected.append)
        return self.finish(prepared, self.encode(prepared), stats), stats, rejected

    # --- stages ------------------------------------------------------------------------------

    def prepare(
        self, records: List[Record], stats: TokenizeStats, reject: RejectSink
    ) -> List[_Prepared]:
        """Parse each record, render the chats in one batch, then take the records in order: a
        rejected one is counted and sent to ``reject`` (without ``skip_invalid``, the first
        one in input order raises)."""
        parsed: List[Union[List[_Prepared], _Chat, _PairChat, InvalidRecordError]] = []
        chats: List[_Chat] = []
        pairs: List[_PairChat] = []
        for record in records:
            try:
                item = self._prepare(record)
            except InvalidRecordError as exc:
                item = exc
            if isinstance(item, _Chat):
                chats.append(item)
            elif isinstance(item, _PairChat):
                pairs.append(item)
            parsed.append(item)
        train_on = self.options.train_on
        rendered = iter(
            self.template.trained_spans_many([(c.messages, c.record) for c in chats], train_on)
        )
        pair_texts = iter(self._render_pairs(pairs))
        prepared = []
        for record, item in zip(records, parsed):
            if isinstance(item, _Chat):
                item = self._chat_prepared(item, next(rendered))
            elif isinstance(item, _PairChat):
                item = next(pair_texts)
            if isinstance(item, InvalidRecordError):
                if not self.options.skip_invalid:
                    raise item
                stats.rejected += 1
                reject(record.to_rejection(item.reason))
                continue
            prepared.extend(item)
            fmt = self.kind if self.kind != "sft" else "text" if item[0].spans is None else "chat"
            stats.formats[fmt] = stats.formats.get(fmt, 0) + 1
        return prepared

    def _render_pairs(
        self, pairs: List["_PairChat"]
    ) -> List[Union[List[_Prepared], InvalidRecordError]]:
        """Each conversational preference / KTO record's texts (its prompt with the generation
        prompt, then the prompt with each completion), the chunk's rendered in two batches; a
        record whose render fails is its first error, in that order."""
        prompts = self.template.render_many(
            [(p.prompt, p.record) for p in pairs], add_generation_prompt=True
        )
        fulls = iter(
            self.template.render_many(
                [(p.prompt + c, p.record) for p in pairs for c in p.completions]
            )
        )
        out: List[Union[List[_Prepared], InvalidRecordError]] = []
        for pair, prompt in zip(pairs, prompts):
            texts = [prompt] + [next(fulls) for _ in pair.completions]
            error = next((t for t in texts if isinstance(t, InvalidRecordError)), None)
            # A chat text's labels come from the prompt length (finish), hence empty spans.
            out.append(
                error
                if error is not None
                else [_Prepared(pair.record, t, [], False, pair.label) for t in texts]  # type: ignore[arg-type]
            )
        return out

    def _prepare(self, record: Record) -> Union[List[_Prepared], "_Chat", "_PairChat"]:
        """The record's texts: one, or for a preference / KTO record ``1 + roles``; a chat
        to render (with the chunk's others, :meth:`prepare`)."""
        sample = parse_record(record, self.options.format, self.options.columns or {})
        if self.options.carry:
            record.carried = tuple(_carried_value(record, name) for name in self.options.carry)
        if sample.completions is not None:
            return self._prepare_pair(record, sample.prompt, sample.completions, sample.label)
        if sample.text is not None:
            return [_Prepared(record, sample.text, None, True)]
        return _Chat(record, sample.messages or [])

    def _chat_prepared(
        self, chat: "_Chat", rendered: Union[Tuple[str, List[Tuple[int, int]]], InvalidRecordError]
    ) -> Union[List[_Prepared], InvalidRecordError]:
        if isinstance(rendered, InvalidRecordError):
            return rendered
        text, spans = rendered
        if not text:
            return chat.record.fail("the chat template rendered an empty text")
        train_on = self.options.train_on
        last_trained = train_on == "all" or chat.messages[-1].get("role") == "assistant"
        return [_Prepared(chat.record, text, spans, last_trained)]

    def _prepare_pair(
        self, record: Record, prompt: Any, completions: List[Any], label: Optional[bool]
    ) -> Union[List[_Prepared], "_PairChat"]:
        """As TRL's DPO and KTO trainers prepare them: the prompt alone, then the prompt with
        each completion. Strings (the standard shape) are joined, each completion ending with
        the EOS text unless it already does (or ``add_eos`` is off), and encoded with the
        tokenizer's special tokens; conversations are rendered with the chat template, the
        prompt with the generation prompt, and encoded without them."""
        if not isinstance(prompt, str):
            return _PairChat(record, prompt, completions, label)  # rendered with the chunk's
        eos = self.tokenizer.eos_token if self.options.add_eos is not False else None
        ends = [eos if eos and not c.endswith(eos) else "" for c in completions]
        texts = [prompt] + [prompt + c + end for c, end in zip(completions, ends)]
        return [_Prepared(record, text, None, False, label) for text in texts]

    def jsonl_in_rust(self, inputs: Sequence[PathLike]) -> bool:
        """Whether chunks of ``inputs`` go through :meth:`encode_jsonl`: JSONL chat records
        (format ``messages``, or ``auto`` for SFT) rendered and encoded in Rust."""
        return (
            self.kind == "sft"
            and not self.options.carry  # carried fields are read from records parsed in Python
            and self.options.format in ("auto", "messages")
            and self.template.rust is not None
            and self._fast is not None
            and not any(is_parquet(path) for path in inputs)
        )

    def encode_jsonl(self, records: List[Record], threads: int) -> _JsonlTokens:
        """Parses, renders and encodes JSONL ``records`` in Rust (``threads`` threads, the GIL
        released); what it leaves to Python is listed in ``fallback``."""
        columns = self.options.columns or {}
        (ids, labels, offsets, fallback), last = self.template.rust.tokenize_jsonl(
            encoder=self._fast,
            lines=[r.raw if not r.decoded else "" for r in records],  # "": not JSON, Python's
            mode=self.options.train_on,
            messages_key=columns["messages"],
            system_key=columns["system"],
            detect_keys=[columns[k] for k in _DETECTED] if self.options.format == "auto" else None,
            threads=threads,
        )
        return _Tokens(offsets, ids, labels), fallback, last

    def finish_jsonl(
        self,
        records: List[Record],
        encoded: _JsonlTokens,
        stats: TokenizeStats,
        reject: RejectSink,
    ) -> Optional[_Tokens]:
        """The samples of :meth:`encode_jsonl`'s records, those it left to Python prepared and
        encoded here (rejections counted and sent to ``reject`` as :meth:`prepare` does),
        then finished as :meth:`finish` does."""
        flat, fallback, last = encoded
        n_rust = len(records) - len(fallback)
        if n_rust:
            stats.formats["chat"] = stats.formats.get("chat", 0) + n_rust
        if not len(fallback) and not self.options.add_eos:
            done = self._flat_samples(flat, records, stats)
            if done is not None:
                return done
        left = fallback.tolist()
        prepared = self.prepare([records[i] for i in left], stats, reject)
        by_record = {id(p.record): p for p in prepared}
        python_pairs = iter(self.encode(prepared).pairs())
        rust_pairs = flat.pairs()
        trained_all = self.options.train_on == "all"
        chunk: List[_Prepared] = []
        pairs: List[Tuple[np.ndarray, np.ndarray]] = []
        is_left = np.zeros(len(records), dtype=bool)
        is_left[left] = True
        for i, record in enumerate(records):
            if not is_left[i]:
                chunk.append(_Prepared(record, "", [], trained_all or bool(last[i])))
                pairs.append(rust_pairs[i])
            elif id(record) in by_record:  # else rejected
                chunk.append(by_record[id(record)])
                pairs.append(next(python_pairs))
        return self.finish(chunk, _Tokens.from_pairs(pairs), stats)

    def encode(self, chunk: List[_Prepared]) -> _Tokens:
        """Ids and labels of a chunk (chat text without the tokenizer's added special tokens,
        as ``apply_chat_template``; plain text with them)."""
        if self._fast is None or not chunk:
            return _Tokens.from_pairs(_encode_part(self.tokenizer.tokenizer, chunk))
        # Plain text gets the post-processor's tokens (BOS, ...) with add_special_tokens=True;
        # tokpack's encoder has no post-processor, so such text goes to tokenizers.
        slow = self._fast.post_processor_adds_tokens
        items = [p for p in chunk if p.spans is not None or not slow]
        counts = np.zeros(len(items) + 1, dtype=np.int64)
        starts: List[int] = []
        ends: List[int] = []
        for i, p in enumerate(items):
            spans = p.spans if p.spans is not None else [(0, len(p.text))]
            counts[i + 1] = len(spans)
            for a, b in spans:
                starts.append(a)
                ends.append(b)
        # One thread: tokpack's worker processes are the parallelism.
        ids, labels, offsets, fallback = self._fast.encode_batch(
            texts=[p.text for p in items],
            span_offsets=np.cumsum(counts),
            span_starts=np.array(starts, dtype=np.int64),
            span_ends=np.array(ends, dtype=np.int64),
            threads=1,
        )
        flat = _Tokens(offsets, ids, labels)
        if len(items) == len(chunk) and not len(fallback):
            return flat
        pairs = flat.pairs()
        # Text the encoder leaves to tokenizers (not in NFC, for an NFC tokenizer).
        missing = fallback.tolist()
        tok = self.tokenizer.tokenizer
        for i, pair in zip(missing, _encode_part(tok, [items[i] for i in missing])):
            pairs[i] = pair
        if len(items) < len(chunk):
            plain = iter(_encode_part(tok, [p for p in chunk if p.spans is None]))
            fast = iter(pairs)
            pairs = [next(plain) if p.spans is None else next(fast) for p in chunk]
        return _Tokens.from_pairs(pairs)

    def finish(
        self, chunk: List[_Prepared], encoded: _Tokens, stats: TokenizeStats
    ) -> Optional[_Tokens]:
        """The chunk's samples with EOS, over-long policy and sources; None if none is left."""
        if not chunk:
            return None
        if self.kind != "sft":
            return self._finish_pairs(chunk, encoded.pairs(), stats)
        done = self._finish_flat(chunk, encoded, stats)
        return done if done is not None else self._finish_each(chunk, encoded.pairs(), stats)

    def _finish_flat(
        self, chunk: List[_Prepared], flat: _Tokens, stats: TokenizeStats
    ) -> Optional[_Tokens]:
        """The encoder's flat arrays as they are when no sample needs an EOS or a max_len
        policy (the usual case); None otherwise (then :meth:`_finish_each` handles it)."""
        add_eos = self.options.add_eos
        if add_eos or (add_eos is None and any(p.spans is None for p in chunk)):
            return None
        return self._flat_samples(flat, [p.record for p in chunk], stats)

    def _flat_samples(
        self, flat: _Tokens, records: List[Record], stats: TokenizeStats
    ) -> Optional[_Tokens]:
        """``flat`` (one sequence per record, no EOS to add) as the samples of ``records``;
        None when one is over ``max_len``."""
        max_len = self.options.max_len
        if max_len is not None and np.diff(flat.offsets).max() > max_len:
            return None
        stats.samples_in += len(records)
        flat.files = np.fromiter((r.file_index for r in records), np.int32, len(records))
        flat.lines = np.fromiter((r.line for r in records), np.int64, len(records))
        flat.carried = self._carried(records)
        return flat.count(stats)

    def _finish_each(
        self,
        chunk: List[_Prepared],
        encoded: List[Tuple[np.ndarray, np.ndarray]],
        stats: TokenizeStats,
    ) -> Optional[_Tokens]:
        pieces: List[Tuple[np.ndarray, np.ndarray]] = []
        records: List[Record] = []
        eos_id = self._eos_id
        for item, (ids, labels) in zip(chunk, encoded):
            add_eos = self.options.add_eos
            if add_eos is None:
                add_eos = item.spans is None
            if add_eos and eos_id is not None and (not len(ids) or ids[-1] != eos_id):
                eos = np.array([eos_id], dtype=np.int32)
                ids = np.concatenate([ids, eos])
                eos_label = eos if item.eos_trained else np.array([IGNORE_INDEX], dtype=np.int32)
                labels = np.concatenate([labels, eos_label])
            stats.samples_in += 1
            kept = self._apply_max_len(item.record, ids, labels, stats)
            pieces.extend(kept)
            records.extend([item.record] * len(kept))
        if not pieces:
            return None
        done = _Tokens.from_pairs(pieces)
        done.files = np.array([r.file_index for r in records], dtype=np.int32)
        done.lines = np.array([r.line for r in records], dtype=np.int64)
        done.carried = self._carried(records)
        return done.count(stats)

    def _finish_pairs(
        self,
        chunk: List[_Prepared],
        encoded: List[Tuple[np.ndarray, np.ndarray]],
        stats: TokenizeStats,
    ) -> Optional[_Tokens]:
        """Preference / KTO samples from each record's encoded prompt and prompt+completions.
        As TRL (``common_prefix_length``), the prompt is the tokens the encoded prompt shares
        with every prompt+completion, and each sequence (the whole prompt+completion) is
        labelled from there on."""
        width = 1 + (len(PAIR_ROLES) if self.kind == "preference" else 1)
        sequences: List[Tuple[np.ndarray, np.ndarray]] = []
        prompt_lengths: List[int] = []
        kept_items: List[_Prepared] = []
        for at in range(0, len(chunk), width):
            item, prompt = chunk[at], encoded[at][0]
            full = [ids for ids, _ in encoded[at + 1 : at + width]]
            n = min(_common_prefix(prompt, ids) for ids in full)
            stats.samples_in += 1
            kept = self._pair_max_len(item.record, n, full, stats)
            if kept is None:
                continue
            for ids in kept:
                labels = ids.copy()
                labels[:n] = IGNORE_INDEX
                sequences.append((ids, labels))
            prompt_lengths.append(n)
            kept_items.append(item)
        if not kept_items:
            return None
        done = _Tokens.from_pairs(sequences)
        done.kind = self.kind
        done.files = np.fromiter((p.record.file_index for p in kept_items), np.int32)
        done.lines = np.fromiter((p.record.line for p in kept_items), np.int64)
        done.prompt_lengths = np.array(prompt_lengths, dtype=np.int32)
        if self.kind == "kto":
            done.kto_labels = np.array([p.label for p in kept_items], dtype=bool)
        done.carried = self._carried([p.record for p in kept_items])
        return done.count(stats)

    def _carried(self, records: List[Record]) -> Optional[List[List[Any]]]:
        """Per carried field, the value of each of ``records`` (None without any)."""
        if not self.options.carry:
            return None
        return [[r.carried[i] for r in records] for i in range(len(self.options.carry))]

    def _pair_max_len(
        self, record: Record, prompt_length: int, full: List[np.ndarray], stats: TokenizeStats
    ) -> Optional[List[np.ndarray]]:
        """A preference / KTO sample's sequences under ``max_len`` (which applies to each, as
        TRL's ``max_length``): kept whole, truncated (each keeps its start, as TRL's
        ``keep_start``; a sample whose prompt alone fills ``max_len`` is dropped, as TRL drops
        it), dropped (None), or an error."""
        max_len = self.options.max_len
        longest = max(len(ids) for ids in full)
        if max_len is None or longest <= max_len:
            return full
        stats.overlong += 1
        overlong = self.options.overlong
        if overlong == "error":
            raise _overlong_error(record, longest, max_len, 'pass overlong="truncate" or "drop"')
        if overlong == "truncate" and prompt_length < max_len:
            stats.truncated += 1
            return [ids[:max_len] for ids in full]
        stats.dropped += 1
        return None

    def _apply_max_len(
        self, record: Record, ids: np.ndarray, labels: np.ndarray, stats: TokenizeStats
    ) -> List[Tuple[np.ndarray, np.ndarray]]:
        max_len = self.options.max_len
        n = len(ids)
        if max_len is None or n <= max_len:
            return [(ids, labels)]
        stats.overlong += 1
        overlong = self.options.overlong
        if overlong == "error":
            raise _overlong_error(record, n, max_len, OVERLONG_HINT)
        if overlong == "truncate":
            stats.truncated += 1
            return [(ids[:max_len], labels[:max_len])]
        if overlong == "drop":
            stats.dropped += 1
            return []
        stats.split += 1
        pieces = [(ids[i : i + max_len], labels[i : i + max_len]) for i in range(0, n, max_len)]
        stats.split_pieces += len(pieces)
        return pieces


class TokenStream:
    """An iterable of token ``RecordBatch``es (``input_ids``, ``labels``, ``length``; for
    preference and KTO records the columns of :mod:`tokpack.tokenize.schema`) from raw inputs,
    with the accounting in :attr:`stats` (complete once iteration has finished) and the rejected
    records sent to ``on_reject`` in input order (default: kept in :attr:`rejected`). ``sources``
    adds the columns of :data:`SOURCE_SCHEMA`. Iterate once. Built by
    :func:`tokenize_to_batches`, whose arguments it takes (``tokenizer`` may also be a
    :class:`RecordEncoder`, which brings its options)."""

    def __init__(
        self,
        inputs: Union[PathLike, Sequence[PathLike]],
        tokenizer: Union[PathLike, LoadedTokenizer, RecordEncoder],
        *,
        threads: Optional[int] = None,
        on_reject: Optional[RejectSink] = None,
        progress: Optional[Progress] = None,
        sources: bool = False,
        options: Optional[Union[TokenizeOptions, Mapping[str, Any]]] = None,
        runner: Optional["ChunkRunner"] = None,
        **option_values: Any,
    ) -> None:
        self.inputs = resolve_inputs(inputs, RAW_SUFFIXES)
        self.runner = runner
        threads = checked_threads(threads)
        self.threads = threads if threads is not None else _tokpack.default_threads()
        if isinstance(tokenizer, RecordEncoder):
            if options is not None or option_values:
                raise ConfigError("a RecordEncoder brings its own options")
            self.encoding = tokenizer
        else:
            chosen = TokenizeOptions.of(options, **option_values).for_inputs(self.inputs)
            self.encoding = RecordEncoder(tokenizer, chosen)
        self.tokenizer = self.encoding.tokenizer
        self.template_info = self.encoding.template_info
        self.encoder_info = self.encoding.encoder_info
        self._jsonl_in_rust = runner is None and self.encoding.jsonl_in_rust(self.inputs)
        # Which renderer runs, and where JSONL records are parsed when it is Rust's (manifest).
        self.renderer_info = (
            {**self.encoding.renderer_info, "records": "rust"}
            if self._jsonl_in_rust
            else self.encoding.renderer_info
        )
        self.progress = progress
        self.sources = sources
        self.stats = TokenizeStats()
        self.rejected: List[Dict[str, Any]] = []
        self._on_reject = on_reject if on_reject is not None else self.rejected.append
        self._used = False
        # Each carried field's type, and where it was first seen, once a sample has it.
        self._carried: Dict[str, Tuple[pa.DataType, str]] = {}

    def config(self) -> Dict[str, Any]:
        """Everything besides the input bytes that determines the output (for the cache key)."""
        return self.encoding.config()

    @property
    def schema(self) -> pa.Schema:
        """The batches' schema (a carried field's type is known once a sample has it: null
        before, and for good when none has)."""
        return self.encoding.schema(self.sources, {n: t for n, (t, _) in self._carried.items()})

    def _carried_types(self, tokens: _Tokens) -> List[Tuple[str, pa.DataType]]:
        """Each carried field with its type in this run: the type of its first value, which
        every later value must have (else an InvalidRecordError naming both records)."""
        out = []
        for name, values in zip(self.encoding.options.carry, tokens.carried or ()):
            types = [_carried_type(v) for v in values]
            if name not in self._carried:
                path, line, row = self._source(tokens, 0)
                self._carried[name] = (types[0], f"{path}:{'row ' * row}{line}")
            first, where = self._carried[name]
            odd = next((j for j, t in enumerate(types) if t != first), None)
            if odd is not None:
                path, line, row = self._source(tokens, odd)
                reason = (
                    f"carried field {name!r} is of type {types[odd]}, not {first} as at {where}:"
                    " a carried field has one type in a run"
                )
                raise InvalidRecordError(path, line, reason, row=row)
            out.append((name, first))
        return out

    def _source(self, tokens: _Tokens, j: int) -> Tuple[str, int, bool]:
        """The file (as shown), line or row, and whether it is a row, of sample ``j``."""
        assert tokens.files is not None and tokens.lines is not None
        path = self.inputs[int(tokens.files[j])]
        return shown_path(path), int(tokens.lines[j]), is_parquet(path)

    def _record_chunks(self, decode: bool) -> Iterator[List[Record]]:
        """``batch_size`` records at a time: batch boundaries depend on the input only."""
        on_bytes = self.progress.advance if self.progress is not None else None
        chunk: List[Record] = []
        for index, path in enumerate(self.inputs):
            for record in read_records(path, on_bytes, decode=decode):
                record.file_index = index
                self.stats.records += 1
                chunk.append(record)
                if len(chunk) == self.encoding.options.batch_size:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._used:
            raise ConfigError("a TokenStream can be iterated only once")
        self._used = True
        if self.runner is not None:
            return self._iter_runner(self.runner)
        if self._jsonl_in_rust:
            return self._iter_jsonl_in_rust()
        if self.threads > 1:
            return self._iter_processes()
        return self._iter_in_process()

    def _iter_runner(self, runner: "ChunkRunner") -> Iterator[pa.RecordBatch]:
        """Chunks encoded wherever ``runner`` sends them (Ray actors), taken back in order."""
        with runner.session(self.encoding) as (submit, ahead):
            chunks = self._record_chunks(decode=False)
            yield from self._in_order(chunks, lambda records: submit(_pack_records(records)), ahead)

    def _iter_in_process(self) -> Iterator[pa.RecordBatch]:
        """One process: parse and render here, encode on a worker thread meanwhile."""
        encoding = self.encoding
        with _sequential_tokenizers(), ThreadPoolExecutor(1) as pool:

            def start(records: List[Record]) -> Callable[[], _ChunkResult]:
                stats, rejected = TokenizeStats(), []
                prepared = encoding.prepare(records, stats, rejected.append)
                # Encoding of this chunk runs while the previous one is finished.
                encoded = pool.submit(encoding.encode, prepared)
                return lambda: (encoding.finish(prepared, encoded.result(), stats), stats, rejected)

            yield from self._in_order(self._record_chunks(decode=True), start, ahead=1)

    def _iter_jsonl_in_rust(self) -> Iterator[pa.RecordBatch]:
        """JSONL chat records parsed, rendered and encoded in Rust on ``threads`` threads (one
        call a chunk, from a worker thread, the GIL released) while this thread reads the next
        chunk and finishes the previous one (records Rust leaves go through the Python stages
        here)."""
        encoding = self.encoding
        with _sequential_tokenizers(), ThreadPoolExecutor(1) as pool:

            def start(records: List[Record]) -> Callable[[], _ChunkResult]:
                encoded = pool.submit(encoding.encode_jsonl, records, self.threads)

                def result() -> _ChunkResult:
                    stats, rejected = TokenizeStats(), []
                    done = encoding.finish_jsonl(records, encoded.result(), stats, rejected.append)
                    return done, stats, rejected

                return result

            yield from self._in_order(self._record_chunks(decode=False), start, ahead=1)

    def _iter_processes(self) -> Iterator[pa.RecordBatch]:
        """``threads`` worker processes decode, render and encode chunks of records (rendering
        is Python, so threads would share one core); this process reads, hands out chunks and
        takes the results back in input order."""
        import multiprocessing

        # A forked worker inherits this stream's encoder (tokenizer, template); a spawned one
        # loads its own.
        fork = _START_METHOD == "fork"
        encoding = self.encoding
        pool = ProcessPoolExecutor(
            self.threads,
            mp_context=multiprocessing.get_context(_START_METHOD),
            initializer=_worker_init,
            initargs=(
                encoding if fork else (str(encoding.tokenizer.path), encoding.options),
                os.getpid(),
            ),
        )

        def start(records: List[Record]) -> Callable[[], _ChunkResult]:
            return pool.submit(_worker_run, _pack_records(records)).result

        try:
            chunks = self._record_chunks(decode=False)
            yield from self._in_order(chunks, start, ahead=2 * self.threads)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _in_order(
        self,
        chunks: Iterator[List[Record]],
        start: Callable[[List[Record]], Callable[[], _ChunkResult]],
        ahead: int,
    ) -> Iterator[pa.RecordBatch]:
        """Starts each chunk (up to ``ahead`` before the one being finished) and finishes them
        in input order: counts merged, rejections passed on, the batch yielded."""
        window: Deque[Tuple[int, Callable[[], _ChunkResult]]] = deque()
        for records in chunks:
            window.append((len(records), start(records)))
            if len(window) > ahead:
                yield from self._take(*window.popleft())
        while window:
            yield from self._take(*window.popleft())

    def _take(self, n_records: int, result: Callable[[], _ChunkResult]) -> Iterator[pa.RecordBatch]:
        tokens, stats, rejected = result()
        self.stats.merge(stats)
        for rejection in rejected:
            self._on_reject(rejection)
        if self.progress is not None:
            self.progress.add_samples(n_records)
        if tokens is not None:
            yield tokens.to_batch(self.sources, self._carried_types(tokens))


class ChunkRunner(Protocol):
    """Encodes chunks of records outside this process's own workers (``tokpack.ray``): a
    ``session`` for an encoder yields ``(submit, ahead)``; ``submit(packed)`` starts one chunk
    (records as :func:`_pack_records` packs them, to be run by :func:`run_packed`) and returns
    the call that waits for its result; ``ahead`` chunks may be under way at once."""

    def session(
        self, encoding: RecordEncoder
    ) -> ContextManager[Tuple[Callable[[Any], Callable[[], _ChunkResult]], int]]: ...


def run_packed(encoding: RecordEncoder, packed: Any) -> _ChunkResult:
    """One chunk of packed records, wherever it runs (a worker process, a Ray actor)."""
    return encoding.run(_unpack_records(packed))


# How worker processes start: fork where it is the platform's way (Linux: no re-import, the
# tokenizer and template are inherited), spawn elsewhere.
_START_METHOD = "fork" if sys.platform == "linux" else "spawn"

# The encoder of a worker process, set once by the pool's initializer (in the worker only).
_ENCODER: Optional[RecordEncoder] = None


def _worker_init(encoding: Union[RecordEncoder, Tuple[str, TokenizeOptions]], parent: int) -> None:
    """``encoding``: the parent's encoder (fork: inherited, not pickled), or the tokenizer path
    and options to load one from (spawn)."""
    global _ENCODER
    _die_with_parent(parent)
    # Ctrl-C and SIGTERM are the parent's to handle: it stops handing out work and shuts the
    # pool down (a terminal or `kill -- -PGID` signals the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _ENCODER = encoding if isinstance(encoding, RecordEncoder) else RecordEncoder(*encoding)


def _worker_run(packed: Any) -> _ChunkResult:
    """One chunk in a worker process (its counts leave ``records`` to the reader)."""
    assert _ENCODER is not None, "worker not initialised"
    return run_packed(_ENCODER, packed)


# prctl(2) option: the signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """A worker must not outlive the main process (kill -9 of it would leave workers of ~70 MB
    waiting forever under init). On Linux the kernel sends SIGKILL when the parent dies
    (PR_SET_PDEATHSIG; the pool starts its workers from the main thread, whose exit is what
    the kernel watches); elsewhere a daemon thread polls the parent pid. Either way a parent
    that died before this ran is caught by the first getppid check."""
    if sys.platform == "linux":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    else:
        import threading

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="tokpack-parent-watch", daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _pack_records(records: List[Record]) -> Any:
    """Records to send to a worker: undecoded JSONL lines of one file travel as two lists
    (a list of dataclasses costs several times more to pickle)."""
    first = records[0]
    if all(not r.decoded and r.file_index == first.file_index for r in records):
        return (first.path, first.file_index, [r.line for r in records], [r.raw for r in records])
    return records


def _unpack_records(packed: Any) -> List[Record]:
    if isinstance(packed, tuple):
        path, index, lines, raws = packed
        return [
            Record(path, n, False, raw, None, decoded=False, file_index=index)
            for n, raw in zip(lines, raws)
        ]
    return packed


# The Arrow type of a carried value, by its Python type (bool before int: a bool is an int).
_CARRIED_TYPES = ((bool, pa.bool_()), (int, pa.int64()), (float, pa.float64()), (str, pa.string()))


def _carried_type(value: Any) -> pa.DataType:
    return next(t for kind, t in _CARRIED_TYPES if isinstance(value, kind))


def _carried_value(record: Record, name: str) -> Any:
    """Field ``name`` of a parsed record, to carry: one bool, integer (64 bits), float or
    string."""
    value = record.value[name] if name in record.value else None  # type: ignore[index,operator]
    if value is None:
        state = "is null" if name in record.value else "is missing"  # type: ignore[operator]
        raise record.fail(f"carried field {name!r} {state}")
    if not isinstance(value, (bool, int, float, str)):
        raise record.fail(
            f"carried field {name!r} must be a bool, number or string, got {type(value).__name__}"
        )
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise record.fail(f"carried field {name!r} is an integer beyond 64 bits")
    return value


def _overlong_error(record: Record, n: int, max_len: int, hint: str) -> OverlongError:
    where = f"{record.path}:{'row ' if record.is_row else ''}{record.line}"
    return OverlongError(f"{where}: sample of {n} tokens, more than max_len={max_len}; {hint}")


def _common_prefix(ids: np.ndarray, other: np.ndarray) -> int:
    """How many leading tokens the two share."""
    n = min(len(ids), len(other))
    differ = np.flatnonzero(ids[:n] != other[:n])
    return int(differ[0]) if len(differ) else n


def _from_numpy(values: np.ndarray, dtype: type) -> pa.Array:
    # From the buffer, not pa.array(ndarray): that one imports pandas on first use (seconds,
    # during which pyarrow swallows Ctrl-C).
    data = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(dtype), len(data), [None, pa.py_buffer(data)])


def _int32(values: np.ndarray) -> pa.Array:
    return _from_numpy(values, np.int32)


def _ids(encoding: Any) -> np.ndarray:
    return np.array(encoding.ids, dtype=np.int32)


def _encode_part(tokenizer: Any, part: List[_Prepared]) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``tokenizers`` route: ids, and labels from the encoding's offsets."""
    chat = [p.text for p in part if p.spans is not None]
    plain = [p.text for p in part if p.spans is None]
    chat_encs = iter(tokenizer.encode_batch(chat, add_special_tokens=False) if chat else [])
    plain_encs = iter(tokenizer.encode_batch(plain, add_special_tokens=True) if plain else [])
    out = []
    for p in part:
        if p.spans is None:
            ids = _ids(next(plain_encs))
            out.append((ids, ids.copy()))
        else:
            enc = next(chat_encs)
            ids = _ids(enc)
            out.append((ids, labels_from_spans(enc, ids, p.spans)))
    return out


def tokenize_to_batches(
    inputs: Union[PathLike, Sequence[PathLike]],
    tokenizer: Union[PathLike, LoadedTokenizer, RecordEncoder],
    **options: Any,
) -> TokenStream:
    """Tokenize raw chat / instruction / text files into token ``RecordBatch``es without
    writing anything: the building block of ``tokenize_files`` and of one-step ``pack``.

    Args:
        inputs: JSONL, ``.jsonl.gz`` or Parquet files, directories or globs (as ``tokpack
            tokenize`` reads them).
        tokenizer: a ``tokenizer.json`` file or a directory holding it (and
            ``tokenizer_config.json``), or a loaded tokenizer.
        options: the fields of :class:`TokenizeOptions` (or ``options=TokenizeOptions(...)``),
            and ``threads``: worker processes that decode, render and encode (default
            ``TOKPACK_NUM_THREADS`` or all cores; 1: everything in this process); the output
            is identical for every value.
        on_reject: called with each rejected record (default: kept in ``.rejected``).
        progress: a :class:`tokpack._progress.Progress`, told the input bytes read and the
            records done.
        sources: add the columns of :data:`SOURCE_SCHEMA` (each sample's input file and line
            or row) to every batch.

    Returns:
        A :class:`TokenStream`: iterate it for batches, then read ``.stats``.
    """
    return TokenStream(inputs, tokenizer, **options)
