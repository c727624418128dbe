//! Errors of the packing core, as types: a variant per kind of failure (the Python binding maps
//! each to its own exception class), the place it happened as a [`Location`], and the arrow,
//! parquet or OS error under it as a [`Cause`]. Messages are composed here only.

use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// What to do about a sample longer than max_len, said by every overlong error.
pub const OVERLONG_HINT: &str =
    "pass overlong=\"truncate\", \"drop\" or \"split\", or filter it out first";

/// The library error under a core error: what the OS, arrow or parquet said.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
}

/// Where something went wrong, as far as known: file, unit (row group / record batch), row,
/// column. Shown as `file, row group 3, row 7, column "labels"`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location {
    pub file: Option<PathBuf>,
    /// `("row group" or "record batch", index)`.
    pub unit: Option<(&'static str, usize)>,
    pub row: Option<u64>,
    pub column: Option<String>,
}

impl Location {
    pub fn file(path: &Path) -> Self {
        Self {
            file: Some(path.to_path_buf()),
            ..Self::default()
        }
    }

    pub fn unit(path: &Path, kind: &'static str, index: usize) -> Self {
        Self {
            unit: Some((kind, index)),
            ..Self::file(path)
        }
    }

    /// This location, in column `column`.
    pub fn column(self, column: &str) -> Self {
        Self {
            column: Some(column.to_string()),
            ..self
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            self.file.as_ref().map(|f| f.display().to_string()),
            self.unit.map(|(kind, index)| format!("{kind} {index}")),
            self.row.map(|row| format!("row {row}")),
            self.column.as_ref().map(|c| format!("column {c:?}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        f.write_str(&parts.join(", "))
    }
}

/// `"{at}: "`, or nothing when the location is unknown.
fn prefix(at: &Location) -> String {
    if *at == Location::default() {
        String::new()
    } else {
        format!("{at}: ")
    }
}

/// `what (cause)`, `what` or `cause`.
fn detail(what: &str, cause: Option<&Cause>) -> String {
    match (what.is_empty(), cause) {
        (_, None) => what.to_string(),
        (true, Some(c)) => c.to_string(),
        (false, Some(c)) => format!("{what} ({c})"),
    }
}

fn unreadable(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::NotFound => "no such file".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        _ => format!("cannot read ({e})"),
    }
}

/// Everything that can go wrong in the core, with enough context to name the culprit.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A bad argument (max_len < 1, unknown strategy, ...): the caller's configuration is wrong.
    #[error("{0}")]
    Config(String),
    /// Sample `index` is longer than max_len and the overlong policy is `error`.
    #[error(
        "{}sample {index} has {length} tokens, more than max_len={max_len}; {OVERLONG_HINT}",
        prefix(at)
    )]
    Overlong {
        at: Box<Location>,
        index: usize,
        length: i64,
        max_len: u32,
    },
    /// Sample `index` is longer than a micro-batch's max_tokens and the policy is `error`.
    #[error(
        "sample {index} has {length} tokens, more than max_tokens={max_tokens}; pass \
         overlong=\"alone\" to give it a micro-batch of its own, or filter it out first"
    )]
    OverCap {
        index: usize,
        length: i64,
        max_tokens: u64,
    },
    /// The data itself is invalid (negative length, mismatched labels, ...).
    #[error("{}{what}", prefix(at))]
    Data { at: Box<Location>, what: String },
    /// An input file cannot be opened or read: missing, not permitted, or an I/O error.
    #[error("{}: {}", path.display(), unreadable(source))]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An input file is not valid Parquet / Arrow IPC, or its pages do not decode.
    #[error("{}{}", prefix(at), detail(what, source.as_deref()))]
    CorruptInput {
        at: Box<Location>,
        what: String,
        source: Option<Box<Cause>>,
    },
    /// An input file lacks a needed column or has it with an unsupported type.
    #[error("{}{what}", prefix(at))]
    Schema { at: Box<Location>, what: String },
    /// Writing the output (or the temporary spill files) failed.
    #[error("{}: {}", path.display(), detail(what, source.as_deref()))]
    Output {
        path: PathBuf,
        what: String,
        source: Option<Box<Cause>>,
    },
    /// The caller asked the work to stop (Ctrl-C).
    #[error("interrupted")]
    Cancelled,
}

pub type Result<T> = std::result::Result<T, CoreError>;

impl CoreError {
    /// Invalid data at an unknown or irrelevant place.
    pub fn data(what: impl Into<String>) -> Self {
        Self::Data {
            at: Box::default(),
            what: what.into(),
        }
    }

    /// A missing or unsupported column at `at`.
    pub fn schema(at: Location, what: impl Into<String>) -> Self {
        Self::Schema {
            at: Box::new(at),
            what: what.into(),
        }
    }

    /// `path` cannot be opened or read.
    pub fn unreadable(path: &Path, source: std::io::Error) -> Self {
        Self::Unreadable {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Damaged input at `at`: `what` went wrong, because of `source` when known.
    pub fn corrupt(at: Location, what: impl Into<String>, source: Option<Cause>) -> Self {
        Self::CorruptInput {
            at: Box::new(at),
            what: what.into(),
            source: source.map(Box::new),
        }
    }
}

/// Attaches the place to a library error: `file.write_all(..).output(&path)?`.
pub trait Context<T> {
    /// Writing `path` failed.
    fn output(self, path: &Path) -> Result<T>;
    /// Reading or decoding at `at` failed: `what` was being done.
    fn corrupt(self, at: &Location, what: &str) -> Result<T>;
}

impl<T, E: Into<Cause>> Context<T> for std::result::Result<T, E> {
    fn output(self, path: &Path) -> Result<T> {
        self.map_err(|e| CoreError::Output {
            path: path.to_path_buf(),
            what: String::new(),
            source: Some(Box::new(e.into())),
        })
    }

    fn corrupt(self, at: &Location, what: &str) -> Result<T> {
        self.map_err(|e| CoreError::corrupt(at.clone(), what, Some(e.into())))
    }
}
