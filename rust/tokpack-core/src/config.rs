//! `PackConfig`: the one owner of a pack job's options (the plan, the input columns, the pair
//! layout, the carried columns and the shard layout). Its constructor is the only validation;
//! every path (`plan`, `pack_tokens`, `pack_files`, `tokpack.ray.pack`, `stats`, the CLI) builds
//! one, and a path that does not support a field refuses it by name (`tokpack.pack_config`).

use crate::error::{CoreError, Result};
use crate::format::check_carry_name;
use crate::io::pack::LabelSource;
use crate::io::pairs::check_pair_config;
use crate::io::writer::parse_compression;
use crate::plan::PlanConfig;
use crate::policy::{
    check_range, Overlong, PairLayout, RowOrder, SampleKind, Strategy, MAX_LEN, MAX_ROWS,
};

/// The fields of a config from one line per field, in the order of the manifest's `config` and
/// of the CLI's flags: `name: type = default, choices, help` (choices empty: any value of its
/// type; `max_len` has no default). Makes [`PackFields`], [`PackFields::defaults`] and
/// [`FIELDS`], the `(name, choices, help)` the CLI prints.
macro_rules! pack_fields {
    (max_len: $max_ty:ty, $max_help:expr;
     $($(#[$doc:meta])* $name:ident: $ty:ty = $default:expr, $choices:expr, $help:expr;)*) => {
        /// The values a config is made from, as the caller gives them (checked by
        /// [`PackConfig::new`]).
        #[derive(Clone, Debug)]
        pub struct PackFields {
            pub max_len: $max_ty,
            $($(#[$doc])* pub $name: $ty,)*
        }

        impl PackFields {
            /// The defaults, with the given `max_len`.
            pub fn defaults(max_len: $max_ty) -> Self {
                Self { max_len, $($name: $default,)* }
            }
        }

        pub const FIELDS: &[(&str, &[&str], &str)] =
            &[("max_len", &[], $max_help), $((stringify!($name), $choices, $help),)*];
    };
}

pack_fields! {
    max_len: i128, "row capacity in tokens";
    strategy: String = Strategy::Bfd.name().into(), Strategy::NAMES,
        "bfd best-fit decreasing, ffd first-fit decreasing, next_fit input order, padding one \
        sample per row, random shuffle, concatenate and cut";
    overlong: String = Overlong::Error.name().into(), Overlong::NAMES,
        "samples longer than max_len: error, truncate, drop, or split into pieces";
    seed: i128 = 0, &[], "seed of the shuffled row order and of the random strategy";
    row_order: String = RowOrder::Shuffled.name().into(), RowOrder::NAMES,
        "order of the written rows: shuffled (a seeded permutation of the planned rows, so \
        readers get mixed batches) or plan (the planner's order: longest samples first with \
        bfd/ffd)";
    max_segments_per_row: Option<i128> = None, &[],
        "the most segments (samples or pieces) a row may hold, a hard constraint of every \
        strategy: fixed-capacity boundary arrays for CUDA graphs and torch.compile";
    align_segments: i128 = 1, &[],
        "plan each segment as its length rounded up to a multiple of this (128 for block-aligned \
        attention, 2*cp for context parallelism, 16 for FP8); the collators pad it";
    tokens_column: String = "input_ids".into(), &[], "list-of-integers column of token ids";
    labels_column: Option<String> = Some("labels".into()), &[],
        "used when present (-100 = not trained on)";
    loss_mask_column: Option<String> = None, &[], "0/1 column instead of labels";
    /// None: not given (the default layout for preference pairs, nothing for other samples).
    pair_layout: Option<String> = None, PairLayout::NAMES,
        "preference pairs: chosen then rejected, each whole (separate, the default), or the \
        prompt once then both completions (shared-prompt)";
    /// None: not given (`group` for tree token shards; other shards stay what they are).
    tree_group: Option<String> = None, &[],
        "the int64 column grouping sequences that share prefixes (a prompt's completions, a \
        chat's turns): packs the token shards as prefix trees (tree token shards: \"group\")";
    tree_min_shared: i128 = 1, &[],
        "prefix trees: a shared prefix shorter than this many tokens is not shared";
    /// None: `max_len`.
    tree_max_path: Option<i128> = None, &[],
        "prefix trees: the longest root-to-leaf path, the model's context (default: \
        max_len);       a longer sequence is over-long (--overlong: drop, truncate or error)";
    carry: Vec<String> = Vec::new(), &[],
        "scalar per-sample columns kept as per-segment lists (KTO's label always is)";
    rows_per_shard: i128 = 16384, &[], "packed rows per part-NNNNN.parquet";
    row_group_rows: i128 = 1024, &[], "packed rows per Parquet row group";
    compression: String = "zstd".into(), &[], "zstd[:LEVEL], snappy, lz4, none";
}

/// The pair layout of inputs of `kind` (`inputs` names them in messages): preference pairs
/// get one (`separate` when none is given); other kinds refuse any but `separate`.
pub fn pair_layout_for(
    kind: SampleKind,
    layout: Option<PairLayout>,
    inputs: &str,
) -> Result<Option<PairLayout>> {
    match (kind, layout) {
        (SampleKind::Preference, layout) => Ok(Some(layout.unwrap_or(PairLayout::Separate))),
        (_, Some(layout)) if layout != PairLayout::Separate => Err(CoreError::Config(format!(
            "pair_layout {:?} applies to preference pairs; {inputs} holds {} samples",
            layout.name(),
            kind.name()
        ))),
        _ => Ok(None),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PackConfig {
    pub plan: PlanConfig,
    pub tokens_column: String,
    pub labels_column: Option<String>,
    pub loss_mask_column: Option<String>,
    pub pair_layout: Option<PairLayout>,
    /// The group column of sequences packed as prefix trees, when given.
    pub tree_group: Option<String>,
    pub tree_min_shared: u32,
    /// The longest root-to-leaf path of prefix trees, when not `max_len`.
    pub tree_max_path: Option<u32>,
    pub carry: Vec<String>,
    pub rows_per_shard: usize,
    pub row_group_rows: usize,
    /// As given (`zstd:9`), checked.
    pub compression: String,
}

/// A row group's tokens are addressed by int32 offsets: `row_group_rows` full rows of
/// `max_len` tokens must fit.
fn check_row_group_tokens(row_group_rows: i128, max_len: u32) -> Result<()> {
    let most = i128::from(i32::MAX) / i128::from(max_len);
    if row_group_rows > most {
        return Err(CoreError::Config(format!(
            "row_group_rows must be at most {most} with max_len {max_len} (a row group's \
             row_group_rows * max_len tokens must fit in int32), got {row_group_rows}"
        )));
    }
    Ok(())
}

impl PackConfig {
    /// The one validation of the pack options.
    pub fn new(f: PackFields) -> Result<Self> {
        let max_len = check_range("max_len", f.max_len, 1, MAX_LEN)? as u32;
        let seed = check_range("seed", f.seed, 0, u64::MAX.into())? as u64;
        let rows_per_shard = check_range("rows_per_shard", f.rows_per_shard, 1, MAX_ROWS)?;
        let row_group_rows = check_range("row_group_rows", f.row_group_rows, 1, MAX_ROWS)?;
        // A count in `1..=hi` when given.
        let count = |name, n: Option<i128>, hi| -> Result<Option<u32>> {
            n.map(|n| check_range(name, n, 1, hi).map(|n| n as u32))
                .transpose()
        };
        let max_segments = count("max_segments_per_row", f.max_segments_per_row, MAX_LEN)?;
        let align = check_range("align_segments", f.align_segments, 1, MAX_LEN)? as u32;
        let tree_min_shared = check_range("tree_min_shared", f.tree_min_shared, 1, MAX_LEN)? as u32;
        let tree_max_path = count("tree_max_path", f.tree_max_path, max_len.into())?;
        if f.tree_group.as_deref() == Some("") {
            return Err(CoreError::Config(
                "tree_group must be a column name, got ''".into(),
            ));
        }
        check_row_group_tokens(row_group_rows, max_len)?;
        let plan = PlanConfig {
            max_len,
            strategy: f.strategy.parse()?,
            overlong: f.overlong.parse()?,
            seed,
            row_order: f.row_order.parse()?,
            max_segments,
            align,
        };
        plan.check()?;
        if f.loss_mask_column.is_some()
            && !matches!(f.labels_column.as_deref(), None | Some("labels"))
        {
            return Err(CoreError::Config(
                "pass either labels_column or loss_mask_column, not both".into(),
            ));
        }
        let mut carry: Vec<String> = Vec::with_capacity(f.carry.len());
        for name in f.carry {
            check_carry_name(&name, true)?;
            if !carry.contains(&name) {
                carry.push(name);
            }
        }
        parse_compression(&f.compression)?;
        Ok(Self {
            plan,
            tokens_column: f.tokens_column,
            labels_column: f.labels_column,
            loss_mask_column: f.loss_mask_column,
            pair_layout: f.pair_layout.as_deref().map(str::parse).transpose()?,
            tree_group: f.tree_group,
            tree_min_shared,
            tree_max_path,
            carry,
            rows_per_shard: rows_per_shard as usize,
            row_group_rows: row_group_rows as usize,
            compression: f.compression,
        })
    }

    /// This config for inputs of `kind` (`inputs` names them in messages): the pair layout
    /// of [`pair_layout_for`] and the plan options pairs allow ([`check_pair_config`]); the
    /// kind's own carried columns first (`crate::kind`: KTO's `label`, multimodal's media
    /// columns); other kinds refuse KTO's `label`.
    pub fn for_kind(&self, kind: SampleKind, inputs: &str) -> Result<Self> {
        let mut out = self.clone();
        out.pair_layout = pair_layout_for(kind, self.pair_layout, inputs)?;
        if kind == SampleKind::Preference {
            check_pair_config(&self.plan)?;
        }
        if kind == SampleKind::Tree {
            self.check_tree()?;
            // The group column first, by its name (`group` unless `tree_group` names another).
            let group = self.tree_group_column();
            out.carry = std::iter::once(group.to_string())
                .chain(self.carry.iter().filter(|c| *c != group).cloned())
                .collect();
        } else if let Some(n) = self.tree_max_path {
            return Err(CoreError::Config(format!(
                "tree_max_path={n} caps the paths of prefix trees; {inputs} holds {} samples, \
                 which are not packed as trees (max_len caps their rows)",
                kind.name()
            )));
        } else if let Some(group) = &self.tree_group {
            return Err(CoreError::Config(format!(
                "tree_group {group:?} packs token shards as prefix trees (tokpack.pack_files, \
                 tokpack pack); {inputs} holds {} samples, which are not",
                kind.name()
            )));
        } else {
            out.carry = kind.carry(&self.carry);
        }
        let label = crate::format::col::KTO_LABEL;
        if !kind.spec().carried.contains(&label) && self.carry.iter().any(|c| c == label) {
            check_carry_name(label, false)?;
        }
        Ok(out)
    }

    /// The column grouping the sequences of prefix trees.
    pub fn tree_group_column(&self) -> &str {
        self.tree_group
            .as_deref()
            .unwrap_or(crate::format::col::GROUP)
    }

    /// The options prefix trees cannot honour, refused by name with the fix: a sequence is one
    /// path of one row (never split, never cut at a row's end), and a row's parts are pieces of
    /// trees, not segments.
    fn check_tree(&self) -> Result<()> {
        let refuse =
            |what: String| Err(CoreError::Config(format!("{what} (packing prefix trees)")));
        if self.plan.overlong == Overlong::Split {
            return refuse(
                "overlong \"split\" cuts a sample into pieces in several rows, and a tree's \
                 sequence is one path of one row: pass overlong \"truncate\", \"drop\" or \
                 \"error\""
                    .into(),
            );
        }
        if self.plan.strategy == Strategy::Random {
            return refuse(
                "strategy \"random\" cuts samples at row ends, and a tree's sequence is one \
                 path of one row: pass strategy \"bfd\", \"ffd\", \"next_fit\" or \"padding\""
                    .into(),
            );
        }
        if self.plan.max_segments.is_some() {
            return refuse(
                "max_segments_per_row caps segments, and rows of prefix trees hold pieces of \
                 trees: leave it unset"
                    .into(),
            );
        }
        if self.plan.align > 1 {
            return refuse(
                "align_segments pads segments, and rows of prefix trees hold pieces of trees \
                 laid out token by token: leave it at 1"
                    .into(),
            );
        }
        Ok(())
    }

    /// How labels are read: the loss mask when given, else the labels column (required when
    /// it is not the default `labels`, which is used when every input has it).
    pub fn labels(&self) -> LabelSource {
        match (&self.loss_mask_column, &self.labels_column) {
            (Some(mask), _) => LabelSource::LossMask(mask.clone()),
            (None, Some(column)) => LabelSource::Labels {
                column: column.clone(),
                required: column != "labels",
            },
            (None, None) => LabelSource::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The other rules are asserted from Python (test_pack_config, test_stats, test_row_order,
    /// test_pack_pairs).
    #[test]
    fn unknown_compression_is_refused() {
        let mut fields = PackFields::defaults(64);
        fields.compression = "gzip".into();
        let err = PackConfig::new(fields).unwrap_err().to_string();
        assert!(err.starts_with("unknown compression"), "{err}");
    }

    #[test]
    fn row_group_tokens_must_fit_int32() {
        let fields = |max_len, row_group_rows| PackFields {
            row_group_rows,
            ..PackFields::defaults(max_len)
        };
        let most = i128::from(i32::MAX) / 4096;
        assert!(PackConfig::new(fields(4096, most)).is_ok());
        let err = PackConfig::new(fields(4096, most + 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("row_group_rows must be at most 524287"),
            "{err}"
        );
    }
}
