//! Balanced multiway partition of item costs: Karmarkar-Karp largest differencing, LPT, and the
//! better of both refined by local search.

use super::refine::Layout;
use super::{checked_costs, cmp_cost, cost_of, Cost};
use crate::error::{CoreError, Result};
use crate::policy::PartitionMethod;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// `k` parts of item indices, each ascending.
pub type Partition = Vec<Vec<u32>>;

/// Exchanges the local search may make: a few per part (each is the best for the heaviest).
pub(super) fn budget(parts: usize) -> usize {
    8 * parts + 32
}

/// Splits items `0..costs.len()` into `k` non-empty parts whose cost sums are as even as
/// `method` gets them; `equal_size` makes the item counts differ by at most one. The parts are
/// ordered by decreasing sum (ties: smallest first item), each part ascending. It runs on the
/// calling thread.
pub fn partition(
    costs: &[f64],
    k: usize,
    equal_size: bool,
    method: PartitionMethod,
) -> Result<Partition> {
    let n = costs.len();
    if k == 0 || k > n {
        return Err(CoreError::Config(format!(
            "cannot split {n} items into {k} non-empty parts (need 1 <= k <= the number of items)"
        )));
    }
    if n > u32::MAX as usize {
        return Err(CoreError::Config(format!(
            "at most {} items, got {n}",
            u32::MAX
        )));
    }
    checked_costs(costs)?;
    let order = by_cost_desc(costs);
    let parts = match method {
        PartitionMethod::Kk => karmarkar_karp(costs, &order, k, equal_size),
        PartitionMethod::Lpt => lpt(costs, &order, k, equal_size),
        PartitionMethod::Best => {
            let kk = karmarkar_karp(costs, &order, k, equal_size);
            let lpt = lpt(costs, &order, k, equal_size);
            // The lower maximum (Karmarkar-Karp on a tie), refined: one local search, on the
            // calling thread (a thread pool's wake-ups cost more than this work on a busy host).
            let start = if cmp_cost(max_sum(costs, &lpt), max_sum(costs, &kk)).is_lt() {
                lpt
            } else {
                kk
            };
            refined(costs, &order, start, equal_size)
        }
    };
    Ok(sorted(costs, parts))
}

pub(super) fn max_sum(costs: &[f64], parts: &[Vec<u32>]) -> f64 {
    parts.iter().map(|p| cost_of(costs, p)).fold(0.0, f64::max)
}

/// Parts ascending inside, by decreasing sum (ties: smallest first item) outside.
fn sorted(costs: &[f64], mut parts: Partition) -> Partition {
    for p in &mut parts {
        p.sort_unstable();
    }
    let sums: Vec<f64> = parts.iter().map(|p| cost_of(costs, p)).collect();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order
        .sort_by(|&a, &b| cmp_cost(sums[b], sums[a]).then(parts[a].first().cmp(&parts[b].first())));
    order
        .into_iter()
        .map(|i| std::mem::take(&mut parts[i]))
        .collect()
}

/// Items by decreasing cost, ties by index. Non-negative finite costs order as their bit
/// patterns (`+ 0.0` makes a `-0.0` one), so integer keys sort them.
pub(super) fn by_cost_desc(costs: &[f64]) -> Vec<u32> {
    let mut keyed: Vec<(u64, u32)> = costs
        .iter()
        .enumerate()
        .map(|(i, &c)| (!(c + 0.0).to_bits(), i as u32))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i).collect()
}

fn refined(costs: &[f64], order: &[u32], parts: Partition, equal_size: bool) -> Partition {
    let lens = vec![0; costs.len()];
    let k = parts.len();
    let groups = (0..k as u32).collect();
    let mut layout = Layout::new(costs, &lens, u64::MAX, &parts, groups, k, order);
    layout.refine(!equal_size, budget(k));
    layout.bins()
}

/// Longest processing time first: each item, largest first, to the part with the smallest sum
/// (ties: fewest items, lowest index) that may still take one.
/// `order`: the items by decreasing cost ([`by_cost_desc`]).
pub(super) fn lpt(costs: &[f64], order: &[u32], k: usize, equal_size: bool) -> Partition {
    let n = costs.len();
    let (base, mut extra) = if equal_size { (n / k, n % k) } else { (n, 0) };
    let mut parts = vec![Vec::new(); k];
    let mut heap: BinaryHeap<Reverse<(Cost, usize, usize)>> =
        (0..k).map(|p| Reverse((Cost(0.0), 0, p))).collect();
    for &i in order {
        while let Some(Reverse((Cost(s), count, p))) = heap.pop() {
            if equal_size && count == base && extra == 0 {
                continue; // full for good: no part may take a (base + 1)-th item any more
            }
            parts[p].push(i);
            if equal_size && count == base {
                extra -= 1;
            } else {
                heap.push(Reverse((Cost(s + costs[i as usize]), count + 1, p)));
            }
            break;
        }
    }
    parts
}

/// One part of a Karmarkar-Karp state: its sum and items (a linked list through `next`).
#[derive(Clone, Copy)]
struct Entry {
    sum: f64,
    head: u32,
    tail: u32,
}

const END: u32 = u32::MAX;

/// Karmarkar-Karp largest differencing, as verl's `karmarkar_karp`: every item (with
/// `equal_size`: every run of `k` items of similar cost, one per part) starts a state of `k`
/// parts; the two states of largest spread merge, the heaviest part of one with the lightest of
/// the other, until one state is left. A state keeps only its non-empty parts (heaviest first):
/// the others are empty, so a state of one item costs one entry, not `k`.
pub(super) fn karmarkar_karp(
    costs: &[f64],
    order: &[u32],
    k: usize,
    equal_size: bool,
) -> Partition {
    let mut next = vec![END; costs.len()];
    let singleton = |i: u32| Entry {
        sum: costs[i as usize],
        head: i,
        tail: i,
    };
    let mut states: Vec<Vec<Entry>> = if equal_size {
        order
            .chunks(k)
            .map(|run| run.iter().map(|&i| singleton(i)).collect())
            .collect()
    } else {
        order.iter().map(|&i| vec![singleton(i)]).collect()
    };
    let spread = |s: &[Entry]| s[0].sum - if s.len() < k { 0.0 } else { s[s.len() - 1].sum };
    let mut heap: BinaryHeap<(Cost, Reverse<usize>)> = states
        .iter()
        .enumerate()
        .map(|(id, s)| (Cost(spread(s)), Reverse(id)))
        .collect();
    while heap.len() > 1 {
        let (_, Reverse(a)) = heap.pop().expect("two states");
        let (_, Reverse(b)) = heap.pop().expect("two states");
        let (sa, sb) = (
            std::mem::take(&mut states[a]),
            std::mem::take(&mut states[b]),
        );
        let mut merged = Vec::with_capacity(k.min(sa.len() + sb.len()));
        for i in 0..k {
            let x = sa.get(i);
            let y = (k - 1 - i < sb.len()).then(|| &sb[k - 1 - i]);
            match (x, y) {
                (Some(x), Some(y)) => {
                    next[x.tail as usize] = y.head;
                    merged.push(Entry {
                        sum: x.sum + y.sum,
                        head: x.head,
                        tail: y.tail,
                    });
                }
                (Some(e), None) | (None, Some(e)) => merged.push(*e),
                (None, None) => {}
            }
        }
        merged.sort_by(|x, y| cmp_cost(y.sum, x.sum).then(x.head.cmp(&y.head)));
        heap.push((Cost(spread(&merged)), Reverse(states.len())));
        states.push(merged);
    }
    let (_, Reverse(last)) = heap.pop().expect("n >= k >= 1 items");
    states[last]
        .iter()
        .map(|e| {
            let mut items = Vec::new();
            let mut i = e.head;
            while i != END {
                items.push(i);
                i = next[i as usize];
            }
            items
        })
        .collect()
}
