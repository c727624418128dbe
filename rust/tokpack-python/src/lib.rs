//! The thin pyo3 layer over tokpack-core: conversions, error mapping, GIL release.
//! The public API, docstrings and defaults live in the Python package (`python/tokpack`).

mod arrow_in;
mod balance;
mod bpe;
mod config;
mod cuts;
mod errors;
mod files;
mod plan;
mod pydata;
mod shards;
mod template;
mod tree;

#[pyo3::pymodule]
mod _tokpack {
    use pyo3::prelude::*;
    use pyo3::types::{IntoPyDict, PyDict, PyTuple};
    use tokpack_core::bpe::{LLAMA3_REGEX, QWEN2_REGEX};
    use tokpack_core::format;
    use tokpack_core::kind::{CutRule, Entry};
    use tokpack_core::policy::{
        self, MicroBatchOrder, OverCap, Overlong, PairLayout, PartitionMethod, RowOrder,
        SampleKind, Strategy,
    };

    #[pymodule_export]
    use crate::{
        balance::{micro_batches, partition, MicroBatchParts},
        bpe::BpeEncoder,
        config::{check_int, index_name, pair_layout_for, shard_name, PyPackConfig, PyPackReport},
        cuts::safe_pieces,
        files::{bytes_checksum, file_checksum, file_fingerprint, input_columns, pack_files},
        files::{read_lengths, read_row_group, Progress},
        plan::{default_threads, flatten_samples, pack_tokens, plan, PackedRows, PlanParts},
        shards::write_held_shard,
        template::ChatRenderer,
        tree::{tree_pack, tree_step},
    };

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let names = |names: &[&str]| PyTuple::new(m.py(), names.to_vec());
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("MAX_THREADS", tokpack_core::pool::MAX_THREADS)?;
        // The shared names and constants (re-exported to Python by `tokpack/_contract.py`).
        m.add("IGNORE_INDEX", policy::IGNORE_INDEX)?;
        // The packed-directory format (re-exported to Python by `tokpack/packed/format.py`).
        m.add("FORMAT", format::FORMAT)?;
        m.add("FORMAT_VERSION", format::FORMAT_VERSION)?;
        m.add("SIDE_DIR", format::SIDE_DIR)?;
        m.add("MANIFEST_NAME", format::MANIFEST_NAME)?;
        m.add("DROPPED_NAME", format::DROPPED_NAME)?;
        m.add("REJECTED_NAME", format::REJECTED_NAME)?;
        m.add("SHARD_COLUMNS", names(&format::SHARD_COLUMNS)?)?;
        m.add("INDEX_COLUMNS", names(&format::INDEX_COLUMNS)?)?;
        m.add("KTO_LABEL", format::col::KTO_LABEL)?;
        m.add("MAX_LEN", policy::MAX_LEN)?;
        m.add("MAX_ROWS", policy::MAX_ROWS)?;
        m.add("OVERLONG_HINT", policy::OVERLONG_HINT)?;
        m.add("STRATEGIES", names(Strategy::NAMES)?)?;
        m.add("OVERLONG_POLICIES", names(Overlong::NAMES)?)?;
        m.add("PAIR_LAYOUTS", names(PairLayout::NAMES)?)?;
        m.add("ROW_ORDERS", names(RowOrder::NAMES)?)?;
        m.add("SAMPLE_KINDS", names(SampleKind::NAMES)?)?;
        m.add("MEDIA_COLUMNS", names(&format::MEDIA_COLUMNS)?)?;
        m.add("CUT_RULES", names(CutRule::NAMES)?)?;
        m.add("ENTRY_POINTS", names(Entry::NAMES)?)?;
        // The kinds' room (`tokpack_core::kind`, read by `tokpack/kinds.py`).
        let kinds = PyDict::new(m.py());
        for &kind in SampleKind::ALL {
            let spec = kind.spec();
            let entries: Vec<&str> = spec.entries.iter().map(|e| e.name()).collect();
            let entry = PyDict::new(m.py());
            entry.set_item("inputs", names(spec.inputs)?)?;
            entry.set_item("outputs", names(spec.outputs)?)?;
            entry.set_item("carried", names(spec.carried)?)?;
            entry.set_item("cut", spec.cut.name())?;
            entry.set_item("entries", names(&entries)?)?;
            kinds.set_item(kind.name(), entry)?;
        }
        m.add("KINDS", kinds)?;
        m.add("SEGMENT_ROLES", names(&policy::SEGMENT_ROLES)?)?;
        let roles = PyDict::new(m.py());
        for &layout in PairLayout::ALL {
            roles.set_item(layout.name(), PyTuple::new(m.py(), layout.roles())?)?;
        }
        m.add("PAIR_SEGMENT_ROLES", roles)?;
        let regexes = [("llama3", LLAMA3_REGEX), ("qwen2", QWEN2_REGEX)];
        m.add("SPLIT_REGEXES", regexes.into_py_dict(m.py())?)?;
        m.add("PARTITION_METHODS", names(PartitionMethod::NAMES)?)?;
        m.add("MICRO_BATCH_ORDERS", names(MicroBatchOrder::NAMES)?)?;
        m.add("OVER_CAP_POLICIES", names(OverCap::NAMES)?)?;
        let attention = tokpack_core::balance::CostModel::ATTENTION;
        m.add("ATTENTION_COST", (attention.a, attention.b))?;
        Ok(())
    }
}
