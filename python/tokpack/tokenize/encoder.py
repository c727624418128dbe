"""Records to token samples: a :class:`RecordEncoder` holds a loaded tokenizer, the chat
template and the :class:`TokenizeOptions`, renders each chunk of records, encodes it (tokpack's
byte-level BPE in Rust with the GIL released when it reproduces the tokenizer, otherwise
``tokenizers`` with labels from its offsets), applies the over-long policy and gives back its
:class:`~tokpack.tokenize.samples.Tokens`, counts and rejected records. Preference and KTO
records become the texts TRL tokenizes (the prompt, then the prompt with each completion);
:meth:`RecordEncoder.finish` makes one sample of each record's texts. GRPO records and chats
tokenized per turn are samples of the tree kind (:mod:`tokpack.tokenize.trees`)."""

from __future__ import annotations

from functools import partial
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np
import pyarrow as pa

from .._contract import OVERLONG_HINT
from .._io.inputs import is_parquet
from .._tokpack import KTO_LABEL
from ..errors import ConfigError, InvalidRecordError, OverlongError
from ..kinds import kind
from .formats import PER_COMPLETION, Record, Sample, parse_record
from .masks import IGNORE_INDEX, labels_from_spans
from .options import TokenizeOptions
from .samples import (
    Chat,
    ChunkResult,
    JsonlTokens,
    PathLike,
    Prepared,
    RejectSink,
    TokenizeStats,
    Tokens,
)
from .schema import token_schema
from .template import ChatTemplate, resolve_template
from .tokenizer import LoadedTokenizer, load_tokenizer
from .trees import common_prefix, each_turn_prepared, finish_tree

# An over-long tree sequence's remedies ('split' is refused for trees).
_TREE_HINT = 'pass overlong="truncate" or "drop", or filter it out first'
_PAIR_HINT = 'pass overlong="truncate" or "drop"'
# The columns whose presence makes a record of format "auto" other than a chat (detect_format).
_DETECTED = ("chosen", "rejected", "prompt", "completion", "label")


class RecordEncoder:
    """A loaded tokenizer and chat template with :class:`TokenizeOptions`: turns chunks of
    records into token samples. Holds no per-run state (counts and rejections go to the
    caller), so worker processes share one and the cache key can be known before a run."""

    def __init__(
        self, tokenizer: Union[PathLike, LoadedTokenizer], options: TokenizeOptions
    ) -> None:
        self.options = options
        self.kind = options.kind
        self.spec = kind(self.kind)
        self.tree = self.spec.trees
        self.prompted = self.spec.prompted and not self.tree
        self.grpo = options.format == "grpo"
        self._check_kind()
        # A GRPO run's per-completion columns (present when its records give them).
        self.optional = tuple(PER_COMPLETION.values()) if self.grpo else ()
        names = (*token_schema(self.kind, sources=True).names, *self.optional)
        clash = [c for c in options.carry if c in names]
        if clash:
            raise ConfigError(
                f"carry: {', '.join(map(repr, clash))} would replace a column of the {self.kind}"
                " token shards; a carried record field needs another name"
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
        why = "requested" if options.encoder == "tokenizers" else self.tokenizer.fast_unsupported
        slow = {"name": "tokenizers", "reason": why}
        self.encoder_info: Dict[str, Any] = {"name": "tokpack-bpe"} if self._fast else slow
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

    def _check_kind(self) -> None:
        """The options a run of preference / KTO samples or of tree samples (GRPO records,
        ``each_turn`` chats) takes."""
        options = self.options
        if options.each_turn and options.format in ("preference", "kto", "grpo"):
            raise ConfigError(
                f"each_turn applies to chats, not to {options.format} records (a GRPO record's "
                "completions are its tree already)"
            )
        if self.tree:
            what = "GRPO records" if self.grpo else "each_turn samples"
            why = "a piece would lose the prefix its sequence shares with its group"
            trained = "each sequence is trained on its own completion / assistant turn only"
        elif self.prompted:
            what, why = f"{self.kind} samples", "a prompt and its completions stay together"
            trained = "they are trained on their completions, as TRL trains them"
        else:
            return
        if options.overlong == "split":
            raise ConfigError(
                f"overlong 'split' cannot apply to {what} ({why}); choose 'error', 'truncate' or "
                "'drop'"
            )
        if options.train_on != "assistant":
            raise ConfigError(f"train_on {options.train_on!r} does not apply to {what}: {trained}")

    def schema(
        self, sources: bool = False, carried: Optional[Mapping[str, pa.DataType]] = None
    ) -> pa.Schema:
        """The schema of the batches (:mod:`tokpack.tokenize.schema`); a carried field is of
        type ``carried[name]``, null while no sample has shown it."""
        types = carried or {}
        fields = [(c, types[c]) for c in self.optional if c in types]
        fields += [(c, types.get(c, pa.null())) for c in self.options.carry]
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

    def run(self, records: List[Record]) -> ChunkResult:
        """One chunk from start to end (what a worker process does)."""
        stats, rejected = TokenizeStats(), []  # type: TokenizeStats, List[Any]
        prepared = self.prepare(records, stats, rejected.append)
        return self.finish(prepared, self.encode(prepared), stats), stats, rejected

    # --- stages ------------------------------------------------------------------------------

    def prepare(
        self, records: List[Record], stats: TokenizeStats, reject: RejectSink
    ) -> List[Prepared]:
        """Parse each record, render the chats in one batch, then take the records in order: a
        rejected one is counted and sent to ``reject`` (without ``skip_invalid``, the first
        one in input order raises)."""
        parsed: List[Union[List[Prepared], Chat, Sample, InvalidRecordError]] = []
        for record in records:
            try:
                parsed.append(self._prepare(record))
            except InvalidRecordError as exc:
                parsed.append(exc)
        chats = [item for item in parsed if isinstance(item, Chat)]
        pairs = [item for item in parsed if isinstance(item, Sample)]
        train_on = self.options.train_on
        if self.options.each_turn:
            render = lambda convs: self.template.trained_spans_many(convs, train_on)  # noqa: E731
            chat_texts = iter(each_turn_prepared(chats, self.template.has_generation, render))
        else:
            convs = [(c.messages, c.record) for c in chats]
            rendered = self.template.trained_spans_many(convs, train_on)
            chat_texts = map(self._chat_prepared, chats, rendered)
        pair_texts = iter(self._render_pairs(pairs))
        prepared = []
        for record, item in zip(records, parsed):
            if isinstance(item, (Chat, Sample)):
                item = next(chat_texts if isinstance(item, Chat) else pair_texts)
            if isinstance(item, InvalidRecordError):
                if not self.options.skip_invalid:
                    raise item
                stats.rejected += 1
                reject(record.to_rejection(item.reason))
                continue
            prepared.extend(item)
            fmt = self.kind if self.prompted else "grpo" if self.grpo else "chat"
            fmt = "text" if fmt == "chat" and item[0].spans is None else fmt
            stats.formats[fmt] = stats.formats.get(fmt, 0) + 1
        return prepared

    def _render_pairs(self, pairs: List[Sample]) -> List[Union[List[Prepared], InvalidRecordError]]:
        """Each conversational preference / KTO record's texts (its prompt with the generation
        prompt, then the prompt with each completion), the chunk's rendered in two batches; a
        record whose render fails is its first error, in that order."""
        convs: List[Any] = [(p.prompt, p.record) for p in pairs]
        prompts = self.template.render_many(convs, add_generation_prompt=True)
        convs = [(p.prompt + c, p.record) for p in pairs for c in p.completions]  # type: ignore[operator,union-attr]
        fulls = iter(self.template.render_many(convs))
        out: List[Union[List[Prepared], InvalidRecordError]] = []
        for pair, prompt in zip(pairs, prompts):
            texts = [prompt] + [next(fulls) for _ in pair.completions]  # type: ignore[union-attr]
            error = next((t for t in texts if isinstance(t, InvalidRecordError)), None)
            # A chat text's labels come from the prompt length (finish), hence empty spans.
            out.append(
                error
                if error is not None
                else [Prepared(pair.record, t, [], False, pair.label) for t in texts]  # type: ignore[arg-type]
            )
        return out

    def _prepare(self, record: Record) -> Union[List[Prepared], Chat, Sample]:
        """The record's texts: one, or for a preference / KTO record ``1 + roles``; a chat
        to render (with the chunk's others, :meth:`prepare`)."""
        sample = parse_record(record, self.options.format, self.options.columns or {})
        if self.options.carry:
            record.carried = tuple(_carried_value(record, name) for name in self.options.carry)
        if sample.completions is not None:
            return self._prepare_pair(sample)
        if sample.text is not None:
            return [Prepared(record, sample.text, None, True)]
        return Chat(record, sample.messages or [])

    def _chat_prepared(
        self, chat: "Chat", rendered: Union[Tuple[str, List[Tuple[int, int]]], InvalidRecordError]
    ) -> Union[List[Prepared], InvalidRecordError]:
        if isinstance(rendered, InvalidRecordError):
            return rendered
        text, spans = rendered
        if not text:
            return chat.record.fail("the chat template rendered an empty text")
        train_on = self.options.train_on
        last_trained = train_on == "all" or chat.messages[-1].get("role") == "assistant"
        return [Prepared(chat.record, text, spans, last_trained)]

    def _prepare_pair(self, sample: Sample) -> Union[List[Prepared], Sample]:
        """As TRL's DPO and KTO trainers prepare them: the prompt alone, then the prompt with
        each completion. Strings (the standard shape) are joined, each completion ending with
        the EOS text unless it already does (or ``add_eos`` is off), and encoded with the
        tokenizer's special tokens; conversations are rendered with the chat template, the
        prompt with the generation prompt, and encoded without them."""
        prompt, completions = sample.prompt, sample.completions or []
        if not isinstance(prompt, str):
            return sample  # rendered with the chunk's
        eos = self.tokenizer.eos_token if self.options.add_eos is not False else None
        ends = [eos if eos and not c.endswith(eos) else "" for c in completions]  # type: ignore[union-attr]
        texts = [prompt] + [prompt + c + end for c, end in zip(completions, ends)]  # type: ignore[operator]
        return [Prepared(sample.record, text, None, False, sample.label) for text in texts]

    def jsonl_in_rust(self, inputs: Sequence[PathLike]) -> bool:
        """Whether chunks of ``inputs`` go through :meth:`encode_jsonl`: JSONL chat records
        (format ``messages``, or ``auto`` for SFT) rendered and encoded in Rust."""
        return (
            not (self.spec.prompted or self.tree)  # one flat sequence per record
            and not self.options.carry  # carried fields are read from records parsed in Python
            and self.options.format in ("auto", "messages")
            and self.template.rust is not None
            and self._fast is not None
            and not any(is_parquet(path) for path in inputs)
        )

    def encode_jsonl(self, records: List[Record], threads: int) -> JsonlTokens:
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
        return Tokens(offsets, ids, labels), fallback, last

    def finish_jsonl(
        self,
        records: List[Record],
        encoded: JsonlTokens,
        stats: TokenizeStats,
        reject: RejectSink,
    ) -> Optional[Tokens]:
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
        chunk: List[Prepared] = []
        pairs: List[Tuple[np.ndarray, np.ndarray]] = []
        is_left = set(left)
        for i, record in enumerate(records):
            if i not in is_left:
                chunk.append(Prepared(record, "", [], trained_all or bool(last[i])))
                pairs.append(rust_pairs[i])
            elif id(record) in by_record:  # else rejected
                chunk.append(by_record[id(record)])
                pairs.append(next(python_pairs))
        return self.finish(chunk, Tokens.from_pairs(pairs), stats)

    def encode(self, chunk: List[Prepared]) -> Tokens:
        """Ids and labels of a chunk (chat text without the tokenizer's added special tokens,
        as ``apply_chat_template``; plain text with them)."""
        if self._fast is None or not chunk:
            return Tokens.from_pairs(_encode_part(self.tokenizer.tokenizer, chunk))
        # Plain text gets the post-processor's tokens (BOS, ...) with add_special_tokens=True;
        # tokpack's encoder has no post-processor, so such text goes to tokenizers.
        slow = self._fast.post_processor_adds_tokens
        items = [p for p in chunk if p.spans is not None or not slow]
        spans = [p.spans if p.spans is not None else [(0, len(p.text))] for p in items]
        bounds = np.array([s for part in spans for s in part], dtype=np.int64).reshape(-1, 2).T
        # One thread: tokpack's worker processes are the parallelism.
        ids, labels, offsets, fallback = self._fast.encode_batch(
            texts=[p.text for p in items],
            span_offsets=np.cumsum([0, *map(len, spans)], dtype=np.int64),
            span_starts=np.ascontiguousarray(bounds[0]),
            span_ends=np.ascontiguousarray(bounds[1]),
            threads=1,
        )
        flat = Tokens(offsets, ids, labels)
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
        return Tokens.from_pairs(pairs)

    def finish(
        self, chunk: List[Prepared], encoded: Tokens, stats: TokenizeStats
    ) -> Optional[Tokens]:
        """The chunk's samples with EOS, over-long policy and sources; None if none is left."""
        if not chunk:
            return None
        if self.tree:
            fit = partial(self._apply_max_len, hint=_TREE_HINT)
            trees = finish_tree(chunk, encoded.pairs(), stats, self.grpo, self._with_eos, fit)
            return None if trees is None else self._finished(*trees, stats)
        if self.prompted:
            return self._finish_pairs(chunk, encoded.pairs(), stats)
        # The encoder's flat arrays as they are when no sample needs an EOS or a max_len policy
        # (the usual case).
        add_eos = self.options.add_eos
        if not add_eos and not (add_eos is None and any(p.spans is None for p in chunk)):
            done = self._flat_samples(encoded, [p.record for p in chunk], stats)
            if done is not None:
                return done
        return self._finish_each(chunk, encoded.pairs(), stats)

    def _flat_samples(
        self, flat: Tokens, records: List[Record], stats: TokenizeStats
    ) -> Optional[Tokens]:
        """``flat`` (one sequence per record, no EOS to add) as the samples of ``records``;
        None when one is over ``max_len``."""
        max_len = self.options.max_len
        if max_len is not None and np.diff(flat.offsets).max() > max_len:
            return None
        stats.samples_in += len(records)
        return self._finished(flat, records, stats)

    def _finish_each(
        self,
        chunk: List[Prepared],
        encoded: List[Tuple[np.ndarray, np.ndarray]],
        stats: TokenizeStats,
    ) -> Optional[Tokens]:
        pieces: List[Tuple[np.ndarray, np.ndarray]] = []
        records: List[Record] = []
        for item, (ids, labels) in zip(chunk, encoded):
            ids, labels = self._with_eos(item, ids, labels)
            stats.samples_in += 1
            kept = self._apply_max_len(item.record, ids, labels, stats)
            pieces.extend(kept)
            records.extend([item.record] * len(kept))
        if not pieces:
            return None
        return self._finished(Tokens.from_pairs(pieces), records, stats)

    def _with_eos(
        self, item: Prepared, ids: np.ndarray, labels: np.ndarray
    ) -> Tuple[np.ndarray, np.ndarray]:
        """``ids`` and ``labels`` with the EOS token appended where ``add_eos`` asks for it."""
        add_eos = item.spans is None if self.options.add_eos is None else self.options.add_eos
        eos_id = self._eos_id
        if add_eos and eos_id is not None and (not len(ids) or ids[-1] != eos_id):
            ids = np.append(ids, np.int32(eos_id))
            labels = np.append(labels, np.int32(eos_id if item.eos_trained else IGNORE_INDEX))
        return ids, labels

    def _finish_pairs(
        self,
        chunk: List[Prepared],
        encoded: List[Tuple[np.ndarray, np.ndarray]],
        stats: TokenizeStats,
    ) -> Optional[Tokens]:
        """Preference / KTO samples from each record's encoded prompt and prompt+completions.
        As TRL (``common_prefix_length``), the prompt is the tokens the encoded prompt shares
        with every prompt+completion, and each sequence (the whole prompt+completion) is
        labelled from there on."""
        width = self.spec.sequences
        sequences: List[Tuple[np.ndarray, np.ndarray]] = []
        prompt_lengths: List[int] = []
        kept_items: List[Prepared] = []
        for at in range(0, len(chunk), width):
            item, prompt = chunk[at], encoded[at][0]
            full = [ids for ids, _ in encoded[at + 1 : at + width]]
            n = min(common_prefix(prompt, ids) for ids in full)
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
        done = Tokens.from_pairs(sequences)
        done.kind = self.kind
        done.prompt_lengths = np.array(prompt_lengths, dtype=np.int32)
        if KTO_LABEL in self.spec.carried:
            done.kto_labels = np.array([p.label for p in kept_items], dtype=bool)
        return self._finished(done, [p.record for p in kept_items], stats)

    def _finished(self, done: Tokens, records: List[Record], stats: TokenizeStats) -> Tokens:
        """``done``, a sample from each of ``records``, with their files, lines and carried
        fields (per field, each sample's value; None without any), counted in ``stats``."""
        done.files = np.fromiter((r.file_index for r in records), np.int32, len(records))
        done.lines = np.fromiter((r.line for r in records), np.int64, len(records))
        carried = dict(done.carried or {})
        for i, name in enumerate(self.options.carry):
            carried[name] = [r.carried[i] for r in records]
        done.carried = carried or None
        return done.count(stats)

    def _pair_max_len(
        self, record: Record, prompt_length: int, full: List[np.ndarray], stats: TokenizeStats
    ) -> Optional[List[np.ndarray]]:
        """A preference / KTO sample's sequences under ``max_len`` (which applies to each, as
        TRL's ``max_length``): kept whole, truncated (each keeps its start, as TRL's
        ``keep_start``; a sample whose prompt alone fills ``max_len`` is dropped, as TRL drops
        it), dropped (None), or an error."""
        policy = self._overlong(record, max(map(len, full)), stats, _PAIR_HINT)
        if policy is None:
            return full
        max_len = self.options.max_len
        if policy == "truncate" and prompt_length < max_len:  # type: ignore[operator]
            stats.truncated += 1
            return [ids[:max_len] for ids in full]
        stats.dropped += 1
        return None

    def _apply_max_len(
        self,
        record: Record,
        ids: np.ndarray,
        labels: np.ndarray,
        stats: TokenizeStats,
        hint: str = OVERLONG_HINT,
    ) -> List[Tuple[np.ndarray, np.ndarray]]:
        n, max_len = len(ids), self.options.max_len
        policy = self._overlong(record, n, stats, hint)
        if policy is None:
            return [(ids, labels)]
        if policy == "truncate":
            stats.truncated += 1
            return [(ids[:max_len], labels[:max_len])]
        if policy == "drop":
            stats.dropped += 1
            return []
        stats.split += 1
        pieces = [(ids[i : i + max_len], labels[i : i + max_len]) for i in range(0, n, max_len)]  # type: ignore[operator,arg-type]
        stats.split_pieces += len(pieces)
        return pieces

    def _overlong(self, record: Record, n: int, stats: TokenizeStats, hint: str) -> Optional[str]:
        """None when ``n`` tokens fit ``max_len``; else (counted) the over-long policy to apply,
        or its error."""
        max_len = self.options.max_len
        if max_len is None or n <= max_len:
            return None
        stats.overlong += 1
        if self.options.overlong == "error":
            raise overlong_error(record, n, max_len, hint)
        return self.options.overlong


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


def overlong_error(record: Record, n: int, max_len: int, hint: str) -> OverlongError:
    where = f"{record.path}:{'row ' if record.is_row else ''}{record.line}"
    return OverlongError(f"{where}: sample of {n} tokens, more than max_len={max_len}; {hint}")


def _encode_part(tokenizer: Any, part: List[Prepared]) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``tokenizers`` route: ids, and labels from the encoding's offsets."""
    chat = [p.text for p in part if p.spans is not None]
    plain = [p.text for p in part if p.spans is None]
    chat_encs = iter(tokenizer.encode_batch(chat, add_special_tokens=False) if chat else [])
    plain_encs = iter(tokenizer.encode_batch(plain, add_special_tokens=True) if plain else [])
    out = []
    for p in part:
        enc = next(plain_encs if p.spans is None else chat_encs)
        ids = np.array(enc.ids, dtype=np.int32)
        out.append((ids, ids.copy() if p.spans is None else labels_from_spans(enc, ids, p.spans)))
    return out
