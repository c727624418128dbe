//! `BpeEncoder`: the core's byte-level BPE encoder, batch calls with the GIL released.

use crate::errors::{config_error, detached, ConfigError};
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use tokpack_core::bpe::{self, BpeTokenizer, EncodedBatch, LoadError};

/// A byte-level BPE tokenizer loaded from `tokenizer.json` text.
#[pyclass(frozen, module = "tokpack._tokpack")]
pub struct BpeEncoder(pub(crate) BpeTokenizer);

/// An encoded batch as numpy arrays: `(ids, labels, offsets, fallback)` (see
/// [`BpeEncoder::encode_batch`]).
pub(crate) type Batch<'py> = (
    Bound<'py, PyArray1<i32>>,
    Bound<'py, PyArray1<i32>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
);

pub(crate) fn batch_to_py(py: Python<'_>, out: EncodedBatch) -> Batch<'_> {
    (
        out.ids.into_pyarray(py),
        out.labels.into_pyarray(py),
        out.offsets.into_pyarray(py),
        out.fallback.into_pyarray(py),
    )
}

#[pymethods]
impl BpeEncoder {
    /// `(encoder, None)`, or `(None, reason)` when the tokenizer is valid but not one this
    /// encoder reproduces exactly. Raises ConfigError when the text is not a tokenizer file.
    #[staticmethod]
    fn load(py: Python<'_>, json: &str) -> PyResult<(Option<Self>, Option<String>)> {
        match py.detach(|| BpeTokenizer::from_json(json)) {
            Ok(tok) => Ok((Some(Self(tok)), None)),
            Err(LoadError::Unsupported(why)) => Ok((None, Some(why))),
            Err(err @ LoadError::Invalid(_)) => Err(ConfigError::new_err(err.to_string())),
        }
    }

    /// Whether `add_special_tokens=True` would add tokens (the post-processor's template).
    #[getter]
    fn post_processor_adds_tokens(&self) -> bool {
        self.0.post_processor_adds_tokens
    }

    /// The ids of one text (`add_special_tokens=False`); None for text this encoder leaves to
    /// `tokenizers` (not in NFC, for a tokenizer that normalizes to NFC).
    fn encode(&self, py: Python<'_>, text: &str) -> Option<Vec<u32>> {
        py.detach(|| self.0.encode(text))
    }

    /// Encodes `texts`; text `i` is trained on the character spans
    /// `zip(span_starts, span_ends)[span_offsets[i]:span_offsets[i + 1]]`.
    /// Returns `(ids, labels, offsets, fallback)` flat numpy arrays; the texts listed in
    /// `fallback` have no tokens (encode them with `tokenizers`).
    #[pyo3(signature = (*, texts, span_offsets, span_starts, span_ends, threads=None))]
    fn encode_batch<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        span_offsets: PyReadonlyArray1<'py, i64>,
        span_starts: PyReadonlyArray1<'py, i64>,
        span_ends: PyReadonlyArray1<'py, i64>,
        threads: Option<usize>,
    ) -> PyResult<Batch<'py>> {
        let offsets = span_offsets.as_slice()?;
        let (starts, ends) = (span_starts.as_slice()?, span_ends.as_slice()?);
        if offsets.len() != texts.len() + 1 || starts.len() != ends.len() {
            return Err(config_error("span arrays do not match the texts"));
        }
        let n_spans = starts.len() as i64;
        if offsets[0] != 0
            || offsets[texts.len()] != n_spans
            || offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(config_error("span_offsets must rise from 0 to len(spans)"));
        }
        let spans: Vec<(i64, i64)> = starts.iter().copied().zip(ends.iter().copied()).collect();
        let out = detached(py, threads, || {
            Ok(bpe::encode_batch(&self.0, &texts, offsets, &spans))
        })?;
        Ok(batch_to_py(py, out))
    }
}
