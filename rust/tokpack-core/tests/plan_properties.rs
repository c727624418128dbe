//! Invariants of every strategy: each kept sample's tokens are covered exactly once, no row goes
//! over max_len, the accounting adds up, and the decreasing strategies beat next-fit.

use proptest::prelude::*;
use tokpack_core::{materialize, plan, pool, FlatColumn, Plan, PlanConfig};

const STRATEGIES: [&str; 5] = ["bfd", "ffd", "next_fit", "padding", "random"];

fn config(max_len: i64, strategy: &str, overlong: &str) -> PlanConfig {
    PlanConfig::new(max_len, strategy, overlong, 7).unwrap()
}

/// Per sample, the covered token ranges must be exactly `0..kept_len` with no overlap.
fn check_coverage(lengths: &[i64], plan: &Plan, max_len: i64) {
    let mut pieces: Vec<Vec<(i64, i64)>> = vec![Vec::new(); lengths.len()];
    for k in 0..plan.sample_ids.len() {
        assert!(plan.lengths[k] > 0, "empty segment");
        pieces[plan.sample_ids[k] as usize].push((plan.starts[k], plan.lengths[k]));
    }
    for (i, &len) in lengths.iter().enumerate() {
        let expected = if plan.dropped.binary_search(&(i as i64)).is_ok() {
            0
        } else if plan.truncated.binary_search(&(i as i64)).is_ok() {
            max_len
        } else {
            len
        };
        let mut p = pieces[i].clone();
        p.sort();
        let mut cursor = 0;
        for (start, l) in p {
            assert_eq!(start, cursor, "sample {i}: gap or overlap");
            cursor += l;
        }
        assert_eq!(cursor, expected, "sample {i}");
    }
    for w in plan.bin_offsets.windows(2) {
        assert!(w[1] > w[0], "empty row");
        let tokens: i64 = plan.lengths[w[0] as usize..w[1] as usize].iter().sum();
        assert!(tokens <= max_len, "row over max_len");
    }
}

proptest! {
    #[test]
    fn every_strategy_covers_each_sample_once(
        lengths in proptest::collection::vec(0i64..300, 0..400),
        max_len in 1i64..256,
        overlong in prop_oneof![Just("truncate"), Just("drop"), Just("split")],
    ) {
        for strategy in STRATEGIES {
            let p = plan(&lengths, &config(max_len, strategy, overlong)).unwrap();
            check_coverage(&lengths, &p, max_len);
            prop_assert!(p.n_bins() as u64 >= p.lower_bound());
            let kept = p.sample_ids.iter().collect::<std::collections::BTreeSet<_>>().len();
            prop_assert_eq!(kept + p.dropped.len(), lengths.len());
        }
    }

    #[test]
    fn decreasing_strategies_never_use_more_rows_than_next_fit(
        lengths in proptest::collection::vec(1i64..200, 0..400),
        max_len in 200i64..512,
    ) {
        let nf = plan(&lengths, &config(max_len, "next_fit", "error")).unwrap().n_bins();
        for strategy in ["bfd", "ffd"] {
            prop_assert!(plan(&lengths, &config(max_len, strategy, "error")).unwrap().n_bins() <= nf);
        }
    }

}

proptest! {
    // Inputs above the 65,536-sample chunk size so the parallel path really runs.
    #![proptest_config(ProptestConfig::with_cases(8))]
    #[test]
    fn same_plan_for_any_thread_count(
        lengths in proptest::collection::vec(0i64..3000, 0..150_000usize),
        strategy in prop_oneof![Just("bfd"), Just("ffd"), Just("random")],
    ) {
        let c = config(2048, strategy, "split");
        let one = pool::install(Some(1), || plan(&lengths, &c)).unwrap();
        let two = pool::install(Some(2), || plan(&lengths, &c)).unwrap();
        prop_assert_eq!(one, two);
    }
}

proptest! {
    #[test]
    fn materialized_rows_hold_each_segment_tokens(
        lengths in proptest::collection::vec(0usize..50, 1..100),
        max_len in 1i64..64,
    ) {
        let mut offsets = vec![0i64];
        let mut values = Vec::new();
        for (i, &len) in lengths.iter().enumerate() {
            for t in 0..len {
                values.push((i * 1000 + t) as i32);
            }
            offsets.push(values.len() as i64);
        }
        let labels: Vec<i32> = values.iter().map(|&v| if v % 3 == 0 { -100 } else { v }).collect();
        let tokens = FlatColumn { values: &values, offsets: &offsets };
        let label_col = FlatColumn { values: &labels, offsets: &offsets };
        let p = plan(&tokens.lengths(), &config(max_len, "bfd", "split")).unwrap();
        let rows = materialize(&p, &tokens, Some(&label_col));
        let out_labels = rows.labels.unwrap();
        let loss = rows.seg_loss_tokens.unwrap();
        let mut pos = 0usize;
        for k in 0..p.sample_ids.len() {
            for t in 0..p.lengths[k] as usize {
                let expect = p.sample_ids[k] as i32 * 1000 + p.starts[k] as i32 + t as i32;
                prop_assert_eq!(rows.tokens[pos + t], expect);
                prop_assert_eq!(out_labels[pos + t], if expect % 3 == 0 { -100 } else { expect });
            }
            let trained = out_labels[pos..pos + p.lengths[k] as usize].iter().filter(|&&v| v != -100).count();
            prop_assert_eq!(loss[k] as usize, trained);
            pos += p.lengths[k] as usize;
        }
        prop_assert_eq!(*rows.row_offsets.last().unwrap() as usize, pos);
    }
}

#[test]
fn overlong_error_names_the_sample() {
    let err = plan(&[3i64, 10, 2], &config(5, "bfd", "error")).unwrap_err();
    assert!(err.to_string().contains("sample 1 has 10 tokens"), "{err}");
}

#[test]
fn negative_length_is_a_data_error() {
    let err = plan(&[3i64, -1], &config(5, "bfd", "error")).unwrap_err();
    assert!(matches!(err, tokpack_core::CoreError::Data(_)));
}

#[test]
fn bad_config_is_rejected() {
    assert!(PlanConfig::new(0, "bfd", "error", 0).is_err());
    assert!(PlanConfig::new(8, "best", "error", 0).is_err());
    assert!(PlanConfig::new(8, "bfd", "cut", 0).is_err());
}

#[test]
fn best_fit_picks_the_tightest_row() {
    // Sorted: 6, 5, 4, 3. Rows after 6 and 5: rooms 4 and 5. The 4 goes to room 4 (tightest),
    // the 3 then goes to room 5.
    let p = plan(&[3i64, 6, 4, 5], &config(10, "bfd", "error")).unwrap();
    assert_eq!(p.bin_offsets, vec![0, 2, 4]);
    assert_eq!(p.sample_ids, vec![1, 2, 3, 0]);
    let f = plan(&[3i64, 6, 4, 5], &config(10, "ffd", "error")).unwrap();
    assert_eq!(f.sample_ids, vec![1, 2, 3, 0]);
    let f2 = plan(&[5i64, 6, 4, 3], &config(10, "ffd", "error")).unwrap();
    assert_eq!(f2.n_bins(), 2);
}

#[test]
fn next_fit_matches_the_guide_example() {
    let p = plan(&[3i64, 2, 4, 3], &config(8, "next_fit", "error")).unwrap();
    assert_eq!(p.bin_offsets, vec![0, 2, 4]);
    assert_eq!(p.sample_ids, vec![0, 1, 2, 3]);
}
