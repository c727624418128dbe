//! Local search shared by [`super::partition`] and [`super::micro_batches`]: items sit in bins
//! (with a token cap), bins in groups; while some exchange lowers the heaviest group, move one
//! item from it to a lighter group, or swap one item of each. Every accepted exchange lowers
//! the heaviest group or the number of groups that heavy and strictly lowers the sum of squared
//! group sums, so the search ends; a budget bounds it anyway. Bins never become empty.

use super::{cmp_cost, Cost};
use std::cmp::Ordering;
use std::collections::BTreeSet;

/// Lightest groups tried against the heaviest before giving up.
const TRIES: usize = 8;
/// Items looked at on each side of the ideal swap partner before giving up on a direction.
const WINDOW: usize = 16;

/// A group's sum and id, ordered by sum then id.
type Key = (Cost, u32);

/// Ascending cost, ties by decreasing index (the reverse of `partition::by_cost_desc`).
fn by_cost(cost: &[f64], a: u32, b: u32) -> Ordering {
    cmp_cost(cost[a as usize], cost[b as usize]).then(b.cmp(&a))
}

/// One exchange: item `x` of the heavy group goes to bin `to` (a move) or trades places with
/// item `y` (a swap). `score` is how far the change in sums is from half the gap (lower wins).
#[derive(Clone, Copy)]
struct Exchange {
    score: f64,
    x: u32,
    y: Option<u32>,
    to: u32,
}

impl Exchange {
    fn better_than(&self, other: &Option<Exchange>) -> bool {
        match other {
            None => true,
            Some(o) => cmp_cost(self.score, o.score)
                .then(self.x.cmp(&o.x))
                .then(self.y.cmp(&o.y))
                .is_lt(),
        }
    }
}

pub(super) struct Layout<'a> {
    cost: &'a [f64],
    len: &'a [u64],
    cap: u64,
    bin_of: Vec<u32>,
    bin_tokens: Vec<u64>,
    bin_count: Vec<u32>,
    bin_group: Vec<u32>,
    group_bins: Vec<Vec<u32>>,
    group_sum: Vec<f64>,
    /// Each group's items by ascending (cost, index): swap partners are found by one merge.
    members: Vec<Vec<u32>>,
    order: BTreeSet<Key>,
}

impl<'a> Layout<'a> {
    /// `bins[b]` lists the items of bin `b` (every item of `cost` in exactly one bin), which
    /// belongs to group `bin_group[b]` (< `n_groups`); `order`: every item by decreasing cost,
    /// ties by index (`partition::by_cost_desc`).
    pub fn new(
        cost: &'a [f64],
        len: &'a [u64],
        cap: u64,
        bins: &[Vec<u32>],
        bin_group: Vec<u32>,
        n_groups: usize,
        order: &[u32],
    ) -> Self {
        let n = cost.len();
        let mut layout = Self {
            cost,
            len,
            cap,
            bin_of: vec![0; n],
            bin_tokens: vec![0; bins.len()],
            bin_count: vec![0; bins.len()],
            group_bins: vec![Vec::new(); n_groups],
            group_sum: vec![0.0; n_groups],
            members: vec![Vec::new(); n_groups],
            order: BTreeSet::new(),
            bin_group,
        };
        for (b, items) in bins.iter().enumerate() {
            let g = layout.bin_group[b] as usize;
            layout.group_bins[g].push(b as u32);
            for &i in items {
                layout.bin_of[i as usize] = b as u32;
                layout.bin_tokens[b] += len[i as usize];
                layout.bin_count[b] += 1;
                layout.group_sum[g] += cost[i as usize];
            }
        }
        // Each group's members in [`by_cost`] order, without a sort per group.
        for &i in order.iter().rev() {
            let g = layout.bin_group[layout.bin_of[i as usize] as usize] as usize;
            layout.members[g].push(i);
        }
        layout.order = (0..n_groups)
            .map(|g| (Cost(layout.group_sum[g]), g as u32))
            .collect();
        layout
    }

    /// The items of each bin, ascending.
    pub fn bins(&self) -> Vec<Vec<u32>> {
        let mut bins = vec![Vec::new(); self.bin_tokens.len()];
        for (i, &b) in self.bin_of.iter().enumerate() {
            bins[b as usize].push(i as u32);
        }
        bins
    }

    /// Improves the layout for at most `budget` exchanges; `moves` allows single-item moves
    /// (off when every group must keep its item count).
    pub fn refine(&mut self, moves: bool, budget: usize) {
        let mean = self.group_sum.iter().sum::<f64>() / self.group_sum.len().max(1) as f64;
        for _ in 0..budget {
            let Some(&(Cost(heavy_sum), p)) = self.order.iter().next_back() else {
                return;
            };
            if heavy_sum - mean <= mean * 1e-12 {
                return; // as even as sums get
            }
            let found = self
                .order
                .iter()
                .take(TRIES)
                .take_while(|k| k.1 != p)
                .find_map(|&(Cost(s), q)| {
                    self.best_exchange(p, q, heavy_sum - s, moves)
                        .map(|e| (q, e))
                });
            match found {
                Some((q, e)) => self.apply(p, q, e),
                None => return,
            }
        }
    }

    fn fits(&self, bin: u32, out: u32, into: u32) -> bool {
        let b = bin as usize;
        (self.bin_tokens[b] - self.len[out as usize]).saturating_add(self.len[into as usize])
            <= self.cap
    }

    fn best_exchange(&self, p: u32, q: u32, gap: f64, moves: bool) -> Option<Exchange> {
        if gap <= 0.0 {
            return None;
        }
        let half = gap / 2.0;
        let cost = self.cost;
        let light = &self.members[q as usize];
        // The light group's bin with the fewest tokens, for moves.
        let roomiest = self.group_bins[q as usize]
            .iter()
            .copied()
            .min_by_key(|&b| (self.bin_tokens[b as usize], b));
        let mut best: Option<Exchange> = None;
        // Heavy items ascend, so the ideal partner `cx - half` does too: `split` only advances.
        let mut split = 0;
        for &x in &self.members[p as usize] {
            let (cx, bx) = (cost[x as usize], self.bin_of[x as usize]);
            if moves && self.bin_count[bx as usize] > 1 && cx > 0.0 && cx < gap {
                if let Some(to) = roomiest {
                    let room = self.bin_tokens[to as usize].saturating_add(self.len[x as usize]);
                    let e = Exchange {
                        score: (cx - half).abs(),
                        x,
                        y: None,
                        to,
                    };
                    if room <= self.cap && e.better_than(&best) {
                        best = Some(e);
                    }
                }
            }
            // Swap partners: cost in (cx - gap, cx), ideally cx - half; the nearest that fits
            // the cap on each side.
            while split < light.len() && cost[light[split] as usize] < cx - half {
                split += 1;
            }
            let below = light[..split].iter().rev();
            let above = light[split..].iter();
            let partners = [
                self.swap_partner(x, gap, below),
                self.swap_partner(x, gap, above),
            ];
            for y in partners.into_iter().flatten() {
                let e = Exchange {
                    score: (cx - cost[y as usize] - half).abs(),
                    x,
                    y: Some(y),
                    to: self.bin_of[y as usize],
                };
                if e.better_than(&best) {
                    best = Some(e);
                }
            }
        }
        best
    }

    /// The first of (at most [`WINDOW`]) `candidates` that `x` may swap with: `x` costs more,
    /// by less than `gap`, and both bins stay under the cap.
    fn swap_partner<'b>(
        &self,
        x: u32,
        gap: f64,
        candidates: impl Iterator<Item = &'b u32>,
    ) -> Option<u32> {
        let bx = self.bin_of[x as usize];
        for &y in candidates.take(WINDOW) {
            let delta = self.cost[x as usize] - self.cost[y as usize];
            if !(delta > 0.0 && delta < gap) {
                return None;
            }
            if self.fits(bx, x, y) && self.fits(self.bin_of[y as usize], y, x) {
                return Some(y);
            }
        }
        None
    }

    fn apply(&mut self, p: u32, q: u32, e: Exchange) {
        let bx = self.bin_of[e.x as usize];
        self.relocate(e.x, bx, p, e.to, q);
        if let Some(y) = e.y {
            self.relocate(y, e.to, q, bx, p);
        }
    }

    fn relocate(&mut self, item: u32, from: u32, from_group: u32, to: u32, to_group: u32) {
        let (i, c, l) = (
            item as usize,
            self.cost[item as usize],
            self.len[item as usize],
        );
        self.bin_tokens[from as usize] -= l;
        self.bin_count[from as usize] -= 1;
        self.bin_tokens[to as usize] += l;
        self.bin_count[to as usize] += 1;
        self.bin_of[i] = to;
        let cost = self.cost;
        let from_members = &mut self.members[from_group as usize];
        let at = from_members
            .binary_search_by(|&m| by_cost(cost, m, item))
            .expect("an item is among its group's members");
        from_members.remove(at);
        let to_members = &mut self.members[to_group as usize];
        let at = to_members
            .binary_search_by(|&m| by_cost(cost, m, item))
            .unwrap_or_else(|at| at);
        to_members.insert(at, item);
        for (g, change) in [(from_group, -c), (to_group, c)] {
            let sum = &mut self.group_sum[g as usize];
            self.order.remove(&(Cost(*sum), g));
            *sum += change;
            self.order.insert((Cost(*sum), g));
        }
    }
}
