//! Core errors to Python exceptions. The classes live in `tokpack/errors.py` so users can import
//! and catch them; each error kind has its own class under `tokpack.TokpackError`.

use pyo3::PyErr;
use tokpack_core::CoreError;

pyo3::import_exception!(tokpack.errors, ConfigError);
pyo3::import_exception!(tokpack.errors, OverlongError);
pyo3::import_exception!(tokpack.errors, DataError);

pub fn to_py(err: CoreError) -> PyErr {
    let message = err.to_string();
    match err {
        CoreError::Config(_) => ConfigError::new_err(message),
        CoreError::Overlong { .. } => OverlongError::new_err(message),
        CoreError::Data(_) => DataError::new_err(message),
    }
}
