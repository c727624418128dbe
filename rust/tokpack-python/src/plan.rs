//! `plan` and `pack_flat`: numpy arrays in, numpy arrays out, the GIL released while Rust works.

use crate::errors::to_py;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tokpack_core::io::columns::{check_flat, Role};
use tokpack_core::{materialize, pool, FlatColumn, Plan, PlanConfig};

fn plan_tuple<'py>(py: Python<'py>, plan: Plan) -> PyResult<Bound<'py, PyTuple>> {
    let n_samples = plan.n_samples;
    let input_tokens = plan.input_tokens;
    let max_len = plan.max_len;
    (
        plan.bin_offsets.into_pyarray(py),
        plan.sample_ids.into_pyarray(py),
        plan.starts.into_pyarray(py),
        plan.lengths.into_pyarray(py),
        plan.dropped.into_pyarray(py),
        plan.empty.into_pyarray(py),
        plan.truncated.into_pyarray(py),
        plan.split.into_pyarray(py),
        n_samples,
        input_tokens,
        max_len,
    )
        .into_pyobject(py)
}

/// Plans the packing of `lengths` (a contiguous int32 or int64 numpy array).
#[pyfunction]
#[pyo3(signature = (lengths, max_len, strategy, overlong, seed, threads=None))]
pub fn plan<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    max_len: i64,
    strategy: &str,
    overlong: &str,
    seed: u64,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyTuple>> {
    let config = PlanConfig::new(max_len, strategy, overlong, seed).map_err(to_py)?;
    let result = if let Ok(arr) = lengths.extract::<PyReadonlyArray1<i64>>() {
        let slice = arr.as_slice()?;
        py.detach(|| pool::install(threads, || tokpack_core::plan(slice, &config)))
    } else {
        let arr = lengths.extract::<PyReadonlyArray1<i32>>()?;
        let slice = arr.as_slice()?;
        py.detach(|| pool::install(threads, || tokpack_core::plan(slice, &config)))
    };
    plan_tuple(py, result.map_err(to_py)?)
}

type PackOutput = (Plan, tokpack_core::PackedRows);

/// Plans from the token column's lengths and copies tokens (and labels) into packed rows.
/// Returns `(plan_tuple, tokens, labels|None, row_offsets)`.
#[pyfunction]
#[pyo3(signature = (values, offsets, label_values, label_offsets, max_len, strategy, overlong, seed, threads=None))]
#[allow(clippy::too_many_arguments)]
pub fn pack_flat<'py>(
    py: Python<'py>,
    values: PyReadonlyArray1<'py, i32>,
    offsets: PyReadonlyArray1<'py, i64>,
    label_values: Option<PyReadonlyArray1<'py, i32>>,
    label_offsets: Option<PyReadonlyArray1<'py, i64>>,
    max_len: i64,
    strategy: &str,
    overlong: &str,
    seed: u64,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyTuple>> {
    let config = PlanConfig::new(max_len, strategy, overlong, seed).map_err(to_py)?;
    let tokens = FlatColumn {
        values: values.as_slice()?,
        offsets: offsets.as_slice()?,
    };
    let labels = match (&label_values, &label_offsets) {
        (Some(v), Some(o)) => Some(FlatColumn {
            values: v.as_slice()?,
            offsets: o.as_slice()?,
        }),
        _ => None,
    };
    let result: tokpack_core::Result<PackOutput> = py.detach(|| {
        pool::install(threads, || {
            tokens.validate("input_ids")?;
            check_flat(tokens.values, tokens.offsets, "input_ids", Role::Tokens)?;
            if let Some(l) = &labels {
                l.validate("labels")?;
                tokpack_core::check_labels_aligned(&tokens, l)?;
                check_flat(l.values, l.offsets, "labels", Role::Labels)?;
            }
            let plan = tokpack_core::plan(&tokens.lengths(), &config)?;
            let rows = materialize(&plan, &tokens, labels.as_ref());
            Ok((plan, rows))
        })
    });
    let (plan, rows) = result.map_err(to_py)?;
    let labels_out: Option<Bound<'py, PyArray1<i32>>> = rows.labels.map(|l| l.into_pyarray(py));
    (
        plan_tuple(py, plan)?,
        rows.tokens.into_pyarray(py),
        labels_out,
        rows.row_offsets.into_pyarray(py),
    )
        .into_pyobject(py)
}

/// Threads used when `threads=None`: `TOKPACK_NUM_THREADS`, else all cores.
#[pyfunction]
pub fn default_threads() -> PyResult<usize> {
    pool::default_threads().map_err(to_py)
}
