//! The character classes of the pre-tokenizer regexes (`\p{L}`, `\p{N}`, `\s`), as range tables
//! taken from `regex-syntax`'s Unicode data, with an ASCII fast path.

use regex_syntax::hir::{Class, HirKind};

/// Sorted, disjoint inclusive ranges of one class.
pub(crate) struct CharClass {
    ascii: [bool; 128],
    ranges: Vec<(u32, u32)>,
}

impl CharClass {
    fn from_regex(pattern: &str) -> Self {
        let hir = regex_syntax::parse(pattern).expect("built-in class pattern");
        let ranges: Vec<(u32, u32)> = match hir.kind() {
            HirKind::Class(Class::Unicode(class)) => class
                .ranges()
                .iter()
                .map(|r| (r.start() as u32, r.end() as u32))
                .collect(),
            _ => unreachable!("{pattern} is a Unicode class"),
        };
        let ascii = std::array::from_fn(|i| {
            ranges
                .iter()
                .any(|&(lo, hi)| (lo..=hi).contains(&(i as u32)))
        });
        Self { ascii, ranges }
    }

    #[inline]
    pub(crate) fn contains(&self, c: char) -> bool {
        let c = c as u32;
        if c < 128 {
            return self.ascii[c as usize];
        }
        // The first range not wholly below `c` holds it, if any does.
        let i = self.ranges.partition_point(|&(_, hi)| hi < c);
        self.ranges.get(i).is_some_and(|&(lo, _)| lo <= c)
    }
}

/// Letters, numbers and white space.
pub(crate) struct Classes {
    pub letter: CharClass,
    pub number: CharClass,
    pub space: CharClass,
}

impl Classes {
    pub(crate) fn get() -> &'static Classes {
        static CLASSES: std::sync::OnceLock<Classes> = std::sync::OnceLock::new();
        CLASSES.get_or_init(|| Classes {
            letter: CharClass::from_regex(r"\p{L}"),
            number: CharClass::from_regex(r"\p{N}"),
            space: CharClass::from_regex(r"\s"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_match_the_usual_characters() {
        let c = Classes::get();
        assert!(c.letter.contains('a') && c.letter.contains('é') && c.letter.contains('中'));
        assert!(
            !c.letter.contains('1') && !c.letter.contains(' ') && !c.letter.contains('\u{301}')
        );
        assert!(c.number.contains('7') && c.number.contains('½') && c.number.contains('٣'));
        assert!(c.space.contains(' ') && c.space.contains('\n') && c.space.contains('\u{3000}'));
        assert!(!c.space.contains('\u{200b}') && !c.space.contains('x'));
    }
}
