//! Laid-out rows as a training batch: the per-token arrays as one `[rows, width]` block each,
//! `width` the longest row rounded up to a multiple; padding sees only itself.

use super::TreeRows;

/// [`TreeRows`] with the per-token arrays padded to `[rows, width]` (row-major) and each
/// sequence's number of trained targets. Padding: `input_ids` the pad token, `position_ids` 0,
/// `token_node` -1, `token_tout` its own column + 1 (so no query row is all masked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeBatch {
    pub rows: usize,
    pub width: usize,
    /// The rows' tokens without the padding.
    pub forward_tokens: i64,
    pub input_ids: Vec<i64>,
    pub position_ids: Vec<i64>,
    pub token_tout: Vec<i64>,
    pub token_node: Vec<i64>,
    pub node_offsets: Vec<i64>,
    pub node_parent: Vec<i64>,
    pub node_depth: Vec<i64>,
    pub node_tin: Vec<i64>,
    pub node_tout: Vec<i64>,
    pub node_len: Vec<i64>,
    pub seq_index: Vec<i64>,
    pub seq_row: Vec<i64>,
    pub seq_end_node: Vec<i64>,
    pub target_offsets: Vec<i64>,
    pub target_pred: Vec<i64>,
    pub pred_row: Vec<i64>,
    pub pred_pos: Vec<i64>,
    pub pred_token: Vec<i64>,
    pub pred_weight: Vec<i64>,
    pub completion_lengths: Vec<i64>,
}

impl TreeRows {
    /// The rows as a batch `multiple`-aligned (at least 1), padded with `pad_token`. A single
    /// row keeps its arrays (grown in place to the width); several are copied into blocks.
    pub fn into_batch(self, multiple: usize, pad_token: i64) -> TreeBatch {
        let rows = self.row_offsets.len().saturating_sub(1);
        let lengths: Vec<usize> = self
            .row_offsets
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let multiple = multiple.max(1);
        let width = longest.div_ceil(multiple) * multiple;
        let offsets = &self.row_offsets;
        let block = |flat: Vec<i64>, fill: &dyn Fn(usize) -> i64| -> Vec<i64> {
            if rows == 1 {
                let mut v = flat;
                let n = v.len();
                v.extend((n..width).map(fill));
                return v;
            }
            let mut out: Vec<i64> = Vec::with_capacity(rows * width);
            for (r, &n) in lengths.iter().enumerate() {
                let start = offsets[r] as usize;
                out.extend_from_slice(&flat[start..start + n]);
                out.extend((n..width).map(fill));
            }
            out
        };
        let completion_lengths = self
            .target_offsets
            .windows(2)
            .map(|w| w[1] - w[0])
            .collect();
        TreeBatch {
            rows,
            width,
            forward_tokens: self.row_offsets.last().copied().unwrap_or(0),
            input_ids: block(self.input_ids, &|_| pad_token),
            position_ids: block(self.position_ids, &|_| 0),
            token_tout: block(self.token_tout, &|c| c as i64 + 1),
            token_node: block(self.token_node, &|_| -1),
            node_offsets: self.node_offsets,
            node_parent: self.node_parent,
            node_depth: self.node_depth,
            node_tin: self.node_tin,
            node_tout: self.node_tout,
            node_len: self.node_len,
            seq_index: self.seq_index,
            seq_row: self.seq_row,
            seq_end_node: self.seq_end_node,
            target_offsets: self.target_offsets,
            target_pred: self.target_pred,
            pred_row: self.pred_row,
            pred_pos: self.pred_pos,
            pred_token: self.pred_token,
            pred_weight: self.pred_weight,
            completion_lengths,
        }
    }
}
