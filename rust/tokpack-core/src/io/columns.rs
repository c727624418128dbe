//! Arrow list columns to flat int32 values with offsets, checking every value so bad input is
//! reported with its file, unit, row and column instead of producing a wrong packing.

use crate::error::{CoreError, Location, Result};
use crate::policy::IGNORE_INDEX;
use arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
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

impl Role {
    fn expected(self) -> &'static str {
        match self {
            Role::Tokens | Role::Labels => {
                "list or large_list of integers (int32, int64, uint32, ...)"
            }
            Role::LossMask => "list or large_list of 0/1 integers or booleans",
        }
    }
}

/// Where a batch came from, for error messages: its unit, and the row of its first row there.
pub struct BatchAt<'a> {
    pub unit: &'a Location,
    pub row_base: u64,
}

impl BatchAt<'_> {
    fn at(&self, row: usize, column: &str) -> Location {
        Location {
            row: Some(self.row_base + row as u64),
            column: Some(column.to_string()),
            ..self.unit.clone()
        }
    }

    fn data(&self, row: usize, column: &str, what: impl Into<String>) -> CoreError {
        CoreError::Data {
            at: Box::new(self.at(row, column)),
            what: what.into(),
        }
    }
}

fn is_integer(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
    )
}

/// Checks a column's type before any data is read; `file` names the file in the error.
pub fn check_type(file: &Location, column: &str, data_type: &DataType, role: Role) -> Result<()> {
    let child = match data_type {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    };
    let ok =
        child.is_some_and(|c| is_integer(c) || (role == Role::LossMask && *c == DataType::Boolean));
    if ok {
        Ok(())
    } else {
        Err(wrong_type(file, column, "type", data_type, role))
    }
}

/// A list column of one batch, flattened: row `i` is `values[offsets[i]..offsets[i+1]]`.
pub struct Flat {
    pub values: Vec<i32>,
    pub offsets: Vec<i64>,
}

/// Flattens and checks one list column of a batch.
pub fn flatten(array: &ArrayRef, column: &str, role: Role, loc: &BatchAt) -> Result<Flat> {
    let (offsets, child): (Vec<i64>, &ArrayRef) = match array.data_type() {
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            (
                l.value_offsets().iter().map(|&o| i64::from(o)).collect(),
                l.values(),
            )
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            (l.value_offsets().to_vec(), l.values())
        }
        other => return Err(wrong_type(loc.unit, column, "type", other, role)),
    };
    if array.null_count() > 0 {
        let row = (0..array.len()).find(|&i| array.is_null(i)).unwrap_or(0);
        return Err(loc.data(row, column, "the list is null"));
    }
    let (start, end) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
    let row_of = |k: usize| -> usize {
        // First row whose end is past flat position `start + k`.
        offsets
            .partition_point(|&o| o as usize <= start + k)
            .saturating_sub(1)
    };
    if child.null_count() > 0 {
        if let Some(k) = (start..end).position(|i| child.is_null(i)) {
            return Err(loc.data(row_of(k), column, "holds a null value"));
        }
    }
    let values = match child.data_type() {
        DataType::Boolean if role == Role::LossMask => {
            let b = child.as_boolean();
            Ok((start..end).map(|i| i32::from(b.value(i))).collect())
        }
        DataType::Int8 => convert::<Int8Type>(child, start, end),
        DataType::Int16 => convert::<Int16Type>(child, start, end),
        DataType::Int32 => Ok(child.as_primitive::<Int32Type>().values()[start..end].to_vec()),
        DataType::Int64 => convert::<Int64Type>(child, start, end),
        DataType::UInt8 => convert::<UInt8Type>(child, start, end),
        DataType::UInt16 => convert::<UInt16Type>(child, start, end),
        DataType::UInt32 => convert::<UInt32Type>(child, start, end),
        DataType::UInt64 => convert::<UInt64Type>(child, start, end),
        other => return Err(wrong_type(loc.unit, column, "values of type", other, role)),
    }
    .map_err(|(k, v)| loc.data(row_of(k), column, out_of_range(role, &v)))?;
    check_values(&values, role).map_err(|k| {
        loc.data(
            row_of(k),
            column,
            out_of_range(role, &values[k].to_string()),
        )
    })?;
    let base = offsets[0];
    let offsets = offsets.iter().map(|&o| o - base).collect();
    Ok(Flat { values, offsets })
}

/// Checks the values of an in-memory column (`pack_tokens`) with the same rule as files: the
/// error names the column and row of the first bad value.
/// `offsets` must be valid over `values` (values outside them, e.g. of a sliced array, are
/// not looked at).
pub fn check_flat(values: &[i32], offsets: &[i64], column: &str, role: Role) -> Result<()> {
    let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else {
        return Ok(());
    };
    let used = &values[first as usize..last as usize];
    check_values(used, role).map_err(|k| {
        let at = first + k as i64;
        let row = offsets.partition_point(|&o| o <= at).saturating_sub(1);
        let what = out_of_range(role, &used[k].to_string());
        CoreError::data(format!("column {column:?}, row {row}: {what}"))
    })
}

/// The column (of the file or unit at `at`) has an unsupported type.
fn wrong_type(at: &Location, column: &str, what: &str, found: &DataType, role: Role) -> CoreError {
    let expected = role.expected();
    CoreError::Schema {
        at: Box::new(at.clone()),
        what: format!("column {column:?} has {what} {found}; expected a {expected}"),
    }
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
    start: usize,
    end: usize,
) -> std::result::Result<Vec<i32>, (usize, String)> {
    let a: &PrimitiveArray<T> = child.as_primitive::<T>();
    let raw = &a.values()[start..end];
    let mut out = Vec::with_capacity(raw.len());
    for (k, &v) in raw.iter().enumerate() {
        match v.to_i64().and_then(|x| i32::try_from(x).ok()) {
            Some(x) => out.push(x),
            None => return Err((k, format!("{v:?}"))),
        }
    }
    Ok(out)
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
pub fn labels_from_mask(tokens: &[i32], mask: &[i32]) -> Vec<i32> {
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
