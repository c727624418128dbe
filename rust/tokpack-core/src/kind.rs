//! The sample kinds' room: per [`SampleKind`], the columns its token shards hold, the columns
//! its packed shards add or carry, where its samples may be cut, and the entry points that take
//! it. `_tokpack.KINDS` exports this table to Python (`tokpack/kinds.py`), so a new kind is one
//! variant of `SampleKind` and one entry of [`SampleKind::spec`] here, plus its collator.

use crate::format::{col, MEDIA_COLUMNS, TREE_COLUMNS};
use crate::policy::{named, SampleKind};

named!(
    /// Where a sample of a kind may be cut.
    CutRule, "cut rule", {
        /// Anywhere: `truncate` and `split` at `max_len`, `random` at row ends.
        Anywhere = "anywhere",
        /// Never: packed whole, or dropped (a preference pair).
        Never = "never",
        /// Only at the boundaries of its blocks (an image with its markers), planned by
        /// `crate::cuts`.
        SafeBlocks = "safe-blocks",
        /// Only truncated at `max_len` (its end dropped); never split into pieces or cut across
        /// rows (a tree's sequence: its path is one row's).
        Truncate = "truncate",
    }
    /// The entry points a kind may be given to.
    Entry, "entry point", {
        /// `pack_files` (`tokpack pack`), token shards or one-step records.
        Pack = "pack",
        /// `tokenize_files` (`tokpack tokenize`): records to token shards.
        Tokenize = "tokenize",
        /// `tokpack.ray` (`--ray`).
        Ray = "ray",
        /// Megatron / NeMo export of a packed directory.
        Export = "export",
        /// `pack_tokens`, in memory.
        PackTokens = "pack_tokens",
    }
);

/// The columns of a preference token shard the packer reads: chosen tokens and labels,
/// rejected tokens and labels, prompt length.
pub const PAIR_COLUMNS: [&str; 5] = [
    "chosen_input_ids",
    "chosen_labels",
    "rejected_input_ids",
    "rejected_labels",
    "prompt_length",
];

/// What one kind of sample is, for every path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindSpec {
    /// The columns of its token shards (besides carried record fields).
    pub inputs: &'static [&'static str],
    /// The shard columns its packed rows add (beyond `format::SHARD_COLUMNS`' common ones).
    pub outputs: &'static [&'static str],
    /// The columns carried per segment whatever the config says, first, in this order.
    pub carried: &'static [&'static str],
    pub cut: CutRule,
    pub entries: &'static [Entry],
}

const SFT_INPUTS: [&str; 3] = ["input_ids", "labels", "length"];

impl SampleKind {
    /// The kind's entry of the table.
    pub fn spec(self) -> KindSpec {
        use Entry::*;
        match self {
            SampleKind::Sft => KindSpec {
                inputs: &SFT_INPUTS,
                outputs: &[],
                carried: &[],
                cut: CutRule::Anywhere,
                entries: &[Pack, Tokenize, Ray, Export, PackTokens],
            },
            SampleKind::Preference => KindSpec {
                inputs: &[
                    PAIR_COLUMNS[0],
                    PAIR_COLUMNS[1],
                    PAIR_COLUMNS[2],
                    PAIR_COLUMNS[3],
                    PAIR_COLUMNS[4],
                    "length",
                ],
                outputs: &[col::SEQ_ROLES, col::NUM_PAIRS],
                carried: &[],
                cut: CutRule::Never,
                entries: &[Pack, Tokenize],
            },
            SampleKind::Kto => KindSpec {
                inputs: &[
                    "input_ids",
                    "labels",
                    "length",
                    "prompt_length",
                    col::KTO_LABEL,
                ],
                outputs: &[],
                carried: &[col::KTO_LABEL],
                cut: CutRule::Anywhere,
                entries: &[Pack, Tokenize, Ray],
            },
            SampleKind::Multimodal => KindSpec {
                inputs: &[
                    "input_ids",
                    "labels",
                    "length",
                    MEDIA_COLUMNS[0],
                    MEDIA_COLUMNS[1],
                    MEDIA_COLUMNS[2],
                ],
                outputs: &[],
                carried: &MEDIA_COLUMNS,
                cut: CutRule::SafeBlocks,
                entries: &[Pack, Tokenize],
            },
            // Sequences of one `group` share prefixes (`crate::tree`): each packed row is one
            // row of prefix trees (`crate::io::trees`), its group carried per sequence.
            SampleKind::Tree => KindSpec {
                inputs: &["input_ids", "labels", "length", col::GROUP],
                outputs: &TREE_COLUMNS,
                carried: &[col::GROUP],
                cut: CutRule::Truncate,
                entries: &[Pack, Tokenize],
            },
        }
    }

    /// The kind takes `entry`.
    pub fn supports(self, entry: Entry) -> bool {
        self.spec().entries.contains(&entry)
    }

    /// `carry` with the kind's own carried columns first (each once), in the table's order.
    pub fn carry(self, carry: &[String]) -> Vec<String> {
        let own = self.spec().carried;
        own.iter()
            .map(|c| c.to_string())
            .chain(carry.iter().filter(|c| !own.contains(&c.as_str())).cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_inputs_and_packs() {
        for &kind in SampleKind::ALL {
            let spec = kind.spec();
            assert!(spec.inputs.contains(&"length"), "{kind:?}");
            assert!(kind.supports(Entry::Pack), "{kind:?}");
            for c in spec.carried {
                assert!(
                    spec.inputs.contains(c),
                    "{kind:?} carries {c} it does not read"
                );
            }
        }
    }

    #[test]
    fn own_carried_columns_come_first() {
        let carry = vec!["score".to_string(), "vision_tokens".to_string()];
        let got = SampleKind::Multimodal.carry(&carry);
        assert_eq!(
            got,
            ["media", "vision_tokens", "vision_patches", "score"].map(String::from)
        );
        assert_eq!(SampleKind::Sft.carry(&carry), carry);
        assert_eq!(SampleKind::Kto.carry(&carry)[0], "label");
    }
}
