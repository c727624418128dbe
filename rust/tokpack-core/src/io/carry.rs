//! Carried columns: scalar per-sample input columns (a KTO label, a source name, a weight, a
//! score) written to the packed rows as list columns with one entry per segment, the sample's
//! value repeated for each of its segments, in the input's type.

use super::columns::BatchAt;
use super::source::Source;
use crate::cuts::Cuts;
use crate::error::{Context, CoreError, Location, Result};
use arrow::array::{Array, ArrayRef, UInt64Array};
use arrow::datatypes::DataType;
use std::sync::Arc;

/// A carried column: its name and one value per sample: `values[s]` is sample `s`'s, or with
/// `ids` (the held samples of a `tokpack.ray` shard task, ascending) `values[i]` is `ids[i]`'s.
pub struct Carried {
    pub name: String,
    pub values: ArrayRef,
    pub ids: Option<Vec<i64>>,
    /// Values of the chosen pieces of some samples ([`crate::cuts`]): a segment that is piece
    /// `k` of `cuts` takes `values[base + k]`, not its sample's value.
    pub pieces: Option<PieceValues>,
}

/// Where the per-piece values of a carried column are (see [`Carried::pieces`]).
pub struct PieceValues {
    pub cuts: Arc<Cuts>,
    pub base: usize,
}

/// A carried column of one value per sample (`values`), and with `piece_values` (one per piece
/// of `cuts`, the column's type) for the chosen pieces.
pub fn with_pieces(
    name: &str,
    values: ArrayRef,
    cuts: Option<&Arc<Cuts>>,
    piece_values: Option<&ArrayRef>,
) -> Result<Carried> {
    let (values, pieces) = match (cuts, piece_values) {
        (Some(cuts), Some(p)) => {
            if p.len() != cuts.starts.len() || p.data_type() != values.data_type() {
                return Err(CoreError::Config(format!(
                    "cuts: {} values of type {} for carried column {name:?}, expected {} of type \
                     {}",
                    p.len(),
                    p.data_type(),
                    cuts.starts.len(),
                    values.data_type()
                )));
            }
            let base = values.len();
            let all = concat(&[values, p.clone()], p.data_type())?;
            let pieces = PieceValues {
                cuts: Arc::clone(cuts),
                base,
            };
            (all, Some(pieces))
        }
        _ => (values, None),
    };
    Ok(Carried {
        name: name.to_string(),
        values,
        ids: None,
        pieces,
    })
}

/// A carried column holds one scalar per sample (the error at `at` otherwise).
fn check_scalar(t: &DataType, at: Location) -> Result<()> {
    let scalar = t.is_integer()
        || matches!(
            t,
            DataType::Boolean
                | DataType::Float32
                | DataType::Float64
                | DataType::Utf8
                | DataType::LargeUtf8
        );
    if scalar {
        return Ok(());
    }
    Err(CoreError::schema(
        at,
        format!(
            "cannot carry a column of type {t}: carried columns hold one bool, integer, float \
             or string per sample"
        ),
    ))
}

/// Every input has each carried column, with one scalar type across the files; returns the
/// types in the order of `columns`.
pub fn carried_types(sources: &[Source], columns: &[String]) -> Result<Vec<DataType>> {
    let mut types = Vec::with_capacity(columns.len());
    for column in columns {
        let mut first: Option<DataType> = None;
        for s in sources {
            let idx = s.column_indices(&[column.as_str()])?[0];
            let t = s.schema.field(idx).data_type();
            let at = Location::file(&s.path).column(column);
            check_scalar(t, at.clone())?;
            match &first {
                Some(f) if f != t => {
                    return Err(CoreError::schema(
                        at,
                        format!(
                            "has type {t}, the first input has {f}: a carried column must have \
                             one type across the inputs"
                        ),
                    ))
                }
                Some(_) => {}
                None => first = Some(t.clone()),
            }
        }
        types.push(first.unwrap_or(DataType::Null));
    }
    Ok(types)
}

/// An in-memory column to carry (a `tokpack.ray` block's), checked as a file's: a scalar type
/// and no null (errors name the row and column).
pub fn check_carried_in_memory(array: &ArrayRef, column: &str) -> Result<()> {
    check_scalar(array.data_type(), Location::default().column(column))?;
    carried_values(array, column, &BatchAt::IN_MEMORY).map(|_| ())
}

/// A batch's values of a carried column, which must hold no null (its row named otherwise).
pub fn carried_values(array: &ArrayRef, column: &str, loc: &BatchAt) -> Result<ArrayRef> {
    if array.null_count() > 0 {
        let row = (0..array.len()).find(|&i| array.is_null(i)).unwrap_or(0);
        return Err(loc.data(row, column, "is null; carried columns must have a value"));
    }
    Ok(array.clone())
}

/// Chunks of one column in sample order, as one array.
pub fn concat(chunks: &[ArrayRef], data_type: &DataType) -> Result<ArrayRef> {
    if chunks.is_empty() {
        return Ok(arrow::array::new_empty_array(data_type));
    }
    let refs: Vec<&dyn Array> = chunks.iter().map(|a| a.as_ref()).collect();
    arrow::compute::concat(&refs).corrupt(&Location::default(), "cannot gather a carried column")
}

/// The values of the segments of samples `samples` starting at `starts` (one per segment).
pub fn per_segment(
    carried: &Carried,
    samples: &[i64],
    starts: &[i64],
    dir: &std::path::Path,
) -> Result<ArrayRef> {
    let indices = match (&carried.ids, &carried.pieces) {
        (None, None) => UInt64Array::from_iter_values(samples.iter().map(|&s| s as u64)),
        (_, Some(p)) => samples
            .iter()
            .zip(starts)
            .map(|(&s, &start)| match p.cuts.pieces_of(s) {
                None => Ok(s as u64),
                Some(_) => p
                    .cuts
                    .piece_at(s, start)
                    .map(|k| (p.base + k) as u64)
                    .ok_or_else(|| {
                        CoreError::data(format!("sample {s} has no chosen piece at {start}"))
                    }),
            })
            .collect::<Result<UInt64Array>>()?,
        (Some(ids), None) => samples
            .iter()
            .map(|s| {
                ids.binary_search(s)
                    .map(|i| i as u64)
                    .map_err(|_| CoreError::data(format!("sample {s} was not sent to this shard")))
            })
            .collect::<Result<UInt64Array>>()?,
    };
    arrow::compute::take(carried.values.as_ref(), &indices, None).output(dir)
}
