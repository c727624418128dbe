//! Conversations as plain data (what JSON holds: the messages Python parsed, converted by the
//! binding), turned into template values with the dict key order kept, as the template sees
//! Python dicts, and with transformers' reasoning aliases.

use indexmap::IndexMap;
use minijinja::value::Value;

/// A JSON-like value. Maps keep their order.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Data>),
    Map(Vec<(String, Data)>),
}

impl Data {
    /// Whether any string (key or value) holds one of tokpack's marker characters.
    pub(crate) fn has_marker(&self) -> bool {
        match self {
            Data::Str(s) => has_marker(s),
            Data::List(items) => items.iter().any(Data::has_marker),
            Data::Map(pairs) => pairs.iter().any(|(k, v)| has_marker(k) || v.has_marker()),
            _ => false,
        }
    }

    pub(crate) fn to_value(&self) -> Value {
        match self {
            Data::Null => Value::from(()),
            Data::Bool(b) => Value::from(*b),
            Data::Int(i) => Value::from(*i),
            Data::Float(f) => Value::from(*f),
            Data::Str(s) => Value::from(s.as_str()),
            Data::List(items) => Value::from(items.iter().map(Data::to_value).collect::<Vec<_>>()),
            Data::Map(pairs) => {
                let map: IndexMap<Value, Value> = pairs
                    .iter()
                    .map(|(k, v)| (Value::from(k.as_str()), v.to_value()))
                    .collect();
                Value::from(map)
            }
        }
    }
}

/// Whether `s` holds U+E000..U+E003.
pub(crate) fn has_marker(s: &str) -> bool {
    markers(s).next().is_some()
}

/// The byte offset of each U+E000..U+E003 in `s` (UTF-8 `EE 80 80..=83`, found with memchr: a
/// scan of the text per render) and which one it is (0..=3).
pub(crate) fn markers(s: &str) -> impl Iterator<Item = (usize, u8)> + '_ {
    let b = s.as_bytes();
    memchr::memchr_iter(0xEE, b).filter_map(move |i| match (b.get(i + 1), b.get(i + 2)) {
        (Some(0x80), Some(&x @ 0x80..=0x83)) => Some((i, x - 0x80)),
        _ => None,
    })
}

/// Reasoning under any of these names is also passed as `reasoning_content` (the standard
/// name) and `thinking` (read by gpt-oss templates), as transformers does.
const REASONING_KEYS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The messages as the template sees them: each message with its reasoning aliased as
/// transformers' `{"thinking": r, **message, "reasoning_content": r}`.
pub(crate) fn messages_value(messages: &[Data]) -> Value {
    Value::from(messages.iter().map(message_value).collect::<Vec<_>>())
}

fn message_value(message: &Data) -> Value {
    let Data::Map(pairs) = message else {
        return message.to_value();
    };
    let reasoning = REASONING_KEYS.iter().find_map(|key| {
        pairs
            .iter()
            .find(|(k, v)| k == key && *v != Data::Null)
            .map(|(_, v)| v.to_value())
    });
    let Some(reasoning) = reasoning else {
        return message.to_value();
    };
    let mut map: IndexMap<Value, Value> = IndexMap::with_capacity(pairs.len() + 2);
    map.insert(Value::from("thinking"), reasoning.clone());
    for (k, v) in pairs {
        map.insert(Value::from(k.as_str()), v.to_value());
    }
    map.insert(Value::from("reasoning_content"), reasoning);
    Value::from(map)
}
