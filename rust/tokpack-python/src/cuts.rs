//! The safe-cut rule the multimodal tokenizer shares with the packer (`tokpack_core::cuts`).

use crate::errors::to_py;
use pyo3::prelude::*;
use tokpack_core::cuts;
use tokpack_core::policy::{check_range, Overlong, MAX_LEN};
use tokpack_core::CoreError;

/// `(start, end)` of the pieces a sample of `length > max_len` tokens keeps under `overlong`
/// (`"truncate"` or `"split"`), never cut inside one of `blocks` (`(start, end)` spans); `[]`
/// when it has no safe cut (it is dropped).
#[pyfunction]
#[pyo3(signature = (*, length, max_len, overlong, blocks))]
pub fn safe_pieces(
    length: i64,
    max_len: i64,
    overlong: &str,
    blocks: Vec<(i64, i64)>,
) -> PyResult<Vec<(i64, i64)>> {
    let whole = match overlong.parse::<Overlong>().map_err(to_py)? {
        Overlong::Split => true,
        Overlong::Truncate => false,
        other => {
            return Err(to_py(CoreError::Config(format!(
                "safe_pieces: overlong {:?} keeps no piece (\"truncate\" or \"split\")",
                other.name()
            ))))
        }
    };
    check_range("max_len", max_len.into(), 1, MAX_LEN).map_err(to_py)?;
    Ok(cuts::safe_pieces(length, max_len, whole, &blocks))
}
