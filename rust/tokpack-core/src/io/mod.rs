//! Reading token shards from disk and writing packed shards.
//!
//! [`source`] opens Parquet and Arrow IPC files and reads them one unit (row group / record
//! batch) at a time, projecting only the needed columns; [`columns`] turns Arrow list columns
//! into checked int32 tokens; [`spill`] keeps the tokens in flat files so packing needs memory
//! for the per-sample bookkeeping only; [`writer`] writes packed shards with their boundary
//! index; [`checked`] reads them back against their checksums; [`pack`] ties them together;
//! [`shard`] writes one shard from samples held in memory (the shard tasks of `tokpack.ray`);
//! [`pairs`] makes preference pairs packing units and [`carry`] carries per-sample columns.
//! [`filebytes`], the byte level under them all (opening files, checksummed byte ranges),
//! imports no other `io` module.

pub mod carry;
pub mod checked;
pub mod columns;
pub mod filebytes;
pub mod fingerprint;
pub mod pack;
mod pagecache;
pub mod pairs;
pub mod progress;
mod read_columns;
pub mod shard;
pub mod source;
pub mod spill;
pub mod trees;
pub mod writer;

pub use checked::{read_checked_row_group, GroupCheck};
pub use filebytes::{bytes_checksum, file_checksum, ByteRange};
pub use fingerprint::file_fingerprint;
pub use pack::{pack_files, read_lengths, LabelSource, PackFilesConfig, PackOutcome};
pub use pairs::PairLayout;
pub use progress::{Phase, Progress};
pub use read_columns::input_columns;
pub use shard::{write_held_shard, HeldSamples};
pub use source::{read_row_group, Source};
pub use trees::TreeCounts;
pub use writer::{parse_compression, ShardInfo};
