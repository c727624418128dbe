//! `write_held_shard`: one packed shard from the samples a `tokpack.ray` shard task holds, with
//! the writer of `pack_files` (identical bytes for the same plan rows).

use crate::arrow_in::Chunks;
use crate::config::PyPackConfig;
use crate::errors::to_py;
use crate::pydata::to_python;
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use std::path::PathBuf;
use tokpack_core::io::carry::Carried;
use tokpack_core::io::{self, HeldSamples};
use tokpack_core::Plan;

/// Writes shard `shard` into `out_dir`: plan rows given as CSR arrays (`bin_offsets` from 0,
/// global `sample_ids`), tokens gathered from the held samples `ids` (ascending) with
/// `offsets` into `tokens` / `labels`, and `carried`: `(name, Arrow array)` with one value per
/// held sample, in `config`'s row groups and compression. Returns the shard's manifest entry.
#[pyfunction]
#[pyo3(signature = (*, out_dir, shard, config, bin_offsets, sample_ids, starts, lengths, ids,
    offsets, tokens, labels, carried=Vec::new()))]
#[allow(clippy::too_many_arguments)]
pub fn write_held_shard<'py>(
    py: Python<'py>,
    out_dir: PathBuf,
    shard: usize,
    config: &PyPackConfig,
    bin_offsets: PyReadonlyArray1<'py, i64>,
    sample_ids: PyReadonlyArray1<'py, i64>,
    starts: PyReadonlyArray1<'py, i64>,
    lengths: PyReadonlyArray1<'py, i64>,
    ids: PyReadonlyArray1<'py, i64>,
    offsets: PyReadonlyArray1<'py, i64>,
    tokens: PyReadonlyArray1<'py, i32>,
    labels: Option<PyReadonlyArray1<'py, i32>>,
    carried: Vec<(String, Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyAny>> {
    let carried = carried
        .iter()
        .map(|(name, values)| {
            Ok(Carried {
                name: name.clone(),
                values: Chunks::import(values)?.column(name)?,
                ids: Some(ids.as_slice()?.to_vec()),
                pieces: None,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let config = &config.0;
    let rows = Plan {
        max_len: config.plan.max_len,
        bin_offsets: bin_offsets.as_slice()?.to_vec(),
        sample_ids: sample_ids.as_slice()?.to_vec(),
        starts: starts.as_slice()?.to_vec(),
        lengths: lengths.as_slice()?.to_vec(),
        ..Plan::default()
    };
    let samples = HeldSamples {
        ids: ids.as_slice()?,
        offsets: offsets.as_slice()?,
        tokens: tokens.as_slice()?,
        labels: labels.as_ref().map(|l| l.as_slice()).transpose()?,
    };
    let compression = io::parse_compression(&config.compression).map_err(to_py)?;
    let info = py
        .detach(|| {
            io::write_held_shard(
                &out_dir,
                shard,
                &rows,
                &samples,
                &carried,
                config.row_group_rows,
                compression,
            )
        })
        .map_err(to_py)?;
    to_python(py, &info)
}
