//! tokpack-core: sequence packing for LLM fine-tuning, with no knowledge of Python.
//!
//! [`plan`] turns sample lengths into rows of segments (best-fit / first-fit decreasing,
//! next-fit, padding, random concatenation); [`materialize`] copies tokens into those rows.
//! [`bpe`] and [`template`] tokenize chat data: byte-level BPE encoding and chat templates;
//! [`records`] takes JSONL chat records through both. [`balance`] splits work evenly across
//! data-parallel ranks and capped micro-batches.
//!
//! Unix only: [`io`] reads spill files and checked shards with positioned reads
//! (`std::os::unix::fs::FileExt`), which keep one file handle shareable between threads.

#[cfg(not(unix))]
compile_error!(
    "tokpack-core is Unix-only: io::spill and io::filebytes use std::os::unix::fs::FileExt"
);

pub mod balance;
pub mod bpe;
mod cap_repair;
mod capacity_index;
pub mod config;
pub mod cuts;
pub mod error;
pub mod format;
pub mod io;
pub mod items;
pub mod kind;
pub mod materialize;
pub mod media;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod records;
pub mod report;
mod rng;
mod strategies;
pub mod template;
pub mod tree;

pub use config::PackConfig;
pub use cuts::{Blocks, Cuts};
pub use error::{CoreError, Result};
pub use materialize::{materialize, FlatColumn, PackedRows};
pub use plan::{plan, plan_cut, Plan, PlanConfig};
pub use policy::{Overlong, SampleKind, Strategy, IGNORE_INDEX};
pub use report::PackReport;
