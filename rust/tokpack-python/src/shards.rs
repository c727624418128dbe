//! `write_held_shard`: one packed shard from the samples a `tokpack.ray` shard task holds, with
//! the writer of `pack_files` (identical bytes for the same plan rows).

use crate::arrow_in::Chunks;
use crate::errors::to_py;
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::PathBuf;
use tokpack_core::io::carry::Carried;
use tokpack_core::io::{self, HeldSamples, ShardInfo};
use tokpack_core::Plan;

fn byte_range_dict<'py>(py: Python<'py>, r: &io::ByteRange) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("offset", r.offset)?;
    d.set_item("length", r.length)?;
    d.set_item("checksum", &r.checksum)?;
    Ok(d)
}

/// A shard's manifest entry, as `pack_files` reports it.
pub fn shard_dict<'py>(py: Python<'py>, s: &ShardInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("file", &s.file)?;
    d.set_item("index", &s.index)?;
    d.set_item("rows", s.rows)?;
    d.set_item("row_groups", s.row_groups)?;
    d.set_item("tokens", s.tokens)?;
    d.set_item("loss_tokens", s.loss_tokens)?;
    d.set_item("size", s.size)?;
    d.set_item("checksum", &s.checksum)?;
    let groups = PyList::empty(py);
    for r in &s.row_group_bytes {
        groups.append(byte_range_dict(py, r)?)?;
    }
    d.set_item("row_group_bytes", groups)?;
    d.set_item("footer_bytes", byte_range_dict(py, &s.footer_bytes)?)?;
    d.set_item("index_size", s.index_size)?;
    d.set_item("index_checksum", &s.index_checksum)?;
    Ok(d)
}

/// Writes shard `shard` into `out_dir`: plan rows given as CSR arrays (`bin_offsets` from 0,
/// global `sample_ids`), tokens gathered from the held samples `ids` (ascending) with
/// `offsets` into `tokens` / `labels`, and `carried`: `(name, Arrow array)` with one value per
/// held sample. Returns the shard's manifest entry.
#[pyfunction]
#[pyo3(signature = (*, out_dir, shard, max_len, bin_offsets, sample_ids, starts, lengths, ids,
    offsets, tokens, labels, row_group_rows, compression, carried=Vec::new()))]
#[allow(clippy::too_many_arguments)]
pub fn write_held_shard<'py>(
    py: Python<'py>,
    out_dir: PathBuf,
    shard: usize,
    max_len: u32,
    bin_offsets: PyReadonlyArray1<'py, i64>,
    sample_ids: PyReadonlyArray1<'py, i64>,
    starts: PyReadonlyArray1<'py, i64>,
    lengths: PyReadonlyArray1<'py, i64>,
    ids: PyReadonlyArray1<'py, i64>,
    offsets: PyReadonlyArray1<'py, i64>,
    tokens: PyReadonlyArray1<'py, i32>,
    labels: Option<PyReadonlyArray1<'py, i32>>,
    row_group_rows: usize,
    compression: &str,
    carried: Vec<(String, Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyDict>> {
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
    let rows = Plan {
        max_len,
        bin_offsets: bin_offsets.as_slice()?.to_vec(),
        sample_ids: sample_ids.as_slice()?.to_vec(),
        starts: starts.as_slice()?.to_vec(),
        lengths: lengths.as_slice()?.to_vec(),
        dropped: Vec::new(),
        empty: Vec::new(),
        truncated: Vec::new(),
        split: Vec::new(),
        n_samples: 0,
        input_tokens: 0,
    };
    let samples = HeldSamples {
        ids: ids.as_slice()?,
        offsets: offsets.as_slice()?,
        tokens: tokens.as_slice()?,
        labels: labels.as_ref().map(|l| l.as_slice()).transpose()?,
    };
    let compression = io::parse_compression(compression).map_err(to_py)?;
    let info = py
        .detach(|| {
            io::write_held_shard(
                &out_dir,
                shard,
                &rows,
                &samples,
                &carried,
                row_group_rows,
                compression,
            )
        })
        .map_err(to_py)?;
    shard_dict(py, &info)
}
