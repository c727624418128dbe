//! The static-shape options of the planner (issue 38): `max_segments` is a hard constraint of
//! every strategy, `align` plans every segment on its length rounded up; both keep each sample's
//! tokens covered exactly once and the plan independent of the thread count.

mod common;

use proptest::prelude::*;
use tokpack_core::plan::aligned;
use tokpack_core::{plan, pool, Plan, PlanConfig, Strategy};

fn config(
    max_len: i64,
    strategy: &str,
    overlong: &str,
    cap: Option<u32>,
    align: u32,
) -> PlanConfig {
    PlanConfig {
        max_segments: cap,
        align,
        ..PlanConfig::new(max_len, strategy, overlong, 7).unwrap()
    }
}

/// Each kept sample's tokens are covered once (in order, no gap, no overlap).
fn check_coverage(lengths: &[i64], p: &Plan) {
    let mut pieces: Vec<Vec<(i64, i64)>> = vec![Vec::new(); lengths.len()];
    for k in 0..p.sample_ids.len() {
        assert!(p.lengths[k] > 0, "empty segment");
        pieces[p.sample_ids[k] as usize].push((p.starts[k], p.lengths[k]));
    }
    for (i, &len) in lengths.iter().enumerate() {
        let i64i = i as i64;
        let expected = if p.dropped.binary_search(&i64i).is_ok() {
            0
        } else if p.truncated.binary_search(&i64i).is_ok() {
            i64::from(p.max_len)
        } else {
            len
        };
        let mut mine = pieces[i].clone();
        mine.sort();
        let mut cursor = 0;
        for (start, l) in mine {
            assert_eq!(start, cursor, "sample {i}: gap or overlap");
            cursor += l;
        }
        assert_eq!(cursor, expected, "sample {i}");
    }
}

/// No row over the cap, none over max_len once its segments are aligned.
fn check_rows(p: &Plan, cap: Option<u32>, align: u32) {
    for w in p.bin_offsets.windows(2) {
        let n = (w[1] - w[0]) as u32;
        assert!(n >= 1, "empty row");
        assert!(
            n <= cap.unwrap_or(u32::MAX),
            "row of {n} segments over the cap {cap:?}"
        );
        let footprint: i64 = p.lengths[w[0] as usize..w[1] as usize]
            .iter()
            .map(|&l| i64::from(aligned(l as u32, align)))
            .sum();
        assert!(
            footprint <= i64::from(p.max_len),
            "aligned row over max_len"
        );
    }
}

proptest! {
    #![proptest_config(common::deterministic(256))]
    #[test]
    fn every_strategy_meets_the_cap_and_covers_each_sample_once(
        lengths in proptest::collection::vec(0i64..300, 0..400),
        max_len in 1i64..256,
        cap in 1u32..6,
        overlong in prop_oneof![Just("truncate"), Just("drop"), Just("split")],
    ) {
        for strategy in Strategy::NAMES {
            let p = plan(&lengths, &config(max_len, strategy, overlong, Some(cap), 1)).unwrap();
            check_coverage(&lengths, &p);
            check_rows(&p, Some(cap), 1);
            prop_assert!(p.max_row_segments() <= u64::from(cap));
        }
    }

    #[test]
    fn aligned_plans_fit_and_cover_each_sample_once(
        lengths in proptest::collection::vec(0i64..300, 0..400),
        rows_of_k in 1i64..16,
        k in prop_oneof![Just(1u32), Just(2), Just(8), Just(16)],
        cap in proptest::option::of(1u32..6),
        overlong in prop_oneof![Just("truncate"), Just("drop"), Just("split")],
    ) {
        let max_len = rows_of_k * i64::from(k);
        for strategy in ["bfd", "ffd", "next_fit", "padding"] {
            let p = plan(&lengths, &config(max_len, strategy, overlong, cap, k)).unwrap();
            check_coverage(&lengths, &p);
            check_rows(&p, cap, k);
        }
    }
}

proptest! {
    #![proptest_config(common::deterministic(256))]
    #[test]
    fn a_cap_no_uncapped_row_is_over_changes_nothing_and_a_cap_never_saves_rows(
        lengths in proptest::collection::vec(0i64..300, 0..400),
        max_len in 1i64..256,
        cap in 1u32..40,
        strategy in prop_oneof![Just("bfd"), Just("ffd")],
    ) {
        // bfd and ffd plan without the cap, then repair the rows over it (cap_repair.rs).
        let free = plan(&lengths, &config(max_len, strategy, "split", None, 1)).unwrap();
        let capped = plan(&lengths, &config(max_len, strategy, "split", Some(cap), 1)).unwrap();
        prop_assert!(capped.n_bins() >= free.n_bins());
        if free.max_row_segments() <= u64::from(cap) {
            prop_assert_eq!(Plan { max_segments: None, ..capped }, free);
        }
    }
}

proptest! {
    // Inputs above the 65,536-sample chunk size so the parallel path really runs.
    #![proptest_config(common::deterministic(4))]
    #[test]
    fn same_capped_aligned_plan_for_any_thread_count(
        lengths in proptest::collection::vec(0i64..3000, 0..150_000usize),
        strategy in prop_oneof![Just("bfd"), Just("ffd"), Just("next_fit")],
    ) {
        let c = config(2048, strategy, "split", Some(8), 64);
        let one = pool::install(Some(1), || plan(&lengths, &c)).unwrap();
        let two = pool::install(Some(2), || plan(&lengths, &c)).unwrap();
        prop_assert_eq!(one, two);
    }
}

#[test]
fn a_cap_only_adds_rows_where_rows_are_over_it() {
    // Ten 1-token samples fit one row of 16; a cap of 4 needs three.
    let lengths = [1i64; 10];
    for strategy in Strategy::NAMES {
        let rows = |cap| {
            plan(&lengths, &config(16, strategy, "error", cap, 1))
                .unwrap()
                .n_bins()
        };
        let expected_uncapped = if *strategy == "padding" { 10 } else { 1 };
        assert_eq!(rows(None), expected_uncapped, "{strategy}");
        assert_eq!(rows(Some(4)), expected_uncapped.max(3), "{strategy}");
    }
}

#[test]
fn alignment_packs_the_rounded_lengths_and_keeps_the_real_ones() {
    // 5 + 3 fit a row of 8 unaligned; aligned to 4 they take 8 + 4.
    let p = plan(&[5i64, 3], &config(8, "bfd", "error", None, 4)).unwrap();
    assert_eq!(p.n_bins(), 2);
    assert_eq!(p.lengths, vec![5, 3]);
    assert_eq!(p.alignment_padding(), 3 + 1);
    assert_eq!(p.align, Some(4));
}

#[test]
fn impossible_static_options_are_refused_with_the_fix() {
    let err = |c: PlanConfig| plan(&[3i64], &c).unwrap_err().to_string();
    let e = err(config(100, "bfd", "error", None, 16));
    assert!(
        e.contains("max_len must be a multiple of align_segments (16)"),
        "{e}"
    );
    assert!(e.contains("pass max_len=96"), "{e}");
    let e = err(config(128, "random", "error", None, 16));
    assert!(e.contains("strategy \"random\" cuts samples"), "{e}");
    let e = err(config(128, "bfd", "error", Some(0), 1));
    assert!(e.contains("max_segments_per_row must be at least 1"), "{e}");
}
