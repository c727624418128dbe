//! In-memory Arrow data from Python through the Arrow PyCapsule interface
//! (`__arrow_c_stream__` / `__arrow_c_array__`): pyarrow, polars, duckdb, nanoarrow, ...
//! without importing any of them, and without copying the buffers.

use crate::errors::{config_error, SchemaError};
use arrow::array::{make_array, new_empty_array, Array, ArrayReader, ArrayRef, AsArray};
use arrow::datatypes::DataType;
use arrow::error::ArrowError;
use arrow::ffi::{from_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use arrow::ffi_stream::{ArrayStreamReader, FFI_ArrowArrayStream};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::CStr;

/// An imported object: its chunks, all of one type.
pub struct Chunks {
    data_type: DataType,
    arrays: Vec<ArrayRef>,
}

fn arrow_err(e: ArrowError) -> PyErr {
    crate::errors::DataError::new_err(format!("reading Arrow data: {e}"))
}

/// The struct a capsule holds, checked by the name the protocol gives it.
fn capsule_ptr<T>(capsule: &Bound<'_, PyAny>, name: &CStr) -> PyResult<*mut T> {
    let capsule = capsule.cast::<PyCapsule>()?;
    Ok(capsule.pointer_checked(Some(name))?.as_ptr().cast())
}

impl Chunks {
    /// Imports an object with `__arrow_c_stream__` (tables, chunked arrays, data frames, ...)
    /// or `__arrow_c_array__` (arrays, record batches).
    pub fn import(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if obj.hasattr("__arrow_c_stream__")? {
            let capsule = obj.call_method0("__arrow_c_stream__")?;
            let raw = capsule_ptr::<FFI_ArrowArrayStream>(&capsule, c"arrow_array_stream")?;
            // SAFETY: the capsule, alive until the end of this block, holds a C stream (checked
            // by name); from_raw moves it out and leaves a released one for its destructor.
            let reader = unsafe { ArrayStreamReader::from_raw(raw) }.map_err(arrow_err)?;
            let data_type = reader.field().data_type().clone();
            let arrays = reader.collect::<Result<_, _>>().map_err(arrow_err)?;
            return Ok(Self { data_type, arrays });
        }
        if obj.hasattr("__arrow_c_array__")? {
            let (schema, array): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                obj.call_method0("__arrow_c_array__")?.extract()?;
            let schema = capsule_ptr::<FFI_ArrowSchema>(&schema, c"arrow_schema")?;
            let array = capsule_ptr::<FFI_ArrowArray>(&array, c"arrow_array")?;
            // SAFETY: as above, for the C data interface's schema and array.
            let data = unsafe {
                let schema = FFI_ArrowSchema::from_raw(schema);
                from_ffi(FFI_ArrowArray::from_raw(array), &schema)
            }
            .map_err(arrow_err)?;
            let array = make_array(data);
            return Ok(Self {
                data_type: array.data_type().clone(),
                arrays: vec![array],
            });
        }
        Err(config_error(format!(
            "{} is not Arrow data (no __arrow_c_stream__ or __arrow_c_array__)",
            obj.get_type().name()?
        )))
    }

    /// Column `name` of a table (a struct); None when the data is no table or has no such
    /// column.
    pub fn field(&self, name: &str) -> PyResult<Option<ArrayRef>> {
        let DataType::Struct(fields) = &self.data_type else {
            return Ok(None);
        };
        let Some((i, field)) = fields.find(name) else {
            return Ok(None);
        };
        let column = |a: &ArrayRef| a.as_struct().column(i).clone();
        let arrays: Vec<ArrayRef> = self.arrays.iter().map(column).collect();
        joined(field.data_type(), &arrays).map(Some)
    }

    /// The data as one array, or the column `name` of a table, which must have it.
    pub fn column(&self, name: &str) -> PyResult<ArrayRef> {
        if !matches!(self.data_type, DataType::Struct(_)) {
            return joined(&self.data_type, &self.arrays);
        }
        self.field(name)?
            .ok_or_else(|| SchemaError::new_err(format!("the table has no column {name:?}")))
    }
}

/// Chunks of one type as one array (copied only when there are several).
fn joined(data_type: &DataType, arrays: &[ArrayRef]) -> PyResult<ArrayRef> {
    Ok(match arrays {
        [] => new_empty_array(data_type),
        [one] => one.clone(),
        many => {
            let refs: Vec<&dyn Array> = many.iter().map(AsRef::as_ref).collect();
            arrow::compute::concat(&refs).map_err(arrow_err)?
        }
    })
}
