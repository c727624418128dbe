//! JSONL chat records tokenized without Python: each line parsed (serde_json), checked as
//! `tokpack.tokenize.formats.parse_record` checks an OpenAI-style `messages` record, rendered
//! with a [`ChatTemplate`] and encoded with a [`BpeTokenizer`], in parallel on the current
//! rayon pool.
//!
//! Only records this path reproduces exactly are taken: anything else (invalid JSON, a
//! missing or ill-typed field, a float or an integer beyond 64 bits, a duplicated key, a
//! template or encoder refusal, ...) is listed as a fallback and the caller runs its Python
//! path on it, which gives the same result or the rejection message the user sees.

use crate::bpe::{encode_each, BpeTokenizer, EncodedBatch};
use crate::template::{ChatTemplate, Data, Mode};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// The roles `parse_record` accepts (`CHAT_ROLES`).
const CHAT_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// The JSON keys a record is read from (the run's resolved columns).
pub struct ChatFields {
    pub messages: String,
    pub system: String,
    /// With format `"auto"`: the `chosen`, `rejected`, `prompt`, `completion` and `label`
    /// keys, whose presence makes a record another format (left to the caller).
    pub detect: Option<[String; 5]>,
}

/// The records' flat ids and labels (a fallback record owns no tokens) and, for each, whether
/// its last message is an assistant's.
pub struct TokenizedRecords {
    pub batch: EncodedBatch,
    pub last_assistant: Vec<bool>,
}

/// Tokenizes JSONL `lines` (one record each) trained on the spans of `mode` (not plain).
pub fn tokenize_jsonl<S: AsRef<str> + Sync>(
    template: &ChatTemplate,
    tokenizer: &BpeTokenizer,
    lines: &[S],
    fields: &ChatFields,
    mode: Mode,
) -> TokenizedRecords {
    let last: Vec<AtomicBool> = lines.iter().map(|_| AtomicBool::new(false)).collect();
    let batch = encode_each(tokenizer, lines.len(), |i| {
        let (messages, last_assistant) = chat_messages(lines[i].as_ref(), fields)?;
        let rendered = template.render(&messages, mode).ok()?;
        last[i].store(last_assistant, Ordering::Relaxed);
        Some((Cow::Owned(rendered.text), Cow::Owned(rendered.spans)))
    });
    TokenizedRecords {
        batch,
        last_assistant: last.into_iter().map(AtomicBool::into_inner).collect(),
    }
}

/// The messages of a valid `messages` record as `parse_record` gives them (the system
/// message first, keys holding null dropped) and whether the last turn is an assistant's;
/// None for anything else.
fn chat_messages(line: &str, fields: &ChatFields) -> Option<(Vec<Data>, bool)> {
    let Plain(Data::Map(record)) = serde_json::from_str(line).ok()? else {
        return None;
    };
    let get = |key: &str| record.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    if let Some([chosen, rejected, prompt, completion, label]) = &fields.detect {
        let has = |key: &String| get(key).is_some();
        if (has(chosen) && has(rejected)) || (has(prompt) && has(completion) && has(label)) {
            return None;
        }
    }
    let mut out = Vec::new();
    match get(&fields.system) {
        None | Some(Data::Null) => {}
        Some(Data::Str(s)) if s.is_empty() => {}
        Some(Data::Str(s)) => out.push(Data::Map(vec![
            ("role".into(), Data::Str("system".into())),
            ("content".into(), Data::Str(s.clone())),
        ])),
        Some(_) => return None,
    }
    let Some(Data::List(turns)) = get(&fields.messages) else {
        return None;
    };
    let mut last_assistant = false;
    for turn in turns {
        let Data::Map(pairs) = turn else {
            return None;
        };
        let field = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v);
        let Some(Data::Str(role)) = field("role") else {
            return None;
        };
        if !CHAT_ROLES.contains(&role.as_str()) || !matches!(field("content"), Some(Data::Str(_))) {
            return None;
        }
        last_assistant = role == "assistant";
        let kept = pairs.iter().filter(|(_, v)| *v != Data::Null).cloned();
        out.push(Data::Map(kept.collect()));
    }
    (!turns.is_empty()).then_some((out, last_assistant))
}

/// A JSON value as plain [`Data`], refused (a deserialization error) where Python's
/// `json.loads` could give something else: floats (rounding, `-0`), integers beyond 64 bits
/// and duplicated keys.
struct Plain(Data);

impl<'de> Deserialize<'de> for Plain {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PlainVisitor)
    }
}

struct PlainVisitor;

impl<'de> Visitor<'de> for PlainVisitor {
    type Value = Plain;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON without floats")
    }

    fn visit_unit<E>(self) -> Result<Plain, E> {
        Ok(Plain(Data::Null))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Plain, E> {
        Ok(Plain(Data::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Plain, E> {
        Ok(Plain(Data::Int(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Plain, E> {
        i64::try_from(v)
            .map(|v| Plain(Data::Int(v)))
            .map_err(|_| E::custom("integer beyond 64 bits"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Plain, E> {
        Err(E::custom("float"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Plain, E> {
        Ok(Plain(Data::Str(v.to_owned())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Plain, A::Error> {
        let mut items = Vec::new();
        while let Some(Plain(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Plain(Data::List(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Plain, A::Error> {
        let mut pairs: Vec<(String, Data)> = Vec::new();
        while let Some((key, Plain(value))) = map.next_entry::<String, Plain>()? {
            if pairs.iter().any(|(k, _)| *k == key) {
                return Err(de::Error::custom("duplicated key"));
            }
            pairs.push((key, value));
        }
        Ok(Plain(Data::Map(pairs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(auto: bool) -> ChatFields {
        ChatFields {
            messages: "messages".into(),
            system: "system".into(),
            detect: auto
                .then(|| ["chosen", "rejected", "prompt", "completion", "label"].map(String::from)),
        }
    }

    #[test]
    fn valid_records_give_the_parsed_messages() {
        let line = r#"{"system": "Be brief.", "messages": [{"role": "user", "content": "Hi\u00e9", "name": null}, {"role": "assistant", "content": ""}]}"#;
        let (messages, last) = chat_messages(line, &fields(true)).unwrap();
        assert!(last);
        let msg = |role: &str, content: &str| {
            Data::Map(vec![
                ("role".into(), Data::Str(role.into())),
                ("content".into(), Data::Str(content.into())),
            ])
        };
        assert_eq!(
            messages,
            vec![
                msg("system", "Be brief."),
                msg("user", "Hié"),
                msg("assistant", "")
            ]
        );
    }

    #[test]
    fn anything_python_could_see_otherwise_is_left_to_it() {
        for line in [
            "not json",
            "[1]",
            r#"{"messages": []}"#,
            r#"{"messages": [{"role": "bot", "content": "x"}]}"#,
            r#"{"messages": [{"role": "user", "content": null}]}"#,
            r#"{"messages": [{"role": "user", "content": "x", "w": 1.5}]}"#,
            r#"{"messages": [{"role": "user", "content": "x", "w": 18446744073709551615}]}"#,
            r#"{"messages": [{"role": "user", "content": "x"}], "messages": []}"#,
            r#"{"system": 3, "messages": [{"role": "user", "content": "x"}]}"#,
            r#"{"chosen": 1, "rejected": 2, "messages": [{"role": "user", "content": "x"}]}"#,
            r#"{"messages": [{"role": "user", "content": "\ud800"}]}"#,
        ] {
            assert!(chat_messages(line, &fields(true)).is_none(), "{line}");
        }
        let pair =
            r#"{"chosen": 1, "rejected": 2, "messages": [{"role": "user", "content": "x"}]}"#;
        assert!(chat_messages(pair, &fields(false)).is_some());
    }
}
