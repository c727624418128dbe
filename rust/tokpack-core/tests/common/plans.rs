//! Plans as rows of segments, for the tests that compare plans (included by path: the
//! library's own tests share `common/mod.rs`, where `tokpack_core` is not a crate name).

use tokpack_core::Plan;

/// The rows of `p`, each as its (sample id, start, length) segments, in row order.
pub fn plan_rows(p: &Plan) -> Vec<Vec<(i64, i64, i64)>> {
    p.bin_offsets
        .windows(2)
        .map(|w| {
            (w[0] as usize..w[1] as usize)
                .map(|k| (p.sample_ids[k], p.starts[k], p.lengths[k]))
                .collect()
        })
        .collect()
}
