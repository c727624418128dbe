//! Pre-tokenizers: the splits of byte-level BPE tokenizers, written out by hand (the regexes
//! use a look-ahead, which the `regex` crate lacks, and a scanner is several times faster).

use super::unicode::Classes;

/// Which split a tokenizer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// Llama 3 ([`LLAMA3_REGEX`]) when `max_digits` is 3; Qwen2 ([`QWEN2_REGEX`]) when 1.
    Llama3 { max_digits: usize },
}

/// The `Split` regex of Llama 3's `tokenizer.json`.
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The `Split` regex of Qwen2's `tokenizer.json` (one digit per piece).
pub const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Letter,
    Number,
    Space,
    Other,
}

#[inline]
fn kind(classes: &Classes, c: char) -> Kind {
    if c.is_ascii() {
        return match c {
            'a'..='z' | 'A'..='Z' => Kind::Letter,
            '0'..='9' => Kind::Number,
            ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r' => Kind::Space,
            _ => Kind::Other,
        };
    }
    if classes.letter.contains(c) {
        Kind::Letter
    } else if classes.number.contains(c) {
        Kind::Number
    } else if classes.space.contains(c) {
        Kind::Space
    } else {
        Kind::Other
    }
}

#[inline]
fn char_at(s: &str, i: usize) -> Option<char> {
    s[i..].chars().next()
}

/// End (byte index) of the run of characters of `k` starting at `i`.
#[inline]
fn run_end(classes: &Classes, s: &str, mut i: usize, k: Kind) -> usize {
    let bytes = s.as_bytes();
    while i < bytes.len() {
        let b = bytes[i];
        if b < 128 {
            if kind(classes, b as char) != k {
                break;
            }
            i += 1;
        } else {
            let c = char_at(s, i).expect("char boundary");
            if kind(classes, c) != k {
                break;
            }
            i += c.len_utf8();
        }
    }
    i
}

/// Calls `f(start, end)` for each piece of `s`, in order; the pieces cover `s` exactly.
pub(crate) fn split(pattern: Pattern, s: &str, mut f: impl FnMut(usize, usize)) {
    let classes = Classes::get();
    let mut i = 0;
    while i < s.len() {
        let end = match pattern {
            Pattern::Gpt2 => gpt2_piece(classes, s, i),
            Pattern::Llama3 { max_digits } => llama3_piece(classes, s, i, max_digits),
        };
        f(i, end);
        i = end;
    }
}

/// `\s+(?!\S)|\s+` from `i` (a white-space character): the run stops before its last
/// character when a non-space follows (that character then leads the next piece), unless the
/// run is that one character.
fn space_run(classes: &Classes, s: &str, i: usize) -> usize {
    let end = run_end(classes, s, i, Kind::Space);
    if end == s.len() {
        return end;
    }
    let last = s[i..end]
        .char_indices()
        .next_back()
        .map_or(i, |(j, _)| i + j);
    if last > i {
        last
    } else {
        end
    }
}

#[inline]
fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `i` (Llama 3 and Qwen2: `(?i:...)`, any case): its end.
fn contraction(bytes: &[u8], i: usize, any_case: bool) -> Option<usize> {
    if bytes[i] != b'\'' {
        return None;
    }
    let fold = |b: &u8| if any_case { b.to_ascii_lowercase() } else { *b };
    let at = |k: usize| bytes.get(i + k).map(fold);
    match (at(1), at(2)) {
        (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => Some(i + 3),
        (Some(b's' | b't' | b'm' | b'd'), _) => Some(i + 2),
        _ => None,
    }
}

fn llama3_piece(classes: &Classes, s: &str, i: usize, max_digits: usize) -> usize {
    let bytes = s.as_bytes();
    let c = char_at(s, i).expect("char boundary");
    if let Some(end) = contraction(bytes, i, true) {
        return end;
    }
    let k = kind(classes, c);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if k == Kind::Letter {
        return run_end(classes, s, i, Kind::Letter);
    }
    let next = char_at(s, i + c.len_utf8());
    if k != Kind::Number && !is_newline(c) {
        if let Some(n) = next {
            if kind(classes, n) == Kind::Letter {
                return run_end(classes, s, i + c.len_utf8(), Kind::Letter);
            }
        }
    }
    // \p{N}{1,max_digits}
    if k == Kind::Number {
        let mut end = i;
        for (taken, ch) in s[i..].chars().enumerate() {
            if taken == max_digits || kind(classes, ch) != Kind::Number {
                break;
            }
            end += ch.len_utf8();
        }
        return end;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    let other_from = if c == ' ' && next.is_some_and(|n| kind(classes, n) == Kind::Other) {
        Some(i + 1)
    } else if k == Kind::Other {
        Some(i)
    } else {
        None
    };
    if let Some(from) = other_from {
        let mut end = run_end(classes, s, from, Kind::Other);
        while end < bytes.len() && matches!(bytes[end], b'\r' | b'\n') {
            end += 1;
        }
        return end;
    }
    // \s*[\r\n]+ : through the last line break of the white-space run.
    let run = run_end(classes, s, i, Kind::Space);
    if let Some((j, ch)) = s[i..run]
        .char_indices()
        .rev()
        .find(|&(_, ch)| is_newline(ch))
    {
        return i + j + ch.len_utf8();
    }
    space_run(classes, s, i)
}

fn gpt2_piece(classes: &Classes, s: &str, i: usize) -> usize {
    let c = char_at(s, i).expect("char boundary");
    if let Some(end) = contraction(s.as_bytes(), i, false) {
        return end;
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional ASCII space, then a run.
    let (start, first) = if c == ' ' {
        match char_at(s, i + 1) {
            Some(next) => (i + 1, next),
            None => return i + 1,
        }
    } else {
        (i, c)
    };
    let k = kind(classes, first);
    if k != Kind::Space {
        return run_end(classes, s, start, k);
    }
    space_run(classes, s, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split(Pattern::Gpt2, s, |a, b| out.push(&s[a..b]));
        out
    }

    fn llama3(s: &str, max_digits: usize) -> Vec<&str> {
        let mut out = Vec::new();
        split(Pattern::Llama3 { max_digits }, s, |a, b| out.push(&s[a..b]));
        out
    }

    #[test]
    fn llama3_splits_like_the_regex() {
        assert_eq!(llama3("Hello world", 3), ["Hello", " world"]);
        assert_eq!(llama3("I'M here'S", 3), ["I", "'M", " here", "'S"]);
        assert_eq!(llama3("12345", 3), ["123", "45"]);
        assert_eq!(llama3("12345", 1), ["1", "2", "3", "4", "5"]);
        assert_eq!(
            llama3("(hello) ...\n\nx", 3),
            ["(hello", ")", " ...\n\n", "x"]
        );
        assert_eq!(llama3("a \n \n  b", 3), ["a", " \n \n", " ", " b"]);
        assert_eq!(llama3("\thi\nyo", 3), ["\thi", "\n", "yo"]);
        assert_eq!(llama3("x   ", 3), ["x", "   "]);
    }

    #[test]
    fn gpt2_splits_like_the_regex() {
        assert_eq!(pieces("Hello world"), ["Hello", " world"]);
        assert_eq!(pieces("I'm here's"), ["I", "'m", " here", "'s"]);
        assert_eq!(pieces("a  b"), ["a", " ", " b"]);
        assert_eq!(pieces("a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(pieces("x   "), ["x", "   "]);
        assert_eq!(pieces("3.14 (42)!"), ["3", ".", "14", " (", "42", ")!"]);
        assert_eq!(pieces(" 'x"), [" '", "x"]);
        assert_eq!(pieces("héllo wörld"), ["héllo", " wörld"]);
        assert_eq!(pieces("\n Hi"), ["\n", " Hi"]);
        assert_eq!(pieces(""), Vec::<&str>::new());
    }
}
