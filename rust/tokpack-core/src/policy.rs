//! The names and constants shared by the core, the binding and the Python package, defined once
//! here (`_tokpack` exports them, `tokpack/_contract.py` re-exports them to Python). A leaf
//! module: it imports nothing else of the crate but the error type.

use crate::error::{CoreError, Result};

/// Label value that the loss ignores.
pub const IGNORE_INDEX: i32 = -100;

/// `seq_roles` of a packed segment, by value: 0 a plain sample (outputs without pairs have no
/// roles), else which part of a preference pair it is.
pub const SEGMENT_ROLES: [&str; 4] = ["sequence", "chosen", "rejected", "prompt"];
pub const ROLE_CHOSEN: i8 = 1;
pub const ROLE_REJECTED: i8 = 2;
pub const ROLE_PROMPT: i8 = 3;

/// What to do about a sample longer than max_len (defined with the overlong error).
pub use crate::error::OVERLONG_HINT;

/// Largest `max_len`: token offsets inside a row are int32.
pub const MAX_LEN: i128 = i32::MAX as i128;
/// Largest row count of a shard or a row group.
pub const MAX_ROWS: i128 = i32::MAX as i128;

/// `value` when it is in `lo..=hi`, else the one message of every numeric argument's range.
pub fn check_range(name: &str, value: i128, lo: i128, hi: i128) -> Result<i128> {
    if (lo..=hi).contains(&value) {
        Ok(value)
    } else {
        Err(CoreError::Config(format!(
            "{name} must be at least {lo} and at most {hi}, got {value}"
        )))
    }
}

/// Enums of named choices, each with its names (in the order the documentation lists them),
/// `name()`, and a `FromStr` whose error lists the names.
macro_rules! named {
    ($($(#[$doc:meta])* $ty:ident, $what:literal, { $($(#[$vdoc:meta])* $v:ident = $name:literal,)+ })+) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $ty { $($(#[$vdoc])* $v,)+ }

        impl $ty {
            pub const NAMES: &'static [&'static str] = &[$($name),+];
            pub const ALL: &'static [Self] = &[$(Self::$v),+];

            pub fn name(self) -> &'static str {
                Self::NAMES[self as usize]
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::error::CoreError;
            fn from_str(s: &str) -> $crate::error::Result<Self> {
                match Self::NAMES.iter().position(|n| *n == s) {
                    Some(i) => Ok(Self::ALL[i]),
                    None => Err($crate::policy::unknown($what, s, Self::NAMES)),
                }
            }
        }
    )+};
}
pub(crate) use named;

pub(crate) fn unknown(what: &str, got: &str, names: &[&str]) -> CoreError {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    CoreError::Config(format!(
        "unknown {what} {got:?}; expected one of {}",
        quoted.join(", ")
    ))
}

named!(
    /// Packing strategies.
    Strategy, "strategy", {
        /// Best-fit decreasing (the default).
        Bfd = "bfd",
        /// First-fit decreasing.
        Ffd = "ffd",
        /// Input order, a new row when the next sample does not fit.
        NextFit = "next_fit",
        /// One sample per row.
        Padding = "padding",
        /// Shuffle, concatenate, cut every max_len tokens (samples may be split).
        Random = "random",
    }
    /// What to do with samples longer than max_len.
    Overlong, "overlong policy", {
        Error = "error",
        Truncate = "truncate",
        Drop = "drop",
        Split = "split",
    }
    /// How a preference pair is laid out in its row.
    PairLayout, "pair layout", {
        /// `[chosen][rejected]`, each prompt + completion.
        Separate = "separate",
        /// `[prompt][chosen completion][rejected completion]`.
        SharedPrompt = "shared-prompt",
    }
    /// The order packed rows are written in (and a plan's rows are listed in).
    RowOrder, "row order", {
        /// A seeded permutation of the planned rows (the default): any reader, in file order
        /// or shuffling within a few row groups, gets rows of mixed composition.
        Shuffled = "shuffled",
        /// The planner's own order (best-fit decreasing: longest samples first).
        Plan = "plan",
    }
    /// What one input sample is: a plain sequence, a preference pair, a KTO record, a
    /// sequence with images or a sequence of a group sharing prefixes, packed as prefix trees
    /// (`crate::kind` says what each kind is, for every path).
    SampleKind, "sample kind", {
        Sft = "sft",
        Preference = "preference",
        Kto = "kto",
        Multimodal = "multimodal",
        Tree = "tree",
    }
    /// How `balance::partition` splits items.
    PartitionMethod, "partition method", {
        /// The better (lower maximum) of Karmarkar-Karp and LPT, each refined by local search.
        Best = "best",
        /// Karmarkar-Karp largest differencing (verl's algorithm), unrefined.
        Kk = "kk",
        /// Longest processing time first: each item, largest first, to the lightest part.
        Lpt = "lpt",
    }
    /// The order of a rank's micro-batches.
    MicroBatchOrder, "micro-batch order", {
        /// Heaviest first on every rank: the i-th micro-batches of all ranks cost about the same.
        Descending = "descending",
        /// Lightest at both ends, heaviest in the middle: small pipeline warm-up and cool-down.
        Pp = "pp",
        /// By smallest sample index.
        Input = "input",
    }
    /// What `balance::micro_batches` does with a sample longer than max_tokens.
    OverCap, "over-cap policy", {
        Error = "error",
        /// A micro-batch of its own.
        Alone = "alone",
    }
);

impl PairLayout {
    /// The `seq_roles` of a pair's segments in a row, in order.
    pub fn roles(self) -> &'static [i8] {
        match self {
            PairLayout::Separate => &[ROLE_CHOSEN, ROLE_REJECTED],
            PairLayout::SharedPrompt => &[ROLE_PROMPT, ROLE_CHOSEN, ROLE_REJECTED],
        }
    }
}
