//! The columns `pack_files` reads from every input, resolved once across the files: the
//! tokens and labels (or a preference pair's [`PAIR_COLUMNS`]) and the carried columns.

use super::carry::carried_types;
use super::columns::{check_scalar_int, check_type, Role};
use super::pairs::PairLayout;
use super::source::Source;
use crate::error::{CoreError, Location, Result};
use crate::kind::PAIR_COLUMNS;
use arrow::datatypes::DataType;
use std::path::PathBuf;

/// Where labels come from.
#[derive(Clone, Debug)]
pub enum LabelSource {
    /// No labels.
    None,
    /// A labels column (-100 = not trained on). With `required: false` it is used when every
    /// input has it and ignored when none has.
    Labels { column: String, required: bool },
    /// A 0/1 loss-mask column; labels are the tokens where it is 1, -100 elsewhere.
    LossMask(String),
}

/// The resolved columns to read from every file.
pub(crate) struct Columns {
    pub tokens: String,
    pub labels: Option<(String, Role)>,
    pub pairs: Option<PairLayout>,
    /// Carried columns and their types.
    pub carry: Vec<(String, DataType)>,
}

impl Columns {
    pub fn names(&self) -> Vec<&str> {
        let labels = self.labels.as_ref().map(|(c, _)| c.as_str());
        let mut names = match self.pairs {
            Some(_) => PAIR_COLUMNS.to_vec(),
            None => std::iter::once(self.tokens.as_str())
                .chain(labels)
                .collect(),
        };
        names.extend(self.carry.iter().map(|(c, _)| c.as_str()));
        names
    }
}

fn resolve_labels(sources: &[Source], labels: &LabelSource) -> Result<Option<(String, Role)>> {
    let has = |s: &Source, c: &str| s.schema.index_of(c).is_ok();
    Ok(match labels {
        LabelSource::None => None,
        LabelSource::LossMask(c) => Some((c.clone(), Role::LossMask)),
        LabelSource::Labels { column, required } => {
            let missing: Vec<&Source> = sources.iter().filter(|s| !has(s, column)).collect();
            if missing.is_empty() {
                Some((column.clone(), Role::Labels))
            } else if missing.len() == sources.len() && !required {
                None
            } else {
                // Present in some files only, or asked for explicitly: name a file lacking it.
                missing[0].column_indices(&[column.as_str()])?;
                None
            }
        }
    })
}

pub(crate) fn resolve_columns(
    sources: &[Source],
    tokens: &str,
    labels: &LabelSource,
    pairs: Option<PairLayout>,
    carry: &[String],
) -> Result<Columns> {
    let labels = match pairs {
        Some(_) => None,
        None => resolve_labels(sources, labels)?,
    };
    let mut wanted: Vec<(&str, Role)> = match pairs {
        Some(_) => {
            let [ci, cl, ri, rl, _] = PAIR_COLUMNS;
            vec![
                (ci, Role::Tokens),
                (cl, Role::Labels),
                (ri, Role::Tokens),
                (rl, Role::Labels),
            ]
        }
        None => vec![(tokens, Role::Tokens)],
    };
    if let Some((c, role)) = &labels {
        wanted.push((c.as_str(), *role));
    }
    for s in sources {
        let file = Location::file(&s.path);
        for &(column, role) in &wanted {
            let idx = s.column_indices(&[column])?[0];
            check_type(&file, column, s.schema.field(idx).data_type(), role)?;
        }
        if pairs.is_some() {
            let column = PAIR_COLUMNS[4];
            let idx = s.column_indices(&[column])?[0];
            check_scalar_int(&file, column, s.schema.field(idx).data_type())?;
        }
    }
    let types = carried_types(sources, carry)?;
    Ok(Columns {
        tokens: tokens.to_string(),
        labels,
        pairs,
        carry: carry.iter().cloned().zip(types).collect(),
    })
}

/// The columns `pack_files` reads from token shards `paths` (plain sequences), by its rules and
/// with its errors (a file lacking the labels the others have is named, carried columns need
/// one scalar type across the files): the labels column and whether it is a loss mask.
pub fn input_columns(
    paths: &[PathBuf],
    tokens: &str,
    labels: &LabelSource,
    carry: &[String],
) -> Result<Option<(String, bool)>> {
    let sources = open_all(paths)?;
    let columns = resolve_columns(&sources, tokens, labels, None, carry)?;
    Ok(columns
        .labels
        .map(|(name, role)| (name, matches!(role, Role::LossMask))))
}

pub(crate) fn open_all(paths: &[PathBuf]) -> Result<Vec<Source>> {
    if paths.is_empty() {
        return Err(CoreError::Config("no input files given".into()));
    }
    paths.iter().map(|p| Source::open(p)).collect()
}
