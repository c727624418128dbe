//! Arrow list columns to flat int32 values with offsets, checking every value so bad input is
//! reported with its file, unit, row and column instead of producing a wrong packing.

use crate::error::{CoreError, Location, Result};
use crate::materialize::FlatColumn;
use crate::policy::IGNORE_INDEX;
use arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{
    ArrowNativeType, ArrowPrimitiveType, DataType, Int16Type, Int32Type, Int64Type, Int8Type,
    UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};

/// What a column holds, which decides the accepted values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Token ids: 0..=i32::MAX.
    Tokens,
    /// Labels: -100 (not trained on) or a token id.
    Labels,
    /// Loss mask: 0 or 1 (or booleans).
    LossMask,
}

/// Where a batch came from, for error messages: its unit, and the row of its first row there.
pub struct BatchAt<'a> {
    pub unit: &'a Location,
    pub row_base: u64,
}

impl BatchAt<'static> {
    /// In-memory data (`pack_tokens`, the blocks of `tokpack.ray`): no file or unit, so errors
    /// name the row and column only.
    pub const IN_MEMORY: Self = BatchAt {
        unit: &Location {
            file: None,
            unit: None,
            row: None,
            column: None,
        },
        row_base: 0,
    };
}

impl BatchAt<'_> {
    /// Invalid data in row `row` of this batch, column `column`.
    pub(crate) fn data(&self, row: usize, column: &str, what: impl Into<String>) -> CoreError {
        let at = Location {
            row: Some(self.row_base + row as u64),
            ..self.unit.clone()
        };
        CoreError::Data {
            at: Box::new(at.column(column)),
            what: what.into(),
        }
    }
}

/// Checks a column's type before any data is read; `file` names the file in the error.
pub fn check_type(file: &Location, column: &str, data_type: &DataType, role: Role) -> Result<()> {
    let child = match data_type {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    };
    let ok = child
        .is_some_and(|c| c.is_integer() || (role == Role::LossMask && *c == DataType::Boolean));
    if ok {
        Ok(())
    } else {
        Err(wrong_type(file, column, "type", data_type, role))
    }
}

/// Checks that a per-sample column (a prompt length) holds integers.
pub fn check_scalar_int(file: &Location, column: &str, data_type: &DataType) -> Result<()> {
    if data_type.is_integer() {
        Ok(())
    } else {
        let what = format!("column {column:?} has type {data_type}; expected an integer");
        Err(CoreError::schema(file.clone(), what))
    }
}

/// A list column of one batch, flattened: row `i` is `values[offsets[i]..offsets[i+1]]`.
/// int32 values are the batch's own buffer, not a copy.
pub struct Flat {
    pub values: ScalarBuffer<i32>,
    pub offsets: Vec<i64>,
}

impl Flat {
    pub fn column(&self) -> FlatColumn<'_> {
        FlatColumn {
            values: &self.values,
            offsets: &self.offsets,
        }
    }
}

/// A list array as offsets from 0 and the values they index (the child sliced to the rows'
/// span, so a sliced array's outside values are never looked at); None for other types.
pub fn list_parts(array: &ArrayRef) -> Option<(Vec<i64>, ArrayRef)> {
    let (offsets, child): (Vec<i64>, &ArrayRef) = match array.data_type() {
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            let offsets = l.value_offsets().iter().map(|&o| i64::from(o)).collect();
            (offsets, l.values())
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            (l.value_offsets().to_vec(), l.values())
        }
        _ => return None,
    };
    let (start, end) = (offsets[0], offsets[offsets.len() - 1]);
    let values = child.slice(start as usize, (end - start) as usize);
    Some((offsets.iter().map(|&o| o - start).collect(), values))
}

/// Flattens and checks one list column of a batch.
pub fn flatten(array: &ArrayRef, column: &str, role: Role, loc: &BatchAt) -> Result<Flat> {
    let Some((offsets, child)) = list_parts(array) else {
        return Err(wrong_type(
            loc.unit,
            column,
            "type",
            array.data_type(),
            role,
        ));
    };
    if array.null_count() > 0 {
        let row = (0..array.len()).find(|&i| array.is_null(i)).unwrap_or(0);
        return Err(loc.data(row, column, "the list is null"));
    }
    // The row holding flat position `k`: the last one starting at or before it.
    let row_of = |k: usize| {
        offsets
            .partition_point(|&o| o as usize <= k)
            .saturating_sub(1)
    };
    if child.null_count() > 0 {
        if let Some(k) = (0..child.len()).position(|i| child.is_null(i)) {
            return Err(loc.data(row_of(k), column, "holds a null value"));
        }
    }
    let bad = |k: usize, v: &str| loc.data(row_of(k), column, out_of_range(role, v));
    let values = match child.data_type() {
        DataType::Boolean if role == Role::LossMask => {
            Ok(child.as_boolean().values().iter().map(i32::from).collect())
        }
        DataType::Int8 => convert::<Int8Type>(&child),
        DataType::Int16 => convert::<Int16Type>(&child),
        DataType::Int32 => Ok(child.as_primitive::<Int32Type>().values().clone()),
        DataType::Int64 => convert::<Int64Type>(&child),
        DataType::UInt8 => convert::<UInt8Type>(&child),
        DataType::UInt16 => convert::<UInt16Type>(&child),
        DataType::UInt32 => convert::<UInt32Type>(&child),
        DataType::UInt64 => convert::<UInt64Type>(&child),
        other => return Err(wrong_type(loc.unit, column, "values of type", other, role)),
    }
    .map_err(|(k, v)| bad(k, &v))?;
    check_values(&values, role).map_err(|k| bad(k, &values[k].to_string()))?;
    Ok(Flat { values, offsets })
}

/// The column (of the file or unit at `at`) has an unsupported type.
fn wrong_type(at: &Location, column: &str, what: &str, found: &DataType, role: Role) -> CoreError {
    let expected = match role {
        Role::Tokens | Role::Labels => "list or large_list of integers (int32, int64, uint32, ...)",
        Role::LossMask => "list or large_list of 0/1 integers or booleans",
    };
    let what = format!("column {column:?} has {what} {found}; expected a {expected}");
    CoreError::schema(at.clone(), what)
}

fn out_of_range(role: Role, value: &str) -> String {
    match role {
        Role::Tokens => format!("token id {value} is out of range (0..={})", i32::MAX),
        Role::Labels => format!(
            "label {value} is neither {IGNORE_INDEX} nor a token id (0..={})",
            i32::MAX
        ),
        Role::LossMask => format!("loss mask value {value} is not 0 or 1"),
    }
}

/// Values as i32; `Err((position, value))` for the first one that does not fit.
fn convert<T: ArrowPrimitiveType>(
    child: &ArrayRef,
) -> std::result::Result<ScalarBuffer<i32>, (usize, String)> {
    let a: &PrimitiveArray<T> = child.as_primitive::<T>();
    let raw = a.values();
    let mut out = Vec::with_capacity(raw.len());
    for (k, &v) in raw.iter().enumerate() {
        match v.to_i64().and_then(|x| i32::try_from(x).ok()) {
            Some(x) => out.push(x),
            None => return Err((k, format!("{v:?}"))),
        }
    }
    Ok(out.into())
}

/// Position of the first value not allowed for `role`.
fn check_values(values: &[i32], role: Role) -> std::result::Result<(), usize> {
    let bad = |v: i32| match role {
        Role::Tokens => v < 0,
        Role::Labels => v < 0 && v != IGNORE_INDEX,
        Role::LossMask => v != 0 && v != 1,
    };
    // A vectorisable scan first; the position is searched only when something is wrong.
    let suspicious = match role {
        Role::Tokens | Role::Labels => values.iter().copied().min().is_some_and(|m| m < 0),
        Role::LossMask => values.iter().any(|&v| v as u32 > 1),
    };
    if suspicious {
        if let Some(k) = values.iter().position(|&v| bad(v)) {
            return Err(k);
        }
    }
    Ok(())
}

/// Labels from a 0/1 loss mask: the token where the mask is 1, -100 elsewhere.
pub fn labels_from_mask(tokens: &[i32], mask: &[i32]) -> ScalarBuffer<i32> {
    tokens
        .iter()
        .zip(mask)
        .map(|(&t, &m)| if m == 1 { t } else { IGNORE_INDEX })
        .collect()
}

/// Checks that a labels / mask column has as many entries as tokens in every row.
pub fn check_aligned(tokens: &Flat, other: &Flat, column: &str, loc: &BatchAt) -> Result<()> {
    for row in 0..tokens.offsets.len() - 1 {
        let t = tokens.offsets[row + 1] - tokens.offsets[row];
        let o = other.offsets[row + 1] - other.offsets[row];
        if t != o {
            return Err(loc.data(
                row,
                column,
                format!("has {o} entries but the tokens have {t}"),
            ));
        }
    }
    Ok(())
}

/// Tokens and labels of in-memory data (`pack_tokens`, the blocks of `tokpack.ray`), flattened
/// and checked by the same rules as a file's batches (errors name the row and column: there is
/// no file or unit). `labels` is `(array, column name, Role::Labels or Role::LossMask)`; a loss
/// mask becomes labels.
pub fn flatten_in_memory(
    tokens: (&ArrayRef, &str),
    labels: Option<(&ArrayRef, &str, Role)>,
) -> Result<(Flat, Option<Flat>)> {
    flatten_sequence(tokens, labels, &BatchAt::IN_MEMORY)
}

/// Flattens and checks a sequence's tokens and its labels or loss mask (as many rows, as many
/// entries in each row as tokens); a loss mask becomes labels.
pub fn flatten_sequence(
    tokens: (&ArrayRef, &str),
    labels: Option<(&ArrayRef, &str, Role)>,
    loc: &BatchAt,
) -> Result<(Flat, Option<Flat>)> {
    let flat = flatten(tokens.0, tokens.1, Role::Tokens, loc)?;
    let Some((labels, name, role)) = labels else {
        return Ok((flat, None));
    };
    if labels.len() != tokens.0.len() {
        return Err(CoreError::data(format!(
            "{name} have {} rows but {} have {}",
            labels.len(),
            tokens.1,
            tokens.0.len()
        )));
    }
    let mut other = flatten(labels, name, role, loc)?;
    check_aligned(&flat, &other, name, loc)?;
    if role == Role::LossMask {
        other.values = labels_from_mask(&flat.values, &other.values);
    }
    Ok((flat, Some(other)))
}
