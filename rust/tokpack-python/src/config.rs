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

/// The fields of `kwargs` over `fields` (an unknown name is refused as a Python signature
/// words it).
fn apply(fields: &mut PackFields, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let Some(kwargs) = kwargs else { return Ok(()) };
    for (key, value) in kwargs.iter() {
        let key: String = key.extract()?;
        let v = &value;
        match key.as_str() {
            "max_len" => fields.max_len = integer(v, "max_len")?,
            "strategy" => fields.strategy = string(v, "strategy")?,
            "overlong" => fields.overlong = string(v, "overlong")?,
            "seed" => fields.seed = integer(v, "seed")?,
            "row_order" => fields.row_order = string(v, "row_order")?,
            "max_segments_per_row" => {
                fields.max_segments_per_row = (!v.is_none())
                    .then(|| integer(v, "max_segments_per_row"))
                    .transpose()?
            }
            "align_segments" => fields.align_segments = integer(v, "align_segments")?,
            "tokens_column" => fields.tokens_column = string(v, "tokens_column")?,
            "labels_column" => fields.labels_column = optional_string(v, "labels_column")?,
            "loss_mask_column" => fields.loss_mask_column = optional_string(v, "loss_mask_column")?,
            "pair_layout" => fields.pair_layout = optional_string(v, "pair_layout")?,
            "tree_group" => fields.tree_group = optional_string(v, "tree_group")?,
            "tree_min_shared" => fields.tree_min_shared = integer(v, "tree_min_shared")?,
            "carry" => fields.carry = carry(v)?,
            "rows_per_shard" => fields.rows_per_shard = integer(v, "rows_per_shard")?,
            "row_group_rows" => fields.row_group_rows = integer(v, "row_group_rows")?,
            "compression" => fields.compression = string(v, "compression")?,
            _ => {
                return Err(config_error(format!(
                    "PackConfig got an unexpected keyword argument {key:?}"
                )))
            }
        }
    }
    Ok(())
}

/// The pack options, checked once when made: ``PackConfig(max_len, **fields)``; the fields,
/// their defaults and choices are listed in ``PackConfig.FIELDS``.
#[pyclass(frozen, eq, hash, name = "PackConfig", module = "tokpack._tokpack")]
#[derive(PartialEq, Eq, Hash)]
pub struct PyPackConfig(pub PackConfig);

/// The `#[pymethods]` of `PyPackConfig` with a getter for each `name -> type = value of c`
/// (`c`: the core config), and `scalars`, which sets those fields in a dict, in order.
macro_rules! pack_config_methods {
    ($($name:ident -> $ty:ty = |$c:ident| $value:expr;)* { $($methods:tt)* }) => {
        impl PyPackConfig {
            fn scalars(&self, d: &Bound<'_, PyDict>) -> PyResult<()> {
                $(d.set_item(stringify!($name), self.$name())?;)*
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
        self.scalars(&d)?;
        // Only where they apply (and always with `all`), so the cache keys of SFT outputs stay
        // what they were.
        if all || self.0.plan.max_segments.is_some() {
            d.set_item("max_segments_per_row", self.max_segments_per_row())?;
        }
        if all || self.0.plan.align > 1 {
            d.set_item("align_segments", self.align_segments())?;
        }
        if all || self.0.pair_layout.is_some() {
            d.set_item("pair_layout", self.pair_layout())?;
        }
        if all || self.0.tree_group.is_some() {
            d.set_item("tree_group", self.tree_group())?;
        }
        if all || self.0.tree_min_shared > 1 {
            d.set_item("tree_min_shared", self.tree_min_shared())?;
        }
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
    max_len -> u32 = |c| c.plan.max_len;
    strategy -> &'static str = |c| c.plan.strategy.name();
    overlong -> &'static str = |c| c.plan.overlong.name();
    seed -> u64 = |c| c.plan.seed;
    row_order -> &'static str = |c| c.plan.row_order.name();
    tokens_column -> &str = |c| &c.tokens_column;
    labels_column -> Option<&str> = |c| c.labels_column.as_deref();
    loss_mask_column -> Option<&str> = |c| c.loss_mask_column.as_deref();
    rows_per_shard -> usize = |c| c.rows_per_shard;
    row_group_rows -> usize = |c| c.row_group_rows;
    compression -> &str = |c| &c.compression;
{
    #[new]
    #[pyo3(signature = (max_len, **fields))]
    fn new(max_len: &Bound<'_, PyAny>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut f = PackFields::defaults(integer(max_len, "max_len")?);
        apply(&mut f, fields)?;
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
    fn max_segments_per_row(&self) -> Option<u32> {
        self.0.plan.max_segments
    }
    #[getter]
    fn align_segments(&self) -> u32 {
        self.0.plan.align
    }
    #[getter]
    fn pair_layout(&self) -> Option<&'static str> {
        self.0.pair_layout.map(|l| l.name())
    }
    /// The column grouping sequences packed as prefix trees, when given.
    #[getter]
    fn tree_group(&self) -> Option<&str> {
        self.0.tree_group.as_deref()
    }
    #[getter]
    fn tree_min_shared(&self) -> u32 {
        self.0.tree_min_shared
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
