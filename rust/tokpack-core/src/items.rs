//! Turning sample lengths into packable items, applying the overlong policy.

use crate::cuts::Cuts;
use crate::error::{CoreError, Result};
use crate::policy::Overlong;
use rayon::prelude::*;

/// One piece of a sample to place in a row: `len` tokens of sample `sample` starting at `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub sample: i64,
    pub start: i64,
    pub len: u32,
}

/// Items in sample order plus the accounting of samples that did not go in whole.
#[derive(Default)]
pub struct Items {
    pub items: Vec<Item>,
    pub dropped: Vec<i64>,
    pub empty: Vec<i64>,
    pub truncated: Vec<i64>,
    pub split: Vec<i64>,
    pub input_tokens: u64,
}

/// Anything that can be a length: the binding passes int32 or int64 arrays without copying.
pub trait Length: Copy + Send + Sync {
    fn to_i64(self) -> i64;
}
macro_rules! length {
    ($($t:ty),*) => {$(
        impl Length for $t {
            fn to_i64(self) -> i64 {
                i64::from(self)
            }
        }
    )*};
}
length!(i32, i64, u32);

const CHUNK: usize = 1 << 16;

/// The most items (samples and split pieces) a plan holds: the strategies index items with
/// u32. Checked before anything is allocated, so an absurd length with `overlong="split"` is an
/// error, not an abort or the OOM killer.
pub const MAX_ITEMS: u64 = u32::MAX as u64;

/// Items sample `length` becomes under `overlong`.
fn pieces(length: i64, cap: i64, overlong: Overlong) -> u64 {
    match overlong {
        _ if length <= 0 => 0,
        _ if length <= cap => 1,
        Overlong::Split => (length as u64).div_ceil(cap as u64),
        Overlong::Truncate => 1,
        Overlong::Drop | Overlong::Error => 0,
    }
}

fn too_many_items<L: Length>(lengths: &[L], max_len: u32, overlong: Overlong) -> CoreError {
    let cap = i64::from(max_len);
    let mut total = 0u64;
    for (index, &l) in lengths.iter().enumerate() {
        total = total.saturating_add(pieces(l.to_i64(), cap, overlong));
        if total > MAX_ITEMS {
            return CoreError::data(format!(
                "sample {index} has {} tokens: with max_len={max_len} the samples up to it make \
                 {total} pieces, more than the {MAX_ITEMS} a plan can hold; raise max_len or \
                 filter out the longest samples",
                l.to_i64()
            ));
        }
    }
    unreachable!("called only when the items exceed MAX_ITEMS")
}

fn reserve(items: &mut Vec<Item>, n: u64) -> Result<()> {
    items.try_reserve_exact(n as usize).map_err(|_| {
        CoreError::data(format!(
            "planning {n} pieces needs {} GiB of memory, more than is available; raise max_len \
             or filter out the longest samples",
            (n * std::mem::size_of::<Item>() as u64) >> 30
        ))
    })
}

fn add_tokens(total: u64, more: u64) -> Result<u64> {
    total
        .checked_add(more)
        .ok_or_else(|| CoreError::data("the sample lengths add up to more than 2^64 tokens"))
}

/// The items of `lengths` under `overlong`; `cuts` chooses the pieces of some over-long samples
/// under `truncate` and `split` (see [`crate::cuts`]).
pub fn build_items<L: Length>(
    lengths: &[L],
    max_len: u32,
    overlong: Overlong,
    cuts: Option<&Cuts>,
) -> Result<Items> {
    if let Some(&last) = cuts.and_then(|c| c.samples.last()) {
        if last < 0 || last as usize >= lengths.len() {
            return Err(CoreError::Config(format!(
                "cuts: sample {last} is not one of the {} samples",
                lengths.len()
            )));
        }
    }
    let cap = i64::from(max_len);
    let counts: Vec<u64> = lengths
        .par_chunks(CHUNK)
        .map(|chunk| {
            let count = |n: u64, l: &L| n.saturating_add(pieces(l.to_i64(), cap, overlong));
            chunk.iter().fold(0u64, count)
        })
        .collect();
    let total = counts.iter().fold(0u64, |a, &b| a.saturating_add(b));
    if total > MAX_ITEMS {
        return Err(too_many_items(lengths, max_len, overlong));
    }
    // Chunks are processed in parallel and concatenated in order, so the result is the same
    // for any thread count; the first error in sample order wins.
    let parts: Vec<Result<Items>> = lengths
        .par_chunks(CHUNK)
        .zip(counts)
        .enumerate()
        .map(|(c, (chunk, n))| build_chunk(chunk, c * CHUNK, n, max_len, overlong, cuts))
        .collect();
    let mut all = Items::default();
    reserve(&mut all.items, total)?;
    for part in parts {
        let part = part?;
        all.items.extend_from_slice(&part.items);
        all.dropped.extend_from_slice(&part.dropped);
        all.empty.extend_from_slice(&part.empty);
        all.truncated.extend_from_slice(&part.truncated);
        all.split.extend_from_slice(&part.split);
        all.input_tokens = add_tokens(all.input_tokens, part.input_tokens)?;
    }
    Ok(all)
}

fn build_chunk<L: Length>(
    chunk: &[L],
    base: usize,
    n_items: u64,
    max_len: u32,
    overlong: Overlong,
    cuts: Option<&Cuts>,
) -> Result<Items> {
    let mut out = Items::default();
    reserve(&mut out.items, n_items)?;
    let cap = i64::from(max_len);
    for (i, &raw) in chunk.iter().enumerate() {
        let index = base + i;
        let sample = index as i64;
        let length = raw.to_i64();
        if length < 0 {
            return Err(CoreError::data(format!(
                "sample {index} has a negative length ({length})"
            )));
        }
        out.input_tokens = add_tokens(out.input_tokens, length as u64)?;
        let whole = overlong == Overlong::Split;
        // A sample that fits may have no chosen cut (it would be ignored silently).
        let chosen = match cuts {
            Some(c)
                if length <= cap || matches!(overlong, Overlong::Truncate | Overlong::Split) =>
            {
                c.chosen(sample, length, cap, whole)?
            }
            _ => None,
        };
        if length == 0 {
            out.empty.push(sample);
            continue;
        }
        if length <= cap {
            out.items.push(Item {
                sample,
                start: 0,
                len: length as u32,
            });
            continue;
        }
        if let Some(pieces) = chosen {
            match (pieces.is_empty(), whole) {
                (true, _) => out.dropped.push(sample),
                (false, true) => out.split.push(sample),
                (false, false) => out.truncated.push(sample),
            }
            out.items
                .extend(pieces.into_iter().map(|(start, len)| Item {
                    sample,
                    start,
                    len: len as u32,
                }));
            continue;
        }
        match overlong {
            Overlong::Error => {
                return Err(CoreError::Overlong {
                    at: Default::default(),
                    index,
                    length,
                    max_len,
                })
            }
            Overlong::Drop => out.dropped.push(sample),
            Overlong::Truncate => {
                out.truncated.push(sample);
                out.items.push(Item {
                    sample,
                    start: 0,
                    len: max_len,
                });
            }
            Overlong::Split => {
                out.split.push(sample);
                out.items
                    .extend((0..length).step_by(cap as usize).map(|start| Item {
                        sample,
                        start,
                        len: (length - start).min(cap) as u32,
                    }));
            }
        }
    }
    Ok(out)
}
