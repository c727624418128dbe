//! The core's serde structs (reports, manifest entries) as Python data (through `pythonize`:
//! dicts in field order, lists, ints and floats as they are in Rust, strings, None) and back,
//! checked through `serde_json::Value`, whose errors name the field and type that do not fit.

use crate::errors::config_error;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::{Map, Number, Value};

/// `value` as Python data.
pub fn to_python<'py>(py: Python<'py>, value: &impl Serialize) -> PyResult<Bound<'py, PyAny>> {
    pythonize::pythonize(py, value).map_err(|e| config_error(e.to_string()))
}

/// Python data (numpy arrays and scalars too, by their `tolist()`) as a `T`; a ConfigError
/// names what does not fit.
pub fn from_python<T: DeserializeOwned>(value: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
    let value = py_to_value(value, what)?;
    serde_json::from_value(value).map_err(|e| config_error(format!("{what}: {e}")))
}

fn py_to_value(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return match (obj.extract::<i64>(), obj.extract::<u64>()) {
            (Ok(i), _) => Ok(i.into()),
            (_, Ok(u)) => Ok(u.into()),
            _ => Err(config_error(format!(
                "{what}: {} is out of range",
                obj.repr()?
            ))),
        };
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        let n = Number::from_f64(f.value());
        return n
            .map(Value::Number)
            .ok_or_else(|| config_error(format!("{what}: {} is not a finite number", f.value())));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_cow()?.into_owned()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                let what = format!("{what}: keys must be strings, got {}", k.repr()?);
                return Err(config_error(what));
            };
            map.insert(key.to_cow()?.into_owned(), py_to_value(&v, what)?);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let items: PyResult<Vec<_>> = obj.try_iter()?.map(|v| py_to_value(&v?, what)).collect();
        return Ok(Value::Array(items?));
    }
    match obj.getattr("tolist") {
        Ok(tolist) => py_to_value(&tolist.call0()?, what),
        Err(_) => Err(config_error(format!(
            "{what}: {} is not plain data",
            obj.get_type().name()?
        ))),
    }
}
