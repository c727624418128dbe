//! Python's text forms of template values, as transformers' Jinja produces them: `str()` for
//! `{{ value }}` output (`True`, `None`, `['a', 1]`, `{'k': 'v'}`) and `json.dumps` for the
//! `tojson` filter (`ensure_ascii=False` by default, key order kept, Python's separators and
//! float repr).

use indexmap::IndexMap;
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write;

/// `repr(float)`: the shortest digits that round-trip, positional for exponents in
/// `-4..16`, else scientific with a signed two-digit exponent (`1e+16`, `1.5e-05`).
pub fn float_repr(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sci = format!("{:e}", v.abs()); // "d.ddde-5": shortest round-trip digits
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if v < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if exp + 1 >= n {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        } else {
            let (a, b) = digits.split_at((exp + 1) as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.abs())
    }
}

fn number(value: &Value, out: &mut String) {
    if value.is_integer() {
        // Integers print the same in Rust and Python.
        let _ = write!(out, "{value}");
    } else {
        match f64::try_from(value.clone()) {
            Ok(f) => out.push_str(&float_repr(f)),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        }
    }
}

/// `str(value)` as Python prints it, or None for values that have no Python counterpart here
/// (namespaces, macros, loops: left to minijinja's own formatting).
pub fn py_str(value: &Value) -> Option<String> {
    match value.kind() {
        ValueKind::String => Some(value.as_str().unwrap_or_default().to_owned()),
        ValueKind::Undefined => Some(String::new()),
        _ => {
            let mut out = String::new();
            py_repr(value, &mut out).then_some(out)
        }
    }
}

/// Appends `repr(value)`; false for a value without a Python counterpart.
fn py_repr(value: &Value, out: &mut String) -> bool {
    match value.kind() {
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => number(value, out),
        ValueKind::String => str_repr(value.as_str().unwrap_or_default(), out),
        kind @ (ValueKind::Seq | ValueKind::Map)
            if kind == ValueKind::Seq || is_plain_map(value) =>
        {
            let map = kind == ValueKind::Map;
            let Ok(items) = value.try_iter() else {
                return false;
            };
            out.push(if map { '{' } else { '[' });
            for (i, item) in items.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if !py_repr(&item, out) {
                    return false;
                }
                if map {
                    out.push_str(": ");
                    if !py_repr(&value.get_item(&item).unwrap_or_default(), out) {
                        return false;
                    }
                }
            }
            out.push(if map { '}' } else { ']' });
        }
        _ => return false,
    }
    true
}

/// Dicts (from the data or template literals), not namespaces or other objects.
fn is_plain_map(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|o| o.downcast_ref::<IndexMap<Value, Value>>().is_some())
}

/// `repr(str)`: single quotes unless the text holds a single quote and no double quote.
fn str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) || c == '\u{ad}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if !printable(c) => {
                let n = c as u32;
                if n > 0xffff {
                    let _ = write!(out, "\\U{n:08x}");
                } else {
                    let _ = write!(out, "\\u{n:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for the non-ASCII characters templates meet: separators,
/// format characters and private use are not printable.
fn printable(c: char) -> bool {
    !matches!(c as u32,
        0x2028 | 0x2029 | 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x2064
        | 0xfeff | 0xe000..=0xf8ff | 0xfff9..=0xfffb | 0x1680 | 0x2000..=0x200a
        | 0x202f | 0x205f | 0x3000)
}

/// Options of `json.dumps` that templates pass to `tojson`.
pub struct JsonStyle {
    pub ensure_ascii: bool,
    /// The indent string (`indent=4`: four spaces); None: one line.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

/// `json.dumps(value, ...)`.
pub fn dumps(value: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_json(value, style, 0, &mut out)?;
    Ok(out)
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", value.kind()),
    )
}

fn newline(style: &JsonStyle, depth: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(
    value: &Value,
    style: &JsonStyle,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if value.is_integer() {
                let _ = write!(out, "{value}");
            } else {
                let f = f64::try_from(value.clone()).map_err(|_| not_serializable(value))?;
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&float_repr(f));
                }
            }
        }
        ValueKind::String => json_str(value.as_str().unwrap_or_default(), style.ensure_ascii, out),
        kind @ (ValueKind::Seq | ValueKind::Map)
            if kind == ValueKind::Seq || is_plain_map(value) =>
        {
            let map = kind == ValueKind::Map;
            // `(key, item)`: dict keys as JSON writes them; no key for list items.
            let mut pairs = Vec::new();
            for key in value.try_iter()? {
                pairs.push(if map {
                    let item = value.get_item(&key)?;
                    (Some(json_key(&key, style)?), item)
                } else {
                    (None, key)
                });
            }
            if map && style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push(if map { '{' } else { '[' });
            for (i, (key, item)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, depth + 1, out);
                if let Some(key) = key {
                    json_str(key, style.ensure_ascii, out);
                    out.push_str(&style.key_sep);
                }
                write_json(item, style, depth + 1, out)?;
            }
            if !pairs.is_empty() {
                newline(style, depth, out);
            }
            out.push(if map { '}' } else { ']' });
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// A dict key as `json.dumps` writes it (non-string keys become their JSON text).
fn json_key(key: &Value, style: &JsonStyle) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None | ValueKind::Bool | ValueKind::Number => dumps(key, style),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

fn json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (v, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789012345.6, "123456789012345.6"),
            (1e15, "1000000000000000.0"),
            (2.75, "2.75"),
            (-0.0, "-0.0"),
            (2.5e300, "2.5e+300"),
        ] {
            assert_eq!(float_repr(v), want, "{v}");
        }
    }
}
