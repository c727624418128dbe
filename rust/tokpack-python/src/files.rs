//! Files on disk: `pack_files`, `read_lengths` and the shared reader primitive `read_row_group`.
//! Rust work runs with the GIL released; progress is polled through a `Progress` object.

use crate::errors::to_py;
use crate::shards::shard_dict;
use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::Arc;
use tokpack_core::io::columns::list_parts;
use tokpack_core::io::{self, LabelSource, PackFilesConfig};
use tokpack_core::{pool, PlanConfig};

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

fn label_source(
    labels_column: Option<String>,
    labels_required: bool,
    loss_mask_column: Option<String>,
) -> LabelSource {
    match (loss_mask_column, labels_column) {
        (Some(mask), _) => LabelSource::LossMask(mask),
        (None, Some(column)) => LabelSource::Labels {
            column,
            required: labels_required,
        },
        (None, None) => LabelSource::None,
    }
}

/// The columns `pack_files` would read from the token shards `paths` (its rules, its errors):
/// `(labels column, is a loss mask)`, or None without labels.
#[pyfunction]
#[pyo3(signature = (*, paths, tokens_column, labels_column, labels_required, loss_mask_column,
    carry=Vec::new()))]
pub fn input_columns(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    tokens_column: String,
    labels_column: Option<String>,
    labels_required: bool,
    loss_mask_column: Option<String>,
    carry: Vec<String>,
) -> PyResult<Option<(String, bool)>> {
    let labels = label_source(labels_column, labels_required, loss_mask_column);
    py.detach(|| io::input_columns(&paths, &tokens_column, &labels, &carry))
        .map_err(to_py)
}

/// Packs token shards into `out_dir`; returns a dict of the outcome. With `pair_layout`
/// ("separate" or "shared-prompt") the inputs are preference token shards packed pair by pair;
/// `carry` names scalar per-sample columns written as per-segment list columns.
#[pyfunction]
#[pyo3(signature = (*, paths, out_dir, spill_dir, tokens_column, labels_column, labels_required,
    loss_mask_column, max_len, strategy, overlong, seed, rows_per_shard, row_group_rows,
    compression, batch_rows, pair_layout=None, carry=Vec::new(), threads=None, progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn pack_files<'py>(
    py: Python<'py>,
    paths: Vec<PathBuf>,
    out_dir: PathBuf,
    spill_dir: PathBuf,
    tokens_column: String,
    labels_column: Option<String>,
    labels_required: bool,
    loss_mask_column: Option<String>,
    max_len: i64,
    strategy: &str,
    overlong: &str,
    seed: u64,
    rows_per_shard: usize,
    row_group_rows: usize,
    compression: &str,
    batch_rows: usize,
    pair_layout: Option<&str>,
    carry: Vec<String>,
    threads: Option<usize>,
    progress: Option<&Bound<'py, Progress>>,
) -> PyResult<Bound<'py, PyDict>> {
    let labels = label_source(labels_column, labels_required, loss_mask_column);
    let config = PackFilesConfig {
        paths,
        out_dir,
        spill_dir,
        tokens_column,
        labels,
        pairs: pair_layout
            .map(str::parse::<io::PairLayout>)
            .transpose()
            .map_err(to_py)?,
        carry,
        plan: PlanConfig::new(max_len, strategy, overlong, seed).map_err(to_py)?,
        rows_per_shard,
        row_group_rows,
        compression: io::parse_compression(compression).map_err(to_py)?,
        batch_rows,
    };
    let progress = progress_of(progress);
    let outcome = py
        .detach(|| pool::install(threads, || io::pack_files(&config, &progress)))
        .map_err(to_py)?;
    let plan = &outcome.plan;
    let out = PyDict::new(py);
    out.set_item("input_rows", outcome.input_rows.clone())?;
    out.set_item("has_labels", outcome.has_labels)?;
    out.set_item("n_samples", plan.n_samples)?;
    out.set_item("rows", plan.n_bins())?;
    out.set_item("segments", plan.sample_ids.len())?;
    out.set_item("tokens", plan.total_tokens())?;
    out.set_item("input_tokens", plan.input_tokens)?;
    out.set_item("lower_bound", plan.lower_bound())?;
    out.set_item("efficiency", plan.efficiency())?;
    out.set_item("max_len", plan.max_len)?;
    out.set_item("dropped", plan.dropped.clone().into_pyarray(py))?;
    out.set_item("empty", plan.empty.clone().into_pyarray(py))?;
    out.set_item("truncated", plan.truncated.clone().into_pyarray(py))?;
    out.set_item("split", plan.split.clone().into_pyarray(py))?;
    let shards: PyResult<Vec<_>> = outcome.shards.iter().map(|s| shard_dict(py, s)).collect();
    out.set_item("shards", shards?)?;
    Ok(out)
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

/// Size and `xxh3_128:<hex>` checksum of a whole file (the manifest's shard checksum).
#[pyfunction]
pub fn file_checksum(py: Python<'_>, path: PathBuf) -> PyResult<(u64, String)> {
    py.detach(|| io::file_checksum(&path)).map_err(to_py)
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
    let (lengths, rows) = py
        .detach(|| {
            pool::install(threads, || {
                io::read_lengths(&paths, &tokens_column, pairs, batch_rows, &progress)
            })
        })
        .map_err(to_py)?;
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
            let b = array.as_boolean();
            Ok((0..b.len())
                .map(|i| b.value(i))
                .collect::<Vec<bool>>()
                .into_pyarray(py)
                .into_any())
        }
        // Strings (carried columns) as an object array of str.
        None if matches!(array.data_type(), Utf8 | LargeUtf8) => {
            let strings: Vec<Py<PyAny>> = match array.data_type() {
                Utf8 => string_objects(py, array.as_string::<i32>().iter()),
                _ => string_objects(py, array.as_string::<i64>().iter()),
            };
            Ok(PyArray1::from_vec(py, strings).into_any())
        }
        None => Err(PyTypeError::new_err(format!(
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
