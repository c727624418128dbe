//! Errors of the packing core. The Python binding maps each variant to its own exception class.

/// Everything that can go wrong in the core, with enough context to name the culprit.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A bad argument (max_len < 1, unknown strategy, ...): the caller's configuration is wrong.
    #[error("{0}")]
    Config(String),
    /// A sample is longer than max_len and the overlong policy is `error`.
    #[error(
        "sample {index} has {length} tokens, more than max_len={max_len}; \
         pass overlong=\"truncate\", \"drop\" or \"split\", or filter it out first"
    )]
    Overlong {
        index: usize,
        length: i64,
        max_len: u32,
    },
    /// The data itself is invalid (negative length, mismatched labels, ...).
    #[error("{0}")]
    Data(String),
}

pub type Result<T> = std::result::Result<T, CoreError>;
