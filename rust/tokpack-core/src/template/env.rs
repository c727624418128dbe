//! The Jinja environment transformers renders chat templates in, rebuilt on minijinja:
//! `trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`, `tojson` with
//! `json.dumps` semantics, `strftime_now`, Python's string/dict methods (`pycompat`) and
//! Python's `str()` for printed values.

use super::pyfmt::{dumps, py_str, JsonStyle};
use super::GEN_OPEN_CLOSE;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use std::time::{SystemTime, UNIX_EPOCH};

/// The filter that `{% generation %}` blocks are rewritten into: it brackets its body with
/// marker characters, removed after rendering (their positions are the generation spans).
pub const GENERATION_FILTER: &str = "__tokpack_generation";

pub fn environment(utc_offset: i64) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, state, value| {
        if let Some(text) = value.as_str() {
            return out.write_str(text).map_err(Error::from);
        }
        match py_str(value) {
            Some(text) => out.write_str(&text).map_err(Error::from),
            None => minijinja::escape_formatter(out, state, value),
        }
    });
    env.add_filter("tojson", tojson);
    env.add_filter(GENERATION_FILTER, |body: String| {
        let (open, close) = GEN_OPEN_CLOSE;
        Value::from_safe_string(format!("{open}{body}{close}"))
    });
    env.add_function(
        "raise_exception",
        |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_function("strftime_now", move |format: String| {
        strftime_now(&format, utc_offset)
    });
    env
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson"));
    }
    let arg = |i: usize| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(NAMES[i])?;
        Ok(named.or_else(|| args.get(i).cloned()))
    };
    let ensure_ascii = arg(0)?.is_some_and(|v| v.is_true());
    let indent = match arg(1)? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().into()),
        Some(v) => {
            let n = v
                .as_i64()
                .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "bad indent"))?;
            Some(" ".repeat(n.max(0) as usize))
        }
    };
    let (item_sep, key_sep) = match arg(2)? {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap().into(), b.as_str().unwrap().into())
                }
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "bad separators")),
            }
        }
        _ if indent.is_some() => (",".into(), ": ".into()),
        _ => (", ".into(), ": ".into()),
    };
    let sort_keys = arg(3)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    Ok(Value::from(dumps(value, &style)?))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `datetime.now().strftime(format)` in the local time of `utc_offset` seconds east of UTC
/// (the offset Python saw when the run started), for the C locale's common directives; any
/// other directive is an error (the conversation is then rendered by Python).
fn strftime_now(format: &str, utc_offset: i64) -> Result<String, Error> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
        + utc_offset;
    let (days, secs) = (now.div_euclid(86_400), now.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let pad = spec != Some('-');
        if !pad {
            spec = chars.next();
        }
        let num = |n: i64, width: usize| {
            if pad {
                format!("{n:0width$}")
            } else {
                n.to_string()
            }
        };
        let text = match spec {
            Some('Y') => year.to_string(),
            Some('y') => num(year.rem_euclid(100), 2),
            Some('m') => num(month, 2),
            Some('d') => num(day, 2),
            Some('e') => format!("{day:>2}"),
            Some('H') => num(hour, 2),
            Some('I') => num(hour12, 2),
            Some('M') => num(minute, 2),
            Some('S') => num(second, 2),
            Some('j') => num(yday, 3),
            Some('p') => (if hour < 12 { "AM" } else { "PM" }).into(),
            Some('B') => MONTHS[month as usize - 1].into(),
            Some('b') | Some('h') => MONTHS[month as usize - 1][..3].into(),
            Some('A') => DAYS[weekday].into(),
            Some('a') => DAYS[weekday][..3].into(),
            Some('%') if pad => "%".into(),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported format {format:?}"),
                ))
            }
        };
        out.push_str(&text);
    }
    Ok(out)
}

/// Year, month, day of a day count from 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_round_trip() {
        for (days, ymd) in [
            (0, (1970, 1, 1)),
            (19_723, (2024, 1, 1)),
            (20_416, (2025, 11, 24)),
            (11_016, (2000, 2, 29)),
        ] {
            assert_eq!(civil_from_days(days), ymd);
            assert_eq!(days_from_civil(ymd.0, ymd.1, ymd.2), days);
        }
    }

    #[test]
    fn unsupported_strftime_directive_is_an_error() {
        assert!(strftime_now("%Z", 0).is_err());
        assert_eq!(strftime_now("100%%", 0).unwrap(), "100%");
    }
}
