//! Micro-batches under a hard token cap, balanced across data-parallel ranks.
//!
//! 1. The micro-batch count: at least what best-fit decreasing needs under the cap (never fewer
//!    than `ceil(tokens / max_tokens)`), at least `min_micro_batches` per rank, rounded up to a
//!    multiple of `divisible_by` per rank (and of `dp_size` in all when counts are equal).
//! 2. Samples, largest compute first, each to the lightest micro-batch it fits in (LPT under
//!    the cap); if one fits nowhere, best-fit decreasing instead, which always fits. Local
//!    search then evens the micro-batches' compute, the cap checked on every exchange.
//! 3. Micro-batches to ranks: a balanced partition of their compute (equal counts), then local
//!    search moving and swapping single samples between the heaviest rank's micro-batches and
//!    the lightest ranks', again under the cap.

use super::partition::{budget, by_cost_desc, partition, Partition};
use super::refine::Layout;
use super::{cmp_cost, cost_of, Cost, CostModel};
use crate::error::{CoreError, Result};
use crate::policy::{MicroBatchOrder, OverCap, PartitionMethod};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

#[derive(Clone, Copy, Debug)]
pub struct MicroBatchConfig {
    pub max_tokens: u64,
    pub dp_size: usize,
    pub cost: CostModel,
    pub same_count: bool,
    pub min_micro_batches: usize,
    pub divisible_by: usize,
    pub order: MicroBatchOrder,
    pub over_cap: OverCap,
}

/// Rank `r`'s micro-batches are `rank_offsets[r]..rank_offsets[r+1]`; micro-batch `m` holds
/// samples `indices[mb_offsets[m]..mb_offsets[m+1]]` (ascending), `mb_tokens[m]` tokens and
/// `mb_compute[m]` compute.
#[derive(Clone, Debug, PartialEq)]
pub struct MicroBatchPlan {
    pub indices: Vec<i64>,
    pub mb_offsets: Vec<i64>,
    pub rank_offsets: Vec<i64>,
    pub mb_tokens: Vec<i64>,
    pub mb_compute: Vec<f64>,
}

pub fn micro_batches(lengths: &[i64], cfg: &MicroBatchConfig) -> Result<MicroBatchPlan> {
    let n = lengths.len();
    let cap = cfg.max_tokens;
    if cap == 0 || cfg.dp_size == 0 || cfg.divisible_by == 0 || cfg.min_micro_batches == 0 {
        return Err(CoreError::Config(format!(
            "max_tokens, dp_size, divisible_by and min_micro_batches must be at least 1, got \
             {cap}, {}, {}, {}",
            cfg.dp_size, cfg.divisible_by, cfg.min_micro_batches
        )));
    }
    if n > u32::MAX as usize {
        return Err(CoreError::Config(format!(
            "at most {} samples, got {n}",
            u32::MAX
        )));
    }
    let mut len = Vec::with_capacity(n);
    for (index, &l) in lengths.iter().enumerate() {
        if l < 0 {
            return Err(CoreError::data(format!(
                "sample {index} has a negative length ({l})"
            )));
        }
        if l as u64 > cap && cfg.over_cap == OverCap::Error {
            return Err(CoreError::OverCap {
                index,
                length: l,
                max_tokens: cap,
            });
        }
        len.push(l as u64);
    }
    let cost: Vec<f64> = len.iter().map(|&l| cfg.cost.cost(l)).collect();
    let (alone, fitting): (Vec<u32>, Vec<u32>) =
        (0..n as u32).partition(|&i| len[i as usize] > cap);
    let mut fitting = fitting;
    fitting.sort_by(|&a, &b| {
        let (a_, b_) = (a as usize, b as usize);
        cmp_cost(cost[b_], cost[a_])
            .then(len[b_].cmp(&len[a_]))
            .then(a.cmp(&b))
    });

    let bfd = best_fit_decreasing(&fitting, &len, cap);
    let needed = alone.len() + bfd.len();
    let dp = cfg.dp_size;
    let per_rank = needed.div_ceil(dp).max(cfg.min_micro_batches);
    let per_rank = per_rank.div_ceil(cfg.divisible_by) * cfg.divisible_by;
    let total = if cfg.same_count || cfg.divisible_by > 1 {
        per_rank * dp
    } else {
        needed.max(cfg.min_micro_batches * dp)
    };
    if total > n {
        return Err(CoreError::Config(format!(
            "{n} samples cannot fill {total} non-empty micro-batches ({dp} ranks, at least {} \
             each{}); give more samples or lower min_micro_batches / divisible_by / dp_size",
            total / dp,
            if total % dp == 0 { "" } else { " or one more" }
        )));
    }

    // Step 2: samples to micro-batches.
    let mut bins: Vec<Vec<u32>> = alone.iter().map(|&i| vec![i]).collect();
    let open = total - alone.len();
    let packed = lpt_capped(&fitting, &cost, &len, cap, open)
        .unwrap_or_else(|| fill_empty(bfd, open, &cost));
    bins.extend(packed);
    let order = by_cost_desc(&cost);
    let groups = (0..total as u32).collect();
    let mut layout = Layout::new(&cost, &len, cap, &bins, groups, total, &order);
    layout.refine(true, budget(total));
    let bins = layout.bins();

    // Step 3: micro-batches to ranks.
    let bin_cost: Vec<f64> = bins.iter().map(|b| cost_of(&cost, b)).collect();
    let ranks: Partition = partition(&bin_cost, dp, true, PartitionMethod::Best)?;
    let mut bin_rank = vec![0u32; total];
    for (r, part) in ranks.iter().enumerate() {
        for &b in part {
            bin_rank[b as usize] = r as u32;
        }
    }
    let mut layout = Layout::new(&cost, &len, cap, &bins, bin_rank, dp, &order);
    layout.refine(true, budget(dp));
    let bins = layout.bins();

    Ok(assemble(&bins, &ranks, &cost, &len, cfg.order))
}

/// Best-fit decreasing of `items` (already largest first) into bins of `cap` tokens.
fn best_fit_decreasing(items: &[u32], len: &[u64], cap: u64) -> Vec<Vec<u32>> {
    let mut bins: Vec<Vec<u32>> = Vec::new();
    // (free tokens, bin): the fullest bin that still fits is the first with free >= len.
    let mut free: BTreeSet<(u64, usize)> = BTreeSet::new();
    for &i in items {
        let l = len[i as usize];
        let fit = free.range((l, 0)..).next().copied();
        let (room, b) = fit.unwrap_or_else(|| {
            bins.push(Vec::new());
            (cap, bins.len() - 1)
        });
        free.remove(&(room, b));
        bins[b].push(i);
        free.insert((room - l, b));
    }
    bins
}

/// LPT under the cap: each item (largest first) to the micro-batch of least compute (ties:
/// fewest items, lowest index) it fits in; None when one fits nowhere.
fn lpt_capped(
    items: &[u32],
    cost: &[f64],
    len: &[u64],
    cap: u64,
    m: usize,
) -> Option<Vec<Vec<u32>>> {
    // A micro-batch's compute, item count and index.
    type Load = (Cost, usize, usize);
    let mut bins = vec![Vec::new(); m];
    let mut tokens = vec![0u64; m];
    let mut heap: BinaryHeap<Reverse<Load>> = (0..m).map(|b| Reverse((Cost(0.0), 0, b))).collect();
    let mut full = Vec::new();
    for &i in items {
        let (c, l) = (cost[i as usize], len[i as usize]);
        let placed = loop {
            let Some(Reverse((Cost(s), count, b))) = heap.pop() else {
                break false;
            };
            if tokens[b] + l <= cap {
                bins[b].push(i);
                tokens[b] += l;
                heap.push(Reverse((Cost(s + c), count + 1, b)));
                break true;
            }
            full.push(Reverse((Cost(s), count, b)));
        };
        heap.extend(full.drain(..));
        if !placed {
            return None;
        }
    }
    Some(bins)
}

/// `bins` (from best-fit decreasing, at most `m`) made exactly `m` non-empty bins: each empty
/// one takes the costliest item of the costliest bin holding two or more.
fn fill_empty(mut bins: Vec<Vec<u32>>, m: usize, cost: &[f64]) -> Vec<Vec<u32>> {
    while bins.len() < m {
        let donor = (0..bins.len())
            .filter(|&b| bins[b].len() > 1)
            .max_by(|&a, &b| {
                cmp_cost(cost_of(cost, &bins[a]), cost_of(cost, &bins[b])).then(b.cmp(&a))
            })
            .expect("fewer bins than items");
        let at = (0..bins[donor].len())
            .max_by(|&a, &b| {
                let (x, y) = (bins[donor][a], bins[donor][b]);
                cmp_cost(cost[x as usize], cost[y as usize]).then(y.cmp(&x))
            })
            .expect("non-empty");
        let item = bins[donor].swap_remove(at);
        bins.push(vec![item]);
    }
    bins
}

fn assemble(
    bins: &[Vec<u32>],
    ranks: &Partition,
    cost: &[f64],
    len: &[u64],
    order: MicroBatchOrder,
) -> MicroBatchPlan {
    let mut plan = MicroBatchPlan {
        indices: Vec::with_capacity(cost.len()),
        mb_offsets: vec![0],
        rank_offsets: vec![0],
        mb_tokens: Vec::with_capacity(bins.len()),
        mb_compute: Vec::with_capacity(bins.len()),
    };
    for part in ranks {
        let compute = |b: u32| cost_of(cost, &bins[b as usize]);
        // Heaviest first (ties: smallest first sample); bins are ascending, so [0] is the first.
        let mut mine: Vec<u32> = part.clone();
        mine.sort_by(|&a, &b| {
            cmp_cost(compute(b), compute(a)).then(bins[a as usize][0].cmp(&bins[b as usize][0]))
        });
        let mine = match order {
            MicroBatchOrder::Descending => mine,
            // verl's order: even positions reversed, then odd ones: light, ..., heavy, ..., light.
            MicroBatchOrder::Pp => {
                let evens = mine.iter().step_by(2).rev();
                evens
                    .chain(mine.iter().skip(1).step_by(2))
                    .copied()
                    .collect()
            }
            MicroBatchOrder::Input => {
                mine.sort_by_key(|&b| bins[b as usize][0]);
                mine
            }
        };
        for b in mine {
            let items = &bins[b as usize];
            plan.indices.extend(items.iter().map(|&i| i as i64));
            plan.mb_offsets.push(plan.indices.len() as i64);
            plan.mb_tokens
                .push(items.iter().map(|&i| len[i as usize] as i64).sum());
            plan.mb_compute.push(compute(b));
        }
        plan.rank_offsets.push(plan.mb_tokens.len() as i64);
    }
    plan
}
