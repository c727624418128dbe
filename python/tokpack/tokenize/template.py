"""Chat template rendering with the semantics of transformers' ``apply_chat_template``
(``add_generation_prompt=False`` unless a preference prompt asks for it): the same sandboxed
Jinja environment (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``,
``tojson``, ``strftime_now``, guarded ``dict``/``namespace``), the tokenizer config's special
tokens as variables, ``tools`` and ``documents`` set to None, and ``{% generation %}`` blocks
tracked exactly as transformers tracks them. The template is compiled once per run; each
conversation is rendered once (twice for templates without generation markers, see
:meth:`ChatTemplate.trained_spans`).

Batches of conversations (:meth:`ChatTemplate.trained_spans_many`) are rendered in Rust
(``tokpack-core``'s ``template``, minijinja with transformers' extensions) when the template
compiles there and renders a fixed set of probe conversations exactly as this module does
(decided once, when the template is loaded: :attr:`ChatTemplate.renderer_info`); a
conversation the Rust renderer does not render (an error, ``raise_exception``, data it does
not take) is rendered here, which gives the same text or the error the user sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import ConfigError, InputNotFoundError, InvalidRecordError
from .formats import Record

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "resolve_template", "TRAIN_ON", "RENDERERS"]

TRAIN_ON = ("assistant", "all", "last")

# "auto": the Rust renderer when it passes the parity probe; "python": always this module.
RENDERERS = ("auto", "python")

# A conversation rendered: its text and trained character spans, or why it is invalid.
Spans = List[Tuple[int, int]]
Rendered = Union[Tuple[str, Spans], InvalidRecordError]

# The built-in fallback for tokenizers without a chat template: ChatML, with generation markers
# around each assistant turn's content and its end-of-turn token.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Conversations the Rust renderer must render exactly as Jinja (or refuse) before it is used:
# the shapes chat templates branch on (system prompts, alternation, a final user turn, tool
# calls with dict and string arguments, tool results, reasoning, <think> blocks, whitespace,
# quotes and non-ASCII text, numbers and booleans printed from the data).
_TOOL_CALL = {
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 3, "metric": True}},
}
PROBE_CONVERSATIONS: Tuple[List[Dict[str, Any]], ...] = (
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I?"}],
    [
        {"role": "system", "content": "You are terse.\n"},
        {"role": "user", "content": "  2+2? "},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 'quoted' \"text\" \\ {braces} <tags>?"},
        {"role": "assistant", "content": " Sure: 'a' and \"b\".\n\n"},
    ],
    [
        {"role": "user", "content": "Pense à l'été 東京 🙂"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nD'accord."},
        {"role": "user", "content": "Encore"},
    ],
    [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [_TOOL_CALL]},
        {"role": "tool", "name": "get_weather", "content": '{"temp": 21.5, "sky": "clear"}'},
        {"role": "assistant", "content": "21.5 °C and clear."},
    ],
    [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because.", "reasoning_content": "Short answer."},
        {"role": "user", "content": "Ok"},
        {
            "role": "assistant",
            "content": "Done",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": [1, 2.5, null, false]}'},
                }
            ],
        },
    ],
    [{"role": "user", "content": "only a question"}],
)

_GENERATION_RE = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
# Private-use characters that bracket assistant contents in the locating render.
_OPEN, _CLOSE = "\ue000", "\ue001"


def resolve_template(
    template_dict_or_str: Optional[Union[str, Mapping[str, str]]],
    chat_template_file: Optional[Union[str, os.PathLike]],
) -> Tuple[str, Dict[str, Any]]:
    """The template source to use and its description for the manifest:
    ``--chat-template FILE`` > the tokenizer config's template > built-in ChatML."""
    if chat_template_file is not None:
        path = Path(chat_template_file)
        try:
            source = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputNotFoundError(f"{path}: no such chat template file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputNotFoundError(f"{path}: cannot read chat template ({exc})") from None
        return source, {"source": "file", "path": str(path.resolve())}
    if isinstance(template_dict_or_str, str):
        return template_dict_or_str, {"source": "tokenizer_config"}
    if isinstance(template_dict_or_str, Mapping):
        if "default" not in template_dict_or_str:
            raise ConfigError(
                "the tokenizer config has several chat templates and no 'default' one "
                f"({', '.join(sorted(template_dict_or_str))}); pass --chat-template FILE"
            )
        return template_dict_or_str["default"], {"source": "tokenizer_config", "name": "default"}
    return CHATML_TEMPLATE, {"source": "builtin-chatml"}


@dataclass
class _Tracker:
    """Where the render currently is, so generation blocks can record their character span."""

    active: bool = False
    pos: int = 0
    spans: List[Tuple[int, int]] = field(default_factory=list)


def _compile(source: str, tracker: _Tracker):
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ConfigError(
            "chat templates need the 'jinja2' package: pip install 'tokpack[tokenize]'"
        ) from None

    class GenerationTracker(jinja2.ext.Extension):
        # ``{% generation %}...{% endgeneration %}`` renders its body unchanged and, as in
        # transformers, records the body's span at the position the output has reached.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(
                lineno
            )

        def _generation(self, caller):
            rv = caller()
            if tracker.active:
                tracker.spans.append((tracker.pos, tracker.pos + len(rv)))
            return rv

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # Namespaces refuse underscore attributes so templates cannot reach CPython internals.
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot set underscore attributes on a namespace ({name!r})"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ConfigError(
            f"chat template: syntax error on line {exc.lineno}: {exc.message}"
        ) from None


class ChatTemplate:
    """A compiled chat template and the spans of a conversation that are trained on."""

    def __init__(
        self,
        source: str,
        variables: Mapping[str, str],
        special_token_strings: Sequence[str] = (),
        renderer: str = "auto",
        train_on: str = "assistant",
    ) -> None:
        self.source = source
        self.hash = hashlib.blake2b(source.encode("utf-8"), digest_size=16).hexdigest()
        self.has_generation = bool(_GENERATION_RE.search(source))
        self._variables = dict(variables)
        self._specials = tuple(sorted(special_token_strings, key=len, reverse=True))
        self._tracker = _Tracker()
        self._template = _compile(source, self._tracker)
        # The Rust renderer for ``train_on`` (None: every conversation renders here), and
        # which renderer runs, with the reason when it is Python (for the manifest).
        self.rust: Any = None
        if renderer == "python":
            self.renderer_info: Dict[str, Any] = {"name": "python", "reason": "requested"}
        else:
            self.rust, self.renderer_info = self._rust_renderer(train_on)

    def render(
        self, messages: List[Dict[str, Any]], record: Record, add_generation_prompt: bool = False
    ) -> str:
        """The rendered conversation (as ``apply_chat_template(tokenize=False)``)."""
        try:
            return self._template.render(self._context(messages, add_generation_prompt))
        except Exception as exc:  # raise_exception() and any failure of template code
            raise record.fail(f"chat template failed: {exc}") from None

    def _context(self, messages: List[Dict[str, Any]], add_generation_prompt: bool) -> dict:
        """The template's variables, as ``apply_chat_template`` passes them."""
        return dict(
            messages=_alias_reasoning(messages),
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._variables,
        )

    def render_tracked(
        self, messages: List[Dict[str, Any]], record: Record
    ) -> Tuple[str, List[Tuple[int, int]]]:
        """The rendered conversation and the character spans of its generation blocks."""
        tracker = self._tracker
        tracker.pos = 0
        tracker.spans = []
        blocks = []
        tracker.active = True
        try:
            for block in self._template.generate(self._context(messages, False)):
                blocks.append(block)
                tracker.pos += len(block)
        except Exception as exc:
            raise record.fail(f"chat template failed: {exc}") from None
        finally:
            tracker.active = False
        return "".join(blocks), tracker.spans

    def trained_spans(
        self, messages: List[Dict[str, Any]], train_on: str, record: Record
    ) -> Tuple[str, List[Tuple[int, int]]]:
        """The rendered text and the character spans to train on, in order.

        ``assistant``: with generation markers, every generation block (what transformers'
        ``return_assistant_tokens_mask`` marks); without, every assistant message's content plus
        the special token right after it (its end-of-turn token). ``last``: only the final one.
        ``all``: the whole text.
        """
        if train_on == "all":
            text = self.render(messages, record)
            return text, [(0, len(text))]
        if self.has_generation:
            text, spans = self.render_tracked(messages, record)
            spans = [s for s in spans if s[1] > s[0]]
        else:
            text = self.render(messages, record)
            spans = self._content_spans(messages, text, record)
        if train_on == "last":
            spans = spans[-1:]
        return text, spans

    def trained_spans_many(
        self,
        conversations: Sequence[Tuple[List[Dict[str, Any]], Record]],
        train_on: str,
    ) -> List[Rendered]:
        """:meth:`trained_spans` of each ``(messages, record)``, in order; a conversation that
        fails is returned as its :class:`InvalidRecordError`. One call to the Rust renderer
        renders the batch (GIL released; it reads the messages as plain data and aliases
        reasoning as :func:`_alias_reasoning` does); what it leaves is rendered here."""
        out = _rust_rendered(self.rust, [m for m, _ in conversations], train_on)[0]
        return _in_python(out, conversations, lambda m, r: self.trained_spans(m, train_on, r))

    def render_many(
        self,
        conversations: Sequence[Tuple[List[Dict[str, Any]], Record]],
        add_generation_prompt: bool = False,
    ) -> List[Union[str, InvalidRecordError]]:
        """:meth:`render` of each ``(messages, record)``, in order, as
        :meth:`trained_spans_many` renders them (Rust, then Python for what it leaves)."""
        rendered, _ = _rust_rendered(
            self.rust, [m for m, _ in conversations], "plain", add_generation_prompt
        )
        out = [None if r is None else r[0] for r in rendered]
        return _in_python(out, conversations, lambda m, r: self.render(m, r, add_generation_prompt))

    def _rust_renderer(self, train_on: str) -> Tuple[Any, Dict[str, Any]]:
        """The Rust renderer when it compiles this template and renders every probe
        conversation as this module does (text and spans for ``train_on``); else None with
        the reason."""
        from .. import _tokpack

        rust, why = _tokpack.ChatRenderer.compile(
            source=self.source,
            variables=list(self._variables.items()),
            special_tokens=list(self._specials),
            utc_offset=time.localtime().tm_gmtoff,
        )
        if rust is None:
            return None, {"name": "python", "reason": why}
        # Each probe conversation with the run's spans, and as plain text with and without the
        # generation prompt (preference prompts and completions).
        rendered_any = False
        first_error = None
        for mode, prompt in ((train_on, False), ("plain", False), ("plain", True)):
            rendered, errors = _rust_rendered(rust, PROBE_CONVERSATIONS, mode, prompt)
            first_error = first_error or next((e for e in errors if e), None)
            for i, (messages, got) in enumerate(zip(PROBE_CONVERSATIONS, rendered)):
                if got is None:
                    continue  # rendered by Python at run time too
                record = Record("<parity probe>", i + 1, False, None, None)
                try:
                    if mode == "plain":
                        got, want = got[0], self.render(messages, record, prompt)  # type: ignore[assignment]
                    else:
                        want = self.trained_spans(messages, train_on, record)  # type: ignore[assignment]
                except InvalidRecordError:
                    want = None
                if got != want:  # type: ignore[comparison-overlap]
                    return None, {
                        "name": "python",
                        "reason": f"the Rust renderer differs from Jinja on probe conversation "
                        f"{i} ({mode}{', generation prompt' if prompt else ''})",
                    }
                rendered_any = True
        if not rendered_any:
            reason = first_error or "no probe conversation rendered"
            return None, {"name": "python", "reason": f"the Rust renderer failed: {reason}"}
        return rust, {"name": "rust"}

    def _content_spans(
        self, messages: List[Dict[str, Any]], text: str, record: Record
    ) -> List[Tuple[int, int]]:
        # Render again with each assistant content bracketed by private-use markers; removing
        # the markers must give the same text, and their positions are the content spans. A
        # template that rewrites content (a trim that changes it, say) fails the check.
        targets = [
            i
            for i, m in enumerate(messages)
            if m.get("role") == "assistant" and isinstance(m.get("content"), str)
        ]
        if not targets:
            return []
        marked = list(messages)
        for i in targets:
            content = messages[i]["content"]
            if _OPEN in content or _CLOSE in content:
                raise record.fail("message content holds private-use characters U+E000/U+E001")
            marked[i] = {**messages[i], "content": _OPEN + content + _CLOSE}
        marked_text = self.render(marked, record)
        # Each marked content (the markers alone in pairs around them): its span once the
        # 2 * k markers before the k-th pair are removed.
        found = list(re.finditer(f"{_OPEN}[^{_OPEN}{_CLOSE}]*{_CLOSE}", marked_text))
        markers = marked_text.count(_OPEN) + marked_text.count(_CLOSE)
        unmarked = marked_text.replace(_OPEN, "").replace(_CLOSE, "")
        spans = [(m.start() - 2 * k, m.end() - 2 * k - 2) for k, m in enumerate(found)]
        if markers != 2 * len(found) or len(spans) != len(targets) or unmarked != text:
            raise record.fail(
                "cannot locate the assistant turns in the rendered chat (the template changes or "
                "repeats their content); add {% generation %} markers to the template or train "
                "on 'all'"
            )
        # Each span with the special token right after it (the specials are longest first).
        return [
            (a, b + next((len(t) for t in self._specials if text.startswith(t, b)), 0))
            for a, b in spans
        ]


def _alias_reasoning(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    # As transformers: reasoning given under an older name is also passed as
    # ``reasoning_content`` (the standard name) and ``thinking`` (read by gpt-oss templates).
    out = messages
    for i, message in enumerate(messages):
        for key in ("reasoning_content", "thinking", "reasoning"):
            value = message.get(key)
            if value is not None:
                if out is messages:
                    out = list(messages)
                out[i] = {"thinking": value, **message, "reasoning_content": value}
                break
    return out


def _rust_rendered(
    rust: Any, conversations: Sequence[List[Dict[str, Any]]], mode: str, prompt: bool = False
) -> Tuple[List[Optional[Tuple[str, Spans]]], List[Optional[str]]]:
    """The Rust renderer's text and spans (``mode``; ``prompt``: the generation prompt) of each
    conversation, None where it leaves one to Python (each one without ``rust``); and errors."""
    if rust is None or not conversations:
        return [None] * len(conversations), []
    texts, offsets, starts, ends, errors = rust.render_batch(
        conversations=list(conversations), mode=mode, add_generation_prompt=prompt, threads=1
    )
    bounds, starts, ends = offsets.tolist(), starts.tolist(), ends.tolist()
    spans = [list(zip(starts[a:b], ends[a:b])) for a, b in zip(bounds, bounds[1:])]
    return [None if t is None else (t, s) for t, s in zip(texts, spans)], errors


def _in_python(out: List[Any], conversations: Sequence[Tuple[Any, Record]], render: Any) -> Any:
    """``out`` with what the Rust renderer left (None) rendered by ``render(messages, record)``
    in Python; a rejected conversation's InvalidRecordError takes its place."""
    for i, done in enumerate(out):
        if done is None:
            messages, record = conversations[i]
            try:
                out[i] = render(messages, record)
            except InvalidRecordError as exc:
                out[i] = exc
    return out
