//! `PackReport`: the one owner of a pack job's outcome (counts, the ids of the samples not
//! packed whole, the shards written) and of the figures derived from it, computed here only.

use crate::io::{PackOutcome, ShardInfo, TreeCounts};
use crate::plan::{efficiency, lower_bound};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackReport {
    /// Samples (pairs for preference shards) in each input, in order.
    pub input_rows: Vec<u64>,
    pub has_labels: bool,
    pub max_len: u32,
    pub n_samples: u64,
    pub rows: u64,
    pub segments: u64,
    pub tokens: u64,
    pub input_tokens: u64,
    /// Sample ids (global), ascending: not packed at all, zero-length (also in `dropped`),
    /// cut to max_len, packed in pieces.
    pub dropped: Vec<i64>,
    pub empty: Vec<i64>,
    pub truncated: Vec<i64>,
    pub split: Vec<i64>,
    pub shards: Vec<ShardInfo>,
    /// Each input file's content fingerprint, taken while packing it (`pack_files`; empty for
    /// reports of parts and merged reports).
    #[serde(default)]
    pub input_fingerprints: Vec<String>,
    /// Multimodal samples among `dropped` for having no safe cut (`crate::media`), ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_safe_cut: Vec<i64>,
    /// The most segments of a row, when the plan had a segment cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_row_segments: Option<u64>,
    /// The padding segment alignment adds inside the rows, when the plan aligned segments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alignment_padding_tokens: Option<u64>,
    /// Prefix trees' counts, when the samples were packed as trees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeCounts>,
}

/// The figures of prefix trees: the sequences and the tries' nodes, the pieces planned, the
/// forward tokens (the rows' tokens, each shared prefix once per row) against the tokens and
/// rows of the same sequences packed flat, and their ratio.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TreeFigures {
    pub tree_sequences: u64,
    pub tree_nodes: u64,
    pub tree_pieces: u64,
    pub tree_forward_tokens: u64,
    pub tree_flat_tokens: u64,
    pub tree_flat_rows: u64,
    /// Forward over flat tokens (1.0: nothing shared).
    pub tree_token_ratio: f64,
}

/// The manifest's `figures` (but the wall time).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Figures {
    pub samples_in: u64,
    pub samples_packed: u64,
    pub samples_truncated: u64,
    pub samples_split: u64,
    pub samples_dropped: u64,
    pub samples_empty: u64,
    pub input_tokens: u64,
    pub rows: u64,
    pub tokens: u64,
    pub loss_tokens: u64,
    pub padding_tokens: u64,
    pub padding_tokens_unpacked: u64,
    pub efficiency: f64,
    pub lower_bound: u64,
    /// Only with `max_segments_per_row` (so other manifests stay byte-identical).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_row_segments: Option<u64>,
    /// Only with `align_segments` above 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alignment_padding_tokens: Option<u64>,
    /// Only for prefix trees.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeFigures>,
}

impl PackReport {
    /// Parts of one job (consecutive runs of samples, ids already global) as one report with
    /// `shards` (the parts' shards as they were renamed) and `input_rows`.
    pub fn merge(parts: &[PackReport], shards: Vec<ShardInfo>, input_rows: Vec<u64>) -> Self {
        let cat = |f: fn(&PackReport) -> &Vec<i64>| parts.iter().flat_map(f).copied().collect();
        let sum = |f: fn(&PackReport) -> u64| parts.iter().map(f).sum();
        Self {
            input_rows,
            has_labels: parts.iter().any(|p| p.has_labels),
            max_len: parts.first().map_or(0, |p| p.max_len),
            n_samples: sum(|p| p.n_samples),
            rows: sum(|p| p.rows),
            segments: sum(|p| p.segments),
            tokens: sum(|p| p.tokens),
            input_tokens: sum(|p| p.input_tokens),
            dropped: cat(|p| &p.dropped),
            empty: cat(|p| &p.empty),
            truncated: cat(|p| &p.truncated),
            split: cat(|p| &p.split),
            shards,
            input_fingerprints: Vec::new(),
            no_safe_cut: cat(|p| &p.no_safe_cut),
            max_row_segments: parts.iter().filter_map(|p| p.max_row_segments).max(),
            alignment_padding_tokens: parts
                .iter()
                .filter_map(|p| p.alignment_padding_tokens)
                .reduce(|a, b| a + b),
            tree: parts
                .iter()
                .filter_map(|p| p.tree.clone())
                .reduce(|a, b| TreeCounts {
                    sequences: a.sequences + b.sequences,
                    nodes: a.nodes + b.nodes,
                    pieces: a.pieces + b.pieces,
                    flat_tokens: a.flat_tokens + b.flat_tokens,
                    flat_rows: a.flat_rows + b.flat_rows,
                }),
        }
    }

    pub fn figures(&self) -> Figures {
        let count = |v: &Vec<i64>| v.len() as u64;
        let (dropped, truncated, split) = (
            count(&self.dropped),
            count(&self.truncated),
            count(&self.split),
        );
        let max_len = u64::from(self.max_len);
        Figures {
            samples_in: self.n_samples,
            samples_packed: self.n_samples - dropped - truncated - split,
            samples_truncated: truncated,
            samples_split: split,
            samples_dropped: dropped,
            samples_empty: count(&self.empty),
            input_tokens: self.input_tokens,
            rows: self.rows,
            tokens: self.tokens,
            loss_tokens: self.shards.iter().map(|s| s.loss_tokens).sum(),
            padding_tokens: self.rows * max_len - self.tokens,
            padding_tokens_unpacked: self.segments * max_len - self.tokens,
            efficiency: efficiency(self.tokens, self.rows, self.max_len),
            lower_bound: lower_bound(self.tokens, self.max_len),
            max_row_segments: self.max_row_segments,
            alignment_padding_tokens: self.alignment_padding_tokens,
            tree: self.tree.as_ref().map(|t| TreeFigures {
                tree_sequences: t.sequences,
                tree_nodes: t.nodes,
                tree_pieces: t.pieces,
                tree_forward_tokens: self.tokens,
                tree_flat_tokens: t.flat_tokens,
                tree_flat_rows: t.flat_rows,
                tree_token_ratio: if t.flat_tokens == 0 {
                    1.0
                } else {
                    self.tokens as f64 / t.flat_tokens as f64
                },
            }),
        }
    }
}

impl From<PackOutcome> for PackReport {
    fn from(o: PackOutcome) -> Self {
        let plan = o.plan;
        let max_row_segments = plan.max_segments.map(|_| plan.max_row_segments());
        let alignment_padding_tokens = plan.align.map(|_| plan.alignment_padding());
        Self {
            input_rows: o.input_rows,
            has_labels: o.has_labels,
            max_len: plan.max_len,
            n_samples: plan.n_samples as u64,
            rows: plan.n_bins() as u64,
            segments: plan.sample_ids.len() as u64,
            tokens: plan.total_tokens(),
            input_tokens: plan.input_tokens,
            dropped: plan.dropped,
            empty: plan.empty,
            truncated: plan.truncated,
            split: plan.split,
            max_row_segments,
            alignment_padding_tokens,
            shards: o.shards,
            input_fingerprints: o.input_fingerprints,
            no_safe_cut: o.no_safe_cut,
            tree: o.tree,
        }
    }
}
