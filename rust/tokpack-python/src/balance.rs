//! `partition` and `micro_batches` of `tokpack.balance`: numpy in, flat numpy arrays out (the
//! Python package cuts them into parts), the GIL released while Rust works.

use crate::errors::to_py;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use tokpack_core::balance::{self, CostModel, MicroBatchConfig};
use tokpack_core::policy::PartitionMethod;

/// `(indices, offsets)`: part `p` is `indices[offsets[p]:offsets[p + 1]]`.
type Flat<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>);

/// Splits items by their float64 `costs` into `k` balanced parts (see `tokpack.balance`).
#[pyfunction]
#[pyo3(signature = (*, costs, k, equal_size, method, threads))]
pub fn partition<'py>(
    py: Python<'py>,
    costs: PyReadonlyArray1<'py, f64>,
    k: usize,
    equal_size: bool,
    method: &str,
    threads: Option<usize>,
) -> PyResult<Flat<'py>> {
    let method: PartitionMethod = method.parse().map_err(to_py)?;
    // Accepted so that callers may pass it as elsewhere: partition runs on the calling thread.
    let _ = threads;
    let costs = costs.as_slice()?;
    let parts = py
        .detach(|| balance::partition(costs, k, equal_size, method))
        .map_err(to_py)?;
    let mut offsets = Vec::with_capacity(parts.len() + 1);
    offsets.push(0i64);
    let mut indices = Vec::with_capacity(costs.len());
    for part in &parts {
        indices.extend(part.iter().map(|&i| i64::from(i)));
        offsets.push(indices.len() as i64);
    }
    Ok((indices.into_pyarray(py), offsets.into_pyarray(py)))
}

/// The flat arrays of a micro-batch plan (see `tokpack.balance.MicroBatchPlan`).
#[pyclass(frozen, get_all, module = "tokpack._tokpack")]
pub struct MicroBatchParts {
    indices: Py<PyArray1<i64>>,
    mb_offsets: Py<PyArray1<i64>>,
    rank_offsets: Py<PyArray1<i64>>,
    mb_tokens: Py<PyArray1<i64>>,
    mb_compute: Py<PyArray1<f64>>,
}

/// Micro-batches of at most `max_tokens` tokens of int64 `lengths`, balanced over `dp_size` ranks.
#[pyfunction]
#[pyo3(signature = (*, lengths, max_tokens, dp_size, a, b, same_count, min_micro_batches,
    divisible_by, order, overlong))]
#[allow(clippy::too_many_arguments)]
pub fn micro_batches(
    py: Python<'_>,
    lengths: PyReadonlyArray1<'_, i64>,
    max_tokens: u64,
    dp_size: usize,
    a: f64,
    b: f64,
    same_count: bool,
    min_micro_batches: usize,
    divisible_by: usize,
    order: &str,
    overlong: &str,
) -> PyResult<MicroBatchParts> {
    let config = MicroBatchConfig {
        max_tokens,
        dp_size,
        cost: CostModel::new(a, b).map_err(to_py)?,
        same_count,
        min_micro_batches,
        divisible_by,
        order: order.parse().map_err(to_py)?,
        over_cap: overlong.parse().map_err(to_py)?,
    };
    let lengths = lengths.as_slice()?;
    let plan = py
        .detach(|| balance::micro_batches(lengths, &config))
        .map_err(to_py)?;
    Ok(MicroBatchParts {
        indices: plan.indices.into_pyarray(py).unbind(),
        mb_offsets: plan.mb_offsets.into_pyarray(py).unbind(),
        rank_offsets: plan.rank_offsets.into_pyarray(py).unbind(),
        mb_tokens: plan.mb_tokens.into_pyarray(py).unbind(),
        mb_compute: plan.mb_compute.into_pyarray(py).unbind(),
    })
}
