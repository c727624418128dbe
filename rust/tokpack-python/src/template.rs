//! `ChatRenderer`: the core's chat template renderer, batch calls with the GIL released.

use crate::bpe::{batch_to_py, Batch, BpeEncoder};
use crate::errors::{config_error, detached};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use tokpack_core::records::{self, ChatFields};
use tokpack_core::template::{ChatTemplate, Data, Mode};

/// The plain data of a Python value: exactly None, bool, int (64-bit), float, str, list and
/// dict with str keys (what JSON decodes to). None for anything else (a tuple prints
/// differently, an object has methods): its conversation is rendered in Python.
fn plain_data(obj: &Bound<'_, PyAny>) -> Option<Data> {
    if obj.is_none() {
        Some(Data::Null)
    } else if let Ok(s) = obj.cast_exact::<PyString>() {
        Some(Data::Str(s.to_cow().ok()?.into_owned()))
    } else if let Ok(d) = obj.cast_exact::<PyDict>() {
        let mut pairs = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key = k.cast_exact::<PyString>().ok()?.to_cow().ok()?.into_owned();
            pairs.push((key, plain_data(&v)?));
        }
        Some(Data::Map(pairs))
    } else if let Ok(l) = obj.cast_exact::<PyList>() {
        l.iter()
            .map(|v| plain_data(&v))
            .collect::<Option<_>>()
            .map(Data::List)
    } else if let Ok(b) = obj.cast_exact::<PyBool>() {
        Some(Data::Bool(b.is_true()))
    } else if let Ok(i) = obj.cast_exact::<PyInt>() {
        i.extract::<i64>().ok().map(Data::Int)
    } else if let Ok(f) = obj.cast_exact::<PyFloat>() {
        Some(Data::Float(f.value()))
    } else {
        None
    }
}

/// A conversation's messages as plain data (None: not a list of plain values).
fn conversation(obj: &Bound<'_, PyAny>) -> Option<Vec<Data>> {
    match plain_data(obj)? {
        Data::List(messages) => Some(messages),
        _ => None,
    }
}

/// A chat template compiled for rendering in Rust.
#[pyclass(frozen, module = "tokpack._tokpack")]
pub struct ChatRenderer(ChatTemplate);

type Rendered<'py> = (
    Vec<Option<String>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Vec<Option<String>>,
);

#[pymethods]
impl ChatRenderer {
    /// `(renderer, None)`, or `(None, reason)` when this renderer cannot take the template.
    /// `variables`: the special-token variables; `special_tokens`: the tokenizer's special
    /// token strings, longest first; `utc_offset`: seconds east of UTC (`strftime_now`);
    /// `tools`: passed as `tools` (default None).
    #[staticmethod]
    #[pyo3(signature = (*, source, variables, special_tokens, utc_offset, tools=None))]
    fn compile(
        source: &str,
        variables: Vec<(String, String)>,
        special_tokens: Vec<String>,
        utc_offset: i64,
        tools: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Option<Self>, Option<String>)> {
        let tools = tools
            .map(|t| plain_data(t).ok_or_else(|| config_error("tools must be plain data")))
            .transpose()?;
        let template =
            ChatTemplate::new(source, variables, special_tokens, utc_offset).and_then(|mut t| {
                tools
                    .map_or(Ok(()), |tools| t.set_tools(&tools))
                    .map(|()| t)
            });
        Ok(match template {
            Ok(t) => (Some(Self(t)), None),
            Err(why) => (None, Some(why)),
        })
    }

    /// Whether the template has `{% generation %}` blocks.
    #[getter]
    fn has_generation(&self) -> bool {
        self.0.has_generation()
    }

    /// Renders each conversation (the list of its message dicts). `mode`: `"assistant"`,
    /// `"last"`, `"all"` (texts and trained character spans) or `"plain"` (texts only).
    /// Returns `(texts, span_offsets, span_starts, span_ends, errors)`: conversation `i` is
    /// `texts[i]` with spans `[span_offsets[i], span_offsets[i + 1])`, or None with
    /// `errors[i]` saying why it was not rendered (render it in Python).
    #[pyo3(signature = (*, conversations, mode, add_generation_prompt=false, threads=None))]
    fn render_batch<'py>(
        &self,
        py: Python<'py>,
        conversations: &Bound<'py, PyList>,
        mode: &str,
        add_generation_prompt: bool,
        threads: Option<usize>,
    ) -> PyResult<Rendered<'py>> {
        let mode = Mode::parse(mode, add_generation_prompt)
            .ok_or_else(|| config_error(format!("unknown mode {mode:?}")))?;
        let conversations: Vec<Option<Vec<Data>>> =
            conversations.iter().map(|c| conversation(&c)).collect();
        let results = detached(py, threads, || {
            Ok(self.0.render_batch(&conversations, mode))
        })?;
        let mut offsets = Vec::with_capacity(results.len() + 1);
        offsets.push(0i64);
        let (mut starts, mut ends) = (Vec::new(), Vec::new());
        let (texts, errors): (Vec<_>, Vec<_>) = results
            .into_iter()
            .map(|result| {
                let out = match result {
                    Ok(r) => {
                        starts.extend(r.spans.iter().map(|s| s.0));
                        ends.extend(r.spans.iter().map(|s| s.1));
                        (Some(r.text), None)
                    }
                    Err(why) => (None, Some(why)),
                };
                offsets.push(starts.len() as i64);
                out
            })
            .unzip();
        Ok((
            texts,
            offsets.into_pyarray(py),
            starts.into_pyarray(py),
            ends.into_pyarray(py),
            errors,
        ))
    }

    /// Parses, renders (`mode`: `"assistant"`, `"last"` or `"all"`) and encodes with
    /// `encoder` JSONL lines holding OpenAI-style `messages` records (keys `messages_key`
    /// and `system_key`; with `detect_keys`, the chosen, rejected, prompt, completion and
    /// label keys of format "auto", a record holding them is another format). Returns
    /// `((ids, labels, offsets, fallback), last_assistant)`: line `i` owns
    /// `ids[offsets[i]:offsets[i + 1]]`, except the lines listed in `fallback` (left to the
    /// Python path: they own no tokens); `last_assistant[i]`: its last message is an
    /// assistant's.
    #[pyo3(signature = (*, encoder, lines, mode, messages_key, system_key, detect_keys=None, threads=None))]
    #[allow(clippy::too_many_arguments)]
    fn tokenize_jsonl<'py>(
        &self,
        py: Python<'py>,
        encoder: &Bound<'py, BpeEncoder>,
        lines: Vec<PyBackedStr>,
        mode: &str,
        messages_key: String,
        system_key: String,
        detect_keys: Option<[String; 5]>,
        threads: Option<usize>,
    ) -> PyResult<(Batch<'py>, Bound<'py, PyArray1<bool>>)> {
        let mode = Mode::parse(mode, false)
            .filter(|m| !matches!(m, Mode::Plain { .. }))
            .ok_or_else(|| config_error(format!("unknown mode {mode:?}")))?;
        let fields = ChatFields {
            messages: messages_key,
            system: system_key,
            detect: detect_keys,
        };
        let tokenizer = &encoder.get().0;
        let out = detached(py, threads, || {
            Ok(records::tokenize_jsonl(
                &self.0, tokenizer, &lines, &fields, mode,
            ))
        })?;
        Ok((
            batch_to_py(py, out.batch),
            out.last_assistant.into_pyarray(py),
        ))
    }
}
