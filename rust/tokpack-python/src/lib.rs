//! The thin pyo3 layer over tokpack-core: conversions, error mapping, GIL release.
//! The public API, docstrings and defaults live in the Python package (`python/tokpack`).

mod arrow_in;
mod bpe;
mod errors;
mod files;
mod plan;

use pyo3::prelude::*;

#[pymodule]
fn _tokpack(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_THREADS", tokpack_core::pool::MAX_THREADS)?;
    m.add_function(wrap_pyfunction!(plan::plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan::pack_tokens, m)?)?;
    m.add_class::<plan::PlanParts>()?;
    m.add_class::<plan::PackedRows>()?;
    m.add_function(wrap_pyfunction!(plan::default_threads, m)?)?;
    m.add_class::<bpe::BpeEncoder>()?;
    m.add_class::<files::Progress>()?;
    m.add_function(wrap_pyfunction!(files::pack_files, m)?)?;
    m.add_function(wrap_pyfunction!(files::read_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(files::read_row_group, m)?)?;
    m.add_function(wrap_pyfunction!(files::file_checksum, m)?)?;
    Ok(())
}
