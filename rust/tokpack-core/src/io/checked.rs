//! Reading packed shards against the checksums recorded when they were written: a row group's
//! bytes and the footer's are read once, hashed (xxh3-128), compared with the manifest's, and
//! only then decoded, from memory. A damaged, truncated or replaced shard therefore fails
//! instead of yielding other tokens, and the check covers exactly the bytes that are decoded.

use super::fingerprint::hash_range;
use super::source::{assemble_batch, decode, open_file};
use super::writer::{xxh3_hex, ByteRange};
use crate::error::{Context, CoreError, Location, Result};
use arrow::array::RecordBatch;
use bytes::{Buf, Bytes};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// What the manifest records about one row group of a shard, as a reader needs it.
pub struct GroupCheck {
    /// Size of the whole file.
    pub size: u64,
    pub footer: ByteRange,
    pub group: ByteRange,
}

/// Checked byte ranges of a file standing in for the file: reads outside them fail.
pub(crate) struct CheckedBytes {
    pub size: u64,
    pub ranges: Vec<(u64, Bytes)>,
}

impl CheckedBytes {
    /// The bytes from `start` to the end of the range holding them, and how many there are.
    fn tail(&self, start: u64) -> parquet::errors::Result<Bytes> {
        self.ranges
            .iter()
            .find(|(offset, data)| start >= *offset && start <= offset + data.len() as u64)
            .map(|(offset, data)| data.slice((start - offset) as usize..))
            .ok_or_else(|| {
                ParquetError::General(format!("offset {start} is outside the checked bytes"))
            })
    }
}

impl Length for CheckedBytes {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for CheckedBytes {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.tail(start)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let tail = self.tail(start)?;
        if length > tail.len() {
            return Err(ParquetError::General(format!(
                "bytes {start}..{} are outside the checked bytes",
                start + length as u64
            )));
        }
        Ok(tail.slice(..length))
    }
}

/// Reads `range` of `file` (the `part` of the unit at `at`: "footer: " or nothing) and checks
/// its bytes against the recorded checksum.
fn read_checked(file: &File, at: &Location, part: &str, range: &ByteRange) -> Result<Bytes> {
    let mut buf = vec![0u8; range.length as usize];
    file.read_exact_at(&mut buf, range.offset)
        .corrupt(at, &format!("{part}cannot read"))?;
    let got = bytes_checksum(&buf);
    if got != range.checksum {
        let what = format!(
            "{part}bytes {}..{} do not match their checksum (they hash to {got}, the manifest \
             says {})",
            range.offset,
            range.offset + range.length,
            range.checksum
        );
        return Err(CoreError::corrupt(at.clone(), what, None));
    }
    Ok(Bytes::from(buf))
}

/// Row group `unit` of the packed shard `path` with only `columns`, after checking the file's
/// size and the checksums of the footer and of the row group's bytes.
pub fn read_checked_row_group(
    path: &Path,
    unit: usize,
    columns: &[&str],
    check: &GroupCheck,
) -> Result<RecordBatch> {
    let at = Location::unit(path, "row group", unit);
    let file = open_file(path)?;
    let size = file.metadata().corrupt(&at, "cannot stat")?.len();
    if size != check.size {
        let what = format!(
            "the file has {size} bytes, the manifest says {}",
            check.size
        );
        return Err(CoreError::corrupt(at, what, None));
    }
    let footer = read_checked(&file, &at, "footer: ", &check.footer)?;
    let group = read_checked(&file, &at, "", &check.group)?;
    let data = CheckedBytes {
        size,
        ranges: vec![(check.footer.offset, footer), (check.group.offset, group)],
    };
    let meta = ArrowReaderMetadata::load(&data, ArrowReaderOptions::new())
        .corrupt(&at, "cannot decode")?;
    let groups = meta.metadata().row_groups();
    let Some(rows) = groups.get(unit).map(|g| g.num_rows()) else {
        let what = format!("does not exist (the file has {})", groups.len());
        return Err(CoreError::corrupt(at, what, None));
    };
    let index = |c: &&str| {
        let column = at.clone().column(c);
        meta.schema().index_of(c).corrupt(&column, "no such column")
    };
    let indices = columns.iter().map(index).collect::<Result<Vec<_>>>()?;
    let mask = ProjectionMask::roots(meta.parquet_schema(), indices);
    let mut batches = Vec::new();
    let schema = decode(data, &meta, mask, unit, rows as usize, &at, &mut |b| {
        batches.push(b);
        Ok(())
    })?;
    assemble_batch(&at, schema, batches, columns)
}

/// `xxh3_128:<hex>` of some bytes: the manifest's checksum of a byte range, for a reader that
/// fetched the range itself (a shard on object storage) and checks it before keeping it.
pub fn bytes_checksum(data: &[u8]) -> String {
    xxh3_hex(twox_hash::XxHash3_128::oneshot(data))
}

/// Size and `xxh3_128:<hex>` checksum of a whole file.
pub fn file_checksum(path: &Path) -> Result<(u64, String)> {
    let at = Location::file(path);
    let file = open_file(path)?;
    let size = file.metadata().corrupt(&at, "cannot stat")?.len();
    Ok((size, xxh3_hex(hash_range(&file, 0, size, &at)?)))
}
