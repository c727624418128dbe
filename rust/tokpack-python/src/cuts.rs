//! Chosen cuts and blocks as Python passes them (`tokpack_core::cuts`), and the safe-cut rule
//! the multimodal tokenizer shares with the packer (`safe_pieces`).

use crate::errors::to_py;
use pyo3::prelude::*;
use tokpack_core::cuts::{self, Blocks};
use tokpack_core::policy::{check_range, Overlong, MAX_LEN};
use tokpack_core::{CoreError, Cuts};

/// `(samples, offsets, starts, lengths)` of chosen cuts, or `(samples, offsets, starts, ends)`
/// of blocks, as Python passes them.
pub type CutsArg = (Vec<i64>, Vec<usize>, Vec<i64>, Vec<i64>);

/// The core's cuts of `cuts` with `blocks` (None without either).
pub fn cuts_of(cuts: Option<CutsArg>, blocks: Option<CutsArg>) -> PyResult<Option<Cuts>> {
    if cuts.is_none() && blocks.is_none() {
        return Ok(None);
    }
    let (samples, offsets, starts, lengths) =
        cuts.unwrap_or_else(|| (vec![], vec![0], vec![], vec![]));
    let mut out = Cuts::new(samples, offsets, starts, lengths).map_err(to_py)?;
    if let Some((samples, offsets, starts, ends)) = blocks {
        out = out.with_blocks(Blocks::new(samples, offsets, starts, ends).map_err(to_py)?);
    }
    Ok(Some(out))
}

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
