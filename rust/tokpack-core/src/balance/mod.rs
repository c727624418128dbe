//! Balancing work across data-parallel ranks and micro-batches: [`partition`] splits per-item
//! costs into `k` parts of near-equal sums; [`micro_batches`] splits samples into micro-batches
//! of at most `max_tokens` tokens, spread over ranks so that each rank's compute is even.
//!
//! Everything here is sequential and deterministic: every tie is broken by index, so a result
//! depends on the input only (not on the thread count).

mod micro_batches;
mod partition;
mod refine;

pub use micro_batches::{micro_batches, MicroBatchConfig, MicroBatchPlan};
pub use partition::{partition, Partition};

use crate::error::{CoreError, Result};
use std::cmp::Ordering;

/// The compute of a sample of `L` tokens: `a·L + b·L²` (linear layers plus attention).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    pub a: f64,
    pub b: f64,
}

impl CostModel {
    /// Tokens only: `L`.
    pub const TOKENS: Self = Self { a: 1.0, b: 0.0 };
    /// `24576·L + L²`: a transformer layer's `24·h²·L + 4·h·L²` FLOPs over `4·h`, for hidden
    /// size `h = 4096` (`a = 6·h`), the model verl's `calculate_workload` uses.
    pub const ATTENTION: Self = Self { a: 24576.0, b: 1.0 };

    pub fn new(a: f64, b: f64) -> Result<Self> {
        if !(a.is_finite() && b.is_finite() && a >= 0.0 && b >= 0.0 && a + b > 0.0) {
            return Err(CoreError::Config(format!(
                "cost coefficients (a, b) must be finite, non-negative and not both 0, got ({a}, {b})"
            )));
        }
        Ok(Self { a, b })
    }

    pub fn cost(self, len: u64) -> f64 {
        let l = len as f64;
        self.a * l + self.b * l * l
    }
}

/// Total order of costs (they are finite), as `sort_by` and heaps need it.
fn cmp_cost(x: f64, y: f64) -> Ordering {
    x.total_cmp(&y)
}

/// A cost (or a sum of costs) in a heap or set key, ordered by [`cmp_cost`].
#[derive(Clone, Copy, PartialEq)]
struct Cost(f64);

impl Eq for Cost {}

impl Ord for Cost {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_cost(self.0, other.0)
    }
}

impl PartialOrd for Cost {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The summed cost of `items`, in their order.
fn cost_of(costs: &[f64], items: &[u32]) -> f64 {
    items.iter().map(|&i| costs[i as usize]).sum()
}

/// Costs checked once: finite and non-negative.
fn checked_costs(costs: &[f64]) -> Result<()> {
    match costs.iter().position(|c| !(c.is_finite() && *c >= 0.0)) {
        Some(i) => Err(CoreError::data(format!(
            "cost {i} is {}; costs must be finite and non-negative",
            costs[i]
        ))),
        None => Ok(()),
    }
}
