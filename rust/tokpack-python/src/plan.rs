//! `plan` and `pack_tokens`: arrays in, a `PlanParts` (numpy arrays moved out of Rust without
//! copying, and the plan's figures) out, the GIL released while Rust works.

use crate::arrow_in::Chunks;
use crate::config::PyPackConfig;
use crate::errors::{detached, to_py};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use tokpack_core::format::col;
use tokpack_core::io::carry::check_carried_in_memory;
use tokpack_core::io::columns::{flatten_in_memory, Flat, Role};
use tokpack_core::{materialize, pool, CoreError, Plan, PlanConfig};

/// A plan as the Python `tokpack.Plan` is built from it, by name.
#[pyclass(frozen, get_all, module = "tokpack._tokpack")]
pub struct PlanParts {
    bin_offsets: Py<PyArray1<i64>>,
    sample_ids: Py<PyArray1<i64>>,
    starts: Py<PyArray1<i64>>,
    lengths: Py<PyArray1<i64>>,
    dropped: Py<PyArray1<i64>>,
    empty: Py<PyArray1<i64>>,
    truncated: Py<PyArray1<i64>>,
    split: Py<PyArray1<i64>>,
    n_samples: usize,
    input_tokens: u64,
    max_len: u32,
    strategy: String,
    row_order: String,
    total_tokens: u64,
    lower_bound: u64,
    efficiency: f64,
}

impl PlanParts {
    fn new(py: Python<'_>, plan: Plan, config: &PlanConfig) -> Self {
        Self {
            total_tokens: plan.total_tokens(),
            lower_bound: plan.lower_bound(),
            efficiency: plan.efficiency(),
            n_samples: plan.n_samples,
            input_tokens: plan.input_tokens,
            max_len: plan.max_len,
            strategy: config.strategy.name().to_owned(),
            row_order: config.row_order.name().to_owned(),
            bin_offsets: plan.bin_offsets.into_pyarray(py).unbind(),
            sample_ids: plan.sample_ids.into_pyarray(py).unbind(),
            starts: plan.starts.into_pyarray(py).unbind(),
            lengths: plan.lengths.into_pyarray(py).unbind(),
            dropped: plan.dropped.into_pyarray(py).unbind(),
            empty: plan.empty.into_pyarray(py).unbind(),
            truncated: plan.truncated.into_pyarray(py).unbind(),
            split: plan.split.into_pyarray(py).unbind(),
        }
    }
}

/// Plans the packing of `lengths` (a contiguous int32 or int64 numpy array, read in place)
/// with `config`'s plan options.
#[pyfunction]
#[pyo3(signature = (*, lengths, config, threads))]
pub fn plan(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    config: &PyPackConfig,
    threads: Option<usize>,
) -> PyResult<PlanParts> {
    let config = config.0.plan;
    let plan = if let Ok(arr) = lengths.extract::<PyReadonlyArray1<i64>>() {
        let slice = arr.as_slice()?;
        detached(py, threads, || tokpack_core::plan(slice, &config))?
    } else {
        let arr = lengths.extract::<PyReadonlyArray1<i32>>()?;
        let slice = arr.as_slice()?;
        detached(py, threads, || tokpack_core::plan(slice, &config))?
    };
    Ok(PlanParts::new(py, plan, &config))
}

/// Packed rows: row `r` is `tokens[row_offsets[r]:row_offsets[r + 1]]` (and of `labels`).
#[pyclass(frozen, get_all, module = "tokpack._tokpack")]
pub struct PackedRows {
    plan: Py<PlanParts>,
    tokens: Py<PyArray1<i32>>,
    labels: Option<Py<PyArray1<i32>>>,
    row_offsets: Py<PyArray1<i64>>,
}

/// Packs in-memory Arrow data: `input_ids` (and `labels`) are list columns, or tables whose
/// `input_ids` (and `labels`, when present) columns are used. Both are checked by the rules of
/// `pack_files`, then planned from the tokens' lengths and copied into packed rows.
#[pyfunction]
#[pyo3(signature = (*, input_ids, labels, config, threads))]
pub fn pack_tokens(
    py: Python<'_>,
    input_ids: &Bound<'_, PyAny>,
    labels: Option<&Bound<'_, PyAny>>,
    config: &PyPackConfig,
    threads: Option<usize>,
) -> PyResult<PackedRows> {
    let config = config.0.plan;
    let input = Chunks::import(input_ids)?;
    let tokens = input.column(col::INPUT_IDS)?;
    let labels = match labels {
        Some(labels) => Some(Chunks::import(labels)?.column(col::LABELS)?),
        None => input.field(col::LABELS)?,
    };
    let (plan, rows) = detached(py, threads, || {
        let labels = labels.as_ref().map(|l| (l, col::LABELS, Role::Labels));
        let (tokens, labels) = flatten_in_memory((&tokens, col::INPUT_IDS), labels)?;
        let labels = labels.as_ref().map(Flat::column);
        let plan = tokpack_core::plan(&tokens.column().lengths(), &config)?;
        let rows = materialize(&plan, &tokens.column(), labels.as_ref());
        Ok((plan, rows))
    })?;
    Ok(PackedRows {
        plan: Py::new(py, PlanParts::new(py, plan, &config))?,
        tokens: rows.tokens.into_pyarray(py).unbind(),
        labels: rows.labels.map(|l| l.into_pyarray(py).unbind()),
        row_offsets: rows.row_offsets.into_pyarray(py).unbind(),
    })
}

/// The samples of in-memory Arrow data (a table's `tokens_column`, and `labels_column` or
/// `mask_column`), checked by the rules of `pack_files`: flat int32 tokens, int64 offsets from
/// 0, and int32 labels (from the loss mask when given one) or None. The `carry` columns are
/// checked as `pack_files` checks carried columns (a scalar type, no null).
#[pyfunction]
#[pyo3(signature = (*, table, tokens_column, labels_column, mask_column, carry=Vec::new()))]
pub fn flatten_samples<'py>(
    py: Python<'py>,
    table: &Bound<'py, PyAny>,
    tokens_column: &str,
    labels_column: Option<&str>,
    mask_column: Option<&str>,
    carry: Vec<String>,
) -> PyResult<FlatSamples<'py>> {
    let input = Chunks::import(table)?;
    for name in &carry {
        check_carried_in_memory(&input.column(name)?, name).map_err(to_py)?;
    }
    let tokens = input.column(tokens_column)?;
    let labels = match (labels_column, mask_column) {
        (Some(name), None) => Some((input.column(name)?, name, Role::Labels)),
        (None, Some(name)) => Some((input.column(name)?, name, Role::LossMask)),
        (None, None) => None,
        (Some(_), Some(_)) => {
            return Err(to_py(CoreError::Config(
                "give labels_column or mask_column, not both".into(),
            )))
        }
    };
    let result = py.detach(|| {
        let labels = labels.as_ref().map(|(a, name, role)| (a, *name, *role));
        flatten_in_memory((&tokens, tokens_column), labels)
    });
    let (tokens, labels) = result.map_err(to_py)?;
    Ok((
        tokens.values.to_vec().into_pyarray(py),
        tokens.offsets.into_pyarray(py),
        labels.map(|l| l.values.to_vec().into_pyarray(py)),
    ))
}

type FlatSamples<'py> = (
    Bound<'py, PyArray1<i32>>,
    Bound<'py, PyArray1<i64>>,
    Option<Bound<'py, PyArray1<i32>>>,
);

/// Threads used when `threads=None`: `TOKPACK_NUM_THREADS`, else all cores.
#[pyfunction]
pub fn default_threads() -> PyResult<usize> {
    pool::default_threads().map_err(to_py)
}
