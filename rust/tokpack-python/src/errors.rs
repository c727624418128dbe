//! Core errors to Python exceptions. The classes live in `tokpack/errors.py` so users can import
//! and catch them; each error kind has its own class under `tokpack.TokpackError`.

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::PyErr;
use tokpack_core::CoreError;

pyo3::import_exception!(tokpack.errors, ConfigError);
pyo3::import_exception!(tokpack.errors, OverlongError);
pyo3::import_exception!(tokpack.errors, DataError);
pyo3::import_exception!(tokpack.errors, InputNotFoundError);
pyo3::import_exception!(tokpack.errors, CorruptInputError);
pyo3::import_exception!(tokpack.errors, SchemaError);
pyo3::import_exception!(tokpack.errors, OutputError);

pub fn to_py(err: CoreError) -> PyErr {
    let message = err.to_string();
    match err {
        CoreError::Config(_) => ConfigError::new_err(message),
        CoreError::Overlong { .. } | CoreError::OverlongAt(_) => OverlongError::new_err(message),
        CoreError::Data(_) => DataError::new_err(message),
        CoreError::InputNotFound(_) => InputNotFoundError::new_err(message),
        CoreError::CorruptInput(_) => CorruptInputError::new_err(message),
        CoreError::Schema(_) => SchemaError::new_err(message),
        CoreError::Output(_) => OutputError::new_err(message),
        CoreError::Cancelled => PyKeyboardInterrupt::new_err(message),
    }
}
