//! The packing strategies. Each takes items (in sample order) and returns, for every row, the
//! items it holds, as a CSR pair `(row_offsets, item_order)`; segments keep the order in which
//! they were placed.

use crate::capacity_index::SuccessorSet;
use crate::items::Item;
use crate::rng::SplitMix64;

/// Rows as CSR over a sequence of segments.
pub struct Rows {
    pub offsets: Vec<i64>,
    pub segments: Vec<Item>,
}

/// Item indices ordered by length descending, ties by position: a counting sort, O(n + max_len).
pub fn order_by_length_desc(items: &[Item], max_len: u32) -> Vec<u32> {
    let max = max_len as usize;
    let mut starts = vec![0usize; max + 2];
    for item in items {
        starts[max - item.len as usize + 1] += 1;
    }
    for k in 1..starts.len() {
        starts[k] += starts[k - 1];
    }
    let mut order = vec![0u32; items.len()];
    for (i, item) in items.iter().enumerate() {
        let slot = &mut starts[max - item.len as usize];
        order[*slot] = i as u32;
        *slot += 1;
    }
    order
}

/// Groups placed items into rows, keeping placement order inside each row.
fn rows_from_assignment(items: &[Item], order: &[u32], row_of: &[u32], n_rows: usize) -> Rows {
    let mut offsets = vec![0i64; n_rows + 1];
    for &r in row_of {
        offsets[r as usize + 1] += 1;
    }
    for k in 1..offsets.len() {
        offsets[k] += offsets[k - 1];
    }
    let mut cursor: Vec<i64> = offsets[..n_rows].to_vec();
    let mut segments = vec![
        Item {
            sample: 0,
            start: 0,
            len: 0
        };
        order.len()
    ];
    for (&i, &r) in order.iter().zip(row_of) {
        let slot = &mut cursor[r as usize];
        segments[*slot as usize] = items[i as usize];
        *slot += 1;
    }
    Rows { offsets, segments }
}

/// Best-fit decreasing: each item goes to the open row with the least room that still fits it.
/// Open rows are kept in buckets by remaining room; a successor set over non-empty buckets finds
/// the tightest fit in O(log64 max_len).
pub fn best_fit_decreasing(items: &[Item], max_len: u32) -> Rows {
    let order = order_by_length_desc(items, max_len);
    let max = max_len as usize;
    const NONE: u32 = u32::MAX;
    let mut bucket_head = vec![NONE; max + 1];
    let mut next_in_bucket: Vec<u32> = Vec::new();
    let mut nonempty = SuccessorSet::new(max);
    let mut row_of = Vec::with_capacity(order.len());
    let mut n_rows: u32 = 0;
    for &i in &order {
        let len = items[i as usize].len as usize;
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
    rows_from_assignment(items, &order, &row_of, n_rows as usize)
}

/// First-fit decreasing: each item goes to the lowest-numbered row that fits it. A max segment
/// tree over rows (unopened rows count as empty) finds it in O(log n).
pub fn first_fit_decreasing(items: &[Item], max_len: u32) -> Rows {
    let order = order_by_length_desc(items, max_len);
    let leaves = order.len().max(1).next_power_of_two();
    let mut tree = vec![max_len; 2 * leaves];
    let mut row_of = Vec::with_capacity(order.len());
    let mut n_rows = 0usize;
    for &i in &order {
        let len = items[i as usize].len;
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
    rows_from_assignment(items, &order, &row_of, n_rows)
}

/// Input order; a new row starts when the next item does not fit in the current one.
pub fn next_fit(items: &[Item], max_len: u32) -> Rows {
    let mut offsets = vec![0i64];
    let mut room = 0u32;
    for (k, item) in items.iter().enumerate() {
        if item.len > room {
            if k > 0 {
                offsets.push(k as i64);
            }
            room = max_len;
        }
        room -= item.len;
    }
    if !items.is_empty() {
        offsets.push(items.len() as i64);
    }
    Rows {
        offsets,
        segments: items.to_vec(),
    }
}

/// One item per row: the padded baseline.
pub fn padding(items: &[Item]) -> Rows {
    Rows {
        offsets: (0..=items.len() as i64).collect(),
        segments: items.to_vec(),
    }
}

/// The "random packing" baseline: shuffle samples with `seed`, concatenate, cut every `max_len`
/// tokens. Samples may be cut across rows; the cut ones are returned as the third value.
pub fn random_concat(items: &[Item], max_len: u32, seed: u64) -> (Rows, Vec<i64>) {
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
            let mut piece = *item;
            while piece.len > 0 {
                let take = piece.len.min(room);
                segments.push(Item { len: take, ..piece });
                if take < piece.len && cut.last() != Some(&piece.sample) {
                    cut.push(piece.sample);
                }
                piece.start += i64::from(take);
                piece.len -= take;
                room -= take;
                if room == 0 {
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
    (Rows { offsets, segments }, cut)
}
