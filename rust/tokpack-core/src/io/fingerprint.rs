//! Content fingerprints of input files, taken in the pass that reads them for packing, so a
//! large corpus is read from disk once, not once to hash it and again to pack it.
//!
//! A file's bytes are cut into a sequence of parts that depends on the bytes only: for Parquet
//! the byte span of each row group (the units the pack pass reads whole) and the gaps between
//! them (magic, footer, page indexes); for any other file parts of [`PART`] bytes. The
//! fingerprint is xxh3-128 over the file size and each part's offset, length and xxh3-128.
//! Whether the parts are hashed in order by [`file_fingerprint`] or out of order by the pack
//! pass ([`Parts::finish`] hashes what the pass did not read), the result is the same.

use super::filebytes::{hash_range, open_file, READ_BYTES};
use crate::error::{Context, Location, Result};
use parquet::file::metadata::ParquetMetaData;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use twox_hash::XxHash3_128;

/// Part size of files without row groups: the read size of hashing.
pub const PART: u64 = READ_BYTES;

/// The parts of a file: `(offset, length)`, in order, covering every byte once.
#[derive(Clone, Debug, PartialEq)]
pub struct Parts {
    pub size: u64,
    pub parts: Vec<(u64, u64)>,
    /// For each row group, the index of its part (Parquet), else empty.
    pub units: Vec<usize>,
}

/// Equal parts of [`PART`] bytes (the last one shorter).
fn even(size: u64, from: u64, parts: &mut Vec<(u64, u64)>) {
    let mut at = from;
    while at < size {
        let n = PART.min(size - at);
        parts.push((at, n));
        at += n;
    }
}

impl Parts {
    /// A file without row groups.
    pub fn plain(size: u64) -> Self {
        let mut parts = Vec::new();
        even(size, 0, &mut parts);
        Self {
            size,
            parts,
            units: Vec::new(),
        }
    }

    /// A Parquet file of `size` bytes: each row group's span is a part, the gaps are cut
    /// evenly. Spans that overlap an earlier one or reach past the end (a malformed footer)
    /// are clipped, so the parts still cover each byte once.
    pub fn parquet(meta: &ParquetMetaData, size: u64) -> Self {
        let mut parts = Vec::new();
        let mut units = Vec::new();
        let mut at = 0u64;
        for group in meta.row_groups() {
            let (start, end) = group
                .columns()
                .iter()
                .map(|c| {
                    let (s, n) = c.byte_range();
                    (s, s.saturating_add(n))
                })
                .fold((u64::MAX, 0), |(a, b), (s, e)| (a.min(s), b.max(e)));
            let start = start.clamp(at, size);
            let end = end.clamp(start, size);
            even(start, at, &mut parts);
            units.push(parts.len());
            parts.push((start, end - start));
            at = end;
        }
        even(size, at, &mut parts);
        Self { size, parts, units }
    }

    /// The fingerprint from each part's digest (`digests[i]` of `parts[i]`), hashing the parts
    /// without one from `file`.
    pub fn finish(
        &self,
        file: &File,
        at: &Location,
        digests: &mut [Option<u128>],
    ) -> Result<String> {
        let mut h = XxHash3_128::new();
        h.write(&self.size.to_le_bytes());
        for (&(offset, length), digest) in self.parts.iter().zip(digests.iter_mut()) {
            let d = match digest {
                Some(d) => *d,
                None => hash_range(file, offset, length, at)?,
            };
            *digest = Some(d);
            h.write(&offset.to_le_bytes());
            h.write(&length.to_le_bytes());
            h.write(&d.to_le_bytes());
        }
        Ok(format!("{:032x}", h.finish_128()))
    }
}

/// The fingerprint of the file at `path`, read once in order: what the pack pass records for
/// it (the cache key's content fingerprint of an input).
pub fn file_fingerprint(path: &Path) -> Result<(u64, String)> {
    let at = Location::file(path);
    let file = open_file(path)?;
    let size = file.metadata().corrupt(&at, "cannot stat")?.len();
    let parts = parquet_parts(&file, size).unwrap_or_else(|| Parts::plain(size));
    let mut digests = vec![None; parts.parts.len()];
    Ok((size, parts.finish(&file, &at, &mut digests)?))
}

/// The parts of a Parquet file, or None when `file` is not one (or its footer is unreadable:
/// then it is hashed in even parts, as the pack pass, which rejects it, never reads it).
fn parquet_parts(file: &File, size: u64) -> Option<Parts> {
    let mut magic = [0u8; 4];
    file.read_exact_at(&mut magic, 0).ok()?;
    if &magic != b"PAR1" {
        return None;
    }
    let meta = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(file)
        .ok()?;
    Some(Parts::parquet(&meta, size))
}
