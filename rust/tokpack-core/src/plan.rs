//! Planning: sample lengths in, rows of segments out.

use crate::cuts::Cuts;
use crate::error::{CoreError, Result};
use crate::items::{build_items, Item, Length};
use crate::policy::{check_range, Overlong, RowOrder, Strategy, MAX_LEN};
use crate::rng::SplitMix64;
use crate::strategies;
use rayon::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanConfig {
    pub max_len: u32,
    pub strategy: Strategy,
    pub overlong: Overlong,
    /// Seeds the `random` strategy and the `shuffled` row order.
    pub seed: u64,
    pub row_order: RowOrder,
    /// The most segments a row may hold (a hard constraint of every strategy); None: no cap.
    pub max_segments: Option<u32>,
    /// Each segment's footprint in its row is its length rounded up to a multiple of this
    /// (the planner packs the rounded lengths; the rows store the segments unpadded and the
    /// collators place them at aligned offsets); 1: none.
    pub align: u32,
}

impl PlanConfig {
    /// A config listing rows in the planner's order (`row_order: RowOrder::Plan`; the
    /// `PackConfig` default is `Shuffled`).
    pub fn new(max_len: i64, strategy: &str, overlong: &str, seed: u64) -> Result<Self> {
        let max_len = check_range("max_len", max_len.into(), 1, MAX_LEN)?;
        Ok(Self {
            max_len: max_len as u32,
            strategy: strategy.parse()?,
            overlong: overlong.parse()?,
            seed,
            row_order: RowOrder::Plan,
            max_segments: None,
            align: 1,
        })
    }

    /// The cap of the strategies (`u32::MAX`: none).
    fn cap(&self) -> u32 {
        self.max_segments.unwrap_or(u32::MAX)
    }

    /// The options the planner cannot honour together, refused by name with the fix.
    pub fn check(&self) -> Result<()> {
        if self.max_segments == Some(0) {
            return Err(CoreError::Config(
                "max_segments_per_row must be at least 1, got 0".into(),
            ));
        }
        if self.align == 0 {
            return Err(CoreError::Config(
                "align_segments must be at least 1, got 0".into(),
            ));
        }
        if self.align > 1 && !self.max_len.is_multiple_of(self.align) {
            return Err(CoreError::Config(format!(
                "max_len must be a multiple of align_segments ({}) so that every aligned sample \
                 fits a row, got {}; pass max_len={}",
                self.align,
                self.max_len,
                (self.max_len / self.align).max(1) * self.align
            )));
        }
        if self.align > 1 && self.strategy == Strategy::Random {
            return Err(CoreError::Config(
                "align_segments pads whole segments and strategy \"random\" cuts samples at \
                 row ends; pass strategy \"bfd\", \"ffd\", \"next_fit\" or \"padding\""
                    .into(),
            ));
        }
        Ok(())
    }
}

/// A packing plan: row `r` holds segments `bin_offsets[r]..bin_offsets[r+1]`; segment `k` is
/// tokens `starts[k]..starts[k]+lengths[k]` of input sample `sample_ids[k]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub max_len: u32,
    pub bin_offsets: Vec<i64>,
    pub sample_ids: Vec<i64>,
    pub starts: Vec<i64>,
    pub lengths: Vec<i64>,
    /// Samples not packed at all (over-long with `drop`, and zero-length ones), ascending.
    pub dropped: Vec<i64>,
    /// The zero-length samples among `dropped`.
    pub empty: Vec<i64>,
    /// Samples cut to max_len (`truncate`), ascending.
    pub truncated: Vec<i64>,
    /// Samples packed whole but in several pieces (`split`, or cut across rows by the `random`
    /// strategy), ascending; never also in `truncated`.
    pub split: Vec<i64>,
    pub n_samples: usize,
    /// Tokens in the input, before truncation or dropping.
    pub input_tokens: u64,
    /// The segment cap the plan was made under (`PlanConfig::max_segments`).
    pub max_segments: Option<u32>,
    /// The alignment the plan was made under, when above 1 (`PlanConfig::align`).
    pub align: Option<u32>,
}

impl Plan {
    pub fn n_bins(&self) -> usize {
        self.bin_offsets.len() - 1
    }

    /// Tokens placed in rows.
    pub fn total_tokens(&self) -> u64 {
        self.lengths.iter().map(|&l| l as u64).sum()
    }

    /// No packing can use fewer rows than this.
    pub fn lower_bound(&self) -> u64 {
        lower_bound(self.total_tokens(), self.max_len)
    }

    /// Packed tokens over the capacity of the rows used (1.0 = no padding at all).
    pub fn efficiency(&self) -> f64 {
        efficiency(self.total_tokens(), self.n_bins() as u64, self.max_len)
    }

    /// The most segments of a row (0 without rows).
    pub fn max_row_segments(&self) -> u64 {
        let counts = self.bin_offsets.windows(2).map(|w| (w[1] - w[0]) as u64);
        counts.max().unwrap_or(0)
    }

    /// The padding `align` adds inside the rows (segments rounded up to its multiple).
    pub fn alignment_padding(&self) -> u64 {
        let k = i64::from(self.align.unwrap_or(1));
        self.lengths.iter().map(|&l| ((k - l % k) % k) as u64).sum()
    }
}

/// `length` rounded up to a multiple of `align`.
pub fn aligned(length: u32, align: u32) -> u32 {
    length.div_ceil(align) * align
}

/// Rows no packing of `tokens` tokens into rows of `max_len` can do without.
pub fn lower_bound(tokens: u64, max_len: u32) -> u64 {
    tokens.div_ceil(u64::from(max_len))
}

/// `tokens` over the capacity of `rows` rows of `max_len` (0 without rows).
pub fn efficiency(tokens: u64, rows: u64, max_len: u32) -> f64 {
    let capacity = rows as f64 * f64::from(max_len);
    if capacity == 0.0 {
        0.0
    } else {
        tokens as f64 / capacity
    }
}

/// Plans how to pack samples of the given lengths into rows of at most `max_len` tokens, its
/// rows listed in `config.row_order`. Deterministic: the result depends only on the inputs,
/// never on the thread count.
pub fn plan<L: Length>(lengths: &[L], config: &PlanConfig) -> Result<Plan> {
    plan_cut(lengths, config, None)
}

/// [`plan`], with the pieces of some over-long samples chosen by the caller (`cuts`, see
/// [`crate::cuts`]): a sample given no piece is dropped. The `random` strategy, which cuts
/// samples at row ends, cuts a sample with blocks only at a safe boundary ([`crate::cuts::safe_cut`]);
/// chosen pieces without blocks are refused with it (nothing would say where it may cut them).
pub fn plan_cut<L: Length>(
    lengths: &[L],
    config: &PlanConfig,
    cuts: Option<&Cuts>,
) -> Result<Plan> {
    let cuts = cuts.filter(|c| !c.is_empty());
    let random = config.strategy == Strategy::Random;
    if random && cuts.is_some_and(|c| c.blocks.is_empty()) {
        return Err(CoreError::Config(
            "strategy \"random\" cuts samples at row ends, and these samples may be cut only at \
             chosen places: give their blocks (the spans no cut may fall inside)"
                .into(),
        ));
    }
    config.check()?;
    let items = build_items(lengths, config.max_len, config.overlong, cuts)?;
    let max_len = config.max_len;
    let cap = config.cap();
    // With alignment the strategies place footprints (lengths rounded up); the real lengths
    // are put back afterwards, so the rows store unpadded segments.
    let padded: Vec<Item>;
    let units = if config.align > 1 {
        let pad = |i: &Item| Item {
            len: aligned(i.len, config.align),
            ..*i
        };
        padded = items.items.par_iter().map(pad).collect();
        &padded
    } else {
        &items.items
    };
    let (mut rows, cut) = match config.strategy {
        Strategy::Bfd => (strategies::best_fit_decreasing(units, max_len, cap), vec![]),
        Strategy::Ffd => (
            strategies::first_fit_decreasing(units, max_len, cap),
            vec![],
        ),
        Strategy::NextFit => (strategies::next_fit(units, max_len, cap), vec![]),
        Strategy::Padding => (strategies::padding(units), vec![]),
        Strategy::Random => {
            let blocks = cuts.map(|c| &c.blocks);
            strategies::random_concat(units, max_len, config.seed, blocks, cap)?
        }
    };
    if config.align > 1 {
        rows.lengths = real_lengths(&items.items, &rows.sample_ids, &rows.starts);
    }
    // Every sample is in exactly one class: a truncated sample that `random` also cuts across
    // rows stays "truncated" (it lost tokens), never "split" as well.
    let mut split = items.split;
    if !cut.is_empty() {
        split.extend(
            cut.into_iter()
                .filter(|s| items.truncated.binary_search(s).is_err()),
        );
        split.sort_unstable();
        split.dedup();
    }
    let mut dropped = items.dropped;
    if !items.empty.is_empty() {
        dropped.extend_from_slice(&items.empty);
        dropped.sort_unstable();
    }
    let mut out = Plan {
        max_len,
        bin_offsets: rows.offsets,
        sample_ids: rows.sample_ids,
        starts: rows.starts,
        lengths: rows.lengths,
        dropped,
        empty: items.empty,
        truncated: items.truncated,
        split,
        n_samples: lengths.len(),
        input_tokens: items.input_tokens,
        max_segments: config.max_segments,
        align: (config.align > 1).then_some(config.align),
    };
    if config.row_order == RowOrder::Shuffled {
        let order = row_permutation(out.n_bins(), config.seed);
        out = out.reordered(&order);
    }
    Ok(out)
}

/// The length of the item each segment `(sample, start)` is (items are in sample order, a
/// sample's pieces by start: a binary search finds each), in parallel and in order.
fn real_lengths(items: &[Item], sample_ids: &[i64], starts: &[i64]) -> Vec<i64> {
    let find = |(&sample, &start): (&i64, &i64)| {
        let k = items
            .binary_search_by(|i| (i.sample, i.start).cmp(&(sample, start)))
            .expect("every segment is one of the planned items");
        i64::from(items[k].len)
    };
    sample_ids.par_iter().zip(starts).map(find).collect()
}

/// Keeps the row shuffle's stream apart from the `random` strategy's sample shuffle of the
/// same seed.
const ROW_ORDER_SALT: u64 = 0x726f_775f_6f72_6465; // "row_orde"

/// The seeded permutation of `n` rows of the `shuffled` row order: row `k` of the output is
/// planned row `perm[k]`. Depends on `n` and `seed` only.
pub fn row_permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed ^ ROW_ORDER_SALT).shuffle(&mut perm);
    perm
}

impl Plan {
    /// The same plan with its rows listed in `order` (row `k` is this plan's row `order[k]`;
    /// `order` is a permutation of the rows). Each row keeps its segments, in their order.
    pub fn reordered(self, order: &[usize]) -> Plan {
        debug_assert_eq!(order.len(), self.n_bins());
        let n = self.sample_ids.len();
        let mut bin_offsets = Vec::with_capacity(self.bin_offsets.len());
        let (mut sample_ids, mut starts, mut lengths) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        bin_offsets.push(0);
        for &r in order {
            let seg = self.bin_offsets[r] as usize..self.bin_offsets[r + 1] as usize;
            sample_ids.extend_from_slice(&self.sample_ids[seg.clone()]);
            starts.extend_from_slice(&self.starts[seg.clone()]);
            lengths.extend_from_slice(&self.lengths[seg]);
            bin_offsets.push(sample_ids.len() as i64);
        }
        Plan {
            bin_offsets,
            sample_ids,
            starts,
            lengths,
            ..self
        }
    }
}
