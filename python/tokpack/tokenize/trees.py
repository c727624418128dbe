"""Samples of the tree kind (prefix trees: the sequences of a group share prefixes, which
``tokpack pack`` then stores once): a GRPO record's completions, each after its prompt, and a
chat's assistant turns (``TokenizeOptions.each_turn``), each after its own history.

Each sequence is a row of the tree token shards (``tokpack.tokenize.schema``'s ``tree``) with
its ``group``: the record's position among the run's records (from 0, counting rejected ones),
the same for any number of workers. A GRPO record is its prompt (rendered with the generation
prompt, as the preference formats render it) then each completion; a completion's labels start
where its tokens leave the prompt's (TRL's common prefix, taken per completion, so every
completion is trained on its own tokens only). Sample ``j`` of a chat is the chat up to and
including its ``j``-th trained assistant turn, rendered by the template on those messages (a
template that drops earlier reasoning gives each turn its own history), trained on that turn
alone. Identical sequences (two equal completions, say) stay two rows of their group.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import InvalidRecordError
from .formats import PER_COMPLETION, Record
from .masks import IGNORE_INDEX
from .samples import Chat, Prepared, TokenizeStats, Tokens

__all__ = ["turn_ends", "each_turn_prepared", "finish_tree", "common_prefix"]

Pair = Tuple[np.ndarray, np.ndarray]


def turn_ends(messages: List[Dict[str, Any]], markers: bool) -> List[int]:
    """Where each trained assistant turn's sample ends (its message count): every assistant
    message when the template marks generation blocks, else those with a string content (the
    ones ``train_on="assistant"`` locates and trains)."""
    return [
        i + 1
        for i, m in enumerate(messages)
        if m.get("role") == "assistant" and (markers or isinstance(m.get("content"), str))
    ]


def each_turn_prepared(
    chats: List[Chat],
    markers: bool,
    render: Callable[[List[Tuple[List[Dict[str, Any]], Record]]], List[Any]],
) -> List[Union[List[Prepared], InvalidRecordError]]:
    """Each chat's per-turn texts (the chunk's prefixes rendered in one ``render`` call, which
    gives ``(text, spans)`` of ``train_on="assistant"`` or an InvalidRecordError each). A chat
    without a trained turn is one text, the whole chat, untrained (as without ``each_turn``).
    The prefix of turn ``j`` must show ``j`` trained spans, of which the last is the turn's."""
    ends = [turn_ends(c.messages, markers) or [len(c.messages)] for c in chats]
    rendered = iter(render([(c.messages[:n], c.record) for c, e in zip(chats, ends) for n in e]))
    out: List[Union[List[Prepared], InvalidRecordError]] = []
    for chat, chat_ends in zip(chats, ends):
        texts = [next(rendered) for _ in chat_ends]
        trained = bool(turn_ends(chat.messages, markers))
        out.append(_turns(chat, texts, trained))
    return out


def _turns(
    chat: Chat, texts: List[Any], trained: bool
) -> Union[List[Prepared], InvalidRecordError]:
    record = chat.record
    error = next((t for t in texts if isinstance(t, InvalidRecordError)), None)
    if error is not None:
        return error
    if not trained:
        text, spans = texts[0]
        last = chat.messages[-1].get("role") == "assistant"
        return [Prepared(record, text, spans, last)] if text else _empty(record)
    out = []
    for turn, (text, spans) in enumerate(texts, start=1):
        if not text:
            return _empty(record)
        if len(spans) != turn:
            return record.fail(
                f"each_turn: the chat template renders the chat up to assistant turn {turn} "
                f"with {len(spans)} trained span(s), not {turn}: its turns cannot be told apart"
                " (a template whose generation blocks do not wrap each assistant message)"
            )
        out.append(Prepared(record, text, spans[-1:], True))
    return out


def _empty(record: Record) -> InvalidRecordError:
    return record.fail("the chat template rendered an empty text")


def finish_tree(
    chunk: List[Prepared],
    encoded: Sequence[Pair],
    stats: TokenizeStats,
    grpo: bool,
    with_eos: Callable[[Prepared, np.ndarray, np.ndarray], Pair],
    apply_max_len: Callable[[Record, np.ndarray, np.ndarray, TokenizeStats], List[Pair]],
) -> Optional[Tuple[Tokens, List[Record]]]:
    """The chunk's tree sequences (with ``grpo``: each record's texts are its prompt, then its
    completions; else each text is a sequence), each after ``with_eos`` and ``apply_max_len``
    (which keeps or drops it whole: ``split`` is refused for trees), with their records."""
    sequences: List[Pair] = []
    records: List[Record] = []
    columns = {c: [] for c in PER_COMPLETION.values()} if grpo else {}  # type: Dict[str, list]
    prompt: Optional[np.ndarray] = None
    last: Optional[Record] = None
    turn = 0
    for item, (ids, labels) in zip(chunk, encoded):
        record = item.record
        if record is not last:
            last, turn = record, 0
            stats.samples_in += 1
            if grpo:
                prompt = ids
                continue
        if grpo:
            assert prompt is not None
            labels = ids.copy()
            labels[: common_prefix(prompt, ids)] = IGNORE_INDEX
        else:
            ids, labels = with_eos(item, ids, labels)
        stats.sequences += 1
        for kept in apply_max_len(record, ids, labels, stats):
            sequences.append(kept)
            records.append(record)
            for name, values in columns.items():
                given = (record.values or {}).get(name)
                values.append(None if given is None else given[turn])
        turn += 1
    if not sequences:
        return None
    done = Tokens.from_pairs(sequences)
    done.kind = "tree"
    done.groups = np.fromiter((r.index for r in records), np.int64, len(records))
    done.carried = columns
    return done, records


def common_prefix(ids: np.ndarray, other: np.ndarray) -> int:
    """How many leading tokens the two share."""
    n = min(len(ids), len(other))
    differ = np.flatnonzero(ids[:n] != other[:n])
    return int(differ[0]) if len(differ) else n
