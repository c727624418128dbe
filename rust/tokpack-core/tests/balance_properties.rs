//! Properties of `balance::partition` and `balance::micro_batches` on random inputs: every
//! index exactly once, parts non-empty, equal counts when asked, the token cap never exceeded,
//! and `Best` never worse than LPT or Karmarkar-Karp.

mod common;

use proptest::prelude::*;
use tokpack_core::balance::{micro_batches, partition, CostModel, MicroBatchConfig};
use tokpack_core::policy::{MicroBatchOrder, OverCap, PartitionMethod};

fn max_sum(costs: &[f64], parts: &[Vec<u32>]) -> f64 {
    parts
        .iter()
        .map(|p| p.iter().map(|&i| costs[i as usize]).sum::<f64>())
        .fold(0.0, f64::max)
}

proptest! {
    #![proptest_config(common::deterministic(256))]

    #[test]
    fn partitions_cover_every_item_once(
        raw in proptest::collection::vec(0u32..10_000, 1..200),
        k in 1usize..40,
        equal_size: bool,
    ) {
        let costs: Vec<f64> = raw.iter().map(|&c| f64::from(c)).collect();
        let k = k.min(costs.len());
        let mut maxima = Vec::new();
        for &method in PartitionMethod::ALL {
            let parts = partition(&costs, k, equal_size, method).unwrap();
            prop_assert_eq!(parts.len(), k);
            prop_assert!(parts.iter().all(|p| !p.is_empty() && p.windows(2).all(|w| w[0] < w[1])));
            let mut all: Vec<u32> = parts.concat();
            all.sort_unstable();
            prop_assert_eq!(all, (0..costs.len() as u32).collect::<Vec<_>>());
            if equal_size {
                let counts: Vec<usize> = parts.iter().map(Vec::len).collect();
                prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
            }
            maxima.push(max_sum(&costs, &parts));
        }
        // ALL is [Best, Kk, Lpt].
        prop_assert!(maxima[0] <= maxima[1] && maxima[0] <= maxima[2], "{:?}", maxima);
        // A pure function of the input (it runs on the calling thread: no thread count to vary).
        let again = partition(&costs, k, equal_size, PartitionMethod::Best).unwrap();
        prop_assert_eq!(again, partition(&costs, k, equal_size, PartitionMethod::Best).unwrap());
    }

    #[test]
    fn micro_batches_respect_the_cap(
        lengths in proptest::collection::vec(0i64..=4096, 1..200),
        dp_size in 1usize..6,
        cap in prop_oneof![Just(4096u64), Just(6000), Just(12_000)],
        same_count: bool,
        divisible_by in 1usize..4,
        order in 0usize..3,
    ) {
        let config = MicroBatchConfig {
            max_tokens: cap,
            dp_size,
            cost: CostModel::ATTENTION,
            same_count,
            min_micro_batches: 1,
            divisible_by,
            order: MicroBatchOrder::ALL[order],
            over_cap: OverCap::Error,
        };
        let plan = match micro_batches(&lengths, &config) {
            Ok(plan) => plan,
            // Only too few samples for the micro-batches asked for.
            Err(e) => {
                prop_assert!(e.to_string().contains("cannot fill"), "{}", e);
                return Ok(());
            }
        };
        let mut seen: Vec<i64> = plan.indices.clone();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..lengths.len() as i64).collect::<Vec<_>>());
        for m in 0..plan.mb_tokens.len() {
            let items = &plan.indices[plan.mb_offsets[m] as usize..plan.mb_offsets[m + 1] as usize];
            prop_assert!(!items.is_empty());
            let tokens: i64 = items.iter().map(|&i| lengths[i as usize]).sum();
            prop_assert_eq!(tokens, plan.mb_tokens[m]);
            prop_assert!(tokens as u64 <= cap);
        }
        let counts: Vec<i64> = plan.rank_offsets.windows(2).map(|w| w[1] - w[0]).collect();
        prop_assert_eq!(counts.len(), dp_size);
        if same_count || divisible_by > 1 {
            prop_assert!(counts.iter().all(|&c| c == counts[0] && c % divisible_by as i64 == 0));
        }
    }
}
