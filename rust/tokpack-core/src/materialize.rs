//! Materialising a plan: copying each segment's tokens (and labels) into packed rows.

use crate::plan::Plan;
use rayon::prelude::*;

/// A list column laid out flat: sample `i` is `values[offsets[i]..offsets[i+1]]`.
#[derive(Clone, Copy)]
pub struct FlatColumn<'a> {
    pub values: &'a [i32],
    pub offsets: &'a [i64],
}

impl FlatColumn<'_> {
    pub fn lengths(&self) -> Vec<i64> {
        self.offsets.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn slice(&self, sample: i64, start: i64, len: i64) -> &[i32] {
        let a = (self.offsets[sample as usize] + start) as usize;
        &self.values[a..a + len as usize]
    }
}

/// Packed rows laid out flat: row `r` is `tokens[row_offsets[r]..row_offsets[r+1]]`.
pub struct PackedRows {
    pub tokens: Vec<i32>,
    pub labels: Option<Vec<i32>>,
    pub row_offsets: Vec<i64>,
}

/// Copies the planned segments into rows, in parallel over groups of segments.
pub fn materialize(plan: &Plan, tokens: &FlatColumn, labels: Option<&FlatColumn>) -> PackedRows {
    let ends = plan.lengths.iter().scan(0i64, |end, &l| {
        *end += l;
        Some(*end)
    });
    let seg_offsets: Vec<i64> = std::iter::once(0).chain(ends).collect();
    let total = seg_offsets[seg_offsets.len() - 1] as usize;
    let row_offsets: Vec<i64> = plan
        .bin_offsets
        .iter()
        .map(|&s| seg_offsets[s as usize])
        .collect();
    let out_tokens = gather(plan, &seg_offsets, tokens, total);
    PackedRows {
        tokens: out_tokens,
        labels: labels.map(|col| gather(plan, &seg_offsets, col, total)),
        row_offsets,
    }
}

const GROUP_TOKENS: i64 = 1 << 18;

fn gather(plan: &Plan, seg_offsets: &[i64], col: &FlatColumn, total: usize) -> Vec<i32> {
    let mut out = vec![0i32; total];
    // Cut the output at segment boundaries into groups of ~GROUP_TOKENS tokens; groups are
    // disjoint slices, filled in parallel.
    let mut groups: Vec<(usize, usize, &mut [i32])> = Vec::new();
    let mut rest: &mut [i32] = &mut out;
    let n = plan.lengths.len();
    let mut a = 0;
    while a < n {
        let mut b = a + 1;
        while b < n && seg_offsets[b] - seg_offsets[a] < GROUP_TOKENS {
            b += 1;
        }
        let size = (seg_offsets[b] - seg_offsets[a]) as usize;
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(size);
        groups.push((a, b, head));
        rest = tail;
        a = b;
    }
    groups.into_par_iter().for_each(|(a, b, dst)| {
        let mut pos = 0;
        for k in a..b {
            let src = col.slice(plan.sample_ids[k], plan.starts[k], plan.lengths[k]);
            dst[pos..pos + src.len()].copy_from_slice(src);
            pos += src.len();
        }
    });
    out
}
