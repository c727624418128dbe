//! Added tokens (`<|im_start|>`, ...): found in the text before pre-tokenization, leftmost
//! longest, the tokens not marked `normalized` first, then the others in the remaining gaps
//! (the order of `tokenizers`' `AddedVocabulary`).

use aho_corasick::{AhoCorasick, MatchKind};

pub(crate) struct AddedTokens {
    /// Passes in order, each an automaton and the id of each of its patterns.
    passes: Vec<(AhoCorasick, Vec<u32>)>,
}

/// A piece of text: either an added token or a stretch for the BPE model.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Added { id: u32, start: usize, end: usize },
    Text { start: usize, end: usize },
}

impl AddedTokens {
    /// Fails when the automaton would exceed aho-corasick's limits (the user's tokens).
    pub(crate) fn new(
        raw: Vec<(String, u32)>,
        normalized: Vec<(String, u32)>,
    ) -> Result<Self, aho_corasick::BuildError> {
        let passes = [raw, normalized]
            .into_iter()
            .filter(|set| !set.is_empty())
            .map(|set| {
                let (patterns, ids): (Vec<String>, Vec<u32>) = set.into_iter().unzip();
                let ac = AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&patterns)?;
                Ok((ac, ids))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { passes })
    }

    /// Calls `f` with the pieces of `text`, in order.
    pub(crate) fn split(&self, text: &str, f: &mut impl FnMut(Piece)) {
        self.split_pass(0, text, 0, text.len(), f);
    }

    fn split_pass(&self, pass: usize, text: &str, lo: usize, hi: usize, f: &mut impl FnMut(Piece)) {
        if lo == hi {
            return;
        }
        let Some((ac, ids)) = self.passes.get(pass) else {
            f(Piece::Text { start: lo, end: hi });
            return;
        };
        let mut pos = lo;
        for m in ac.find_iter(&text.as_bytes()[lo..hi]) {
            let (start, end) = (lo + m.start(), lo + m.end());
            self.split_pass(pass + 1, text, pos, start, f);
            f(Piece::Added {
                id: ids[m.pattern().as_usize()],
                start,
                end,
            });
            pos = end;
        }
        self.split_pass(pass + 1, text, pos, hi, f);
    }
}
