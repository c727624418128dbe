//! The names and constants shared by the core, the binding and the Python package, defined once
//! here (`_tokpack` exports them, `tokpack/_contract.py` re-exports them to Python). A leaf
//! module: it imports nothing else of the crate but the error type.

use crate::error::{CoreError, Result};
use std::str::FromStr;

/// Label value that the loss ignores.
pub const IGNORE_INDEX: i32 = -100;

/// The `format` field of a packed directory's manifest.
pub const FORMAT: &str = "tokpack-packed";

/// The `format_version` of the packed directories this version writes and reads. 2: shards
/// record their size and the checksums of each row group's bytes and of the footer.
pub const FORMAT_VERSION: u32 = 2;

/// Subdirectory of side files (indexes, manifest): Parquet readers skip it (see `_outdir.py`).
pub const SIDE_DIR: &str = "__tokpack__";

/// What to do about a sample longer than max_len, said by every overlong error.
pub const OVERLONG_HINT: &str =
    "pass overlong=\"truncate\", \"drop\" or \"split\", or filter it out first";

/// Packing strategies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Best-fit decreasing (the default).
    Bfd,
    /// First-fit decreasing.
    Ffd,
    /// Input order, a new row when the next sample does not fit.
    NextFit,
    /// One sample per row.
    Padding,
    /// Shuffle, concatenate, cut every max_len tokens (samples may be split).
    Random,
}

/// What to do with samples longer than max_len.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlong {
    Error,
    Truncate,
    Drop,
    Split,
}

/// An enum of named choices: its names, in the order the documentation lists them.
pub trait Named: Copy + 'static {
    /// What the choice is, for messages ("strategy").
    const WHAT: &'static str;
    const ALL: &'static [Self];
    fn name(self) -> &'static str;

    fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|v| v.name()).collect()
    }
}

fn parse<T: Named>(s: &str) -> Result<T> {
    T::ALL
        .iter()
        .copied()
        .find(|v| v.name() == s)
        .ok_or_else(|| {
            let quoted: Vec<String> = T::names().iter().map(|n| format!("{n:?}")).collect();
            CoreError::Config(format!(
                "unknown {} {s:?}; expected one of {}",
                T::WHAT,
                quoted.join(", ")
            ))
        })
}

impl Named for Strategy {
    const WHAT: &'static str = "strategy";
    const ALL: &'static [Self] = &[
        Self::Bfd,
        Self::Ffd,
        Self::NextFit,
        Self::Padding,
        Self::Random,
    ];
    fn name(self) -> &'static str {
        match self {
            Self::Bfd => "bfd",
            Self::Ffd => "ffd",
            Self::NextFit => "next_fit",
            Self::Padding => "padding",
            Self::Random => "random",
        }
    }
}

impl Named for Overlong {
    const WHAT: &'static str = "overlong policy";
    const ALL: &'static [Self] = &[Self::Error, Self::Truncate, Self::Drop, Self::Split];
    fn name(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Truncate => "truncate",
            Self::Drop => "drop",
            Self::Split => "split",
        }
    }
}

impl FromStr for Strategy {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        parse(s)
    }
}

impl FromStr for Overlong {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Named + FromStr<Err = CoreError> + PartialEq + std::fmt::Debug>() {
        for &v in T::ALL {
            assert_eq!(v.name().parse::<T>().unwrap(), v);
        }
        let err = "nope".parse::<T>().unwrap_err().to_string();
        assert!(err.starts_with(&format!("unknown {} \"nope\"; expected one of ", T::WHAT)));
    }

    #[test]
    fn names_round_trip() {
        round_trips::<Strategy>();
        round_trips::<Overlong>();
        assert_eq!(
            Strategy::names(),
            ["bfd", "ffd", "next_fit", "padding", "random"]
        );
        assert_eq!(Overlong::names(), ["error", "truncate", "drop", "split"]);
    }
}
