//! The packing strategies. Each takes items (in sample order) and returns, for every row, the
//! items it holds, as CSR: row `r` is positions `offsets[r]..offsets[r+1]` of the segment
//! columns; segments keep the order in which they were placed.

use crate::cap_repair::meet_cap;
use crate::capacity_index::SuccessorSet;
use crate::cuts::{safe_cut, Blocks};
use crate::error::{CoreError, Result};
use crate::items::Item;
use crate::rng::SplitMix64;
use rayon::prelude::*;
use std::ops::Range;

/// Rows as CSR over segments, one column per field (the plan's own layout, so nothing is
/// reshaped after planning).
pub struct Rows {
    pub offsets: Vec<i64>,
    pub sample_ids: Vec<i64>,
    pub starts: Vec<i64>,
    pub lengths: Vec<i64>,
}

/// A placed item: its length (high 32 bits) and index (low 32 bits), so the common case (item
/// `i` is all of sample `i`) builds the segment columns without looking the item up.
type Placed = u64;

impl Rows {
    /// Rows whose segment `p` is the item `placed[p]` names. Columns are collected in parallel
    /// (written once, never zeroed first; the random reads of `items` overlap), in order, so
    /// the result does not depend on the thread count.
    fn gather(offsets: Vec<i64>, items: &[Item], placed: &[Placed], identity: bool) -> Self {
        let index = |p: Placed| p as u32 as usize;
        let (sample_ids, starts) = if identity {
            let samples = placed.par_iter().map(|&p| index(p) as i64).collect();
            (samples, vec![0; placed.len()])
        } else {
            let item = |&p: &Placed| items[index(p)];
            placed
                .par_iter()
                .map(item)
                .map(|i| (i.sample, i.start))
                .unzip()
        };
        Self {
            offsets,
            sample_ids,
            starts,
            lengths: placed.par_iter().map(|&p| (p >> 32) as i64).collect(),
        }
    }

    /// Rows over `items` in their order.
    fn in_order(offsets: Vec<i64>, items: &[Item]) -> Self {
        let column = |field: fn(&Item) -> i64| items.par_iter().map(field).collect();
        Self {
            offsets,
            sample_ids: column(|item| item.sample),
            starts: column(|item| item.start),
            lengths: column(|item| i64::from(item.len)),
        }
    }
}

/// Item indices by length descending, ties by position (a stable counting sort,
/// O(n + max_len)), kept as one run per length so the packing loops never look an item up.
struct ByLength {
    order: Vec<u32>,
    /// Items of length `max_len - d` are `order[bounds[d]..bounds[d + 1]]`.
    bounds: Vec<usize>,
    max_len: u32,
    /// Item `i` is all of sample `i` (nothing split, dropped or empty).
    identity: bool,
}

impl ByLength {
    fn new(items: &[Item], max_len: u32) -> Self {
        let max = max_len as usize;
        // Counted at d + 1, so the prefix sums are each run's start, then its cursor.
        let mut bounds = vec![0usize; max + 2];
        let mut identity = true;
        for (i, item) in items.iter().enumerate() {
            bounds[max - item.len as usize + 1] += 1;
            identity &= item.sample == i as i64 && item.start == 0;
        }
        for k in 1..bounds.len() {
            bounds[k] += bounds[k - 1];
        }
        let mut order = vec![0u32; items.len()];
        for (i, item) in items.iter().enumerate() {
            let slot = &mut bounds[max - item.len as usize];
            order[*slot] = i as u32;
            *slot += 1;
        }
        // Each cursor now sits at its run's end, the next run's start: shifted by one they are
        // the bounds again, without a second O(max_len) array.
        bounds.rotate_right(1);
        bounds[0] = 0;
        Self {
            order,
            bounds,
            max_len,
            identity,
        }
    }

    /// `(length, positions in length order)` per non-empty run, longest first.
    fn runs(&self) -> impl Iterator<Item = (u32, Range<usize>)> + '_ {
        self.bounds
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1] > w[0])
            .map(|(d, w)| (self.max_len - d as u32, w[0]..w[1]))
    }
}

/// Groups placed items into rows, keeping placement order inside each row. `row_of[k]` is the
/// row of the `k`-th item in length order.
fn rows_from_assignment(items: &[Item], by_len: &ByLength, row_of: &[u32], n_rows: usize) -> Rows {
    let mut offsets = vec![0i64; n_rows + 1];
    for &r in row_of {
        offsets[r as usize + 1] += 1;
    }
    for k in 1..offsets.len() {
        offsets[k] += offsets[k - 1];
    }
    let mut cursor: Vec<i64> = offsets[..n_rows].to_vec();
    let mut placed: Vec<Placed> = vec![0; row_of.len()];
    for (len, run) in by_len.runs() {
        for (&i, &r) in by_len.order[run.clone()].iter().zip(&row_of[run]) {
            let slot = &mut cursor[r as usize];
            placed[*slot as usize] = u64::from(len) << 32 | u64::from(i);
            *slot += 1;
        }
    }
    Rows::gather(offsets, items, &placed, by_len.identity)
}

/// The rows of an uncapped placement, repaired to hold at most `cap` items each
/// ([`crate::cap_repair`]); unchanged without a cap.
fn capped_rows(
    items: &[Item],
    by_len: &ByLength,
    mut row_of: Vec<u32>,
    n_rows: usize,
    cap: u32,
) -> Rows {
    let n_rows = if cap < u32::MAX {
        let mut lens = vec![0u32; row_of.len()];
        for (len, run) in by_len.runs() {
            lens[run].fill(len);
        }
        meet_cap(&lens, &mut row_of, n_rows, by_len.max_len, cap)
    } else {
        n_rows
    };
    rows_from_assignment(items, by_len, &row_of, n_rows)
}

/// Best-fit decreasing: each item goes to the open row with the least room that still fits it.
/// Open rows are kept in buckets by remaining room; a successor set over non-empty buckets finds
/// the tightest fit in O(log64 max_len). With a cap the rows are then repaired to meet it
/// ([`crate::cap_repair`]).
pub fn best_fit_decreasing(items: &[Item], max_len: u32, cap: u32) -> Rows {
    let by_len = ByLength::new(items, max_len);
    let max = max_len as usize;
    const NONE: u32 = u32::MAX;
    let mut bucket_head = vec![NONE; max + 1];
    let mut next_in_bucket: Vec<u32> = Vec::new();
    let mut nonempty = SuccessorSet::new(max);
    let mut row_of = Vec::with_capacity(items.len());
    let mut n_rows: u32 = 0;
    for (len, run) in by_len.runs() {
        let len = len as usize;
        for _ in run {
            let (row, room) = match nonempty.successor(len) {
                Some(room) => {
                    let row = bucket_head[room];
                    bucket_head[room] = next_in_bucket[row as usize];
                    if bucket_head[room] == NONE {
                        nonempty.remove(room);
                    }
                    (row, room)
                }
                None => {
                    next_in_bucket.push(NONE);
                    n_rows += 1;
                    (n_rows - 1, max)
                }
            };
            row_of.push(row);
            let left = room - len;
            if left > 0 {
                next_in_bucket[row as usize] = bucket_head[left];
                if bucket_head[left] == NONE {
                    nonempty.insert(left);
                }
                bucket_head[left] = row;
            }
        }
    }
    capped_rows(items, &by_len, row_of, n_rows as usize, cap)
}

/// First-fit decreasing: each item goes to the lowest-numbered row that fits it. A max segment
/// tree over rows (unopened rows count as empty) finds it in O(log n). With a cap the rows are
/// then repaired to meet it ([`crate::cap_repair`]).
pub fn first_fit_decreasing(items: &[Item], max_len: u32, cap: u32) -> Rows {
    let by_len = ByLength::new(items, max_len);
    let leaves = items.len().max(1).next_power_of_two();
    let mut tree = vec![max_len; 2 * leaves];
    let mut row_of = Vec::with_capacity(items.len());
    let mut n_rows = 0usize;
    for (len, run) in by_len.runs() {
        for _ in run {
            // Descend to the leftmost leaf whose room is >= len; one always exists (n items <= leaves).
            let mut node = 1;
            while node < leaves {
                node = if tree[2 * node] >= len {
                    2 * node
                } else {
                    2 * node + 1
                };
            }
            let row = node - leaves;
            n_rows = n_rows.max(row + 1);
            row_of.push(row as u32);
            tree[node] -= len;
            while node > 1 {
                node /= 2;
                tree[node] = tree[2 * node].max(tree[2 * node + 1]);
            }
        }
    }
    capped_rows(items, &by_len, row_of, n_rows, cap)
}

/// Input order; a new row starts when the next item does not fit in the current one, or the
/// current one holds `cap` items.
pub fn next_fit(items: &[Item], max_len: u32, cap: u32) -> Rows {
    let mut offsets = vec![0i64];
    let mut room = 0u32;
    let mut held = 0u32;
    for (k, item) in items.iter().enumerate() {
        if item.len > room || held == cap {
            if k > 0 {
                offsets.push(k as i64);
            }
            room = max_len;
            held = 0;
        }
        room -= item.len;
        held += 1;
    }
    if !items.is_empty() {
        offsets.push(items.len() as i64);
    }
    Rows::in_order(offsets, items)
}

/// One item per row: the padded baseline.
pub fn padding(items: &[Item]) -> Rows {
    Rows::in_order((0..=items.len() as i64).collect(), items)
}

/// The "random packing" baseline: shuffle samples with `seed`, concatenate, cut every `max_len`
/// tokens. Samples may be cut across rows; the cut ones are returned as the second value. A
/// sample with `blocks` is cut only at a safe boundary (the last at or before the row's end,
/// [`crate::cuts::safe_cut`]): the row ends there, shorter, and the rest starts the next one.
/// A row ends, shorter, when it holds `cap` segments.
pub fn random_concat(
    items: &[Item],
    max_len: u32,
    seed: u64,
    blocks: Option<&Blocks>,
    cap: u32,
) -> Result<(Rows, Vec<i64>)> {
    // Items of one sample are contiguous (they come in sample order): shuffle sample groups.
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for (k, item) in items.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if items[g.0].sample == item.sample => g.1 = k + 1,
            _ => groups.push((k, k + 1)),
        }
    }
    SplitMix64::new(seed).shuffle(&mut groups);
    let mut offsets = vec![0i64];
    let mut segments = Vec::with_capacity(items.len());
    let mut cut = Vec::new();
    let mut room = max_len;
    for &(a, b) in &groups {
        for item in &items[a..b] {
            let spans = blocks.map_or(&[][..], |b| b.of(item.sample));
            let mut piece = *item;
            while piece.len > 0 {
                let mut take = piece.len.min(room);
                if take < piece.len && !spans.is_empty() {
                    let end = safe_cut(spans, piece.start, piece.start + i64::from(take));
                    take = (end - piece.start) as u32;
                }
                if take == 0 {
                    if room == max_len {
                        return Err(CoreError::data(format!(
                            "sample {}: no safe cut in tokens {}..{} (a block longer than \
                             max_len {max_len} inside a piece)",
                            piece.sample,
                            piece.start,
                            piece.start + i64::from(piece.len)
                        )));
                    }
                    offsets.push(segments.len() as i64);
                    room = max_len;
                    continue;
                }
                segments.push(Item { len: take, ..piece });
                if take < piece.len && cut.last() != Some(&piece.sample) {
                    cut.push(piece.sample);
                }
                piece.start += i64::from(take);
                piece.len -= take;
                room -= take;
                // Without blocks a piece is left over only when the row is full.
                let held = segments.len() as i64 - offsets[offsets.len() - 1];
                if room == 0 || piece.len > 0 || held == i64::from(cap) {
                    offsets.push(segments.len() as i64);
                    room = max_len;
                }
            }
        }
    }
    if room < max_len {
        offsets.push(segments.len() as i64);
    }
    cut.sort_unstable();
    cut.dedup();
    Ok((Rows::in_order(offsets, &segments), cut))
}
