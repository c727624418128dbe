//! Turning sample lengths into packable items, applying the overlong policy.

use crate::error::{CoreError, Result};
use crate::plan::Overlong;
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
impl Length for i32 {
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}
impl Length for i64 {
    fn to_i64(self) -> i64 {
        self
    }
}
impl Length for u32 {
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}

const CHUNK: usize = 1 << 16;

pub fn build_items<L: Length>(lengths: &[L], max_len: u32, overlong: Overlong) -> Result<Items> {
    // Chunks are processed in parallel and concatenated in order, so the result is the same
    // for any thread count; the first error in sample order wins.
    let parts: Vec<Result<Items>> = lengths
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(c, chunk)| build_chunk(chunk, c * CHUNK, max_len, overlong))
        .collect();
    let mut all = Items::default();
    for part in parts {
        let part = part?;
        all.items.extend_from_slice(&part.items);
        all.dropped.extend_from_slice(&part.dropped);
        all.empty.extend_from_slice(&part.empty);
        all.truncated.extend_from_slice(&part.truncated);
        all.split.extend_from_slice(&part.split);
        all.input_tokens += part.input_tokens;
    }
    Ok(all)
}

fn build_chunk<L: Length>(
    chunk: &[L],
    base: usize,
    max_len: u32,
    overlong: Overlong,
) -> Result<Items> {
    let mut out = Items {
        items: Vec::with_capacity(chunk.len()),
        ..Items::default()
    };
    let cap = i64::from(max_len);
    for (i, &raw) in chunk.iter().enumerate() {
        let index = base + i;
        let sample = index as i64;
        let length = raw.to_i64();
        if length < 0 {
            return Err(CoreError::Data(format!(
                "sample {index} has a negative length ({length})"
            )));
        }
        out.input_tokens += length as u64;
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
        match overlong {
            Overlong::Error => {
                return Err(CoreError::Overlong {
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
                let mut start = 0;
                while start < length {
                    let len = (length - start).min(cap);
                    out.items.push(Item {
                        sample,
                        start,
                        len: len as u32,
                    });
                    start += len;
                }
            }
        }
    }
    Ok(out)
}
