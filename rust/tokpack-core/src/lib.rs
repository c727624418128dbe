//! tokpack-core: sequence packing for LLM fine-tuning, with no knowledge of Python.
//!
//! [`plan`] turns sample lengths into rows of segments (best-fit / first-fit decreasing,
//! next-fit, padding, random concatenation); [`materialize`] copies tokens into those rows.

pub mod bpe;
mod capacity_index;
pub mod error;
pub mod io;
pub mod items;
pub mod materialize;
pub mod plan;
pub mod pool;
mod rng;
mod strategies;

pub use error::{CoreError, Result};
pub use materialize::{materialize, FlatColumn, PackedRows, IGNORE_INDEX};
pub use plan::{plan, Overlong, Plan, PlanConfig, Strategy};
