//! `PackConfig` and `PackReport`: the core's pack options and pack outcome as frozen,
//! picklable Python classes (re-exported as `tokpack.PackConfig` / `tokpack.PackReport`).

use crate::errors::{config_error, to_py};
use crate::pydata::{from_python, to_python};
use numpy::PyArray1;
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};
use tokpack_core::config::{self, PackFields, FIELDS};
use tokpack_core::policy::{check_range, PairLayout, RowOrder};
use tokpack_core::{PackConfig, PackReport, SampleKind};

/// An integer argument (never a bool or a float), saturated to i128 for the core's range check.
fn integer(value: &Bound<'_, PyAny>, name: &str) -> PyResult<i128> {
    match value.extract::<i128>() {
        Ok(v) if !value.is_instance_of::<PyBool>() => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(value.py()) => {
            Ok(if value.gt(0)? { i128::MAX } else { i128::MIN })
        }
        _ => Err(config_error(format!(
            "{name} must be an integer, got {}",
            value.repr()?
        ))),
    }
}

/// `value` as an int in `lo..=hi`, else a ConfigError naming `name` (the one checker of numeric
/// arguments, `tokpack.planning.check_int`).
#[pyfunction]
pub fn check_int(value: &Bound<'_, PyAny>, name: &str, lo: i128, hi: i128) -> PyResult<i128> {
    check_range(name, integer(value, name)?, lo, hi).map_err(to_py)
}

fn string(value: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    value.extract::<String>().map_err(|_| {
        config_error(format!(
            "{name} must be a string, got {}",
            value.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })
}

fn optional_string(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<String>> {
    (!value.is_none()).then(|| string(value, name)).transpose()
}

fn optional_integer(value: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<i128>> {
    (!value.is_none()).then(|| integer(value, name)).transpose()
}

fn carry(value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if value.is_none() {
        return Ok(Vec::new());
    }
    if value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>() {
        return Err(config_error(format!(
            "carry must be a list of column names, not {}",
            value.repr()?
        )));
    }
    let name = |item: PyResult<Bound<'_, PyAny>>| {
        let item = item?;
        match item.extract::<String>() {
            Ok(name) if !name.is_empty() => Ok(name),
            _ => Err(config_error(format!(
                "carry: column names must be non-empty strings, got {}",
                item.repr()?
            ))),
        }
    };
    value.try_iter()?.map(name).collect()
}

/// The pack options, checked once when made: ``PackConfig(max_len, **fields)``; the fields,
/// their defaults and choices are listed in ``PackConfig.FIELDS``.
#[pyclass(frozen, eq, hash, name = "PackConfig", module = "tokpack._tokpack")]
#[derive(PartialEq, Eq, Hash)]
pub struct PyPackConfig(pub PackConfig);

/// The `#[pymethods]` of `PyPackConfig` from one line per field but `carry`, `name: parse ->
/// type = value of c` (`parse`: the checker of its argument, `c`: the core config), with `if`
/// the condition on which the manifest records it (else always): a getter for each; `apply`,
/// which sets the `PackFields` of keyword arguments (an unknown name is refused as a Python
/// signature words it); and `set_fields`, which sets them in a dict, in order (those with an
/// `if` only where they apply, or with `all`, so the cache keys of SFT outputs stay what they
/// were).
macro_rules! pack_config_methods {
    ($($name:ident: $parse:ident -> $ty:ty = |$c:ident| $value:expr $(, if $when:expr)?;)*
     { $($methods:tt)* }) => {
        impl PyPackConfig {
            fn apply(f: &mut PackFields, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
                for (key, v) in kwargs.into_iter().flat_map(|kwargs| kwargs.iter()) {
                    match key.extract::<String>()?.as_str() {
                        $(stringify!($name) => f.$name = $parse(&v, stringify!($name))?,)*
                        "carry" => f.carry = carry(&v)?,
                        key => {
                            return Err(config_error(format!(
                                "PackConfig got an unexpected keyword argument {key:?}"
                            )))
                        }
                    }
                }
                Ok(())
            }

            fn set_fields(&self, d: &Bound<'_, PyDict>, all: bool) -> PyResult<()> {
                $(
                    let $c = &self.0;
                    $(if all || $when)? {
                        d.set_item(stringify!($name), $value)?;
                    }
                )*
                Ok(())
            }
        }

        #[pymethods]
        impl PyPackConfig {
            $(
                #[getter]
                fn $name(&self) -> $ty {
                    let $c = &self.0;
                    $value
                }
            )*
            $($methods)*
        }
    };
}

impl PyPackConfig {
    fn fields_dict<'py>(&self, py: Python<'py>, all: bool) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        self.set_fields(&d, all)?;
        if all || !self.0.carry.is_empty() {
            d.set_item("carry", PyList::new(py, &self.0.carry)?)?;
        }
        Ok(d)
    }

    /// The config of a dict of its fields, ``max_len`` among them (which it removes).
    fn of_fields(fields: &Bound<'_, PyDict>) -> PyResult<Self> {
        let Some(max_len) = fields.get_item("max_len")? else {
            return Err(config_error("the config has no max_len"));
        };
        fields.del_item("max_len")?;
        Self::new(&max_len, Some(fields))
    }
}

pack_config_methods! {
    max_len: integer -> u32 = |c| c.plan.max_len;
    strategy: string -> &'static str = |c| c.plan.strategy.name();
    overlong: string -> &'static str = |c| c.plan.overlong.name();
    seed: integer -> u64 = |c| c.plan.seed;
    row_order: string -> &'static str = |c| c.plan.row_order.name();
    tokens_column: string -> &str = |c| &c.tokens_column;
    labels_column: optional_string -> Option<&str> = |c| c.labels_column.as_deref();
    loss_mask_column: optional_string -> Option<&str> = |c| c.loss_mask_column.as_deref();
    rows_per_shard: integer -> usize = |c| c.rows_per_shard;
    row_group_rows: integer -> usize = |c| c.row_group_rows;
    compression: string -> &str = |c| &c.compression;
    max_segments_per_row: optional_integer -> Option<u32> = |c| c.plan.max_segments,
        if c.plan.max_segments.is_some();
    align_segments: integer -> u32 = |c| c.plan.align, if c.plan.align > 1;
    pair_layout: optional_string -> Option<&'static str> = |c| c.pair_layout.map(|l| l.name()),
        if c.pair_layout.is_some();
    tree_group: optional_string -> Option<&str> = |c| c.tree_group.as_deref(),
        if c.tree_group.is_some();
    tree_min_shared: integer -> u32 = |c| c.tree_min_shared, if c.tree_min_shared > 1;
    tree_max_path: optional_integer -> Option<u32> = |c| c.tree_max_path,
        if c.tree_max_path.is_some();
{
    #[new]
    #[pyo3(signature = (max_len, **fields))]
    fn new(max_len: &Bound<'_, PyAny>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut f = PackFields::defaults(integer(max_len, "max_len")?);
        Self::apply(&mut f, fields)?;
        PackConfig::new(f).map(Self).map_err(to_py)
    }

    /// `(name, default, choices, help)` of every field (max_len has no default).
    #[classattr]
    #[allow(non_snake_case)]
    fn FIELDS(py: Python<'_>) -> PyResult<Py<PyTuple>> {
        let defaults = PyPackConfig(PackConfig::new(PackFields::defaults(1)).map_err(to_py)?);
        let values = defaults.fields_dict(py, true)?;
        let rows: PyResult<Vec<_>> = FIELDS
            .iter()
            .map(|&(name, choices, help)| {
                let default = match name {
                    "max_len" => None,
                    name => values.get_item(name)?,
                };
                (name, default, PyTuple::new(py, choices)?, help).into_pyobject(py)
            })
            .collect();
        Ok(PyTuple::new(py, rows?)?.unbind())
    }

    #[getter]
    fn carry<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.0.carry)
    }

    /// The config as the manifest records it (``format_version`` first; ``pair_layout`` and
    /// ``carry`` only where they apply): part of the cache key.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("format_version", tokpack_core::format::FORMAT_VERSION)?;
        for (k, v) in self.fields_dict(py, false)?.iter() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// The config of a manifest's ``config`` dict (its ``format_version``, ``tokenize`` and
    /// ``ray`` entries are not pack options and are ignored; a dict without ``row_order``, as
    /// manifests written before the field existed, was packed in ``"plan"`` order).
    #[classmethod]
    fn from_dict(_cls: &Bound<'_, pyo3::types::PyType>, d: &Bound<'_, PyDict>) -> PyResult<Self> {
        let fields = d.copy()?;
        for key in ["format_version", "tokenize", "ray"] {
            if fields.contains(key)? {
                fields.del_item(key)?;
            }
        }
        if !fields.contains("row_order")? {
            fields.set_item("row_order", RowOrder::Plan.name())?;
        }
        Self::of_fields(&fields)
    }

    /// A copy with the given fields changed (checked again).
    #[pyo3(signature = (**fields))]
    fn replace(&self, py: Python<'_>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let all = self.fields_dict(py, true)?;
        if let Some(fields) = fields {
            all.update(fields.as_mapping())?;
        }
        Self::of_fields(&all)
    }

    /// This config for inputs of ``kind`` (``"sft"``, ``"preference"``, ``"kto"``, ...;
    /// ``inputs`` names them in messages): preference pairs get a pair layout, KTO carries its
    /// ``label`` first, trees their group column (and refuse what cuts a sequence); a pair
    /// layout on other samples, ``label`` carried from them, or ``tree_group`` on other than
    /// trees, is refused.
    fn for_kind(&self, kind: &str, inputs: &str) -> PyResult<Self> {
        let kind: SampleKind = kind.parse().map_err(to_py)?;
        self.0.for_kind(kind, inputs).map(Self).map_err(to_py)
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
        let from_dict = slf.get_type().getattr("from_dict")?;
        Ok((from_dict, (slf.get().to_dict(slf.py())?,)))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let parts: PyResult<Vec<String>> = self
            .fields_dict(py, true)?
            .iter()
            .map(|(k, v)| Ok(format!("{k}={}", v.repr()?)))
            .collect();
        Ok(format!("PackConfig({})", parts?.join(", ")))
    }
}
}

/// What a pack job did: counts, the ids of the samples not packed whole, the shards written,
/// and the manifest's ``figures()``, computed once here.
#[pyclass(frozen, name = "PackReport", module = "tokpack._tokpack")]
pub struct PyPackReport(pub PackReport);

#[pymethods]
impl PyPackReport {
    /// A report of one part of a job (Ray's groups), by its fields (keywords): ``input_rows``,
    /// ``has_labels``, ``max_len``, ``n_samples``, ``rows``, ``segments``, ``tokens``,
    /// ``input_tokens``, the sample ids (global) ``dropped``, ``empty``, ``truncated``, ``split``,
    /// and the ``shards``' entries.
    #[new]
    #[pyo3(signature = (**fields))]
    fn new(py: Python<'_>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let empty = PyDict::new(py);
        from_python(fields.unwrap_or(&empty), "PackReport").map(Self)
    }

    /// The parts of one job (consecutive runs of samples) as one report, with ``shards`` (the
    /// parts' shards as renamed) and ``input_rows``.
    #[staticmethod]
    fn merge(
        parts: Vec<PyRef<'_, PyPackReport>>,
        shards: &Bound<'_, PyAny>,
        input_rows: Vec<u64>,
    ) -> PyResult<Self> {
        let parts: Vec<PackReport> = parts.iter().map(|p| p.0.clone()).collect();
        let shards = from_python(shards, "shards")?;
        Ok(Self(PackReport::merge(&parts, shards, input_rows)))
    }

    #[getter]
    fn input_rows(&self) -> Vec<u64> {
        self.0.input_rows.clone()
    }
    /// Each input file's content fingerprint, taken while it was read (``pack_files``).
    #[getter]
    fn input_fingerprints(&self) -> Vec<String> {
        self.0.input_fingerprints.clone()
    }
    #[getter]
    fn has_labels(&self) -> bool {
        self.0.has_labels
    }
    #[getter]
    fn dropped<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        PyArray1::from_slice(py, &self.0.dropped)
    }
    #[getter]
    fn empty<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        PyArray1::from_slice(py, &self.0.empty)
    }
    /// Multimodal samples dropped for having no safe cut (among ``dropped``).
    #[getter]
    fn no_safe_cut<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        PyArray1::from_slice(py, &self.0.no_safe_cut)
    }
    /// The shards' manifest entries.
    #[getter]
    fn shards<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.0.shards)
    }

    /// The manifest's ``figures`` (but ``wall_time_s``).
    fn figures<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.0.figures())
    }

    /// Pickled through its keyword constructor (Ray tasks return reports).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let fields = to_python(py, &slf.get().0)?;
        let partial = py.import("functools")?.getattr("partial")?;
        let partial = partial.call((slf.get_type(),), Some(fields.cast()?))?;
        Ok((partial, PyTuple::empty(py)))
    }
}

/// The pair layout of inputs of ``kind`` (``inputs`` names them in messages): preference pairs
/// get one (``"separate"`` when none is given); other kinds refuse any but ``"separate"``.
#[pyfunction]
#[pyo3(signature = (kind, pair_layout, inputs))]
pub fn pair_layout_for(
    kind: &str,
    pair_layout: Option<&str>,
    inputs: &str,
) -> PyResult<Option<&'static str>> {
    let layout: Option<PairLayout> = pair_layout.map(str::parse).transpose().map_err(to_py)?;
    let kind: SampleKind = kind.parse().map_err(to_py)?;
    let layout = config::pair_layout_for(kind, layout, inputs).map_err(to_py)?;
    Ok(layout.map(|l| l.name()))
}

/// The file name of packed shard `shard` (`part-NNNNN.parquet`).
#[pyfunction]
pub fn shard_name(shard: usize) -> String {
    tokpack_core::format::shard_name(shard)
}

/// The file name of shard `shard`'s index, under the side directory.
#[pyfunction]
pub fn index_name(shard: usize) -> String {
    tokpack_core::format::index_name(shard)
}
