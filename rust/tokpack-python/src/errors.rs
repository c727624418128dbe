//! Core errors to Python exceptions. The classes live in `tokpack/errors.py` so users can import
//! and catch them; each error kind has its own class under `tokpack.TokpackError`.

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::types::PyAnyMethods;
use pyo3::{PyErr, PyResult, Python};
use std::io::ErrorKind;
use tokpack_core::{pool, CoreError};

pyo3::import_exception!(tokpack.errors, ConfigError);
pyo3::import_exception!(tokpack.errors, OverlongError);
pyo3::import_exception!(tokpack.errors, DataError);
pyo3::import_exception!(tokpack.errors, InputNotFoundError);
pyo3::import_exception!(tokpack.errors, InputPermissionError);
pyo3::import_exception!(tokpack.errors, InputReadError);
pyo3::import_exception!(tokpack.errors, CorruptInputError);
pyo3::import_exception!(tokpack.errors, SchemaError);
pyo3::import_exception!(tokpack.errors, OutputError);

pub fn to_py(err: CoreError) -> PyErr {
    let message = err.to_string();
    match err {
        CoreError::Config(_) => ConfigError::new_err(message),
        CoreError::Overlong {
            index,
            length,
            max_len,
            ..
        } => overlong(message, index, length, max_len),
        CoreError::OverCap { .. } => OverlongError::new_err(message),
        CoreError::Data { .. } => DataError::new_err(message),
        CoreError::Unreadable { source, .. } => match source.kind() {
            ErrorKind::NotFound | ErrorKind::NotADirectory => InputNotFoundError::new_err(message),
            ErrorKind::PermissionDenied => InputPermissionError::new_err(message),
            _ => InputReadError::new_err(message),
        },
        CoreError::CorruptInput { .. } => CorruptInputError::new_err(message),
        CoreError::Schema { .. } => SchemaError::new_err(message),
        CoreError::Output { .. } => OutputError::new_err(message),
        CoreError::Cancelled => PyKeyboardInterrupt::new_err(message),
    }
}

/// A bad argument the binding finds itself, as the core's config errors are raised.
pub fn config_error(what: impl Into<String>) -> PyErr {
    to_py(CoreError::Config(what.into()))
}

/// An OverlongError with the sample's `index`, `length` and `max_len` as attributes (a one-step
/// pack names the raw record of the staged row `index`).
fn overlong(message: String, index: usize, length: i64, max_len: u32) -> PyErr {
    let err = OverlongError::new_err(message);
    Python::attach(|py| {
        let value = err.value(py);
        let set = [
            ("index", index as i64),
            ("length", length),
            ("max_len", max_len.into()),
        ]
        .into_iter()
        .try_for_each(|(name, v)| value.setattr(name, v));
        set.map_or_else(|e| e, |()| err.clone_ref(py))
    })
}

/// Runs `f` with the GIL released on a pool of `threads` threads (`pool::install`); its error
/// as the Python exception of its kind.
pub fn detached<R: Send>(
    py: Python<'_>,
    threads: Option<usize>,
    f: impl FnOnce() -> tokpack_core::Result<R> + Send,
) -> PyResult<R> {
    py.detach(|| pool::install(threads, f)).map_err(to_py)
}
