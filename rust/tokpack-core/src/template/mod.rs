//! Chat templates rendered in Rust with the semantics of transformers' `apply_chat_template`
//! (see [`env`]), and the character spans a conversation is trained on, as
//! `tokpack.tokenize.template.ChatTemplate.trained_spans` finds them in Python:
//! `{% generation %}` blocks (rewritten into a filter block that brackets its output with
//! marker characters), or each assistant content located by rendering it between markers.
//!
//! A conversation this renderer cannot render (a template error, `raise_exception`, marker
//! characters in the data, ...) is reported as failed; the caller renders it in Python, which
//! gives the same text or the error message the user sees.

mod data;
mod env;
mod pyfmt;

pub use data::Data;
pub use pyfmt::float_repr;

use indexmap::IndexMap;
use minijinja::value::Value;
use minijinja::Environment;
use rayon::prelude::*;

/// Brackets of a generation block's output in the marked render.
const GEN_OPEN_CLOSE: (char, char) = ('\u{E002}', '\u{E003}');
/// Brackets of each assistant content in the locating render (the characters Python uses).
const CONTENT_OPEN_CLOSE: (char, char) = ('\u{E000}', '\u{E001}');
const TEMPLATE_NAME: &str = "chat";
/// UTF-8 length of each marker character.
const MARKER_BYTES: usize = 3;

/// What to render and which spans to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every generation block, or every assistant content and the special token after it.
    Assistant,
    /// Only the last of those.
    Last,
    /// The whole text as one span.
    All,
    /// The text only (no spans), with or without the generation prompt.
    Plain { add_generation_prompt: bool },
}

impl Mode {
    /// `"assistant"`, `"last"`, `"all"`, `"plain"` (with `add_generation_prompt` for plain).
    pub fn parse(name: &str, add_generation_prompt: bool) -> Option<Self> {
        Some(match name {
            "assistant" => Mode::Assistant,
            "last" => Mode::Last,
            "all" => Mode::All,
            "plain" => Mode::Plain {
                add_generation_prompt,
            },
            _ => return None,
        })
    }
}

/// A rendered conversation and its trained character spans (half-open, in characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub spans: Vec<(i64, i64)>,
}

/// A compiled chat template with the variables transformers passes besides the messages.
pub struct ChatTemplate {
    env: Environment<'static>,
    has_generation: bool,
    /// `bos_token`, `eos_token`, ... as the tokenizer config gives them.
    variables: Vec<(String, Value)>,
    /// The tokenizer's special token strings, longest first (end-of-turn detection).
    specials: Vec<String>,
    tools: Value,
}

impl ChatTemplate {
    /// Compiles `source`; `utc_offset`: seconds east of UTC for `strftime_now`. An error
    /// says why this renderer cannot take the template (the caller renders in Python).
    pub fn new(
        source: &str,
        variables: Vec<(String, String)>,
        specials: Vec<String>,
        utc_offset: i64,
    ) -> Result<Self, String> {
        if data::has_marker(source) || variables.iter().any(|(_, v)| data::has_marker(v)) {
            return Err("the template holds private-use characters U+E000..U+E003".into());
        }
        let (rewritten, has_generation) = rewrite_generation(source);
        let mut env = env::environment(utc_offset);
        env.add_template_owned(TEMPLATE_NAME, rewritten)
            .map_err(|e| format!("minijinja cannot compile the template: {e}"))?;
        Ok(Self {
            env,
            has_generation,
            variables: variables
                .into_iter()
                .map(|(k, v)| (k, Value::from(v)))
                .collect(),
            specials,
            tools: Value::from(()),
        })
    }

    /// Passes `tools` to the template instead of None (refused when they hold marker
    /// characters, as conversations are).
    pub fn set_tools(&mut self, tools: &Data) -> Result<(), String> {
        if tools.has_marker() {
            return Err("the tools hold private-use characters U+E000..U+E003".into());
        }
        self.tools = tools.to_value();
        Ok(())
    }

    /// Whether the template has `{% generation %}` blocks.
    pub fn has_generation(&self) -> bool {
        self.has_generation
    }

    /// Renders with the variables transformers passes: `messages`, `tools`, `documents`,
    /// `add_generation_prompt` and the special tokens.
    fn render_value(&self, messages: Value, add_generation_prompt: bool) -> Result<String, String> {
        let mut context = IndexMap::with_capacity(self.variables.len() + 4);
        for (k, v) in &self.variables {
            context.insert(Value::from(k.as_str()), v.clone());
        }
        context.insert(Value::from("messages"), messages);
        context.insert(Value::from("tools"), self.tools.clone());
        context.insert(Value::from("documents"), Value::from(()));
        let add = Value::from(add_generation_prompt);
        context.insert(Value::from("add_generation_prompt"), add);
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| e.to_string())?;
        template
            .render(Value::from(context))
            .map_err(|e| format!("chat template failed: {e}"))
    }

    /// One conversation: the list of its messages.
    pub fn render(&self, messages: &[Data], mode: Mode) -> Result<Rendered, String> {
        if messages.iter().any(Data::has_marker) {
            return Err("the conversation holds private-use characters U+E000..U+E003".into());
        }
        let messages = data::messages_value(messages);
        let add_generation_prompt = matches!(
            mode,
            Mode::Plain {
                add_generation_prompt: true
            }
        );
        let marked = self.render_value(messages.clone(), add_generation_prompt)?;
        let tracked = self.has_generation && matches!(mode, Mode::Assistant | Mode::Last);
        let (text, mut spans) = split_markers(&marked, GEN_OPEN_CLOSE, tracked)
            .ok_or("generation blocks are nested or unbalanced")?;
        if text.is_empty() {
            return Err("the chat template rendered an empty text".into());
        }
        match mode {
            Mode::Plain { .. } => spans.clear(),
            Mode::All => spans = vec![(0, text.chars().count() as i64)],
            Mode::Assistant | Mode::Last => {
                if tracked {
                    spans.retain(|(a, b)| b > a);
                } else {
                    spans = self.content_spans(&messages, &text)?;
                }
                if mode == Mode::Last && spans.len() > 1 {
                    spans.drain(..spans.len() - 1);
                }
            }
        }
        Ok(Rendered { text, spans })
    }

    /// Each assistant content's span plus the special token right after it, found by
    /// rendering the contents between markers (the Python algorithm, step by step).
    fn content_spans(&self, messages: &Value, text: &str) -> Result<Vec<(i64, i64)>, String> {
        let (open, close) = CONTENT_OPEN_CLOSE;
        let mut targets = 0;
        let mut marked = Vec::new();
        for message in messages.try_iter().map_err(|e| e.to_string())? {
            let attr = |name| message.get_attr(name).ok();
            let is_target = attr("role").is_some_and(|r| r.as_str() == Some("assistant"))
                && attr("content").is_some_and(|c| c.as_str().is_some());
            if !is_target {
                marked.push(message);
                continue;
            }
            targets += 1;
            let mut copy = IndexMap::new();
            for key in message.try_iter().map_err(|e| e.to_string())? {
                let mut item = message.get_item(&key).map_err(|e| e.to_string())?;
                if key.as_str() == Some("content") {
                    item = Value::from(format!(
                        "{open}{}{close}",
                        item.as_str().unwrap_or_default()
                    ));
                }
                copy.insert(key, item);
            }
            marked.push(Value::from(copy));
        }
        if targets == 0 {
            return Ok(Vec::new());
        }
        let rendered = self.render_value(Value::from(marked), false)?;
        // Generation markers (none in a template without generation blocks) are not expected.
        let (unmarked, spans) = split_markers(&rendered, CONTENT_OPEN_CLOSE, true)
            .filter(|(t, s)| t == text && s.len() == targets)
            .ok_or(
                "cannot locate the assistant turns in the rendered chat (the template changes \
                 or repeats their content)",
            )?;
        debug_assert_eq!(unmarked, text);
        let char_starts: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
        Ok(spans
            .into_iter()
            .map(|(a, b)| {
                let byte = char_starts.get(b as usize).copied().unwrap_or(text.len());
                (a, b + self.special_at(&text[byte..]))
            })
            .collect())
    }

    /// Characters of the special token `rest` starts with (the longest first), or 0.
    fn special_at(&self, rest: &str) -> i64 {
        self.specials
            .iter()
            .find(|t| rest.starts_with(t.as_str()))
            .map_or(0, |t| t.chars().count() as i64)
    }

    /// Renders `conversations` in parallel on the current rayon pool (results in order, the
    /// same for any number of threads). None: a conversation that is not plain data.
    pub fn render_batch(
        &self,
        conversations: &[Option<Vec<Data>>],
        mode: Mode,
    ) -> Vec<Result<Rendered, String>> {
        conversations
            .par_iter()
            .with_min_len(8)
            .map(|c| match c {
                Some(messages) => self.render(messages, mode),
                None => Err("the messages hold values other than JSON's".into()),
            })
            .collect()
    }
}

/// Removes the `(open, close)` markers from `marked`: the text and the character spans they
/// enclosed (in order of their closing, as transformers records generation blocks), or None
/// when they are nested or unbalanced. With `strict` false markers are dropped unchecked.
fn split_markers(
    marked: &str,
    (open, close): (char, char),
    strict: bool,
) -> Option<(String, Vec<(i64, i64)>)> {
    let kind = |c: char| (c as u32 - 0xE000) as u8;
    let (open, close) = (kind(open), kind(close));
    let mut found = data::markers(marked)
        .filter(|&(_, k)| k == open || k == close)
        .peekable();
    if found.peek().is_none() {
        return Some((marked.to_owned(), Vec::new()));
    }
    let mut text = String::with_capacity(marked.len());
    let mut spans = Vec::new();
    let mut start: Option<i64> = None;
    let mut pos = 0i64;
    let mut last = 0;
    for (at, marker) in found {
        let piece = &marked[last..at];
        text.push_str(piece);
        pos += piece.chars().count() as i64;
        last = at + MARKER_BYTES;
        if marker == open {
            if start.is_some() && strict {
                return None;
            }
            start = Some(pos);
        } else {
            match start.take() {
                Some(a) => spans.push((a, pos)),
                None if strict => return None,
                None => {}
            }
        }
    }
    text.push_str(&marked[last..]);
    if start.is_some() && strict {
        return None;
    }
    Some((text, spans))
}

/// `{% generation %}` / `{% endgeneration %}` (any whitespace control) rewritten into the
/// generation filter block, and whether there were any.
fn rewrite_generation(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut found = false;
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        match parse_tag(tag) {
            Some((len, left, name, right)) => {
                found = true;
                let body = if name == "generation" {
                    format!("filter {}", env::GENERATION_FILTER)
                } else {
                    "endfilter".to_owned()
                };
                out.push_str(&format!("{{%{left} {body} {right}%}}"));
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    (out, found)
}

/// `{%[-+]? (end)?generation [-+]?%}` at the start of `tag`: its length, the whitespace
/// controls and the name.
fn parse_tag(tag: &str) -> Option<(usize, &str, &str, &str)> {
    /// A whitespace control (`-` or `+`) at the start of `s`, or "".
    fn control(s: &str) -> &str {
        &s[..usize::from(s.starts_with(['-', '+']))]
    }
    let inner = &tag[2..];
    let left = control(inner);
    let after = inner[left.len()..].trim_start();
    let name = ["endgeneration", "generation"]
        .into_iter()
        .find(|n| after.starts_with(n))?;
    let after_name = &after[name.len()..];
    let tail = after_name.trim_start();
    if tail.len() == after_name.len() && !tail.starts_with(['-', '+', '%']) {
        return None; // a longer name, `{% generations %}`
    }
    let right = control(tail);
    let end = &tail[right.len()..];
    if !end.starts_with("%}") {
        return None;
    }
    let len = tag.len() - end.len() + 2;
    Some((len, left, name, right))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_filter_blocks() {
        let (out, found) =
            rewrite_generation("a{%- generation %}b{% endgeneration -%}c{% generations %}");
        assert!(found);
        assert_eq!(
            out,
            "a{%- filter __tokpack_generation %}b{% endfilter -%}c{% generations %}"
        );
    }

    #[test]
    fn markers_give_character_spans() {
        let (text, spans) =
            split_markers("é\u{E002}ab\u{E003}c\u{E002}\u{E003}", GEN_OPEN_CLOSE, true).unwrap();
        assert_eq!(text, "éabc");
        assert_eq!(spans, vec![(1, 3), (4, 4)]);
        assert!(split_markers("\u{E002}\u{E002}", GEN_OPEN_CLOSE, true).is_none());
        // The other pair's markers and lookalike bytes (U+E080, U+E7FF) are text.
        let (text, spans) = split_markers(
            "\u{E000}\u{E080}\u{E002}\u{E7FF}\u{E003}",
            GEN_OPEN_CLOSE,
            true,
        )
        .unwrap();
        assert_eq!(text, "\u{E000}\u{E080}\u{E7FF}");
        assert_eq!(spans, vec![(2, 3)]);
        assert!(data::has_marker("a\u{E003}") && !data::has_marker("\u{E004}\u{E080}é"));
    }
}
