//! A set of capacities `0..=max` with O(log64 max) insert, remove and successor queries:
//! the structure that makes best-fit O(n log max_len) instead of a scan over open rows.

pub struct SuccessorSet {
    /// `levels[0]` has one bit per value; each higher level has one bit per non-zero word below.
    levels: Vec<Vec<u64>>,
}

impl SuccessorSet {
    pub fn new(max: usize) -> Self {
        let mut levels = Vec::new();
        let mut bits = max + 1;
        loop {
            let words = bits.div_ceil(64);
            levels.push(vec![0u64; words]);
            if words == 1 {
                break;
            }
            bits = words;
        }
        Self { levels }
    }

    pub fn insert(&mut self, value: usize) {
        let mut v = value;
        for level in &mut self.levels {
            let was_empty = level[v / 64] == 0;
            level[v / 64] |= 1 << (v % 64);
            if !was_empty {
                return;
            }
            v /= 64;
        }
    }

    pub fn remove(&mut self, value: usize) {
        let mut v = value;
        for level in &mut self.levels {
            level[v / 64] &= !(1u64 << (v % 64));
            if level[v / 64] != 0 {
                return;
            }
            v /= 64;
        }
    }

    /// The smallest member `>= value`, if any.
    pub fn successor(&self, value: usize) -> Option<usize> {
        let mut v = value;
        let mut depth = 0;
        // Climb until a word holds a member at or after the current position.
        loop {
            let level = self.levels.get(depth)?;
            let word_index = v / 64;
            if word_index >= level.len() {
                return None;
            }
            let masked = level[word_index] & (u64::MAX << (v % 64));
            if masked != 0 {
                v = word_index * 64 + masked.trailing_zeros() as usize;
                break;
            }
            v = word_index + 1;
            depth += 1;
        }
        // Descend, taking the lowest set bit of each word.
        while depth > 0 {
            depth -= 1;
            let word = self.levels[depth][v];
            v = v * 64 + word.trailing_zeros() as usize;
        }
        Some(v)
    }
}

// The property tests' shared configuration (fixed seed), as the integration tests use it
// (cap_repair's tests too).
#[cfg(test)]
#[path = "../tests/common/mod.rs"]
pub(crate) mod proptest_common;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #![proptest_config(super::proptest_common::deterministic(256))]
        #[test]
        fn matches_btreeset(max in 1usize..5000, ops in proptest::collection::vec((0u8..3, 0usize..5000), 0..300)) {
            let mut set = SuccessorSet::new(max);
            let mut model = BTreeSet::new();
            for (op, raw) in ops {
                let v = raw % (max + 1);
                match op {
                    0 => { set.insert(v); model.insert(v); }
                    1 => { set.remove(v); model.remove(&v); }
                    _ => prop_assert_eq!(set.successor(v), model.range(v..).next().copied()),
                }
            }
        }
    }
}
