//! Files on disk: `pack_files`, `read_lengths` and the shared reader primitive `read_row_group`.
//! Rust work runs with the GIL released; progress is polled through a `Progress` object.

use crate::config::{PyPackConfig, PyPackReport};
use crate::errors::{detached, to_py};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::Arc;
use tokpack_core::io;
use tokpack_core::io::columns::list_parts;

/// Progress counters of a running `pack_files` / `read_lengths`, and its cancel switch.
#[pyclass(frozen, module = "tokpack._tokpack")]
pub struct Progress(Arc<io::Progress>);

#[pymethods]
impl Progress {
    #[new]
    fn new() -> Self {
        Self(Arc::new(io::Progress::new()))
    }

    /// `(phase, done, total, samples_read)`; phase is "starting", "reading", "planning",
    /// "writing" or "done".
    fn snapshot(&self) -> (&'static str, u64, u64, u64) {
        let (phase, done, total, samples) = self.0.snapshot();
        (phase.name(), done, total, samples)
    }

    /// Asks the running work to stop; it then raises KeyboardInterrupt.
    fn cancel(&self) {
        self.0.cancel();
    }
}

fn progress_of(p: Option<&Bound<'_, Progress>>) -> Arc<io::Progress> {
    p.map_or_else(|| Arc::new(io::Progress::new()), |p| Arc::clone(&p.get().0))
}

/// The columns `pack_files` would read from the token shards `paths` with `config` (a config
/// `for_kind` of the inputs; its rules, its errors): `(labels column, is a loss mask)`, or None
/// without labels.
#[pyfunction]
#[pyo3(signature = (*, paths, config))]
pub fn input_columns(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    config: &PyPackConfig,
) -> PyResult<Option<(String, bool)>> {
    let c = config.0.clone();
    py.detach(|| io::input_columns(&paths, &c.tokens_column, &c.labels(), &c.carry))
        .map_err(to_py)
}

/// Packs token shards of `kind` (`"sft"`, ...: the samples' kind, `tokpack.kinds`) into
/// `out_dir` as `config` says (a config `for_kind` of the inputs); returns the job's report.
/// Multimodal samples are cut only at safe blocks, planned once in the core.
#[pyfunction]
#[pyo3(signature = (*, paths, out_dir, spill_dir, config, batch_rows, threads=None, progress=None, kind="sft"))]
#[allow(clippy::too_many_arguments)]
pub fn pack_files(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    out_dir: PathBuf,
    spill_dir: PathBuf,
    config: &PyPackConfig,
    batch_rows: usize,
    threads: Option<usize>,
    progress: Option<&Bound<'_, Progress>>,
    kind: &str,
) -> PyResult<PyPackReport> {
    let job = io::PackFilesConfig {
        paths,
        out_dir,
        spill_dir,
        config: config.0.clone(),
        batch_rows,
        kind: kind.parse().map_err(to_py)?,
    };
    let progress = progress_of(progress);
    let outcome = detached(py, threads, || io::pack_files(&job, &progress))?;
    Ok(PyPackReport(outcome.into()))
}

/// `(offset, length, checksum)` of a byte range, as Python passes it.
type RangeArg = (u64, u64, String);

fn byte_range((offset, length, checksum): RangeArg) -> io::ByteRange {
    io::ByteRange {
        offset,
        length,
        checksum,
    }
}

/// `xxh3_128:<hex>` of `data` (a byte range fetched from object storage, checked against the
/// manifest before it is cached).
#[pyfunction]
pub fn bytes_checksum(py: Python<'_>, data: &[u8]) -> String {
    py.detach(|| io::bytes_checksum(data))
}

/// Size and `xxh3_128:<hex>` checksum of a whole file (the manifest's shard checksum).
#[pyfunction]
pub fn file_checksum(py: Python<'_>, path: PathBuf) -> PyResult<(u64, String)> {
    py.detach(|| io::file_checksum(&path)).map_err(to_py)
}

/// Size and content fingerprint of a file, as `pack_files` takes it while reading an input
/// (the cache key's fingerprint of an input file).
#[pyfunction]
pub fn file_fingerprint(py: Python<'_>, path: PathBuf) -> PyResult<(u64, String)> {
    py.detach(|| io::file_fingerprint(&path)).map_err(to_py)
}

/// Lengths (int64) of the token column across `paths` (with `pair_layout`: the footprints of
/// preference pairs in that layout), and the rows of each file.
#[pyfunction]
#[pyo3(signature = (*, paths, tokens_column, batch_rows, pair_layout=None, threads=None, progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn read_lengths<'py>(
    py: Python<'py>,
    paths: Vec<PathBuf>,
    tokens_column: String,
    batch_rows: usize,
    pair_layout: Option<&str>,
    threads: Option<usize>,
    progress: Option<&Bound<'py, Progress>>,
) -> PyResult<(Bound<'py, PyArray1<i64>>, Vec<u64>)> {
    let pairs = pair_layout
        .map(str::parse::<io::PairLayout>)
        .transpose()
        .map_err(to_py)?;
    let progress = progress_of(progress);
    let (lengths, rows) = detached(py, threads, || {
        io::read_lengths(&paths, &tokens_column, pairs, batch_rows, &progress)
    })?;
    Ok((lengths.into_pyarray(py), rows))
}

macro_rules! primitive_to_numpy {
    ($py:expr, $array:expr, $($dt:ident => $ty:ident),*) => {
        match $array.data_type() {
            $(arrow::datatypes::DataType::$dt => Some(
                $array
                    .as_primitive::<arrow::datatypes::$ty>()
                    .values()
                    .to_vec()
                    .into_pyarray($py)
                    .into_any(),
            ),)*
            _ => None,
        }
    };
}

fn string_objects<'a>(
    py: Python<'_>,
    values: impl Iterator<Item = Option<&'a str>>,
) -> Vec<Py<PyAny>> {
    values
        .map(|v| {
            pyo3::types::PyString::new(py, v.unwrap_or_default())
                .into_any()
                .unbind()
        })
        .collect()
}

fn to_numpy<'py>(
    py: Python<'py>,
    array: &arrow::array::ArrayRef,
    what: &str,
) -> PyResult<Bound<'py, PyAny>> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::DataType::{LargeUtf8, Utf8};
    if array.null_count() > 0 {
        return Err(crate::errors::DataError::new_err(format!(
            "{what} holds nulls"
        )));
    }
    let out = primitive_to_numpy!(py, array,
        Int8 => Int8Type, Int16 => Int16Type, Int32 => Int32Type, Int64 => Int64Type,
        UInt8 => UInt8Type, UInt16 => UInt16Type, UInt32 => UInt32Type, UInt64 => UInt64Type,
        Float32 => Float32Type, Float64 => Float64Type);
    match out {
        Some(a) => Ok(a),
        None if *array.data_type() == arrow::datatypes::DataType::Boolean => {
            let values: Vec<bool> = array.as_boolean().values().iter().collect();
            Ok(values.into_pyarray(py).into_any())
        }
        // Strings (carried columns) as an object array of str.
        None if matches!(array.data_type(), Utf8 | LargeUtf8) => {
            let strings: Vec<Py<PyAny>> = match array.data_type() {
                Utf8 => string_objects(py, array.as_string::<i32>().iter()),
                _ => string_objects(py, array.as_string::<i64>().iter()),
            };
            Ok(PyArray1::from_vec(py, strings).into_any())
        }
        None => Err(crate::errors::SchemaError::new_err(format!(
            "{what} has type {}, which read_row_group does not convert",
            array.data_type()
        ))),
    }
}

/// One Parquet row group (or Arrow IPC record batch) of `path` as numpy arrays: list columns
/// give `(values, offsets)` with int64 offsets starting at 0, other columns an array.
/// With `check = (file size, footer range, row group range)`, ranges as `(offset, length,
/// checksum)` from the manifest, the bytes are checked before they are decoded (packed shards).
#[pyfunction]
#[pyo3(signature = (*, path, row_group, columns, check=None))]
pub fn read_row_group<'py>(
    py: Python<'py>,
    path: PathBuf,
    row_group: usize,
    columns: Vec<String>,
    check: Option<(u64, RangeArg, RangeArg)>,
) -> PyResult<Bound<'py, PyDict>> {
    use arrow::array::Array;
    let names: Vec<&str> = columns.iter().map(String::as_str).collect();
    let check = check.map(|(size, footer, group)| io::GroupCheck {
        size,
        footer: byte_range(footer),
        group: byte_range(group),
    });
    let batch = py
        .detach(|| match &check {
            Some(check) => io::read_checked_row_group(&path, row_group, &names, check),
            None => io::read_row_group(&path, row_group, &names),
        })
        .map_err(to_py)?;
    let out = PyDict::new(py);
    for (name, array) in columns.iter().zip(batch.columns()) {
        let what = format!("{}, row group {row_group}, column {name:?}", path.display());
        let Some((offsets, values)) = list_parts(array) else {
            out.set_item(name, to_numpy(py, array, &what)?)?;
            continue;
        };
        if array.null_count() > 0 {
            return Err(crate::errors::DataError::new_err(format!(
                "{what} holds null lists"
            )));
        }
        let values = to_numpy(py, &values, &what)?;
        out.set_item(name, (values, offsets.into_pyarray(py)))?;
    }
    Ok(out)
}
