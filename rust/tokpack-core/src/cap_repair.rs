//! Meeting a segment cap after an uncapped plan. Greedy capped placement (close a row when it
//! holds `cap` items) piles the shortest items, placed last, into rows that reach the cap
//! half-empty. Instead the strategies plan without the cap and this pass repairs the rows over
//! it, one at a time in row order:
//!
//! 1. **Swaps**: the `m` shortest items of a row over the cap (`m` from 2 up) change places with
//!    one item `c` of a row that has `m - 1` free slots, where `c` holds at least their tokens
//!    and at most their tokens plus the row's room: the row over the cap gets `m - 1` segments
//!    fewer and still fits, the other gets `m - 1` more and no more tokens. Most rows hold a few
//!    long samples and have free slots, so the short items almost always find a match; trying
//!    every `m` spreads the lengths asked for, so no one length runs out.
//! 2. **Evictions**: a row still over the cap gives up its shortest items until it holds `cap`.
//! 3. **Best fit**: the evicted items, longest first, go to the row with the least room that
//!    fits them and has a free slot, else to new rows.
//!
//! Every item stays in exactly one row, no row goes over `max_len` or `cap`, and every step is
//! sequential in a fixed order, so the result does not depend on the thread count.

use crate::capacity_index::SuccessorSet;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const NONE: u32 = u32::MAX;

/// Items of one length that a search passes over (they fit no swap now) before it tries the
/// next length: bounds the search where most rows are near the cap.
const WALK: u32 = 8;

/// Entries (items or rows) by a length: one list per length and a successor set over non-empty
/// lengths, so the shortest length in a range is found in O(log64 max_len).
struct ByLengthIndex {
    head: Vec<u32>,
    next: Vec<u32>,
    nonempty: SuccessorSet,
}

impl ByLengthIndex {
    fn new(n_entries: usize, max_len: u32) -> Self {
        Self {
            head: vec![NONE; max_len as usize + 1],
            next: vec![NONE; n_entries],
            nonempty: SuccessorSet::new(max_len as usize),
        }
    }

    fn push(&mut self, k: u32, len: u32) {
        let l = len as usize;
        self.next[k as usize] = self.head[l];
        if self.head[l] == NONE {
            self.nonempty.insert(l);
        }
        self.head[l] = k;
    }

    /// Takes out an entry of the shortest length in `lo..=hi` that `fits` (the last pushed of
    /// its length); entries met on the way that are `stale` are dropped. At most [`WALK`]
    /// entries that do not fit are passed over per length (they stay).
    fn take(
        &mut self,
        lo: u32,
        hi: u32,
        stale: impl Fn(u32) -> bool,
        fits: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        let mut l = lo as usize;
        loop {
            l = self.nonempty.successor(l)?;
            if l > hi as usize {
                return None;
            }
            let (mut prev, mut k, mut passed) = (NONE, self.head[l], 0);
            let mut found = None;
            while k != NONE && passed < WALK {
                let next = self.next[k as usize];
                let gone = stale(k);
                let take = !gone && fits(k);
                if gone || take {
                    match prev {
                        NONE => self.head[l] = next,
                        p => self.next[p as usize] = next,
                    }
                } else {
                    prev = k;
                    passed += 1;
                }
                if take {
                    found = Some(k);
                    break;
                }
                k = next;
            }
            if self.head[l] == NONE {
                self.nonempty.remove(l);
            }
            if found.is_some() {
                return found;
            }
            l += 1;
        }
    }
}

/// An item (`k` in length order) with its length, ordered shortest first (ties: lowest `k`).
type Short = Reverse<(u32, u32)>;

/// The repair's state: each item's row, each row's segments and tokens.
struct Repair<'a> {
    lens: &'a [u32],
    row_of: &'a mut [u32],
    held: Vec<u32>,
    tokens: Vec<u32>,
    max_len: u32,
    cap: u32,
}

/// Repairs `row_of` (the row of each item; item `k` has length `lens[k]`, items in length order,
/// longest first, no row over `max_len`) so that no row holds more than `cap` items; returns the
/// number of rows (new rows are numbered after the `n_rows` given). Without a row over the cap
/// nothing changes.
pub fn meet_cap(lens: &[u32], row_of: &mut [u32], n_rows: usize, max_len: u32, cap: u32) -> usize {
    let (mut held, mut tokens) = (vec![0u32; n_rows], vec![0u32; n_rows]);
    for (&r, &len) in row_of.iter().zip(lens) {
        held[r as usize] += 1;
        tokens[r as usize] += len;
    }
    let over: Vec<usize> = (0..n_rows).filter(|&r| held[r] > cap).collect();
    if over.is_empty() {
        return n_rows;
    }
    let mut slot = vec![NONE; n_rows];
    for (s, &r) in over.iter().enumerate() {
        slot[r] = s as u32;
    }
    let mut heaps: Vec<BinaryHeap<Short>> = vec![BinaryHeap::new(); over.len()];
    let mut donors = ByLengthIndex::new(lens.len(), max_len);
    for (k, (&r, &len)) in row_of.iter().zip(lens).enumerate() {
        match slot[r as usize] {
            NONE if held[r as usize] < cap => donors.push(k as u32, len),
            NONE => {}
            s => heaps[s as usize].push(Reverse((len, k as u32))),
        }
    }
    let mut state = Repair {
        lens,
        row_of,
        held,
        tokens,
        max_len,
        cap,
    };
    let mut evicted: Vec<u32> = Vec::new();
    for (&i, heap) in over.iter().zip(&mut heaps) {
        state.swap_out(i, heap, &mut donors);
        while state.held[i] > cap {
            let Reverse((len, k)) = heap.pop().expect("a row over the cap holds items");
            state.held[i] -= 1;
            state.tokens[i] -= len;
            evicted.push(k);
        }
    }
    evicted.sort_unstable();
    state.best_fit(&evicted)
}

impl Repair<'_> {
    /// Step 1 for row `i` (its items in `heap`): while it is over the cap, swaps its `m`
    /// shortest items for one donor item, with the smallest `m` that finds one.
    fn swap_out(&mut self, i: usize, heap: &mut BinaryHeap<Short>, donors: &mut ByLengthIndex) {
        let cap = self.cap;
        let mut taken: Vec<(u32, u32)> = Vec::new();
        'swaps: while self.held[i] > cap {
            let most = (self.held[i] - cap + 1).min(cap);
            let room = self.max_len - self.tokens[i];
            let mut sum = 0u32;
            taken.clear();
            while (taken.len() as u32) < most {
                let Some(Reverse(item)) = heap.pop() else {
                    break;
                };
                sum += item.0;
                taken.push(item);
                let m = taken.len() as u32;
                if m < 2 {
                    continue;
                }
                let (held, rows) = (&self.held, &*self.row_of);
                let stale = |k: u32| held[rows[k as usize] as usize] >= cap;
                let fits = |k: u32| held[rows[k as usize] as usize] + m - 1 <= cap;
                if let Some(c) = donors.take(sum, sum.saturating_add(room), stale, fits) {
                    let c_len = self.lens[c as usize];
                    let j = self.swap(i, &taken, sum, c);
                    if self.held[j] < cap {
                        for &(len, k) in &taken {
                            donors.push(k, len);
                        }
                    }
                    heap.push(Reverse((c_len, c)));
                    continue 'swaps;
                }
            }
            heap.extend(taken.drain(..).map(Reverse));
            return;
        }
    }

    /// Moves `taken` (of row `i`, `sum` tokens) to the row of item `c`, and `c` to row `i`;
    /// returns `c`'s former row.
    fn swap(&mut self, i: usize, taken: &[(u32, u32)], sum: u32, c: u32) -> usize {
        let j = self.row_of[c as usize] as usize;
        let gain = self.lens[c as usize] - sum;
        for &(_, k) in taken {
            self.row_of[k as usize] = j as u32;
        }
        self.row_of[c as usize] = i as u32;
        let m = taken.len() as u32;
        self.tokens[i] += gain;
        self.tokens[j] -= gain;
        self.held[i] -= m - 1;
        self.held[j] += m - 1;
        j
    }

    /// Step 3: each of `items` (in length order) to the row with the least room that fits it
    /// and has a free slot (of rows with equal room, the one listed last), else to a new row.
    /// Returns the number of rows.
    fn best_fit(mut self, items: &[u32]) -> usize {
        let (max_len, cap) = (self.max_len, self.cap);
        let mut n_rows = self.held.len();
        if items.is_empty() {
            return n_rows;
        }
        let mut open = ByLengthIndex::new(n_rows + items.len(), max_len);
        for r in 0..n_rows {
            let room = max_len - self.tokens[r];
            if self.held[r] < cap && room > 0 {
                open.push(r as u32, room);
            }
        }
        for &k in items {
            let len = self.lens[k as usize];
            let row = match open.take(len, max_len, |_| false, |_| true) {
                Some(r) => r as usize,
                None => {
                    self.held.push(0);
                    self.tokens.push(0);
                    n_rows += 1;
                    n_rows - 1
                }
            };
            self.row_of[k as usize] = row as u32;
            self.held[row] += 1;
            self.tokens[row] += len;
            if self.tokens[row] < max_len && self.held[row] < cap {
                open.push(row as u32, max_len - self.tokens[row]);
            }
        }
        n_rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Each row's (segments, tokens).
    fn loads(lens: &[u32], row_of: &[u32], n_rows: usize) -> Vec<(u32, u32)> {
        let mut out = vec![(0u32, 0u32); n_rows];
        for (&r, &len) in row_of.iter().zip(lens) {
            out[r as usize].0 += 1;
            out[r as usize].1 += len;
        }
        out
    }

    /// Lengths (longest first) and an arbitrary assignment of them to rows within `max_len`
    /// (each item to a row chosen by `picks`, else a new row).
    fn instance(raw: &[(u32, u32)], max_len: u32) -> (Vec<u32>, Vec<u32>, usize) {
        let mut lens: Vec<u32> = raw.iter().map(|&(l, _)| 1 + l % max_len).collect();
        lens.sort_unstable_by(|a, b| b.cmp(a));
        let mut tokens: Vec<u32> = Vec::new();
        let mut row_of = Vec::new();
        for (&len, &(_, pick)) in lens.iter().zip(raw) {
            let fitting: Vec<usize> = (0..tokens.len())
                .filter(|&r| tokens[r] + len <= max_len)
                .collect();
            let r = if fitting.is_empty() || pick % 4 == 0 {
                tokens.push(0);
                tokens.len() - 1
            } else {
                fitting[pick as usize % fitting.len()]
            };
            tokens[r] += len;
            row_of.push(r as u32);
        }
        let n = tokens.len();
        (lens, row_of, n)
    }

    proptest! {
        #![proptest_config(crate::capacity_index::proptest_common::deterministic(512))]
        #[test]
        fn repaired_rows_meet_the_cap_and_max_len_and_keep_every_item(
            raw in proptest::collection::vec((0u32..1000, 0u32..1000), 0..300),
            max_len in 1u32..400,
            cap in 1u32..8,
        ) {
            let (lens, mut row_of, n_rows) = instance(&raw, max_len);
            let before = loads(&lens, &row_of, n_rows);
            let over = before.iter().any(|&(h, _)| h > cap);
            let original = row_of.clone();
            let n = meet_cap(&lens, &mut row_of, n_rows, max_len, cap);
            // Each item is in exactly one row (row_of assigns one), of the n rows.
            prop_assert!(row_of.iter().all(|&r| (r as usize) < n));
            let after = loads(&lens, &row_of, n);
            for &(held, tokens) in &after {
                prop_assert!(held >= 1, "an empty row");
                prop_assert!(held <= cap && tokens <= max_len);
            }
            // Rows are only added, and never without a row over the cap.
            prop_assert!(n >= n_rows);
            if !over {
                prop_assert_eq!(n, n_rows);
                prop_assert_eq!(&row_of, &original);
            }
            // The tokens are the same, so the rows are at least the tokens' and the items'
            // lower bounds.
            let total: u64 = lens.iter().map(|&l| u64::from(l)).sum();
            prop_assert!(n as u64 >= total.div_ceil(u64::from(max_len)));
            prop_assert!(n as u64 >= (lens.len() as u64).div_ceil(u64::from(cap)));
        }
    }

    #[test]
    fn two_short_items_trade_places_with_one_that_holds_them() {
        // max_len 14, cap 4. Row 0: 6 + 3 + 2 + 2 + 1 (full, five items); row 1: 8 + 3.
        let lens = [8u32, 6, 3, 3, 2, 2, 1];
        let mut row_of = [1u32, 0, 0, 1, 0, 0, 0];
        let n = meet_cap(&lens, &mut row_of, 2, 14, 4);
        // The two shortest of row 0 (1 + 2 = 3) swap with row 1's 3: no row is added.
        assert_eq!(n, 2);
        assert_eq!(loads(&lens, &row_of, n), vec![(4, 14), (3, 11)]);
    }

    #[test]
    fn items_no_swap_can_place_go_to_a_new_row() {
        // One row of four 1-token items, cap 2, nothing to swap with.
        let lens = [1u32; 4];
        let mut row_of = [0u32; 4];
        assert_eq!(meet_cap(&lens, &mut row_of, 1, 8, 2), 2);
        assert_eq!(loads(&lens, &row_of, 2), vec![(2, 2), (2, 2)]);
    }
}
