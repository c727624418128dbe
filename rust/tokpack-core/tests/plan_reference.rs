//! The fast strategies against straightforward reference implementations of their definitions:
//! the plans (rows, the segments in each row and their order) must be identical, not only as
//! good. This pins the exact plans, so a faster sort or index cannot change them.

mod common;
#[path = "common/plans.rs"]
mod plans;

use proptest::prelude::*;
use std::cmp::Reverse;
use std::collections::BTreeSet;
use tokpack_core::{plan, pool, PlanConfig};

/// A piece of a sample to place: (sample, start, len).
type Piece = (i64, i64, i64);

/// The pieces samples become under `overlong`, in sample order (empty samples become none).
fn pieces(lengths: &[i64], max_len: i64, overlong: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    for (s, &len) in lengths.iter().enumerate() {
        let s = s as i64;
        match overlong {
            _ if len <= 0 => {}
            _ if len <= max_len => out.push((s, 0, len)),
            "truncate" => out.push((s, 0, max_len)),
            "split" => {
                let mut start = 0;
                while start < len {
                    out.push((s, start, (len - start).min(max_len)));
                    start += max_len;
                }
            }
            _ => {}
        }
    }
    out
}

/// Longest first, ties in input order.
fn decreasing(pieces: &[Piece]) -> Vec<Piece> {
    let mut sorted = pieces.to_vec();
    sorted.sort_by_key(|p| Reverse(p.2));
    sorted
}

/// Best fit: the open row with the least room that fits; among rows with equal room, the one
/// that reached that room last (rows with no room left are closed).
fn reference_bfd(pieces: &[Piece], max_len: i64) -> Vec<Vec<Piece>> {
    let mut rows: Vec<Vec<Piece>> = Vec::new();
    // (room, Reverse(when the row reached that room), row)
    let mut open: BTreeSet<(i64, Reverse<usize>, usize)> = BTreeSet::new();
    for (step, piece) in decreasing(pieces).into_iter().enumerate() {
        let len = piece.2;
        let found = open.range((len, Reverse(usize::MAX), 0)..).next().copied();
        let (row, room) = match found {
            Some(key) => {
                open.remove(&key);
                (key.2, key.0)
            }
            None => {
                rows.push(Vec::new());
                (rows.len() - 1, max_len)
            }
        };
        rows[row].push(piece);
        if room > len {
            open.insert((room - len, Reverse(step), row));
        }
    }
    rows
}

/// First fit: the lowest-numbered row that fits.
fn reference_ffd(pieces: &[Piece], max_len: i64) -> Vec<Vec<Piece>> {
    let mut rows: Vec<(i64, Vec<Piece>)> = Vec::new();
    for piece in decreasing(pieces) {
        match rows.iter_mut().find(|(room, _)| *room >= piece.2) {
            Some((room, row)) => {
                *room -= piece.2;
                row.push(piece);
            }
            None => rows.push((max_len - piece.2, vec![piece])),
        }
    }
    rows.into_iter().map(|(_, row)| row).collect()
}

fn check(lengths: &[i64], max_len: i64, strategy: &str, overlong: &str, threads: usize) {
    let config = PlanConfig::new(max_len, strategy, overlong, 0).unwrap();
    let p = pool::install(Some(threads), || plan(lengths, &config)).unwrap();
    let items = pieces(lengths, max_len, overlong);
    let expected = match strategy {
        "bfd" => reference_bfd(&items, max_len),
        _ => reference_ffd(&items, max_len),
    };
    let got: Vec<Vec<Piece>> = plans::plan_rows(&p);
    assert_eq!(got.len(), expected.len(), "{strategy}: row count");
    for (r, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "{strategy}: row {r}");
    }
}

/// Lengths of several shapes: uniform, log-uniform (heavy-tailed: many short, a few near and
/// over max_len) and few distinct values (long runs of ties).
fn lengths(n: std::ops::Range<usize>, max_len: i64) -> impl Strategy<Value = Vec<i64>> {
    let top = 2 * max_len;
    let log_uniform = (0u32..=(64 - top.leading_zeros()))
        .prop_flat_map(|bits| 0i64..(1i64 << bits).max(1))
        .boxed();
    prop_oneof![
        proptest::collection::vec(0i64..=top, n.clone()),
        proptest::collection::vec(log_uniform, n.clone()),
        proptest::collection::vec(
            prop_oneof![Just(1i64), Just(max_len / 3 + 1), Just(max_len)],
            n
        ),
    ]
}

proptest! {
    #![proptest_config(common::deterministic(256))]
    #[test]
    fn small_plans_match_the_reference(
        (max_len, lengths) in (1i64..300).prop_flat_map(|m| (Just(m), lengths(0..300, m))),
        strategy in prop_oneof![Just("bfd"), Just("ffd")],
        overlong in prop_oneof![Just("truncate"), Just("drop"), Just("split")],
        threads in 1usize..=2,
    ) {
        check(&lengths, max_len, strategy, overlong, threads);
    }
}

proptest! {
    // Above the 65,536-sample chunk size, so the parallel paths run.
    #![proptest_config(common::deterministic(6))]
    #[test]
    fn large_bfd_plans_match_the_reference(
        lengths in lengths(70_000..140_000, 4096),
        overlong in prop_oneof![Just("truncate"), Just("split")],
        threads in 1usize..=2,
    ) {
        check(&lengths, 4096, "bfd", overlong, threads);
    }
}

proptest! {
    // Every sample one whole item (no empty, dropped or split sample): the path that builds the
    // columns without reading the items.
    #![proptest_config(common::deterministic(4))]
    #[test]
    fn large_whole_sample_plans_match_the_reference(
        lengths in proptest::collection::vec(1i64..=8192, 70_000..140_000),
        threads in 1usize..=2,
    ) {
        check(&lengths, 4096, "bfd", "truncate", threads);
    }
}
