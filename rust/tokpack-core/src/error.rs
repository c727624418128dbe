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
    /// A sample is longer than max_len (policy `error`), located in its input file.
    #[error("{0}")]
    OverlongAt(String),
    /// The data itself is invalid (negative length, mismatched labels, ...).
    #[error("{0}")]
    Data(String),
    /// An input file is missing or cannot be opened (the message names the file).
    #[error("{0}")]
    InputNotFound(String),
    /// An input file is not valid Parquet / Arrow IPC, or its pages do not decode.
    #[error("{0}")]
    CorruptInput(String),
    /// An input file lacks a needed column or has it with an unsupported type.
    #[error("{0}")]
    Schema(String),
    /// Writing the output (or the temporary spill files) failed.
    #[error("{0}")]
    Output(String),
    /// The caller asked the work to stop (Ctrl-C).
    #[error("interrupted")]
    Cancelled,
}

pub type Result<T> = std::result::Result<T, CoreError>;
