//! The packed-directory format, defined once: file names, shard and index columns, the names a
//! carried column may not take, and the format's version (`docs/format.md` describes it; `_tokpack`
//! exports these names and `tokpack/packed/format.py` is the Python side's one reader and writer of
//! the manifest and the dropped list). A leaf module: it imports nothing else of the crate but
//! the error type.

use crate::error::{CoreError, Result};

/// The `format` field of a packed directory's manifest.
pub const FORMAT: &str = "tokpack-packed";

/// The `format_version` of the packed directories this version writes and reads. 2: shards
/// record their size and the checksums of each row group's bytes and of the footer. Bumped only
/// when the bytes of a packed directory change.
pub const FORMAT_VERSION: u32 = 2;

/// Subdirectory of side files (indexes, manifest, dropped list): Parquet readers skip it.
pub const SIDE_DIR: &str = "__tokpack__";
/// The manifest: written last, it makes the directory complete.
pub const MANIFEST_NAME: &str = "__tokpack__/_manifest.json";
/// Every sample that is not in the output, with its source and reason (Arrow IPC, not Parquet:
/// HF `datasets` reads every `*.parquet` under a data_dir).
pub const DROPPED_NAME: &str = "__tokpack__/_dropped.arrow";
/// Records a tokenizing run rejected (JSON lines).
pub const REJECTED_NAME: &str = "__tokpack__/_rejected.jsonl";

/// The file name of packed shard `shard`.
pub fn shard_name(shard: usize) -> String {
    format!("part-{shard:05}.parquet")
}

/// The file name of shard `shard`'s index (one row per packed row).
pub fn index_name(shard: usize) -> String {
    format!("{SIDE_DIR}/_index-part-{shard:05}.arrow")
}

/// The columns of a packed shard, in order (`labels` only with labels, `seq_roles` and
/// `num_pairs` only for preference pairs; carried columns follow).
pub mod col {
    pub const INPUT_IDS: &str = "input_ids";
    pub const LABELS: &str = "labels";
    pub const SEQ_LENGTHS: &str = "seq_lengths";
    pub const SAMPLE_IDS: &str = "sample_ids";
    pub const NUM_TOKENS: &str = "num_tokens";
    pub const NUM_SEQS: &str = "num_seqs";
    pub const NUM_LOSS_TOKENS: &str = "num_loss_tokens";
    pub const SEQ_LOSS_TOKENS: &str = "seq_loss_tokens";
    pub const SEQ_ROLES: &str = "seq_roles";
    pub const NUM_PAIRS: &str = "num_pairs";
    /// The index's token offset of a row inside its shard.
    pub const OFFSET: &str = "offset";
    /// KTO's desirable / undesirable label, carried per segment.
    pub const KTO_LABEL: &str = "label";
    /// A multimodal sample's images (JSON list), pad tokens and vision-encoder patches,
    /// carried per segment.
    pub const MEDIA: &str = "media";
    pub const VISION_TOKENS: &str = "vision_tokens";
    pub const VISION_PATCHES: &str = "vision_patches";
    /// A tree token shard's group (sequences of one group may share prefixes), carried per
    /// sequence.
    pub const GROUP: &str = "group";
    /// Tree rows (`crate::tree::TreeRows`' row-local arrays): per token its node; per node its
    /// parent (-1: a root), depth (position of its first token), token interval, length; per
    /// sequence its end node; per sequence its targets (indices of predictions); per
    /// prediction its position, the token it scores and how many sequences train it.
    pub const TREE_NODE: &str = "tree_node";
    pub const TREE_NODE_PARENT: &str = "tree_node_parent";
    pub const TREE_NODE_DEPTH: &str = "tree_node_depth";
    pub const TREE_NODE_TIN: &str = "tree_node_tin";
    pub const TREE_NODE_TOUT: &str = "tree_node_tout";
    pub const TREE_NODE_LEN: &str = "tree_node_len";
    pub const TREE_SEQ_END_NODE: &str = "tree_seq_end_node";
    pub const TREE_TARGET_PRED: &str = "tree_target_pred";
    pub const TREE_PRED_POS: &str = "tree_pred_pos";
    pub const TREE_PRED_TOKEN: &str = "tree_pred_token";
    pub const TREE_PRED_WEIGHT: &str = "tree_pred_weight";
}

/// The columns packed shards of prefix trees add after the common ones (which have no `labels`
/// there: each sequence's targets are its predictions), in order, all list<int32>.
pub const TREE_COLUMNS: [&str; 11] = [
    col::TREE_NODE,
    col::TREE_NODE_PARENT,
    col::TREE_NODE_DEPTH,
    col::TREE_NODE_TIN,
    col::TREE_NODE_TOUT,
    col::TREE_NODE_LEN,
    col::TREE_SEQ_END_NODE,
    col::TREE_TARGET_PRED,
    col::TREE_PRED_POS,
    col::TREE_PRED_TOKEN,
    col::TREE_PRED_WEIGHT,
];

/// The media columns of multimodal token shards, carried per segment into packed shards.
pub const MEDIA_COLUMNS: [&str; 3] = [col::MEDIA, col::VISION_TOKENS, col::VISION_PATCHES];

pub const SHARD_COLUMNS: [&str; 10] = [
    col::INPUT_IDS,
    col::LABELS,
    col::SEQ_LENGTHS,
    col::SAMPLE_IDS,
    col::NUM_TOKENS,
    col::NUM_SEQS,
    col::NUM_LOSS_TOKENS,
    col::SEQ_LOSS_TOKENS,
    col::SEQ_ROLES,
    col::NUM_PAIRS,
];

pub const INDEX_COLUMNS: [&str; 4] = [
    col::OFFSET,
    col::NUM_TOKENS,
    col::NUM_SEQS,
    col::NUM_LOSS_TOKENS,
];

/// Names a carried column may not take: every shard column, and KTO's `label` (carried by
/// tokpack itself from KTO inputs): two columns of one name, or one a reader takes for another
/// meaning.
pub fn is_reserved(name: &str) -> bool {
    SHARD_COLUMNS.contains(&name) || TREE_COLUMNS.contains(&name) || name == col::KTO_LABEL
}

/// A carried column's name: non-empty and not reserved (`kto`: `label` is KTO's own).
pub fn check_carry_name(name: &str, kto: bool) -> Result<()> {
    if name.is_empty() {
        return Err(CoreError::Config(
            "carry: column names must be non-empty strings, got ''".into(),
        ));
    }
    if is_reserved(name) && !(kto && name == col::KTO_LABEL) {
        return Err(CoreError::Config(format!(
            "carry: '{name}' is a column of packed shards (reserved: {}, {}, {}); rename the \
             input column to carry it",
            SHARD_COLUMNS.join(", "),
            TREE_COLUMNS.join(", "),
            col::KTO_LABEL
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(MANIFEST_NAME, format!("{SIDE_DIR}/_manifest.json"));
        assert_eq!(DROPPED_NAME, format!("{SIDE_DIR}/_dropped.arrow"));
        assert_eq!(REJECTED_NAME, format!("{SIDE_DIR}/_rejected.jsonl"));
        assert_eq!(index_name(3), "__tokpack__/_index-part-00003.arrow");
        assert!(check_carry_name("num_tokens", false).is_err());
        assert!(check_carry_name("label", false).is_err());
        assert!(check_carry_name("label", true).is_ok());
        assert!(check_carry_name("source", false).is_ok());
        assert!(check_carry_name("tree_pred_pos", false).is_err());
    }
}
