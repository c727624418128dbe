//! Chosen cuts: the pieces the caller cuts some over-long samples into, in place of the overlong
//! policy's cut at `max_len`. A caller that knows where a sample may not be cut (the multimodal
//! layer: never inside an image's span) chooses the pieces by its rule; the planner honours
//! them under `truncate` (one piece from the start) and `split` (pieces tiling the sample), and
//! drops, counted, a sample given no piece (no acceptable cut). Other samples are cut as usual.
//!
//! Blocks: the spans of some samples no cut may fall inside ([`safe_cut`], the one rule, also
//! used by tokenize-time cuts through [`safe_pieces`]). The `random` strategy, which cuts
//! samples at row ends, cuts such a sample at the last safe boundary at or before the row end
//! (the row is then shorter, padded).

use crate::error::{CoreError, Result};
use std::ops::Range;

/// The chosen pieces of some samples.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cuts {
    /// The samples with chosen pieces, ascending, each once.
    pub samples: Vec<i64>,
    /// The pieces of `samples[i]` are `offsets[i]..offsets[i + 1]` of `starts` / `lengths`
    /// (none: the sample has no acceptable cut and is dropped).
    pub offsets: Vec<usize>,
    /// Each piece's first token in its sample, ascending within a sample, and its length.
    pub starts: Vec<i64>,
    pub lengths: Vec<i64>,
    /// The spans no cut may fall inside, of some samples (see [`Cuts::with_blocks`]).
    pub blocks: Blocks,
}

/// Spans `[start, end)` of some samples no cut may fall inside: sample `samples[i]` has spans
/// `offsets[i]..offsets[i + 1]` of `starts` / `ends`, ascending and not overlapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocks {
    samples: Vec<i64>,
    offsets: Vec<usize>,
    spans: Vec<(i64, i64)>,
}

impl Blocks {
    /// Checked shapes, as [`check_shape`] says.
    pub fn new(
        samples: Vec<i64>,
        offsets: Vec<usize>,
        starts: Vec<i64>,
        ends: Vec<i64>,
    ) -> Result<Self> {
        let spans: Vec<(i64, i64)> = starts.iter().copied().zip(ends.iter().copied()).collect();
        let columns = [starts.len(), ends.len()];
        check_shape("blocks", &samples, &offsets, &spans, columns)?;
        Ok(Self {
            samples,
            offsets,
            spans,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The spans of `sample` (none for a sample without blocks).
    pub fn of(&self, sample: i64) -> &[(i64, i64)] {
        match self.samples.binary_search(&sample) {
            Ok(i) => &self.spans[self.offsets[i]..self.offsets[i + 1]],
            Err(_) => &[],
        }
    }
}

/// The cut of a piece `start..` of a sample wanted at `end`: `end`, or the start of the block
/// `end` falls inside (never inside one), at least `start` (`start`: no safe cut before `end`).
pub fn safe_cut(blocks: &[(i64, i64)], start: i64, end: i64) -> i64 {
    blocks
        .iter()
        .find(|&&(a, b)| a < end && end < b)
        .map_or(end, |&(a, _)| a.max(start))
}

/// The pieces `(start, end)` a sample of `length > cap` tokens keeps under `truncate` (one
/// piece from 0; `whole: false`) or `split` (pieces tiling it; `whole: true`), each cut at
/// [`safe_cut`]; empty when there is no safe cut (a block alone longer than `cap`, or one
/// starting a piece it cannot fit): the sample is dropped.
pub fn safe_pieces(length: i64, cap: i64, whole: bool, blocks: &[(i64, i64)]) -> Vec<(i64, i64)> {
    if !whole {
        let cut = safe_cut(blocks, 0, cap.min(length));
        return if cut > 0 { vec![(0, cut)] } else { vec![] };
    }
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < length {
        let end = length.min(start + cap);
        let cut = if end < length {
            safe_cut(blocks, start, end)
        } else {
            end
        };
        if cut == start {
            return vec![];
        }
        pieces.push((start, cut));
        start = cut;
    }
    pieces
}

/// The shape chosen pieces and blocks (`what`) share: `samples` ascending and unique, `offsets`
/// non-decreasing from 0 to the number of spans, and the spans of each sample non-empty, each
/// after the one before. `spans` are zipped from two columns as long as each other (`columns`:
/// their lengths).
fn check_shape(
    what: &str,
    samples: &[i64],
    offsets: &[usize],
    spans: &[(i64, i64)],
    columns: [usize; 2],
) -> Result<()> {
    let bad = |m: String| Err(CoreError::Config(format!("{what}: {m}")));
    if offsets.len() != samples.len() + 1
        || offsets.first() != Some(&0)
        || offsets.last() != Some(&spans.len())
        || columns[0] != columns[1]
    {
        return bad(format!(
            "{} offsets, {} starts and {} ends or lengths for {} samples (one offset more than \
             samples, from 0 to the spans, expected)",
            offsets.len(),
            columns[0],
            columns[1],
            samples.len()
        ));
    }
    if let Some(w) = samples.windows(2).find(|w| w[0] >= w[1]) {
        return bad(format!(
            "samples must be ascending and unique, got {} then {}",
            w[0], w[1]
        ));
    }
    if offsets.windows(2).any(|w| w[0] > w[1]) {
        return bad("offsets must not decrease".into());
    }
    for (i, w) in offsets.windows(2).enumerate() {
        let mut end = 0;
        for &(a, b) in &spans[w[0]..w[1]] {
            if a < end || b <= a {
                return bad(format!(
                    "span {a}..{b} of sample {} is empty or overlaps the one before",
                    samples[i]
                ));
            }
            end = b;
        }
    }
    Ok(())
}

impl Cuts {
    /// Checked shapes, as [`check_shape`] says (piece `k` is the span `starts[k]..starts[k] +
    /// lengths[k]`).
    pub fn new(
        samples: Vec<i64>,
        offsets: Vec<usize>,
        starts: Vec<i64>,
        lengths: Vec<i64>,
    ) -> Result<Self> {
        let spans: Vec<(i64, i64)> = starts
            .iter()
            .zip(&lengths)
            .map(|(&s, &l)| (s, s.saturating_add(l)))
            .collect();
        let columns = [starts.len(), lengths.len()];
        check_shape("cuts", &samples, &offsets, &spans, columns)?;
        Ok(Self {
            samples,
            offsets,
            starts,
            lengths,
            blocks: Blocks::default(),
        })
    }

    /// These cuts with `blocks`: the spans the `random` strategy never cuts inside.
    pub fn with_blocks(self, blocks: Blocks) -> Self {
        Self { blocks, ..self }
    }

    /// No chosen piece and no block.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty() && self.blocks.is_empty()
    }

    /// The pieces (indices into `starts` / `lengths`) of `sample`, if it has chosen ones.
    pub fn pieces_of(&self, sample: i64) -> Option<Range<usize>> {
        let i = self.samples.binary_search(&sample).ok()?;
        Some(self.offsets[i]..self.offsets[i + 1])
    }

    /// The index of the piece of `sample` starting at `start`.
    pub fn piece_at(&self, sample: i64, start: i64) -> Option<usize> {
        let r = self.pieces_of(sample)?;
        let k = self.starts[r.clone()].binary_search(&start).ok()?;
        Some(r.start + k)
    }

    /// The chosen pieces of `sample` (`length` tokens, over `cap`) under `split` (`truncate`:
    /// `!whole`): `Ok(None)` when it has none chosen, `Ok(Some(empty))` when it is dropped,
    /// else `(start, len)` of each piece, checked: each fits `cap`; one piece from 0 shorter
    /// than the sample (`truncate`) or pieces tiling the sample (`split`).
    pub fn chosen(
        &self,
        sample: i64,
        length: i64,
        cap: i64,
        whole: bool,
    ) -> Result<Option<Vec<(i64, i64)>>> {
        let Some(r) = self.pieces_of(sample) else {
            return Ok(None);
        };
        let pieces: Vec<(i64, i64)> = r.map(|k| (self.starts[k], self.lengths[k])).collect();
        let fail = |rule: &str| {
            Err(CoreError::data(format!(
                "sample {sample} ({length} tokens, max_len {cap}): its chosen pieces {pieces:?} \
                 {rule}"
            )))
        };
        if length <= cap {
            return fail("are given for a sample that fits max_len");
        }
        if pieces.iter().any(|&(_, l)| l > cap) {
            return fail("include one longer than max_len");
        }
        if pieces.is_empty() {
            return Ok(Some(pieces));
        }
        if whole {
            let mut at = 0;
            for &(s, l) in &pieces {
                if s != at {
                    return fail("do not tile the sample (split)");
                }
                at = s + l;
            }
            if at != length {
                return fail("do not tile the sample (split)");
            }
        } else if pieces.len() != 1 || pieces[0].0 != 0 {
            return fail("are not one piece from its start (truncate)");
        }
        Ok(Some(pieces))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuts() -> Cuts {
        // Sample 2: pieces 0..4, 4..10; sample 5: none (dropped).
        Cuts::new(vec![2, 5], vec![0, 2, 2], vec![0, 4], vec![4, 6]).unwrap()
    }

    #[test]
    fn lookups() {
        let c = cuts();
        assert_eq!(c.pieces_of(2), Some(0..2));
        assert_eq!(c.pieces_of(5), Some(2..2));
        assert_eq!(c.pieces_of(3), None);
        assert_eq!(c.piece_at(2, 4), Some(1));
        assert_eq!(c.piece_at(2, 3), None);
    }

    #[test]
    fn safe_cuts_never_fall_inside_a_block() {
        let blocks = [(2, 6), (6, 9)];
        assert_eq!(safe_cut(&blocks, 0, 4), 2);
        assert_eq!(safe_cut(&blocks, 0, 6), 6); // between two blocks
        assert_eq!(safe_cut(&blocks, 3, 7), 6);
        assert_eq!(safe_cut(&blocks, 6, 8), 6); // none before `end`
        assert_eq!(safe_cut(&blocks, 0, 2), 2);
        assert_eq!(
            safe_pieces(12, 5, true, &blocks),
            vec![(0, 2), (2, 6), (6, 11), (11, 12)]
        );
        assert_eq!(safe_pieces(12, 5, false, &blocks), vec![(0, 2)]);
        assert_eq!(safe_pieces(12, 3, true, &blocks), vec![]); // 2..6 is longer than 3
        assert_eq!(safe_pieces(12, 2, false, &[(0, 4)]), vec![]);
        let b = Blocks::new(vec![3, 7], vec![0, 2, 3], vec![1, 5, 0], vec![4, 8, 2]).unwrap();
        assert_eq!(b.of(3), &[(1, 4), (5, 8)]);
        assert_eq!(b.of(7), &[(0, 2)]);
        assert!(b.of(4).is_empty());
        assert!(Blocks::new(vec![3], vec![0, 2], vec![1, 3], vec![4, 8]).is_err()); // overlap
        assert!(Blocks::new(vec![3], vec![0, 1], vec![4], vec![4]).is_err()); // empty
        assert!(Blocks::new(vec![3, 3], vec![0, 0, 0], vec![], vec![]).is_err());
    }

    #[test]
    fn malformed_cuts_are_refused() {
        assert!(Cuts::new(vec![2, 2], vec![0, 0, 0], vec![], vec![]).is_err());
        assert!(Cuts::new(vec![2], vec![0, 1], vec![0, 1], vec![1, 1]).is_err());
        assert!(Cuts::new(vec![2], vec![0, 2], vec![0, 1], vec![2, 1]).is_err());
        assert!(Cuts::new(vec![2], vec![1, 2], vec![0, 1], vec![1, 1]).is_err());
    }
}
