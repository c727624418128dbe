//! Conversations arrive as JSON text (`json.dumps` of the messages Python parsed) and become
//! template values with the dict key order kept, as the template sees Python dicts.

use indexmap::IndexMap;
use minijinja::value::Value;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A template value read from JSON.
pub struct JsonValue(pub Value);

/// Parses JSON text into a template value (None for text that is not JSON, or JSON that
/// Python's `json.dumps` alone writes: `NaN`, `Infinity`).
pub fn parse(text: &str) -> Option<Value> {
    serde_json::from_str::<JsonValue>(text).ok().map(|v| v.0)
}

impl<'de> Deserialize<'de> for JsonValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = JsonValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(())))
    }

    fn visit_bool<E>(self, v: bool) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_string<E>(self, v: String) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonValue, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(JsonValue(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(JsonValue(Value::from(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonValue, A::Error> {
        let mut out = IndexMap::with_capacity(map.size_hint().unwrap_or(0));
        while let Some((key, JsonValue(v))) = map.next_entry::<String, JsonValue>()? {
            out.insert(Value::from(key), v);
        }
        Ok(JsonValue(Value::from(out)))
    }
}
