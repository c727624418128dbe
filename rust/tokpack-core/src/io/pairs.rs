//! Preference pairs as packing units: a pair (chosen and rejected sequences, each prompt +
//! completion, sharing the first `prompt` tokens) is planned on its row footprint and written
//! as two segments (`separate`: chosen then rejected, each whole) or three (`shared-prompt`:
//! the prompt once, then the chosen and the rejected completions). The overlong policy applies
//! to the footprint: `truncate` caps both completions at the largest common length that fits
//! (water-filling), never the prompt.

use super::columns::{BatchAt, Flat};
use crate::error::{CoreError, Result};
use crate::plan::{Plan, PlanConfig};
pub use crate::policy::PairLayout;
use crate::policy::{Overlong, Strategy};
pub use crate::policy::{ROLE_CHOSEN, ROLE_PROMPT, ROLE_REJECTED};
use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int64Type};

/// Which sequence of a pair a segment's tokens are read from.
pub const SEQ_CHOSEN: u8 = 0;
pub const SEQ_REJECTED: u8 = 1;

impl PairLayout {
    /// Tokens the prompt takes in a row: once per sequence, or once.
    fn prompt_copies(self) -> i64 {
        match self {
            PairLayout::Separate => 2,
            PairLayout::SharedPrompt => 1,
        }
    }
}

/// The lengths of one pair as read: whole chosen and rejected sequences, and the prompt they
/// share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairLengths {
    pub chosen: i32,
    pub rejected: i32,
    pub prompt: i32,
}

impl PairLengths {
    /// Tokens the whole pair takes in a row.
    pub fn footprint(self, layout: PairLayout) -> i64 {
        i64::from(self.chosen) + i64::from(self.rejected)
            - i64::from(self.prompt) * (2 - layout.prompt_copies())
    }

    /// No preference without both completions: such a pair is dropped as empty.
    pub fn is_empty(self) -> bool {
        self.chosen <= self.prompt || self.rejected <= self.prompt
    }
}

/// What a pair becomes under the overlong policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Packed with these lengths (whole sequences, prompt included).
    Kept(PairLengths),
    Truncated(PairLengths),
    Dropped,
    Empty,
    /// Too long under `overlong = "error"`.
    Overlong,
}

/// The largest cap `C` with `min(c, C) + min(r, C) <= budget`, for `c + r > budget >= 0`.
pub fn water_level(c: i64, r: i64, budget: i64) -> i64 {
    let a = c.min(r);
    if 2 * a <= budget {
        budget - a
    } else {
        budget / 2
    }
}

/// The fate of a pair in rows of `max_len` tokens.
pub fn fate(p: PairLengths, layout: PairLayout, max_len: u32, overlong: Overlong) -> Fate {
    if p.is_empty() {
        return Fate::Empty;
    }
    if p.footprint(layout) <= i64::from(max_len) {
        return Fate::Kept(p);
    }
    match overlong {
        Overlong::Error => Fate::Overlong,
        // `split` is refused for pairs before anything is read.
        Overlong::Drop | Overlong::Split => Fate::Dropped,
        Overlong::Truncate => {
            let prompt = i64::from(p.prompt);
            let budget = i64::from(max_len) - prompt * layout.prompt_copies();
            // Each completion keeps at least one token, or the pair trains nothing.
            if budget < 2 {
                return Fate::Dropped;
            }
            let (c, r) = (i64::from(p.chosen) - prompt, i64::from(p.rejected) - prompt);
            let cap = water_level(c, r, budget);
            Fate::Truncated(PairLengths {
                chosen: (prompt + c.min(cap)) as i32,
                rejected: (prompt + r.min(cap)) as i32,
                prompt: p.prompt,
            })
        }
    }
}

/// One segment of a packed row: `len` tokens of sequence `seq` of a sample from `start`, with
/// its role (0 for a plain sample).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub seq: u8,
    pub start: i64,
    pub len: i64,
    pub role: i8,
}

/// The pairs of a `pack_files` run as they are packed (lengths after the overlong policy).
pub struct Pairs {
    pub layout: PairLayout,
    pub kept: Vec<PairLengths>,
}

impl Pairs {
    /// The segments pair `sample` is written as, in order.
    pub fn parts(&self, sample: i64, out: &mut Vec<Part>) {
        let k = self.kept[sample as usize];
        let (c, r, p) = (
            i64::from(k.chosen),
            i64::from(k.rejected),
            i64::from(k.prompt),
        );
        let part = |seq, start, len, role| Part {
            seq,
            start,
            len,
            role,
        };
        match self.layout {
            PairLayout::Separate => {
                out.push(part(SEQ_CHOSEN, 0, c, ROLE_CHOSEN));
                out.push(part(SEQ_REJECTED, 0, r, ROLE_REJECTED));
            }
            PairLayout::SharedPrompt => {
                out.push(part(SEQ_CHOSEN, 0, p, ROLE_PROMPT));
                out.push(part(SEQ_CHOSEN, p, c - p, ROLE_CHOSEN));
                out.push(part(SEQ_REJECTED, p, r - p, ROLE_REJECTED));
            }
        }
    }
}

/// Pairs are never cut: `split` and the `random` strategy (which cuts samples across rows) are
/// configuration errors. The static-shape options count and pad segments, and a pair is planned
/// as one unit of two or three segments: they are refused too.
pub fn check_pair_config(plan: &PlanConfig) -> Result<()> {
    if plan.max_segments.is_some() || plan.align > 1 {
        let name = if plan.align > 1 {
            "align_segments"
        } else {
            "max_segments_per_row"
        };
        return Err(CoreError::Config(format!(
            "{name} applies to SFT samples; preference pairs are planned as units of two or \
             three segments: leave {name} unset for them"
        )));
    }
    if plan.overlong == Overlong::Split {
        return Err(CoreError::Config(
            "overlong=\"split\" would cut a preference pair across rows; pass \"truncate\" \
             (the completions are cut, never the prompt), \"drop\" or \"error\""
                .into(),
        ));
    }
    if plan.strategy == Strategy::Random {
        let others: Vec<String> = Strategy::ALL
            .iter()
            .filter(|s| **s != Strategy::Random)
            .map(|s| format!("{:?}", s.name()))
            .collect();
        return Err(CoreError::Config(format!(
            "strategy \"random\" cuts samples across rows and a preference pair is never cut; \
             pass one of {}",
            others.join(", ")
        )));
    }
    Ok(())
}

/// The lengths of a batch's pairs, checked: each prompt length lies between 0 and both
/// sequences' lengths, and, in the shared-prompt layout, is at least 1 with the prompt tokens of
/// the two sequences equal (the prompt is written once for both).
pub fn pair_lengths(
    chosen: &Flat,
    rejected: &Flat,
    prompts: &ArrayRef,
    layout: PairLayout,
    loc: &BatchAt,
) -> Result<Vec<PairLengths>> {
    let column = "prompt_length";
    if let Some(row) = (0..prompts.len()).find(|&i| prompts.is_null(i)) {
        return Err(loc.data(row, column, "is null"));
    }
    let prompts = arrow::compute::cast(prompts, &DataType::Int64)
        .map_err(|e| loc.data(0, column, format!("is not an integer column ({e})")))?;
    let prompts = prompts.as_primitive::<Int64Type>().values();
    let mut out = Vec::with_capacity(prompts.len());
    for (row, &p) in prompts.iter().enumerate() {
        let (oc, or) = (chosen.offsets[row], rejected.offsets[row]);
        let lc = chosen.offsets[row + 1] - oc;
        let lr = rejected.offsets[row + 1] - or;
        if lc.max(lr) > i64::from(i32::MAX) {
            return Err(loc.data(row, "chosen_input_ids", "has more than 2^31 tokens"));
        }
        if !(0..=lc.min(lr)).contains(&p) {
            return Err(loc.data(
                row,
                column,
                format!(
                    "is {p}, not between 0 and the shorter sequence's length ({} tokens)",
                    lc.min(lr)
                ),
            ));
        }
        if layout == PairLayout::SharedPrompt {
            if p == 0 {
                return Err(loc.data(
                    row,
                    column,
                    "is 0: the shared-prompt layout needs a prompt (its last position predicts \
                     the first token of both completions); pass pair_layout=\"separate\"",
                ));
            }
            let c = &chosen.values[oc as usize..(oc + p) as usize];
            let r = &rejected.values[or as usize..(or + p) as usize];
            if let Some(k) = c.iter().zip(r).position(|(a, b)| a != b) {
                return Err(loc.data(
                    row,
                    "rejected_input_ids",
                    format!(
                        "differs from chosen_input_ids at token {k}, inside the {p}-token \
                         prompt: the shared-prompt layout writes the prompt once for both, so \
                         it must be shared; pass pair_layout=\"separate\""
                    ),
                ));
            }
        }
        out.push(PairLengths {
            chosen: lc as i32,
            rejected: lr as i32,
            prompt: p as i32,
        });
    }
    Ok(out)
}

/// Plans pairs on their footprints after the overlong policy; returns the plan (its accounting
/// in pairs) and what is packed of each pair.
pub fn plan_pairs(
    pairs: &[PairLengths],
    layout: PairLayout,
    config: &PlanConfig,
) -> Result<(Plan, Pairs)> {
    let mut footprints = Vec::with_capacity(pairs.len());
    let mut kept = Vec::with_capacity(pairs.len());
    let (mut truncated, mut empty) = (Vec::new(), Vec::new());
    let mut input_tokens = 0u64;
    for (index, &p) in pairs.iter().enumerate() {
        input_tokens += (i64::from(p.chosen) + i64::from(p.rejected)) as u64;
        let k = match fate(p, layout, config.max_len, config.overlong) {
            Fate::Kept(k) => k,
            Fate::Truncated(k) => {
                truncated.push(index as i64);
                k
            }
            Fate::Dropped => PairLengths::default(),
            Fate::Empty => {
                empty.push(index as i64);
                PairLengths::default()
            }
            Fate::Overlong => {
                return Err(CoreError::Overlong {
                    at: Box::default(),
                    index,
                    length: p.footprint(layout),
                    max_len: config.max_len,
                })
            }
        };
        footprints.push(k.footprint(layout));
        kept.push(k);
    }
    // Every footprint fits, and the plan lists those of 0 tokens (dropped or empty pairs) as
    // dropped; which were empty, which truncated, and the input's tokens are the pairs' own.
    let mut plan = crate::plan::plan(&footprints, config)?;
    plan.truncated = truncated;
    plan.empty = empty;
    plan.input_tokens = input_tokens;
    Ok((plan, Pairs { layout, kept }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(chosen: i32, rejected: i32, prompt: i32) -> PairLengths {
        PairLengths {
            chosen,
            rejected,
            prompt,
        }
    }

    #[test]
    fn truncation_never_cuts_the_prompt_and_fills_the_row() {
        let p = lengths(10 + 30, 10 + 5, 10);
        let sep = fate(p, PairLayout::Separate, 40, Overlong::Truncate);
        assert_eq!(sep, Fate::Truncated(lengths(10 + 15, 10 + 5, 10)));
        let shared = fate(p, PairLayout::SharedPrompt, 40, Overlong::Truncate);
        assert_eq!(shared, Fate::Truncated(lengths(10 + 25, 10 + 5, 10)));
        // The prompts alone (plus one completion token each) do not fit: dropped.
        assert_eq!(
            fate(p, PairLayout::Separate, 21, Overlong::Truncate),
            Fate::Dropped
        );
        assert_eq!(
            fate(p, PairLayout::Separate, 22, Overlong::Truncate),
            Fate::Truncated(lengths(11, 11, 10))
        );
        assert_eq!(
            fate(lengths(5, 9, 5), PairLayout::Separate, 99, Overlong::Error),
            Fate::Empty
        );
    }
}
