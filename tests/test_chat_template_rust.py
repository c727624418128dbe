"""The Rust chat template renderer (``tokpack-core``'s ``template``, used by ``tokenize``)
against transformers' own rendering: the chat templates of widely used model families
(``tests/chat_templates/*.jinja``) on generated conversations (system prompts, multi-turn,
tool calls, reasoning), the same texts and generation spans as ``apply_chat_template``, the
same ids and labels through ``tokenize``, and the fallback to Python where it cannot."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import tokpack
from tokpack import _tokpack
from tokpack.tokenize.template import PROBE_CONVERSATIONS, ChatTemplate

from ._tokenizer_factory import WORDS, build_tokenizer, write_jsonl

pytest.importorskip("transformers")
from transformers import PreTrainedTokenizerFast  # noqa: E402
from transformers.utils.chat_template_utils import render_jinja_template  # noqa: E402

TEMPLATES = Path(__file__).parent / "chat_templates"
SPECIALS = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

# What each template's conversations may hold: a system prompt, tool calls (with arguments as
# a dict, or as a JSON string only), tool results, reasoning, roles that must alternate.
FEATURES = {
    "llama3": {"tools": "single", "args": "dict"},
    "qwen2_5": {"tools": "many", "args": "dict"},
    "qwen3": {"tools": "many", "args": "dict", "reasoning": True},
    "mistral": {"alternate": True},
    "gemma": {"alternate": True, "no_system": True},
    "phi3": {},
    "phi4": {},
    "smollm2": {},
    "zephyr": {},
    "deepseek_r1": {"tools": "many", "args": "str", "reasoning": True},
    "chatml_generation": {"reasoning": True},
    "python_features": {"tools": "many", "args": "dict"},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city, in °C.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": 'The time "now".'}},
]


def source(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def text(rng: random.Random, lo: int = 1, hi: int = 14) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
    return rng.choice(["", "", "", " ", "\n", "'", '"']) + words + rng.choice(["", "", ".", "?\n"])


def tool_call(rng: random.Random, args: str) -> dict:
    arguments = {"city": rng.choice(["Zürich", "東京", "Paris"]), "days": rng.randint(1, 9)}
    if rng.random() < 0.3:
        arguments["metric"] = rng.random() < 0.5
        arguments["ratio"] = rng.choice([0.5, 1e-7, 2.0, 1e21])
    if args == "str" or (args == "any" and rng.random() < 0.5):
        arguments = json.dumps(arguments)
    return {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def conversation(rng: random.Random, features: dict) -> list:
    messages = []
    if not features.get("no_system") and rng.random() < 0.5:
        messages.append({"role": "system", "content": text(rng, 2, 10)})
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": text(rng)})
        if turn > 0 and rng.random() < 0.1 and not features.get("alternate"):
            messages.append({"role": "user", "content": text(rng)})
        tools = features.get("tools")
        if tools and rng.random() < 0.35:
            calls = [tool_call(rng, features["args"])]
            if tools == "many" and rng.random() < 0.4:
                calls.append(tool_call(rng, features["args"]))
            messages.append({"role": "assistant", "content": text(rng, 0, 4), "tool_calls": calls})
            for _ in calls:
                messages.append({"role": "tool", "content": json.dumps({"temp": 21.5})})
        reply = {"role": "assistant", "content": text(rng, 1, 20)}
        if features.get("reasoning") and rng.random() < 0.4:
            if rng.random() < 0.5:
                reply["reasoning_content"] = text(rng)
            else:
                reply["content"] = "<think>\n" + text(rng) + "\n</think>\n\n" + reply["content"]
        messages.append(reply)
    if rng.random() < 0.25:
        messages.append({"role": "user", "content": text(rng)})
    return messages


def conversations(name: str, n: int, seed: int = 0) -> list:
    rng = random.Random(f"{name}-{seed}")
    return [conversation(rng, FEATURES[name]) for _ in range(n)]


def hf_render(name, messages, tools=None, add_generation_prompt=False, spans=False):
    """transformers' text (and generation spans), or None when it raises."""
    try:
        texts, indices = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=source(name),
            add_generation_prompt=add_generation_prompt,
            return_assistant_tokens_mask=spans,
            **SPECIALS,
        )
    except Exception:
        return None
    return (texts[0], [tuple(s) for s in indices[0]]) if spans else texts[0]


def rust(name, tools=None):
    renderer, why = _tokpack.ChatRenderer.compile(
        source=source(name),
        variables=list(SPECIALS.items()),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        utc_offset=0,
        tools=tools,
    )
    assert renderer is not None, why
    return renderer


@pytest.mark.parametrize("name", sorted(FEATURES))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_rendered_text_equals_transformers(name, add_generation_prompt):
    """Each template on 150 conversations, with and (where the template reads them) without
    tools: the Rust text equals transformers' wherever transformers renders, and the Rust
    renderer refuses where transformers raises (raise_exception, a str + dict, ...)."""
    tool_sets = [None, TOOLS] if FEATURES[name].get("tools") else [None]
    convs = conversations(name, 150)
    for tools in tool_sets:
        texts, *_, errors = rust(name, tools).render_batch(
            conversations=convs,
            mode="plain",
            add_generation_prompt=add_generation_prompt,
            threads=2,
        )
        rendered = 0
        for messages, got, error in zip(convs, texts, errors):
            want = hf_render(name, messages, tools, add_generation_prompt)
            assert got == want, (messages, error)
            rendered += got is not None
        assert rendered >= len(convs) // 2


def test_generation_spans_equal_transformers_assistant_indices():
    convs = conversations("chatml_generation", 200, seed=1)
    texts, offsets, starts, ends, _ = rust("chatml_generation").render_batch(
        conversations=convs, mode="assistant"
    )
    for i, messages in enumerate(convs):
        want_text, want_spans = hf_render("chatml_generation", messages, spans=True)
        got = list(zip(starts[offsets[i] : offsets[i + 1]], ends[offsets[i] : offsets[i + 1]]))
        assert texts[i] == want_text
        assert got == [s for s in want_spans if s[1] > s[0]]


@pytest.mark.parametrize("train_on", ["assistant", "last", "all"])
@pytest.mark.parametrize("name", sorted(FEATURES))
def test_spans_equal_the_python_renderer(name, train_on):
    """Texts and trained spans of ``ChatTemplate.trained_spans_many`` are the same with the
    Rust renderer and without it, invalid conversations failing alike."""
    variables = dict(SPECIALS)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    fast = ChatTemplate(source(name), variables, specials, train_on=train_on)
    slow = ChatTemplate(source(name), variables, specials, renderer="python", train_on=train_on)
    assert fast.renderer_info == {"name": "rust"}, fast.renderer_info
    assert slow.rust is None and slow.renderer_info["name"] == "python"
    records = [
        tokpack.tokenize.formats.Record("x.jsonl", i + 1, False, None, None) for i in range(120)
    ]
    items = list(zip(conversations(name, 120, seed=2), records))
    got, want = fast.trained_spans_many(items, train_on), slow.trained_spans_many(items, train_on)
    assert [str(x) if isinstance(x, Exception) else x for x in got] == [
        str(x) if isinstance(x, Exception) else x for x in want
    ]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "base", None)


def tokenizer_dir(tok: Path, tmp: Path, name: str) -> Path:
    out = tmp / name
    out.mkdir()
    shutil.copy(tok / "tokenizer.json", out / "tokenizer.json")
    config = {**SPECIALS, "chat_template": source(name)}
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def table(stream):
    return pa.Table.from_batches(list(stream), schema=tokpack.tokenize.TOKEN_SCHEMA)


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_tokenize_ids_and_labels_equal_with_either_renderer(tmp_path, tok, name):
    """``tokenize`` through the Rust renderer: ids equal transformers' ``apply_chat_template``
    (tokenize=True), and ids, labels, counts and rejections equal the Python renderer's, for
    1 and 2 worker processes; the manifest says the Rust renderer ran."""
    directory = tokenizer_dir(tok, tmp_path, name)
    convs = conversations(name, 120, seed=3)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in convs])
    # The feature template rewrites every content: only 'all' locates what to train.
    train_on = "all" if name == "python_features" else "assistant"
    runs = {}
    for renderer, threads in (("auto", 1), ("auto", 2), ("python", 1)):
        stream = tokpack.tokenize_to_batches(
            data,
            directory,
            renderer=renderer,
            threads=threads,
            skip_invalid=True,
            batch_size=32,
            train_on=train_on,
        )
        runs[renderer, threads] = (table(stream), stream)
    fast, fast_stream = runs["auto", 1]
    slow, slow_stream = runs["python", 1]
    assert fast_stream.renderer_info == {"name": "rust", "records": "rust"}
    assert slow_stream.renderer_info == {"name": "python", "reason": "requested"}
    assert runs["auto", 2][0].equals(fast)
    assert slow.equals(fast)
    assert fast_stream.stats == slow_stream.stats
    assert fast_stream.rejected == slow_stream.rejected
    hf = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), **SPECIALS)
    rejected = {r["line"] for r in fast_stream.rejected}
    kept = [m for i, m in enumerate(convs) if i + 1 not in rejected]
    assert len(kept) == fast.num_rows
    for messages, ids in zip(kept, fast.column("input_ids").to_pylist()):
        want = hf.apply_chat_template(
            messages, chat_template=source(name), tokenize=True, return_dict=False
        )
        assert ids == list(want)
    assert fast.num_rows >= 10
    assert any(x != -100 for labels in fast.column("labels").to_pylist() for x in labels)


@pytest.mark.parametrize("name", ["qwen3", "mistral", "chatml_generation"])
def test_preference_conversations_equal_with_either_renderer(tmp_path, tok, name):
    """Conversational preference records: prompts rendered with the generation prompt and
    prompt + completion, in Rust, give the Python renderer's samples and rejections."""
    directory = tokenizer_dir(tok, tmp_path, name)
    records = []
    for messages in conversations(name, 60, seed=4):
        cut = max(i for i, m in enumerate(messages) if m["role"] != "assistant") + 1
        reply = {"role": "assistant", "content": "yes"}
        records.append(
            {"prompt": messages[:cut], "chosen": [reply], "rejected": [{**reply, "content": "no"}]}
        )
    data = write_jsonl(tmp_path / "pref.jsonl", records)
    out = {}
    for renderer in ("auto", "python"):
        stream = tokpack.tokenize_to_batches(
            data, directory, renderer=renderer, skip_invalid=True, batch_size=16
        )
        batches = list(stream)
        out[renderer] = (pa.Table.from_batches(batches), stream)
    assert out["auto"][1].renderer_info == {"name": "rust"}
    assert out["auto"][0].equals(out["python"][0])
    assert out["auto"][0].num_rows >= 10
    assert out["auto"][1].rejected == out["python"][1].rejected


def test_manifest_names_the_renderer_and_cache_key_ignores_it(tmp_path, tok):
    directory = tokenizer_dir(tok, tmp_path, "qwen2_5")
    records = [{"messages": m} for m in conversations("qwen2_5", 20)]
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    first = tokpack.tokenize_files([data], tmp_path / "out", directory, skip_invalid=True)
    assert first["renderer"] == {"name": "rust", "records": "rust"}
    again = tokpack.tokenize_files(
        [data], tmp_path / "out", directory, skip_invalid=True, renderer="python"
    )
    assert again.get("cache_hit") and again["renderer"] == first["renderer"]


def test_probe_falls_back_to_python_when_the_rust_text_differs():
    """minijinja keeps ``\\N{...}`` escapes in string literals, which Python's Jinja decodes:
    the probe sees the difference and the run renders in Python, saying why."""
    template = '{% for m in messages %}{{ m.content + "\\N{EM DASH}" }}{% endfor %}'
    chat = ChatTemplate(template, SPECIALS, [], train_on="all")
    assert chat.rust is None
    assert chat.renderer_info["name"] == "python"
    assert "differs" in chat.renderer_info["reason"]


def test_template_the_rust_renderer_refuses_falls_back_to_python():
    # Its marker characters in the template itself: Rust refuses it when compiling.
    chat = ChatTemplate("{{ '\ue002' + messages[0].content }}", SPECIALS, [], train_on="all")
    assert chat.rust is None
    assert chat.renderer_info["name"] == "python"
    assert "private-use" in chat.renderer_info["reason"]


def test_conversations_the_rust_renderer_leaves_are_rendered_in_python():
    """Marker characters in the data, values JSON does not hold (a tuple, an int beyond 64
    bits): rendered by Python, with Python's text (the template prints every field)."""
    chat = ChatTemplate(source("python_features"), SPECIALS, ["<|im_end|>"], train_on="all")
    assert chat.rust is not None
    record = tokpack.tokenize.formats.Record("x.jsonl", 1, False, None, None)
    odd = [
        [{"role": "user", "content": "a\ue002b"}, {"role": "assistant", "content": "ok"}],
        [{"role": "user", "content": "hi", "pair": (1, 2)}, {"role": "assistant", "content": "x"}],
        [{"role": "user", "content": "hi", "n": 2**70}, {"role": "assistant", "content": "x"}],
        [
            {"role": "user", "content": "hi", "f": float("nan")},
            {"role": "assistant", "content": "x"},
        ],
    ]
    got = chat.trained_spans_many([(m, record) for m in odd], "all")
    assert got == [chat.trained_spans(m, "all", record) for m in odd]
    assert "(1, 2)" in got[1][0] and str(2**70) in got[2][0] and "nan" in got[3][0]


def test_probe_conversations_render_in_rust_for_every_template():
    for name in FEATURES:
        renderer = rust(name)
        texts, *_ = renderer.render_batch(conversations=list(PROBE_CONVERSATIONS), mode="plain")
        for messages, got in zip(PROBE_CONVERSATIONS, texts):
            assert got == hf_render(name, messages), name


def test_tools_with_marker_characters_are_refused():
    renderer, why = _tokpack.ChatRenderer.compile(
        source=source("qwen2_5"),
        variables=list(SPECIALS.items()),
        special_tokens=[],
        utc_offset=0,
        tools=[{"type": "function", "function": {"name": "a\ue003"}}],
    )
    assert renderer is None and "private-use" in why
