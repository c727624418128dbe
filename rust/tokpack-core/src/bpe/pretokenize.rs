//! Pre-tokenizers: the splits of byte-level BPE tokenizers, written out by hand (the regexes
//! use a look-ahead, which the `regex` crate lacks, and a scanner is several times faster).

use super::unicode::Classes;

/// Which split a tokenizer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
}

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
    match pattern {
        Pattern::Gpt2 => split_gpt2(s, &mut f),
    }
}

fn split_gpt2(s: &str, f: &mut impl FnMut(usize, usize)) {
    let classes = Classes::get();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let end = gpt2_piece(classes, s, i);
        f(i, end);
        i = end;
    }
}

fn gpt2_piece(classes: &Classes, s: &str, i: usize) -> usize {
    let bytes = s.as_bytes();
    let c = char_at(s, i).expect("char boundary");
    if c == '\'' {
        let rest = &bytes[i + 1..];
        if rest.starts_with(b"re") || rest.starts_with(b"ve") || rest.starts_with(b"ll") {
            return i + 3;
        }
        if matches!(rest.first(), Some(b's' | b't' | b'm' | b'd')) {
            return i + 2;
        }
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
    // `\s+(?!\S)|\s+`: a run of white space stops before its last character when a
    // non-space follows (that character then leads the next piece), unless it is alone.
    let end = run_end(classes, s, i, Kind::Space);
    if end == bytes.len() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split(Pattern::Gpt2, s, |a, b| out.push(&s[a..b]));
        out
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
